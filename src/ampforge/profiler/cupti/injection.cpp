// libampforge_cupti_injection: collects GPU activity with the CUPTI Activity API and writes it to an
// activity file (format: profiler/activity_file.h), for `ampforge profile` and in-process sessions.
//
// Two ways in:
//   - CUDA_INJECTION64_PATH=<this library>: the driver calls InitializeInjection() during cuInit; the output
//     path comes from $AMPFORGE_CUPTI_OUTPUT and the file is closed at process exit (atexit).
//   - dlopen + ampforge_cupti_start(path) / ampforge_cupti_stop(): a profiler Session in the same process.
//
// Records: concurrent kernels, memcpy (peer-to-peer copies are a kind of their own), memset, synchronisation,
// runtime and driver API calls. CUPTI's timestamps are replaced by CLOCK_MONOTONIC
// (cuptiActivityRegisterTimestampCallback) so they share the host ranges' clock. A callback on API entry
// records which OS thread made each call (I lines), so kernels map back to the op range that launched them.
// Completed buffers go to a queue drained by a writer thread; CUPTI's own worker delivers them (flush period
// 100 ms, forced flush at stop).
//
// This file is standalone on purpose (no libampforge): it is loaded into arbitrary CUDA programs.
#include <cupti.h>
#include <cxxabi.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#define AF_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr size_t kBufferBytes = 8u << 20;
constexpr size_t kIdsBeforeWake = 4096;  // pending I lines that wake the writer without a completed buffer
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,  CUPTI_ACTIVITY_KIND_MEMCPY2,
    CUPTI_ACTIVITY_KIND_MEMSET,            CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER,
};

struct State {
  std::mutex mu;  // guards every field below
  std::condition_variable cv;
  FILE* out = nullptr;
  bool running = false, stopping = false;
  pid_t pid = 0;  // the process that started collecting (a forked child inherits the state, not the threads)
  size_t untimed = 0;  // device records without usable timestamps, skipped (writer thread; read after join)
  std::deque<std::pair<uint8_t*, size_t>> completed;   // (buffer, valid bytes)
  std::vector<std::pair<uint32_t, int64_t>> corr_tid;  // (correlation id, OS thread id)
  std::thread writer;
  CUpti_SubscriberHandle subscriber = nullptr;
};
State& state() {
  static State* s = new State;  // never destroyed: CUPTI threads may call in during exit
  return *s;
}

uint64_t CUPTIAPI monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool ok(CUptiResult rc, const char* what) {
  if (rc == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(rc, &msg);
  std::fprintf(stderr, "ampforge-cupti: %s failed: %s\n", what, msg != nullptr ? msg : "unknown error");
  return false;
}

std::string clean(const char* s) {
  std::string out = s != nullptr ? s : "?";
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return out;
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = clean(status == 0 && d != nullptr ? d : name);
  std::free(d);
  return out;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "unknown";
  }
}

const char* sync_type(CUpti_ActivitySynchronizationType t) {
  switch (t) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return "cudaEventSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return "cudaStreamWaitEvent";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return "cudaStreamSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return "cudaDeviceSynchronize";
    default: return "synchronization";
  }
}

using ull = unsigned long long;

// A device record CUPTI could not time: start 0 (no device memory for the timestamps, or still incomplete
// at the forced flush of an early stop) or an end before the start.
bool untimed(uint64_t start, uint64_t end) { return start == 0 || end < start; }

// Returns the number of device records skipped because they carry no usable timestamps.
size_t write_records(FILE* f, uint8_t* buffer, size_t valid) {
  size_t skipped = 0;
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        if (untimed(k->start, k->end)) {
          ++skipped;
          break;
        }
        std::fprintf(f, "K\t%u\t%u\t%llu\t%llu\t%u\t%s\n", k->deviceId, k->streamId, static_cast<ull>(k->start),
                     static_cast<ull>(k->end), k->correlationId, demangle(k->name).c_str());
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        if (untimed(m->start, m->end)) {
          ++skipped;
          break;
        }
        std::fprintf(f, "M\t%u\t%u\t%llu\t%llu\t%u\t%llu\t%s\n", m->deviceId, m->streamId, static_cast<ull>(m->start),
                     static_cast<ull>(m->end), m->correlationId, static_cast<ull>(m->bytes), copy_kind(m->copyKind));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY2: {  // between two devices (CUPTI_ACTIVITY_KIND_MEMCPY has none of these)
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(rec);
        if (untimed(m->start, m->end)) {
          ++skipped;
          break;
        }
        std::fprintf(f, "M\t%u\t%u\t%llu\t%llu\t%u\t%llu\tPtoP\n", m->deviceId, m->streamId,
                     static_cast<ull>(m->start), static_cast<ull>(m->end), m->correlationId,
                     static_cast<ull>(m->bytes));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        if (untimed(m->start, m->end)) {
          ++skipped;
          break;
        }
        std::fprintf(f, "S\t%u\t%u\t%llu\t%llu\t%u\t%llu\n", m->deviceId, m->streamId, static_cast<ull>(m->start),
                     static_cast<ull>(m->end), m->correlationId, static_cast<ull>(m->bytes));
        break;
      }
      case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        const auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(rec);
        std::fprintf(f, "Y\t0\t%llu\t%llu\t%u\t%s\n", static_cast<ull>(s->start), static_cast<ull>(s->end),
                     s->correlationId, sync_type(s->type));
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        const char* name = nullptr;
        cuptiGetCallbackName(rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                      : CUPTI_CB_DOMAIN_DRIVER_API,
                             a->cbid, &name);
        std::fprintf(f, "A\t%u\t%llu\t%llu\t%u\t%s\n", a->threadId, static_cast<ull>(a->start),
                     static_cast<ull>(a->end), a->correlationId, clean(name).c_str());
        break;
      }
      default: break;
    }
  }
  return skipped;
}

