#include "ampforge/memory/synthetic.h"

#include <algorithm>
#include <cmath>

#include "ampforge/util/error.h"

namespace ampforge::memory {

namespace {

// splitmix64: tiny, deterministic, good enough to pick sizes and orders.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_;
};

class Builder {
 public:
  uint64_t alloc(uint64_t bytes, uint64_t stream = 0) {
    const uint64_t id = next_++;
    t.events.push_back({TraceEvent::Alloc, id, std::max<uint64_t>(bytes, 1), stream, 0});
    return id;
  }
  void free(uint64_t id) { t.events.push_back({TraceEvent::Free, id, 0, 0, 0}); }
  void step() { t.events.push_back({TraceEvent::Step, 0, 0, 0, 0}); }
  Trace t;

 private:
  uint64_t next_ = 1;
};

uint64_t scaled(double v, double scale) { return static_cast<uint64_t>(std::max(1.0, std::round(v * scale))); }

}  // namespace

Trace synthetic_varlen(const SyntheticOptions& o) {
  Rng rng(o.seed);
  Builder b;
  b.t.source = "synthetic:varlen";
  const uint64_t H = scaled(1024, std::sqrt(o.scale)), B = 4, heads = 16, V = scaled(32000, o.scale);
  const int L = std::max(2, static_cast<int>(std::lround(12 * o.scale)));
  const uint64_t fp32 = 4, fp16 = 2;
  // Parameters (fp32 master weights), one tensor per weight, allocated once.
  std::vector<uint64_t> param_sizes;
  for (int l = 0; l < L; ++l)
    for (uint64_t s : {3 * H * H, 3 * H, H * H, H, 4 * H * H, 4 * H, 4 * H * H, H, H, H, H, H})
      param_sizes.push_back(s * fp32);
  param_sizes.push_back(V * H * fp32);
  std::vector<uint64_t> params, adam;
  for (uint64_t s : param_sizes) params.push_back(b.alloc(s));
  const uint64_t max_t = scaled(1024, std::sqrt(o.scale));
  for (int step = 0; step < o.steps; ++step) {
    // Bucketed variable lengths: the length grows step by step (with jitter), as batches sorted by length do.
    const uint64_t T = std::min<uint64_t>(max_t, 64 + static_cast<uint64_t>(step) * max_t / std::max(1, o.steps) +
                                                     rng.below(32));
    const uint64_t BTH = B * T * H;
    // Autocast's fp16 copies of the weights, for this step only.
    std::vector<uint64_t> casts;
    for (uint64_t s : param_sizes) casts.push_back(b.alloc(s / 2));
    std::vector<std::vector<uint64_t>> saved(L);
    uint64_t x = b.alloc(BTH * fp32);
    for (int l = 0; l < L; ++l) {
      auto& s = saved[l];
      s.push_back(b.alloc(BTH * fp16));      // ln1
      s.push_back(b.alloc(3 * BTH * fp16));  // qkv
      const uint64_t scores = b.alloc(B * heads * T * T * fp16);
      s.push_back(b.alloc(B * heads * T * T * fp16));  // softmax probabilities
      b.free(scores);
      s.push_back(b.alloc(BTH * fp16));  // attention context
      const uint64_t proj = b.alloc(BTH * fp16);
      s.push_back(x);
      x = b.alloc(BTH * fp32);  // residual stream
      b.free(proj);
      s.push_back(b.alloc(BTH * fp16));      // ln2
      s.push_back(b.alloc(4 * BTH * fp16));  // mlp hidden
      s.push_back(b.alloc(4 * BTH * fp16));  // gelu
      const uint64_t mlp_out = b.alloc(BTH * fp16);
      s.push_back(x);
      x = b.alloc(BTH * fp32);
      b.free(mlp_out);
    }
    const uint64_t logits = b.alloc(B * T * V * fp16);
    const uint64_t logits32 = b.alloc(B * T * V * fp32);  // the loss in fp32
    b.free(x);
    uint64_t dlogits = b.alloc(B * T * V * fp32);
    b.free(logits32);
    std::vector<uint64_t> grads(params.size(), 0);
    uint64_t dx = b.alloc(BTH * fp32);
    b.free(dlogits);
    b.free(logits);
    grads.back() = b.alloc(param_sizes.back());
    // Backward: per layer, a gradient for each saved tensor in reverse, freeing the saved ones as it goes,
    // with the weight gradients (set to None at zero_grad, so allocated again every step) in between.
    for (int l = L - 1; l >= 0; --l) {
      auto& s = saved[l];
      for (size_t k = s.size(); k-- > 0;) {
        const uint64_t g = b.alloc(std::max<uint64_t>(BTH * fp16, 1));
        if (k % 3 == 0) {
          const size_t pi = static_cast<size_t>(l) * 12 + (k * 5) % 12;
          if (grads[pi] == 0) grads[pi] = b.alloc(param_sizes[pi]);
        }
        b.free(s[k]);
        b.free(g);
      }
      for (size_t k = 0; k < 12; ++k) {
        const size_t pi = static_cast<size_t>(l) * 12 + k;
        if (grads[pi] == 0) grads[pi] = b.alloc(param_sizes[pi]);
      }
      const uint64_t ndx = b.alloc(BTH * fp32);
      b.free(dx);
      dx = ndx;
    }
    b.free(dx);
    for (uint64_t c : casts) b.free(c);
    // AdamW: state created at the first step, kept for good.
    if (adam.empty())
      for (uint64_t s : param_sizes) {
        adam.push_back(b.alloc(s));
        adam.push_back(b.alloc(s));
      }
    for (uint64_t g : grads) b.free(g);  // zero_grad(set_to_none=True)
    b.step();
  }
  return b.t;
}

