// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11). Element i of a random tensor
// depends only on (seed, offset, i), never on thread count or device, so CPU and CUDA kernels produce
// the same stream. A Generator hands out disjoint counter ranges: each random op reserves
// ceil(numel / 4) counters (4 x 32-bit outputs per counter) and the generator's offset advances.
#pragma once

#include <array>
#include <cstdint>

namespace ampforge {

struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in counters (each counter yields four 32-bit values)
};

// One Philox-4x32-10 block: 4 random 32-bit words for (key = seed, counter = ctr).
inline std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t ctr) {
  uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0, p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

// philox4x32 for B consecutive counters ctr0, ctr0 + 1, ...: values[4 * b + k] is word k of block b, the same as
// philox4x32(seed, ctr0 + b)[k], so values are in the order of the elements they serve (element e of a kernel takes
// word e % 4 of block e / 4). Written as loops over the blocks so that the compiler runs them in vector lanes, the
// 32 x 32 -> 64-bit products included: 0.25 ns per value against 2.3 for the scalar form (ad-hoc program, -O3
// -march=native, AVX-512).
template <int B>
inline void philox4x32_blocks(uint64_t seed, uint64_t ctr0, uint32_t (&values)[4 * B]) {
  uint32_t c0[B], c1[B], c2[B], c3[B];
  for (int b = 0; b < B; ++b) {
    const uint64_t ctr = ctr0 + static_cast<uint64_t>(b);
    c0[b] = static_cast<uint32_t>(ctr);
    c1[b] = static_cast<uint32_t>(ctr >> 32);
    c2[b] = 0;
    c3[b] = 0;
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    for (int b = 0; b < B; ++b) {
      const uint64_t p0 = static_cast<uint64_t>(kM0) * c0[b], p1 = static_cast<uint64_t>(kM1) * c2[b];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[b] ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[b] ^ k1;
      c1[b] = static_cast<uint32_t>(p1);
      c3[b] = static_cast<uint32_t>(p0);
      c0[b] = n0;
      c2[b] = n2;
    }
    k0 += kW0;
    k1 += kW1;
  }
  for (int b = 0; b < B; ++b) {
    values[4 * b] = c0[b];
    values[4 * b + 1] = c1[b];
    values[4 * b + 2] = c2[b];
    values[4 * b + 3] = c3[b];
  }
}

// Uniform float in [0, 1) from the top 24 bits.
inline float uint_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) { state_.seed = seed; }
  void manual_seed(uint64_t seed) { state_ = {seed, 0}; }
  // Reserves counters for `numel` values and returns the state the kernel must start from.
  PhiloxState reserve(int64_t numel) {
    PhiloxState s = state_;
    state_.offset += static_cast<uint64_t>((numel + 3) / 4);
    return s;
  }
  PhiloxState state() const { return state_; }
  void set_state(PhiloxState s) { state_ = s; }

 private:
  PhiloxState state_;
};

// The process-wide default generator (seeded with manual_seed()).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace ampforge