void writer_loop() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    s.cv.wait(lock, [&] { return s.stopping || !s.completed.empty() || s.corr_tid.size() > kIdsBeforeWake; });
    auto buffers = std::move(s.completed);
    s.completed.clear();
    auto ids = std::move(s.corr_tid);
    s.corr_tid.clear();
    const bool done = s.stopping;
    FILE* f = s.out;
    lock.unlock();
    // I lines first: the reader resolves thread ids after reading everything, so order does not matter.
    for (const auto& [corr, tid] : ids) std::fprintf(f, "I\t%u\t%lld\n", corr, static_cast<long long>(tid));
    size_t skipped = 0;
    for (auto& [buf, valid] : buffers) {
      skipped += write_records(f, buf, valid);
      std::free(buf);
    }
    lock.lock();
    s.untimed += skipped;
    if (done && s.completed.empty() && s.corr_tid.empty()) return;
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.completed.emplace_back(buffer, valid);
  }
  s.cv.notify_one();
}

void CUPTIAPI api_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER) return;
  thread_local const int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  State& s = state();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.corr_tid.emplace_back(info->correlationId, tid);
    wake = s.corr_tid.size() == kIdsBeforeWake + 1;  // else only a completed buffer would drain them
  }
  if (wake) s.cv.notify_one();
}

}  // namespace

// Starts collecting into `path` (truncated). 0 on success (also when already running), -1 on failure.
AF_EXPORT int ampforge_cupti_start(const char* path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.running) return 0;
  s.out = std::fopen(path, "w");
  if (s.out == nullptr) {
    std::fprintf(stderr, "ampforge-cupti: cannot write %s: %s\n", path, std::strerror(errno));
    return -1;
  }
  std::fprintf(s.out, "ampforge-activity 1\n");
  if (!ok(cuptiActivityRegisterTimestampCallback(monotonic_ns), "cuptiActivityRegisterTimestampCallback"))
    std::fprintf(s.out, "N\tdevice timestamps are on CUPTI's clock, not the host ranges' clock\n");
  if (!ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks")) {
    std::fclose(s.out);
    s.out = nullptr;
    return -1;
  }
  if (ok(cuptiSubscribe(&s.subscriber, api_callback, nullptr), "cuptiSubscribe (another CUPTI tool attached?)")) {
    ok(cuptiEnableDomain(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API), "cuptiEnableDomain(runtime)");
    ok(cuptiEnableDomain(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API), "cuptiEnableDomain(driver)");
  } else {
    s.subscriber = nullptr;
  }
  for (CUpti_ActivityKind k : kKinds) ok(cuptiActivityEnable(k), "cuptiActivityEnable");
  ok(cuptiActivityFlushPeriod(100), "cuptiActivityFlushPeriod");
  std::fprintf(s.out, "B\t%llu\n", static_cast<ull>(monotonic_ns()));
  s.stopping = false;
  s.untimed = 0;
  s.pid = ::getpid();
  s.running = true;
  s.writer = std::thread(writer_loop);
  return 0;
}

// Flushes every buffer, stops CUPTI and closes the file. 0 on success (also when not running).
AF_EXPORT int ampforge_cupti_stop() {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.running) return 0;
    // A forked child that exits normally runs the parent's atexit handler: it has no writer thread to join
    // and shares the parent's file (its copy of the stdio buffer would be written twice). Leave both alone.
    if (s.pid != ::getpid()) return 0;
  }
  const uint64_t end = monotonic_ns();
  ok(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
  if (s.subscriber != nullptr) cuptiUnsubscribe(s.subscriber);
  ok(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping = true;
  }
  s.cv.notify_one();
  s.writer.join();
  std::lock_guard<std::mutex> lock(s.mu);
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) != CUPTI_SUCCESS) dropped = 0;
  dropped += s.untimed;  // records without timestamps are as good as dropped
  if (dropped > 0) std::fprintf(s.out, "D\t%zu\n", dropped);
  std::fprintf(s.out, "E\t%llu\n", static_cast<ull>(end));
  std::fclose(s.out);
  s.out = nullptr;
  s.subscriber = nullptr;
  s.running = false;
  return 0;
}

// The documented CUPTI injection entry point (CUDA_INJECTION64_PATH). Returns 1: the process continues
// even when collection could not start.
AF_EXPORT int InitializeInjection(void) {
  const char* path = std::getenv("AMPFORGE_CUPTI_OUTPUT");
  if (path == nullptr || *path == '\0') {
    std::fprintf(stderr, "ampforge-cupti: AMPFORGE_CUPTI_OUTPUT is not set; nothing is collected\n");
    return 1;
  }
  // The variables reach every descendant of the profiled program (the ranks `ampforge launch` or mpirun
  // starts, a Python child): only the first CUDA process gets the file, which the others would truncate
  // and interleave their lines into.
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "ampforge-cupti: %s: %s; this process (%d) is not collected\n", path,
                 errno == EEXIST ? "another process of the profiled program writes it" : std::strerror(errno),
                 static_cast<int>(::getpid()));
    return 1;
  }
  ::close(fd);
  if (ampforge_cupti_start(path) == 0) std::atexit([] { ampforge_cupti_stop(); });
  return 1;
}