Trace synthetic_cnn(const SyntheticOptions& o) {
  Rng rng(o.seed + 1000);
  Builder b;
  b.t.source = "synthetic:cnn";
  const int blocks_per_stage[4] = {3, 4, 6, 3};
  const uint64_t channels[4] = {64, 128, 256, 512}, spatial[4] = {56, 28, 14, 7};
  const double s = o.scale;
  std::vector<uint64_t> param_sizes;
  for (int st = 0; st < 4; ++st)
    for (int k = 0; k < blocks_per_stage[st]; ++k)
      for (uint64_t m : {1, 9, 4}) param_sizes.push_back(m * channels[st] * channels[st] * 4);
  std::vector<uint64_t> params, momentum;
  for (uint64_t p : param_sizes) params.push_back(b.alloc(p));
  for (int step = 0; step < o.steps; ++step) {
    // The batch changes every step (e.g. a dynamic batch sampler, or the last batch of an epoch).
    const uint64_t N = scaled(static_cast<double>(64 + 32 * rng.below(7)), s);
    struct Saved {
      uint64_t id, bytes;
    };
    std::vector<Saved> saved;
    uint64_t x = b.alloc(N * 3 * 224 * 224 * 2);
    saved.push_back({x, N * 3 * 224 * 224 * 2});
    for (int st = 0; st < 4; ++st) {
      for (int k = 0; k < blocks_per_stage[st]; ++k) {
        for (int c = 0; c < 3; ++c) {
          const uint64_t ch = channels[st] * (c == 2 ? 4 : 1);
          const uint64_t act = N * ch * spatial[st] * spatial[st] * 2;
          const uint64_t ws = b.alloc(scaled(static_cast<double>((1 + rng.below(64)) << 20), s));  // conv workspace
          const uint64_t conv = b.alloc(act);
          b.free(ws);
          saved.push_back({conv, act});
          saved.push_back({b.alloc(act), act});  // batch-norm output
          saved.push_back({b.alloc(act), act});  // relu output
        }
      }
    }
    std::vector<uint64_t> grads(params.size(), 0);
    uint64_t g = b.alloc(saved.back().bytes);
    size_t pi = params.size();
    for (size_t k = saved.size(); k-- > 1;) {
      const uint64_t ng = b.alloc(saved[k - 1].bytes);
      b.free(g);
      g = ng;
      if (k % 3 == 0 && pi > 0) {
        --pi;
        grads[pi] = b.alloc(param_sizes[pi]);
      }
      b.free(saved[k].id);
    }
    b.free(g);
    b.free(saved[0].id);
    while (pi > 0) {
      --pi;
      grads[pi] = b.alloc(param_sizes[pi]);
    }
    if (momentum.empty())
      for (uint64_t p : param_sizes) momentum.push_back(b.alloc(p));
    for (uint64_t id : grads) b.free(id);
    b.step();
  }
  return b.t;
}

Trace synthetic_many_sizes(const SyntheticOptions& o) {
  Rng rng(o.seed + 2000);
  Builder b;
  b.t.source = "synthetic:many-sizes";
  const double target = 3.0 * static_cast<double>(uint64_t{1} << 30) * o.scale;
  const double lo = std::log(512.0), hi = std::log(256.0 * (1 << 20) * std::min(1.0, o.scale * 4));
  struct Live {
    uint64_t id, bytes;
  };
  std::vector<Live> live;
  double live_bytes = 0;
  const int per_step = 400;
  for (int step = 0; step < o.steps; ++step) {
    for (int e = 0; e < per_step; ++e) {
      if (live_bytes < target || live.empty() || rng.below(3) == 0) {
        const uint64_t bytes = static_cast<uint64_t>(std::exp(lo + (hi - lo) * rng.uniform()));
        live.push_back({b.alloc(bytes), bytes});
        live_bytes += static_cast<double>(bytes);
      }
      while (live_bytes > target && !live.empty()) {
        const size_t k = rng.below(live.size());
        b.free(live[k].id);
        live_bytes -= static_cast<double>(live[k].bytes);
        live[k] = live.back();
        live.pop_back();
      }
    }
    b.step();
  }
  for (const Live& l : live) b.free(l.id);
  return b.t;
}

std::vector<std::string> synthetic_trace_names() { return {"varlen", "cnn", "many-sizes"}; }

Trace synthetic_trace(const std::string& name, const SyntheticOptions& o) {
  if (name == "varlen") return synthetic_varlen(o);
  if (name == "cnn") return synthetic_cnn(o);
  if (name == "many-sizes") return synthetic_many_sizes(o);
  AF_THROW(InvalidArgument, "unknown synthetic trace '{}'; expected varlen, cnn or many-sizes", name);
}

}  // namespace ampforge::memory
