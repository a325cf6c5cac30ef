// Profiler ranges and sessions.
//
//   void conv_forward(...) { AF_PROFILE_FUNCTION(); ... }            // a range named after the function
//   { AF_PROFILE_RANGE("pack weights"); ... }                        // a range for a block
//   profiler::Session s; s.start(); ...train...; ProfileData d = s.stop();
//
// Contract:
//   - When no session is recording, a range costs one relaxed atomic load and a branch (nothing else).
//   - Range names are not copied while recording: pass string literals or other strings that live until
//     the session stops (op names from core's op_name() do).
//   - While a session is active a DispatchObserver is installed, so every op dispatch is a range of kind
//     Op named after the op. Ranges are recorded per thread (no lock shared between threads).
//   - With the CUDA toolkit's NVTX3 headers available at build time, every recorded range is also an NVTX
//     push/pop, so Nsight Systems shows the same ranges (header-only NVTX3: no link dependency).
//   - With a GPU and the CUPTI injection library built, a session also collects device activity in-process
//     (unless the process already runs under `ampforge profile`, which collects it from outside).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "ampforge/core/device.h"
#include "ampforge/profiler/profile_data.h"

namespace ampforge::profiler {

namespace detail {
extern std::atomic<bool> g_recording;
void range_begin(const char* name, RangeKind kind);
void range_end();
}  // namespace detail

// True while a session records (between start() and pause()/stop()).
inline bool recording() { return detail::g_recording.load(std::memory_order_relaxed); }

class Range {
 public:
  explicit Range(const char* name, RangeKind kind = RangeKind::User) {
    if (recording()) [[unlikely]] {
      detail::range_begin(name, kind);
      open_ = true;
    }
  }
  ~Range() {
    if (open_) [[unlikely]] detail::range_end();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool open_ = false;
};

// Records a counter sample (shown as a counter track in the trace) while recording.
void counter(const char* name, double value);
// Samples the current allocated / reserved bytes of the recording session's memory device
// (SessionOptions::memory_device: its caching allocator, memory::caching_allocator_for) into the counters
// "allocated" / "reserved"; for the CPU without a caching allocator, core's host counter as "allocated".
void sample_memory();
// Names the calling thread in reports and traces ("main", "loader 0", ...).
void set_thread_name(const std::string& name);
// OS thread id of the calling thread (the tid used in ranges).
int64_t current_tid();

struct SessionOptions {
  // Collect device activity in-process through the CUPTI injection library when a GPU is present.
  bool device = true;
  // Whose memory the session samples (sample_memory(), the start and end of each window) and summarises
  // at stop(): the CPU's allocator, or a CUDA device's caching allocator (Device(DeviceType::CUDA, i)) for
  // a run that trains there.
  Device memory_device = kCPU;
};

// One session at a time per process. start() opens a profiled window, pause() closes it (ranges stop
// being recorded), start() again opens another; stop() ends the session and returns everything.
// If AMPFORGE_PROFILE_HOST_OUTPUT is set (by `ampforge profile`), stop() also writes the data there.
class Session {
 public:
  explicit Session(SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start();
  void pause();
  bool active() const { return active_; }
  ProfileData stop();

 private:
  struct DeviceCollector;
  SessionOptions options_;
  bool active_ = false, stopped_ = false;
  int64_t window_begin_ = 0;
  ProfileData data_;
  std::unique_ptr<DeviceCollector> device_;
};

}  // namespace ampforge::profiler

#define AF_PROFILE_CONCAT2(a, b) a##b
#define AF_PROFILE_CONCAT(a, b) AF_PROFILE_CONCAT2(a, b)
// A range for the rest of the enclosing scope. `name` must outlive the session (a literal).
#define AF_PROFILE_RANGE(name) ::ampforge::profiler::Range AF_PROFILE_CONCAT(af_prof_range_, __LINE__)(name)
#define AF_PROFILE_RANGE_KIND(name, kind) \
  ::ampforge::profiler::Range AF_PROFILE_CONCAT(af_prof_range_, __LINE__)(name, ::ampforge::profiler::RangeKind::kind)
// A range named after the enclosing function.
#define AF_PROFILE_FUNCTION() ::ampforge::profiler::Range af_prof_function_range_(__func__)
