// Fuzzes the safetensors loader (checkpoints, weights, goldens: files users download). Property: a file
// that loads saves and loads back to the same names, order, dtypes, shapes, bytes and metadata.
#include <cstring>

#include "ampforge/core/safetensors.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile in("safetensors");
  SafetensorsFile f;
  try {
    f = load_safetensors(in.write(data, size));
  } catch (const Error&) {
    return 0;
  }
  const std::string again = fuzz::scratch_dir() + "/resaved.safetensors";
  save_safetensors(again, f.tensors, f.metadata);
  const SafetensorsFile g = load_safetensors(again);
  FUZZ_CHECK(g.tensors.size() == f.tensors.size());
  FUZZ_CHECK(g.metadata == f.metadata);
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const Tensor &a = f.tensors[i].second, &b = g.tensors[i].second;
    FUZZ_CHECK(f.tensors[i].first == g.tensors[i].first, "tensor %zu renamed", i);
    FUZZ_CHECK(a.dtype() == b.dtype() && a.shape() == b.shape(), "tensor %s changed", f.tensors[i].first.c_str());
    FUZZ_CHECK(a.is_contiguous() && b.is_contiguous());
    FUZZ_CHECK(a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0),
               "tensor %s: bytes differ", f.tensors[i].first.c_str());
  }
  return 0;
}
