// The activity file: a line-oriented, tab-separated text format shared by the CUPTI injection library
// (device activity, API calls), sessions (host ranges, written for `ampforge profile` to merge) and
// tests. Text, so a truncated file (a crashed child) still yields everything before the damage.
//
//   ampforge-activity 1                      first line
//   B ts | E ts                              CUPTI collection began / ended (the window when no W lines)
//   W begin end                              a profiled window
//   T tid name                               thread name
//   R tid kind begin end corr name           host range (kind: range_kind_name)
//   A tid begin end corr name                CUDA API call (a CudaApi range)
//   I corr tid                               the OS thread that made API call `corr` (overrides A/Y tids)
//   Y tid begin end corr type                host-side synchronisation (a Sync range)
//   K device stream begin end corr name      kernel
//   M device stream begin end corr bytes kind  memcpy (kind: copy_kind_name)
//   S device stream begin end corr bytes     memset
//   C ts value name                          counter sample
//   P peak_allocated peak_reserved fragmentation source   memory summary
//   N text                                   a note (why there is no device activity)
//   D count                                  activity records CUPTI dropped
// Names are the last field and may contain spaces (tabs and newlines are replaced when written).
#pragma once

#include <string>

#include "ampforge/profiler/profile_data.h"

namespace ampforge::profiler {

// Throws Error(Io) when the file cannot be written.
void write_activity_file(const ProfileData& data, const std::string& path);
// Throws Error(Io) when the file cannot be opened and InvalidArgument for a wrong first line; a malformed
// line is skipped (counted in the returned data's device_note).
ProfileData read_activity_file(const std::string& path);

}  // namespace ampforge::profiler
