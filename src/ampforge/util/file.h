// Writing whole files so that a reader (or a crash) never sees half of one.
#pragma once

#include <string>
#include <string_view>

namespace ampforge {

// Writes `bytes` to `<path>.tmp.<pid>.<tid>.<n>` and renames it over `path`; on any failure the temporary
// file is removed, `path` is left as it was, and Io is thrown naming `what` ("ONNX file", "Markdown file"),
// the path and the system's reason: "cannot write ...", "writing the ... failed: No space left on device
// (... is unchanged; the disk is full)" or "cannot rename ...". No fsync: callers that must survive a power
// loss (checkpoints, core/safetensors.h) do their own.
void write_file_atomically(const std::string& path, std::string_view bytes, const char* what);

}  // namespace ampforge
