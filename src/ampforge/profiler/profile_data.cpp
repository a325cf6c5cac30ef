#include "ampforge/profiler/profile_data.h"

#include <algorithm>
#include <iterator>

namespace ampforge::profiler {

namespace {
constexpr const char* kRangeKindNames[] = {"user", "op", "step", "phase", "data", "sync", "cuda_api"};
static_assert(std::size(kRangeKindNames) == static_cast<size_t>(RangeKind::CudaApi) + 1);
constexpr const char* kActivityKindNames[] = {"kernel", "memcpy", "memset"};
static_assert(std::size(kActivityKindNames) == static_cast<size_t>(ActivityKind::Memset) + 1);
constexpr const char* kCopyKindNames[] = {"unknown", "HtoD", "DtoH", "DtoD", "HtoH", "PtoP"};
static_assert(std::size(kCopyKindNames) == static_cast<size_t>(CopyKind::PtoP) + 1);
}  // namespace

const char* range_kind_name(RangeKind k) { return kRangeKindNames[static_cast<int>(k)]; }
bool range_kind_from_name(const std::string& s, RangeKind* out) {
  for (size_t i = 0; i < std::size(kRangeKindNames); ++i)
    if (s == kRangeKindNames[i]) {
      *out = static_cast<RangeKind>(i);
      return true;
    }
  return false;
}
const char* activity_kind_name(ActivityKind k) { return kActivityKindNames[static_cast<int>(k)]; }
const char* copy_kind_name(CopyKind k) { return kCopyKindNames[static_cast<int>(k)]; }

int64_t ProfileData::wall_ns() const {
  int64_t w = 0;
  for (const auto& [b, e] : windows) w += e - b;
  return w;
}

void ProfileData::merge(ProfileData&& o) {
  std::move(o.ranges.begin(), o.ranges.end(), std::back_inserter(ranges));
  std::move(o.activities.begin(), o.activities.end(), std::back_inserter(activities));
  std::move(o.counters.begin(), o.counters.end(), std::back_inserter(counters));
  if (windows.empty()) windows = std::move(o.windows);
  for (auto& [tid, name] : o.thread_names) thread_names.emplace(tid, std::move(name));
  if (!memory.valid) memory = o.memory;
  device_observed = device_observed || o.device_observed;
  if (device_note.empty()) device_note = std::move(o.device_note);
}

}  // namespace ampforge::profiler
