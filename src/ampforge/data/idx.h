// IDX files (the MNIST / Fashion-MNIST format, http://yann.lecun.com/exdb/mnist/): big-endian magic
// 0x000008NN (unsigned bytes, NN = number of dims), then NN big-endian uint32 sizes, then the data.
// Read from plain or gzip-compressed files (zlib's gzread handles both). Every error names the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ampforge::data {

struct IdxArray {
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // row-major
};

// Throws Error(Io) for a missing/unreadable file, a wrong magic number, a dtype other than unsigned
// byte, absurd sizes or truncated data.
IdxArray read_idx_u8(const std::string& path);

}  // namespace ampforge::data
