// ampforge.optim: SGD and AdamW with PyTorch's argument names (the C++ optimizers over flat buffers: building one
// moves the parameters into one allocation per group, so every handle, NumPy views excepted, sees the new place),
// param_groups whose 'lr' can be set as in PyTorch, state_dict/load_state_dict, LR schedulers, clip_grad_norm_.
#include <cmath>

#include "common.h"

namespace ampforge::python {

namespace {

using af::optim::Optimizer;

// params: an iterable of tensors, or of dicts {"params": [...], "lr": ..., "weight_decay": ...} (param groups).
std::vector<af::optim::ParamGroupSpec> groups_from(nb::handle params) {
  std::vector<af::optim::ParamGroupSpec> groups;
  af::optim::ParamGroupSpec plain;
  bool any_plain = false;
  for (nb::handle item : nb::borrow<nb::object>(params)) {
    if (nb::isinstance<af::Tensor>(item)) {
      plain.params.push_back(nb::cast<af::Tensor>(item));
      any_plain = true;
    } else if (PyDict_Check(item.ptr())) {
      nb::dict d = nb::borrow<nb::dict>(item);
      af::optim::ParamGroupSpec g;
      if (!d.contains("params")) throw nb::value_error("a parameter group needs a 'params' entry");
      for (nb::handle p : nb::borrow<nb::object>(d["params"])) g.params.push_back(nb::cast<af::Tensor>(p));
      if (d.contains("lr")) g.lr = nb::cast<double>(d["lr"]);
      if (d.contains("weight_decay")) g.weight_decay = nb::cast<double>(d["weight_decay"]);
      for (auto [k, v] : d) {
        const std::string key = nb::cast<std::string>(k);
        if (key != "params" && key != "lr" && key != "weight_decay")
          throw nb::value_error(("parameter group option '" + key + "' is not supported (params, lr, weight_decay)").c_str());
      }
      groups.push_back(std::move(g));
    } else {
      throw nb::type_error(("optimizer params: expected tensors or dicts, got " +
                            std::string(nb::type_name(item.type()).c_str())).c_str());
    }
  }
  if (any_plain) {
    if (!groups.empty()) throw nb::value_error("optimizer params: give either tensors or parameter groups, not both");
    groups.push_back(std::move(plain));
  }
  if (groups.empty()) throw nb::value_error("optimizer got an empty parameter list");
  return groups;
}

// One entry of Optimizer.param_groups: group['lr'] reads and sets the group's learning rate, as in PyTorch.
struct GroupRef {
  nb::object owner;  // the optimizer's Python object, kept alive by this reference
  Optimizer* opt;
  size_t index;
  af::optim::ParamGroup& g() const {
    if (index >= opt->param_groups().size()) throw nb::index_error("parameter group no longer exists");
    return opt->param_groups()[index];
  }
};

nb::object group_get(const GroupRef& r, const std::string& key) {
  auto& g = r.g();
  if (key == "lr") return nb::float_(g.lr);
  if (key == "weight_decay") return nb::float_(g.weight_decay);
  if (key == "params") return nb::cast(g.params);
  if (key == "momentum" && r.opt->momentum() >= 0) return nb::float_(r.opt->momentum());
  throw nb::key_error(key.c_str());
}

void group_set(GroupRef& r, const std::string& key, double v) {
  auto& g = r.g();
  if (key == "lr") g.lr = v;
  else if (key == "weight_decay") g.weight_decay = v;
  else if (key == "momentum") r.opt->set_momentum(v);
  else throw nb::key_error(("parameter group key '" + key + "' cannot be set (lr, weight_decay, momentum)").c_str());
}

// A PyTorch-style scheduler over the C++ schedule: step() advances one step (or epoch) and sets every group's lr.
struct Scheduler {
  Scheduler(nb::handle owner, Optimizer& opt, af::optim::ScheduleOptions o)
      : owner(nb::borrow(owner)), opt(&opt), s(opt, o) {
    s.apply(0);
  }
  nb::object owner;  // the optimizer's Python object, kept alive while the scheduler is
  Optimizer* opt;
  af::optim::LRScheduler s;
  int64_t last_epoch = 0;
  void step() { s.apply(++last_epoch); }
  std::vector<double> last_lr() const {
    std::vector<double> v;
    for (auto& g : opt->param_groups()) v.push_back(g.lr);
    return v;
  }
};

}  // namespace

void init_optim(nb::module_& m) {
  nb::class_<GroupRef>(m, "ParamGroup", "A parameter group: group['lr'] = 1e-4 changes its learning rate.")
      .def("__getitem__", &group_get)
      .def("__setitem__", &group_set)
      .def("keys", [](const GroupRef& r) {
        std::vector<std::string> k{"params", "lr", "weight_decay"};
        if (r.opt->momentum() >= 0) k.push_back("momentum");
        return k;
      });

  nb::class_<Optimizer>(m, "Optimizer", "Base of the optimizers (flat buffers, fused steps).")
      .def("step",
           [](Optimizer& o, nb::handle closure) -> nb::object {
             nb::object loss = nb::none();
             if (!closure.is_none()) loss = closure();
             EngineCall call;
             o.step();
             return loss;
           },
           nb::arg("closure") = nb::none())
      .def("zero_grad",
           [](Optimizer& o, bool) { o.zero_grad(); },
           nb::arg("set_to_none") = true,
           "Zeroes every gradient (lazily: the next backward overwrites them). Gradients are never None in ampforge: "
           "set_to_none is accepted and has no effect.")
      .def_prop_ro("param_groups",
                   [](nb::handle self) {
                     Optimizer& o = nb::cast<Optimizer&>(self);
                     std::vector<GroupRef> v;
                     for (size_t i = 0; i < o.param_groups().size(); ++i) v.push_back({nb::borrow(self), &o, i});
                     return v;
                   })
      .def("state_dict",
           [](const Optimizer& o) {
             nb::dict d;
             for (auto& [k, t] : o.state_dict()) d[k.c_str()] = t;
             return d;
           })
      .def("load_state_dict",
           [](Optimizer& o, nb::dict d) {
             std::vector<std::pair<std::string, af::Tensor>> st;
             for (auto [k, v] : d) st.emplace_back(nb::cast<std::string>(k), nb::cast<af::Tensor>(v));
             EngineCall call;
             o.load_state_dict(st);
           },
           nb::arg("state_dict"))
      .def_prop_ro("steps", &Optimizer::steps, "Optimizer steps taken (skipped ones not counted).")
      .def("__repr__", [](const Optimizer& o) { return std::string(o.name()) + " optimizer"; });

  nb::class_<af::optim::AdamW, Optimizer>(m, "AdamW", "AdamW with decoupled weight decay, as torch.optim.AdamW.")
      .def("__init__",
           [](af::optim::AdamW* self, nb::handle params, double lr, std::pair<double, double> betas, double eps,
              double weight_decay, bool amsgrad, bool maximize, nb::handle, bool capturable, bool differentiable,
              nb::handle fused) {
             if (amsgrad) throw nb::value_error("AdamW(amsgrad=True) is not supported by ampforge");
             if (maximize) throw nb::value_error("AdamW(maximize=True) is not supported by ampforge");
             if (differentiable) throw nb::value_error("AdamW(differentiable=True) is not supported by ampforge");
             (void)capturable, (void)fused;  // every ampforge step is fused; CUDA steps are capturable
             af::optim::AdamWOptions o;
             o.lr = lr, o.beta1 = betas.first, o.beta2 = betas.second, o.eps = eps, o.weight_decay = weight_decay;
             auto groups = groups_from(params);
             EngineCall call;
             new (self) af::optim::AdamW(groups, o);
           },
           nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("betas") = std::make_pair(0.9, 0.999),
           nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 1e-2, nb::arg("amsgrad") = false, nb::kw_only(),
           nb::arg("maximize") = false, nb::arg("foreach") = nb::none(), nb::arg("capturable") = false,
           nb::arg("differentiable") = false, nb::arg("fused") = nb::none());

  nb::class_<af::optim::SGD, Optimizer>(m, "SGD", "SGD with momentum, dampening, Nesterov, weight decay (torch.optim.SGD).")
      .def("__init__",
           [](af::optim::SGD* self, nb::handle params, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, bool maximize) {
             if (maximize) throw nb::value_error("SGD(maximize=True) is not supported by ampforge");
             af::optim::SGDOptions o;
             o.lr = lr, o.momentum = momentum, o.dampening = dampening, o.weight_decay = weight_decay;
             o.nesterov = nesterov;
             auto groups = groups_from(params);
             EngineCall call;
             new (self) af::optim::SGD(groups, o);
           },
           nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("momentum") = 0.0, nb::arg("dampening") = 0.0,
           nb::arg("weight_decay") = 0.0, nb::arg("nesterov") = false, nb::kw_only(), nb::arg("maximize") = false);

  nb::class_<Scheduler>(m, "LRScheduler",
                        "LR schedule over the optimizer's steps (or epochs): call step() after optimizer.step().")
      .def("__init__",
           [](Scheduler* self, nb::handle optimizer, const std::string& kind, int64_t total_steps, int64_t step_size,
              double gamma, double min_lr, double final_factor, int64_t warmup_steps) {
             af::optim::ScheduleOptions o;
             o.kind = af::optim::schedule_from_string(kind);
             o.total_steps = total_steps, o.step_size = step_size, o.gamma = gamma, o.min_lr = min_lr;
             o.final_factor = final_factor, o.warmup_steps = warmup_steps;
             new (self) Scheduler(optimizer, nb::cast<Optimizer&>(optimizer), o);
           },
           nb::arg("optimizer"), nb::arg("kind") = "constant", nb::arg("total_steps") = 0, nb::arg("step_size") = 0,
           nb::arg("gamma") = 0.1, nb::arg("min_lr") = 0.0, nb::arg("final_factor") = 0.0,
           nb::arg("warmup_steps") = 0)
      .def("step", &Scheduler::step)
      .def("get_last_lr", &Scheduler::last_lr)
      .def_ro("last_epoch", &Scheduler::last_epoch);

  m.def("clip_grad_norm_",
        [](nb::handle target, double max_norm) {
          if (nb::isinstance<Optimizer>(target)) {
            Optimizer& o = nb::cast<Optimizer&>(target);
            EngineCall call;
            return af::optim::clip_grad_norm_(o, max_norm);
          }
          std::vector<af::Tensor> grads;
          for (nb::handle p : nb::borrow<nb::object>(target)) {
            const af::Tensor g = nb::cast<af::Tensor>(p).grad();
            if (g.defined()) grads.push_back(g);
          }
          EngineCall call;
          af::autograd::NoGradGuard ng;
          double total = 0;
          for (const af::Tensor& g : grads) total += af::sum(af::mul(g.to(af::DType::F64), g.to(af::DType::F64))).item();
          const double norm = std::sqrt(total);
          const double scale = max_norm / (norm + 1e-6);
          if (scale < 1)
            for (const af::Tensor& g : grads) af::ops::mul_(g, af::full(af::Shape{}, scale, g.dtype(), g.device()));
          return norm;
        },
        nb::arg("parameters"), nb::arg("max_norm"),
        "Scales gradients so that their global L2 norm is at most max_norm; returns the norm before clipping. Pass "
        "the optimizer (one fused reduction over its flat buffers) or the parameters.");
}

}  // namespace ampforge::python
