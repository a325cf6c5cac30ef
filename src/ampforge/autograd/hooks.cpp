#include "ampforge/autograd/hooks.h"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ampforge/util/error.h"

namespace ampforge::autograd {

namespace {
struct Registry {
  std::mutex m;
  std::unordered_map<const TensorImpl*, std::vector<std::pair<uint64_t, PostAccumulateGradHook>>> hooks;
  uint64_t next_id = 1;
  std::atomic<int64_t> count{0};
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

HookHandle::~HookHandle() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.m);
  auto it = r.hooks.find(leaf_);
  if (it == r.hooks.end()) return;
  auto& v = it->second;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].first == id_) {
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      r.count.fetch_sub(1);
      break;
    }
  if (v.empty()) r.hooks.erase(it);
}

std::unique_ptr<HookHandle> register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  AF_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(),
           "register_post_accumulate_grad_hook: the tensor must be a leaf that requires grad");
  AF_CHECK(hook != nullptr, "register_post_accumulate_grad_hook: empty hook");
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.m);
  const uint64_t id = r.next_id++;
  r.hooks[leaf.impl()].emplace_back(id, std::move(hook));
  r.count.fetch_add(1);
  return std::make_unique<HookHandle>(leaf.impl(), id);
}

bool has_post_accumulate_grad_hooks() { return registry().count.load() > 0; }

bool has_post_accumulate_grad_hooks(const TensorImpl* leaf) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.m);
  return r.hooks.count(leaf) > 0;
}

void run_post_accumulate_grad_hooks(const Tensor& leaf) {
  std::vector<PostAccumulateGradHook> todo;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.m);
    auto it = r.hooks.find(leaf.impl());
    if (it == r.hooks.end()) return;
    for (auto& [id, h] : it->second) todo.push_back(h);
  }
  for (auto& h : todo) h(leaf);  // outside the lock: a hook may register or remove hooks
}

}  // namespace ampforge::autograd
