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

// Throws a clear error unless `path` is a file that can be opened for reading: Io "cannot open the <what> '<path>':
// <reason>" when it is missing or unreadable, InvalidArgument "'<path>' is a directory, not a <what>" for a
// directory (which a std::ifstream opens without complaint, failing only at the first read).
void check_readable_file(const std::string& path, const char* what);

// Bytes read from a file, fit for an error message: at most `max` characters, control and non-ASCII bytes written
// as \xNN (a binary file's bytes never reach the terminal raw), "..." when cut.
std::string excerpt_for_message(std::string_view bytes, size_t max = 60);

}  // namespace ampforge
