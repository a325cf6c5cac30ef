// Fuzzes the IDX reader (MNIST-format data sets, plain or gzip). Property: what loads is self-consistent
// (the shape's product is the number of bytes read).
#include "ampforge/data/idx.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile in("idx");
  try {
    const data::IdxArray a = data::read_idx_u8(in.write(data, size));
    uint64_t n = 1;
    for (int64_t d : a.shape) {
      FUZZ_CHECK(d >= 0);
      n *= static_cast<uint64_t>(d);
    }
    FUZZ_CHECK(n == a.data.size(), "shape product %llu, %zu bytes", static_cast<unsigned long long>(n), a.data.size());
  } catch (const Error&) {
  }
  return 0;
}
