// Chrome trace-event JSON (the "JSON Array/Object Format" read by Perfetto and chrome://tracing):
//   pid 1 "host": one track per thread, a complete ("X") event per range, nested as recorded;
//   pid 100 + d "device d": one track per stream, an "X" event per kernel / memcpy / memset;
//   flow arrows ("s" at the launching API call, "f" at the activity, id = correlation id);
//   counter ("C") tracks for memory samples.
// Timestamps are microseconds since the first profiled window began.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "ampforge/profiler/profile_data.h"

namespace ampforge::profiler {

inline constexpr int kTraceHostPid = 1;
inline constexpr int kTraceDevicePidBase = 100;

nlohmann::json chrome_trace(const ProfileData& data);
// Throws Error(Io) when the file cannot be written.
void write_chrome_trace(const ProfileData& data, const std::string& path);

}  // namespace ampforge::profiler
