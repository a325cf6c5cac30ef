// Shared by the libFuzzer harnesses (tests/fuzz/README.md): inputs as files, and a check that aborts.
//
// A harness feeds one parser the fuzzer's bytes. An ampforge::Error is the expected answer to bad input
// (a clear message); anything else is a finding: a sanitizer report, a crash, a hang, an exception of
// another type escaping, or a FUZZ_CHECK (a property such as "what loads saves and loads back the same")
// failing.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

// A broken property is a finding: print it and abort, so libFuzzer saves the input.
#define FUZZ_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
      std::fprintf(stderr, "" __VA_ARGS__);                                                    \
      std::fprintf(stderr, "\n");                                                              \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

namespace ampforge::fuzz {

// The input as a file the parsers open by path: an anonymous memory file (memfd) reached through
// /proc/self/fd, rewritten for every input. No disk I/O, nothing to clean up.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(memfd_create(name, 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  std::string write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    return "/proc/self/fd/" + std::to_string(fd_);
  }

 private:
  int fd_;
};

// A private directory in memory (/dev/shm when there is one) for writers that need a real path (atomic
// saves rename a temporary file), removed at exit.
inline const std::string& scratch_dir() {
  // Never destroyed: the exit handler that removes the directory runs after static destructors.
  static const std::string* dir = [] {
    namespace fs = std::filesystem;
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    const fs::path d = base / ("ampforge-fuzz-" + std::to_string(getpid()));
    fs::create_directories(d);
    auto* s = new std::string(d.string());
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
    });
    return s;
  }();
  return *dir;
}

// Reads the input front to back: numbers and strings for harnesses that build structures from bytes.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  uint8_t byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint64_t u64(int bytes = 8) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = v << 8 | byte();
    return v;
  }
  std::string str(size_t max_len) {
    const size_t len = std::min<size_t>(byte() % (max_len + 1), n_);
    std::string s(reinterpret_cast<const char*>(p_), len);
    p_ += len;
    n_ -= len;
    return s;
  }
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p_), n_);
    p_ += n_;
    n_ = 0;
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace ampforge::fuzz
