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

}  // namespace ampforge::optim
