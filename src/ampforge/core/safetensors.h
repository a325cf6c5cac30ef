// safetensors: the project's tensor file format (checkpoints, golden files of the parity harness).
//
// Layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N bytes
// of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the
// data buffer; offsets are relative to the start of the data buffer, tensors are row-major, little-endian.
//
// Contract:
//   - save is atomic: it writes `<path>.tmp.<pid>`, fsyncs it, renames it over `path` and fsyncs the
//     directory. On any failure the temporary file is removed and `path` keeps its old content (or stays
//     absent); the error is thrown after the cleanup.
//   - save writes tensors in the order given, each contiguously (non-contiguous views are gathered);
//     tensors on a non-CPU device are rejected (copy them to the CPU first).
//   - load validates the whole file before returning and throws ampforge::Error of kind Io naming the
//     file and what is wrong (missing file, bad header length, bad JSON, unknown dtype, offsets out of
//     range / overlapping / not matching dtype x shape, truncated data, bool bytes other than 0/1).
//   - load returns the tensors in the order of their data offsets (= the order they were saved in).
//   - dtype names: F32 F16 BF16 F64 I32 I64 U8 BOOL (all of ampforge's dtypes).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor called `name`; throws InvalidArgument naming the file's tensors when absent.
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
};

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

SafetensorsFile load_safetensors(const std::string& path);

// The format's dtype names ("F32", "BOOL", ...) and back; the parser throws Io for an unknown name.
const char* safetensors_dtype_name(DType d);

// Largest header accepted by load (a guard against a corrupt length field allocating gigabytes).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull * 1000 * 1000;

}  // namespace ampforge
