#include "ampforge/optim/param_groups.h"

namespace ampforge::optim {

std::vector<ParamGroupSpec> decay_groups(const nn::Module& model, double weight_decay, double lr) {
  ParamGroupSpec decay, no_decay;
  decay.weight_decay = weight_decay;
  no_decay.weight_decay = 0;
  decay.lr = no_decay.lr = lr;
  for (const auto& [name, p] : model.named_parameters()) (p.dim() <= 1 ? no_decay : decay).params.push_back(p);
  std::vector<ParamGroupSpec> out;
  if (!decay.params.empty()) out.push_back(std::move(decay));
  if (!no_decay.params.empty()) out.push_back(std::move(no_decay));
  return out;
}

std::vector<ParamGroupSpec> ultralytics_groups(const nn::Module& model, double weight_decay, double warmup_bias_lr,
                                               double lr) {
  ParamGroupSpec bias, decay, norm;
  bias.weight_decay = norm.weight_decay = 0;
  decay.weight_decay = weight_decay;
  bias.warmup_start_lr = warmup_bias_lr;
  bias.lr = decay.lr = norm.lr = lr;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    (is_bias ? bias : p.dim() <= 1 ? norm : decay).params.push_back(p);
  }
  std::vector<ParamGroupSpec> out;
  for (ParamGroupSpec* g : {&bias, &decay, &norm})
    if (!g->params.empty()) out.push_back(std::move(*g));
  return out;
}

}  // namespace ampforge::optim
