// Fuzzes the parsers of command-line values: sizes (--budget 64MiB), step ranges (--profile-steps 3:10),
// devices (cuda:1) and dtypes (bf16). Property: a size that parses prints and parses back to itself.
#include "ampforge/core/device.h"
#include "ampforge/core/dtype.h"
#include "ampforge/memory/stats.h"
#include "ampforge/train/trainer.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  try {
    const uint64_t v = memory::parse_size(s, "--budget");
    FUZZ_CHECK(memory::parse_size(std::to_string(v)) == v);
  } catch (const Error&) {
  }
  try {
    const auto [first, last] = train::parse_profile_steps(s);
    // "A:B" with A < B, or "A:" (to the end: B = -1).
    FUZZ_CHECK(first >= 0 && (last == -1 || first < last), "steps %lld:%lld", static_cast<long long>(first),
               static_cast<long long>(last));
  } catch (const Error&) {
  }
  try {
    const Device d = Device::parse(s);
    FUZZ_CHECK(Device::parse(d.str()) == d);
  } catch (const Error&) {
  }
  try {
    (void)dtype_from_string(s);
  } catch (const Error&) {
  }
  return 0;
}
