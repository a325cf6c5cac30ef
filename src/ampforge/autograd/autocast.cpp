#include "ampforge/autograd/autocast.h"

#include <unordered_map>

#include "ampforge/autograd/functions.h"

namespace ampforge::autograd {
namespace {

struct ThreadAutocast {
  AutocastState state;
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

AutocastState autocast_state() { return t_ac.state; }
void set_autocast_state(const AutocastState& s) { t_ac.state = s; }

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
  const AutocastState& s = t_ac.state;
  if (!s.enabled) return;
  const AmpCategory cat = op_amp_category(op);
  if (cat == AmpCategory::None) return;
  // Only when an input lives on the autocast device.
  bool on_device = false;
  for (Tensor* t : inputs)
    if (t->defined() && t->device().type == s.device) on_device = true;
  if (!on_device) return;
  switch (cat) {
    case AmpCategory::Lower:
      for (Tensor* t : inputs)
        if (t->defined() && t->is_floating_point() && t->dtype() != DType::F64) *t = cast_to(*t, s.dtype);
      break;
    case AmpCategory::F32:
      for (Tensor* t : inputs)
        if (t->defined() && dtype_is_16bit_float(t->dtype())) *t = cast_to(*t, DType::F32);
      break;
    case AmpCategory::Promote: {
      DType widest = DType::Bool;
      bool any = false;
      for (Tensor* t : inputs)
        if (t->defined() && t->is_floating_point()) {
          widest = any ? promote_types(widest, t->dtype()) : t->dtype();
          any = true;
        }
      if (!any) return;
      for (Tensor* t : inputs)
        if (t->defined() && t->is_floating_point()) *t = cast_to(*t, widest);
      break;
    }
    case AmpCategory::None: break;
  }
}

}  // namespace ampforge::autograd
