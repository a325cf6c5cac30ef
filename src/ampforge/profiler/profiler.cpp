// Range recording: one buffer per thread (its own mutex, so recording never contends with other threads;
// only collection at stop() takes the locks), a global registry of buffers, and the session that turns the
// buffers into ProfileData. NVTX3 (header-only) mirrors every recorded range when the toolkit is present.
#include "ampforge/profiler/profiler.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "ampforge/core/runtime.h"
#include "ampforge/core/allocator.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/memory/global.h"
#include "ampforge/profiler/activity_file.h"
#include "ampforge/profiler/device.h"
#include "ampforge/util/error.h"
#include "ampforge/util/log.h"
#include "ampforge/util/timer.h"

#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define AF_PROFILER_NVTX 1
#endif
#endif

namespace ampforge::profiler {

namespace detail {
std::atomic<bool> g_recording{false};
}  // namespace detail

namespace {

struct Record {
  const char* name;
  RangeKind kind;
  int64_t begin_ns, end_ns;
};
struct Open {
  const char* name;
  RangeKind kind;
  int64_t begin_ns;
};

struct ThreadBuffer {
  int64_t tid = 0;
  std::mutex mu;                 // guards records and name (taken by the owner per record, by stop() once)
  std::vector<Record> records;
  std::string name;
  std::vector<Open> open;        // owner thread only
  std::atomic<bool> alive{true};
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  std::vector<CounterSample> counters;  // guarded by mu (rare: a few per step)
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may record during static destruction
  return *r;
}

struct ThreadSlot {
  std::shared_ptr<ThreadBuffer> buf;
  ~ThreadSlot() {
    if (buf) buf->alive.store(false);
  }
};

ThreadBuffer& this_thread_buffer() {
  thread_local ThreadSlot slot;
  if (!slot.buf) [[unlikely]] {
    slot.buf = std::make_shared<ThreadBuffer>();
    slot.buf->tid = current_tid();
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.buffers.push_back(slot.buf);
  }
  return *slot.buf;
}

void* observer_begin(OpId op, const KernelArgs&) {
  if (!recording()) return nullptr;
  detail::range_begin(op_name(op), RangeKind::Op);
  return reinterpret_cast<void*>(1);
}
void observer_end(void* token) {
  if (token != nullptr) detail::range_end();
}
const DispatchObserver kObserver{observer_begin, observer_end};

std::atomic<bool> g_session_exists{false};

}  // namespace

namespace detail {

void range_begin(const char* name, RangeKind kind) {
  ThreadBuffer& b = this_thread_buffer();
  b.open.push_back({name, kind, now_ns()});
#ifdef AF_PROFILER_NVTX
  nvtxRangePushA(name);
#endif
}

void range_end() {
  const int64_t end = now_ns();
  ThreadBuffer& b = this_thread_buffer();
  if (b.open.empty()) return;  // opened by a previous session's thread state that was reset
  const Open o = b.open.back();
  b.open.pop_back();
#ifdef AF_PROFILER_NVTX
  nvtxRangePop();
#endif
  std::lock_guard<std::mutex> lock(b.mu);
  b.records.push_back({o.name, o.kind, o.begin_ns, end});
}

}  // namespace detail

int64_t current_tid() {
  thread_local const int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  return tid;
}

void counter(const char* name, double value) {
  if (!recording()) return;
  const int64_t ts = now_ns();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.counters.push_back({name, ts, value});
}

namespace {
// The memory device of the session (SessionOptions::memory_device), packed as type * 65536 + index.
std::atomic<int32_t> g_memory_device{0};
Device memory_device() {
  const int32_t v = g_memory_device.load(std::memory_order_relaxed);
  return Device(static_cast<DeviceType>(v >> 16), v & 0xffff);
}
}  // namespace

void sample_memory() {
  if (!recording()) return;
  const Device dev = memory_device();
  if (auto s = memory::allocator_stats(dev)) {
    counter("allocated", static_cast<double>(s->allocated.current));
    counter("reserved", static_cast<double>(s->reserved.current));
  } else if (dev.is_cpu()) {
    counter("allocated", static_cast<double>(host_allocator_bytes_in_use()));
  }
}

void set_thread_name(const std::string& name) {
  ThreadBuffer& b = this_thread_buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  b.name = name;
}

// ---- device activity collected in-process through the injection library (dlopen, never linked)
struct Session::DeviceCollector {
  void* lib = nullptr;
  int (*stop)() = nullptr;
  std::string path;
};

Session::Session(SessionOptions options) : options_(options) {
  bool expected = false;
  AF_CHECK(g_session_exists.compare_exchange_strong(expected, true),
           "a profiler session is already active in this process (one at a time)");
  g_memory_device.store(static_cast<int32_t>(options_.memory_device.type) * 65536 + options_.memory_device.index,
                        std::memory_order_relaxed);
}

Session::~Session() {
  if (!stopped_) {
    try {
      stop();
    } catch (...) {  // destructors never throw; the data is dropped
    }
  }
  g_memory_device.store(0, std::memory_order_relaxed);
  g_session_exists.store(false);
}

void Session::start() {
  AF_CHECK(!stopped_, "profiler session: start() after stop()");
  if (active_) return;
  if (data_.windows.empty()) {
    // First window: clear what earlier sessions left in the buffers, install the op observer, start CUPTI.
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.counters.clear();
    std::erase_if(r.buffers, [](const std::shared_ptr<ThreadBuffer>& b) { return !b->alive.load(); });
    for (auto& b : r.buffers) {
      std::lock_guard<std::mutex> bl(b->mu);
      b->records.clear();
    }
  }
  if (data_.windows.empty()) {
    set_thread_name("main");
    set_dispatch_observer(&kObserver);
    if (options_.device) {
      const CudaPresence cuda = probe_cuda();
      const char* outer = std::getenv("CUDA_INJECTION64_PATH");
      const std::string lib = cupti_injection_library();
      if (!cuda.present) {
        data_.device_note = cuda.reason;
      } else if (outer != nullptr && *outer != '\0') {
        data_.device_note = "device activity is collected by the injection library outside this process";
      } else if (lib.empty()) {
        data_.device_note = "the CUPTI injection library was not built (no CUPTI headers at build time)";
      } else if (void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        auto start_fn = reinterpret_cast<int (*)(const char*)>(dlsym(h, "ampforge_cupti_start"));
        auto stop_fn = reinterpret_cast<int (*)()>(dlsym(h, "ampforge_cupti_stop"));
        auto dc = std::make_unique<DeviceCollector>();
        dc->path = fmt::format("/tmp/ampforge-cupti-{}-{}.txt", ::getpid(), now_ns());
        if (start_fn != nullptr && stop_fn != nullptr && start_fn(dc->path.c_str()) == 0) {
          dc->lib = h;
          dc->stop = stop_fn;
          device_ = std::move(dc);
        } else {
          data_.device_note = "CUPTI could not be started in this process (see the log above)";
        }
      } else {
        data_.device_note = fmt::format("could not load {}: {}", lib, dlerror());
      }
    }
  }
  window_begin_ = now_ns();
  active_ = true;
  detail::g_recording.store(true, std::memory_order_release);
  sample_memory();
}

void Session::pause() {
  if (!active_) return;
  sample_memory();
  detail::g_recording.store(false, std::memory_order_release);
  data_.windows.emplace_back(window_begin_, now_ns());
  active_ = false;
}

ProfileData Session::stop() {
  AF_CHECK(!stopped_, "profiler session: stop() called twice");
  pause();
  stopped_ = true;
  set_dispatch_observer(nullptr);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    data_.counters = std::move(r.counters);
    r.counters.clear();
    for (auto& b : r.buffers) {
      std::lock_guard<std::mutex> bl(b->mu);
      if (!b->name.empty()) data_.thread_names[b->tid] = b->name;
      for (const Record& rec : b->records) data_.ranges.push_back({b->tid, rec.name, rec.kind, rec.begin_ns, rec.end_ns, 0});
      b->records.clear();
    }
  }
  const Device mem = options_.memory_device;
  if (auto s = memory::allocator_stats(mem)) {
    data_.memory = {true, mem.is_cpu() ? std::string("caching allocator") : "caching allocator, " + mem.str(),
                    s->allocated.peak, s->reserved.peak, s->fragmentation_at_peak};
  } else if (mem.is_cpu()) {
    data_.memory = {true, "host allocator", host_allocator_peak_bytes(), -1, -1};
  } else {
    data_.memory = {};  // no caching allocator on that device (not available): nothing to report
  }
  if (device_) {
    // CUPTI's last flush collects the records of finished work only: the profiled device's kernels still queued
    // would be counted as dropped instead of appearing in the profile.
    if (mem.is_cuda()) {
      try {
        runtime::synchronize(mem);
      } catch (const Error& e) {
        log(LogLevel::Warn, "profiler: waiting for {} before the last CUPTI flush failed: {}", mem.str(), e.what());
      }
    }
    device_->stop();
    try {
      ProfileData dev = read_activity_file(device_->path);
      dev.windows.clear();  // the session's windows are the profiled ones
      data_.merge(std::move(dev));
      data_.device_observed = true;
    } catch (const Error& e) {
      log(LogLevel::Warn, "profiler: could not read the CUPTI activity file: {}", e.what());
    }
    std::remove(device_->path.c_str());
    device_.reset();  // the library stays loaded: CUPTI may still hold callbacks into it
  }
  if (const char* out = std::getenv(kHostOutputEnv); out != nullptr && *out != '\0') {
    try {
      write_activity_file(data_, out);
    } catch (const Error& e) {
      log(LogLevel::Warn, "profiler: could not write {}: {}", out, e.what());
    }
  }
  return std::move(data_);
}

}  // namespace ampforge::profiler
