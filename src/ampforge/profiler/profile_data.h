// The profiler's data model: what a session collects, and all the report and the trace are computed from.
// Both are pure functions of ProfileData, so tests feed synthetic streams with known answers.
//
// Time: every timestamp is nanoseconds on one monotonic clock (steady_clock = CLOCK_MONOTONIC on Linux).
// The CUPTI injection library registers the same clock as CUPTI's timestamp source, so host ranges and
// device activities share one time line. Intervals are half-open [begin, end).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ampforge::profiler {

// What a host range stands for. The report treats the kinds differently (docs/PROFILER.md).
enum class RangeKind : uint8_t {
  User,      // AF_PROFILE_RANGE / AF_PROFILE_FUNCTION
  Op,        // one op dispatch (name = core's op_name)
  Step,      // one training step (data wait + forward + backward + optimizer + bookkeeping)
  Phase,     // forward | backward | optimizer | eval
  DataWait,  // the consumer blocked on the data loader
  Sync,      // the host waiting for the device (or for a value from it: loss.item())
  CudaApi,   // a CUDA runtime/driver API call (from CUPTI), carries the correlation id of what it launched
};
const char* range_kind_name(RangeKind k);
bool range_kind_from_name(const std::string& s, RangeKind* out);

struct HostRange {
  int64_t tid = 0;  // OS thread id (gettid)
  std::string name;
  RangeKind kind = RangeKind::User;
  int64_t begin_ns = 0, end_ns = 0;
  uint32_t correlation_id = 0;  // CudaApi ranges: the id CUPTI gives the API call and what it launched
  int64_t duration_ns() const { return end_ns - begin_ns; }
};

enum class ActivityKind : uint8_t { Kernel, Memcpy, Memset };
const char* activity_kind_name(ActivityKind k);

// Direction of a copy, as CUPTI names them (array copies are folded into the device side).
enum class CopyKind : uint8_t { Unknown, HtoD, DtoH, DtoD, HtoH, PtoP };
const char* copy_kind_name(CopyKind k);

struct DeviceActivity {
  ActivityKind kind = ActivityKind::Kernel;
  CopyKind copy = CopyKind::Unknown;  // Memcpy only
  int32_t device = 0;
  int64_t stream = 0;
  int64_t begin_ns = 0, end_ns = 0;
  int64_t bytes = 0;  // Memcpy / Memset
  uint32_t correlation_id = 0;
  std::string name;  // Kernel: the kernel's (demangled) name
  int64_t duration_ns() const { return end_ns - begin_ns; }
};

// A sampled value for the trace's counter tracks (memory).
struct CounterSample {
  std::string name;  // e.g. "allocated", "reserved"
  int64_t ts_ns = 0;
  double value = 0;
};

// Peak memory from the allocator (memory/ caching allocator stats when installed, else core's host counter).
struct MemorySummary {
  bool valid = false;
  std::string source;            // "caching allocator" | "caching allocator, cuda:N" | "host allocator"
  int64_t peak_allocated = -1;   // bytes
  int64_t peak_reserved = -1;    // bytes; -1: not known (the plain host allocator reserves nothing)
  double fragmentation = -1;     // at the reserved peak, in [0, 1]; -1: not known
};

struct ProfileData {
  std::vector<HostRange> ranges;
  std::vector<DeviceActivity> activities;
  std::vector<CounterSample> counters;
  // The profiled wall-clock intervals (a session may pause between --profile-steps). Sorted, disjoint.
  std::vector<std::pair<int64_t, int64_t>> windows;
  std::map<int64_t, std::string> thread_names;  // tid -> name ("main", "worker 1", ...)
  MemorySummary memory;
  bool device_observed = false;  // CUPTI ran; false: a CPU-only run (device sections are omitted)
  std::string device_note;       // why there is no device activity, when known

  int64_t wall_ns() const;
  // Appends another collection (e.g. the host ranges of a child process and the CUPTI activity file).
  void merge(ProfileData&& other);
};

}  // namespace ampforge::profiler
