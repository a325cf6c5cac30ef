#include "ampforge/autograd/autocast.h"

#include <unordered_map>

#include "ampforge/autograd/functions.h"

namespace ampforge::autograd {
namespace {

struct ThreadAutocast {
  AutocastState state[kNumDeviceTypes];
  int depth = 0;
  // Weight-cast cache: (leaf impl, dtype) -> cast tensor. Holds the leaf alive for the region only.
  std::unordered_map<const TensorImpl*, std::pair<std::shared_ptr<TensorImpl>, Tensor>> cache[2];
};

thread_local ThreadAutocast t_ac;

int cache_index(DType d) { return d == DType::BF16 ? 1 : 0; }

Tensor cast_to(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  const bool cacheable = t.is_leaf() && t.requires_grad() && t_ac.depth > 0 && dtype_is_16bit_float(dtype);
  if (!cacheable) return t.to(dtype);
  auto& c = t_ac.cache[cache_index(dtype)];
  auto it = c.find(t.impl());
  if (it != c.end()) return it->second.second;
  Tensor r = t.to(dtype);
  c.emplace(t.impl(), std::make_pair(t.impl_ptr(), r));
  return r;
}

}  // namespace

AutocastState autocast_state(DeviceType device) { return t_ac.state[static_cast<int>(device)]; }
void set_autocast_state(DeviceType device, const AutocastState& s) { t_ac.state[static_cast<int>(device)] = s; }

void autocast_enter() { ++t_ac.depth; }
void autocast_exit() {
  if (--t_ac.depth <= 0) {
    t_ac.depth = 0;
    t_ac.cache[0].clear();
    t_ac.cache[1].clear();
  }
}
size_t autocast_cache_size() { return t_ac.cache[0].size() + t_ac.cache[1].size(); }

void autocast_inputs(OpId op, std::vector<Tensor*> inputs) {
  // The op runs on its inputs' device (ops/ checks they agree); autocast for that device type decides.
  const Tensor* first = nullptr;
  for (Tensor* t : inputs)
    if (t->defined()) {
      first = t;
      break;
    }
  if (first == nullptr) return;
  const DeviceType device = first->device().type;
  const AutocastState& s = t_ac.state[static_cast<int>(device)];
  if (!s.enabled) return;
  switch (op_amp_category(op, device)) {
    case AmpCategory::Lower:
      for (Tensor* t : inputs)
        if (t->defined() && t->is_floating_point() && t->dtype() != DType::F64) *t = cast_to(*t, s.dtype);
      break;
    case AmpCategory::F32:
      for (Tensor* t : inputs)
        if (t->defined() && dtype_is_16bit_float(t->dtype())) *t = cast_to(*t, DType::F32);
      break;
    case AmpCategory::None: break;
  }
}

}  // namespace ampforge::autograd
