// Fault injection on saves (checkpoints are safetensors files; exports go through util/file.h):
//   - a save killed with SIGKILL at random points, many times, always leaves a complete file: the last save
//     that finished, or the one that was being made, never a torn or truncated one;
//   - a save that runs out of disk space (a small tmpfs in a private mount namespace) fails with a clear
//     error, leaves the previous file as it was and no temporary file behind.
// Both run in child processes (fork), so a kill or a mount never touches the test runner.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "ampforge/core/safetensors.h"
#include "ampforge/util/file.h"

namespace fs = std::filesystem;
using namespace ampforge;

namespace {

// A checkpoint-like file whose every value says which save made it: F32 and I64 tensors filled with
// `version`, and the version in the metadata.
std::vector<std::pair<std::string, Tensor>> payload(int64_t version, int64_t floats) {
  Tensor a = Tensor::empty({floats});
  std::fill_n(a.data<float>(), floats, static_cast<float>(version));
  Tensor b = Tensor::empty({floats / 8}, DType::I64);
  std::fill_n(b.data<int64_t>(), floats / 8, version);
  return {{"model.weight", a}, {"optim.step", b}};
}
std::map<std::string, std::string> meta(int64_t version) { return {{"version", std::to_string(version)}}; }

// The version of a complete, consistent file; an error message otherwise.
std::string check_file(const std::string& path, int64_t floats, int64_t* version) {
  try {
    const SafetensorsFile f = load_safetensors(path);
    const int64_t v = std::stoll(f.metadata.at("version"));
    const Tensor& a = f.at("model.weight");
    const Tensor& b = f.at("optim.step");
    if (a.numel() != floats || b.numel() != floats / 8) return "wrong sizes";
    for (int64_t i = 0; i < a.numel(); ++i)
      if (a.data<float>()[i] != static_cast<float>(v)) return "model.weight is torn at element " + std::to_string(i);
    for (int64_t i = 0; i < b.numel(); ++i)
      if (b.data<int64_t>()[i] != v) return "optim.step is torn at element " + std::to_string(i);
    *version = v;
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

int count_temporaries(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().find(".tmp.") != std::string::npos;
  return n;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(SaveFaults, SigkillAtRandomPointsLeavesACompleteFile) {
  const fs::path dir = fresh_dir("ampforge-sigkill");
  const std::string path = (dir / "ckpt.safetensors").string();
  constexpr int64_t kFloats = 1 << 20;  // 4 MiB + 512 KiB per save
  save_safetensors(path, payload(0, kFloats), meta(0));
  const auto t0 = std::chrono::steady_clock::now();
  save_safetensors(path, payload(0, kFloats), meta(0));
  const double save_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  std::mt19937 rng(20);  // fixed: the same kill times every run (the machine's timing still varies)
  std::uniform_real_distribution<double> when(0.0, 2.5 * save_us);
  int64_t floor_version = 0;  // the file may never go back before the last save known to have finished
  int mid_save = 0;
  constexpr int kKills = 40;
  for (int k = 0; k < kKills; ++k) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const int64_t base = 1000 * (k + 1);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the writer: saves versions base+1, base+2, ... and reports each one that finished
      ::close(fds[0]);
      try {
        for (int64_t v = base + 1;; ++v) {
          save_safetensors(path, payload(v, kFloats), meta(v));
          if (::write(fds[1], &v, sizeof v) != sizeof v) ::_exit(3);
        }
      } catch (...) {
        ::_exit(2);
      }
    }
    ::close(fds[1]);
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(when(rng))));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer failed on its own: " << status;
    int64_t finished = 0, v = 0;
    while (::read(fds[0], &v, sizeof v) == sizeof v) finished = v;
    ::close(fds[0]);
    if (finished > 0) floor_version = finished;
    mid_save += count_temporaries(dir) > 0;

    int64_t got = -1;
    const std::string err = check_file(path, kFloats, &got);
    ASSERT_EQ(err, "") << "after kill " << k << " the checkpoint does not load intact";
    // The last save that finished, or the one in progress if its rename was done before the kill.
    EXPECT_GE(got, floor_version) << "kill " << k << ": the file went back to an older save";
    EXPECT_TRUE(got == floor_version || got == (finished > 0 ? finished + 1 : base + 1))
        << "kill " << k << ": version " << got << " after " << finished;
    floor_version = got;
    for (const auto& e : fs::directory_iterator(dir))  // a killed save cannot clean up its temporary file
      if (e.path().filename().string().find(".tmp.") != std::string::npos) fs::remove(e.path());
  }
  // The kills must land inside saves (in the middle of writing), not only between them, or the test
  // proves nothing.
  EXPECT_GE(mid_save, kKills / 4) << "only " << mid_save << " of " << kKills << " kills interrupted a save";
  std::printf("SIGKILL: %d kills, %d in the middle of a save (one save: %.0f us); every file loaded intact\n", kKills,
              mid_save, save_us);
  fs::remove_all(dir);
}

TEST(SaveFaults, DiskFullFailsClearlyAndLosesNothing) {
  // A 1 MiB tmpfs, mounted in a mount namespace private to a child process (needs root, as CI has, or
  // unprivileged user namespaces). The child reports one line: "ok" or what went wrong.
  const fs::path dir = fresh_dir("ampforge-enospc");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    auto report = [&](const std::string& s) {
      (void)!::write(fds[1], s.data(), s.size());
      ::_exit(s == "ok" ? 0 : 1);
    };
    if (::unshare(CLONE_NEWNS) != 0 && ::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
      report(std::string("cannot make a private mount namespace: ") + std::strerror(errno));
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      report(std::string("cannot make / private: ") + std::strerror(errno));
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0)
      report(std::string("cannot mount a 1 MiB tmpfs: ") + std::strerror(errno));
    try {
      const std::string ckpt = (dir / "ckpt.safetensors").string();
      save_safetensors(ckpt, payload(1, 64 << 10), meta(1));  // 288 KiB: fits
      try {
        save_safetensors(ckpt, payload(2, 256 << 10), meta(2));  // 1.1 MiB: cannot fit
        report("a save larger than the disk succeeded");
      } catch (const Error& e) {
        const std::string m = e.what();
        if (e.kind() != ErrorKind::Io || m.find("No space left on device") == std::string::npos ||
            m.find("ckpt.safetensors") == std::string::npos || m.find("unchanged") == std::string::npos)
          report("unclear error: " + m);
      }
      int64_t v = -1;
      const std::string err = check_file(ckpt, 64 << 10, &v);
      if (!err.empty() || v != 1) report("the previous checkpoint was damaged: " + err);
      if (count_temporaries(dir) != 0) report("a temporary file was left behind");
      // The writer of exports (ONNX, reports) likewise.
      const std::string onnx = (dir / "model.onnx").string();
      write_file_atomically(onnx, std::string(1000, 'a'), "ONNX file");
      try {
        write_file_atomically(onnx, std::string(2 << 20, 'b'), "ONNX file");
        report("an export larger than the disk succeeded");
      } catch (const Error& e) {
        const std::string m = e.what();
        if (m.find("model.onnx") == std::string::npos || m.find("No space left on device") == std::string::npos)
          report("unclear export error: " + m);
      }
      if (fs::file_size(onnx) != 1000 || count_temporaries(dir) != 0) report("the export's previous file changed");
    } catch (const std::exception& e) {
      report(std::string("unexpected error: ") + e.what());
    }
    report("ok");
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(msg, "ok");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  fs::remove_all(dir);
}
