// ampforge.nn: the C++ nn::Module tree, subclassable in Python.
//
// A Python subclass (class Net(ampforge.nn.Module)) is a C++ Module too: PyModule, the trampoline, routes the C++
// forward(x) to the Python method, so a C++ container (Sequential), the Trainer or `model(x)` all run it. Its
// attributes are registered as PyTorch registers them: a Parameter becomes a parameter, a Module a child, under the
// attribute's name, so named_parameters()/state_dict() give the names PyTorch would and a state dict saved from
// Python loads in `ampforge predict` and in torch. C++ modules held by a Python module (or by a C++ container) keep the
// Python object alive through the shared_ptr nanobind makes for it (the Python object owns the C++ one).
//
// The built-in layers (Linear, Conv2d, BatchNorm2d, ...) are the C++ classes with PyTorch's constructor arguments; their
// tensors (weight, bias, ...) are properties whose setter rebinds the data (Tensor.set_data), so every handle (the
// optimizer's included) sees the new values.
#include <nanobind/trampoline.h>

#include "common.h"

#include "ampforge/nn/state_dict.h"

namespace ampforge::python {

namespace {

class PyModule : public af::nn::Module {
 public:
  NB_TRAMPOLINE(af::nn::Module);
  af::Tensor forward(const af::Tensor& x) override { NB_OVERRIDE(forward, x); }

  void add_parameter(const std::string& name, const af::Tensor& t) { register_parameter(name, t); }
  void add_buffer(const std::string& name, const af::Tensor& t) { register_buffer(name, t); }
  void add_child(const std::string& name, af::nn::ModulePtr m) { register_module(name, std::move(m)); }
};

using af::nn::Module;
using af::nn::ModulePtr;

// This module's own parameter / buffer called `name` (not a descendant's).
af::Tensor own_tensor(const Module& m, const std::string& name, bool params) {
  for (auto& [n, t] : params ? m.named_parameters() : m.named_buffers())
    if (n == name) return t;
  return af::Tensor();
}

ModulePtr own_child(const Module& m, const std::string& name) {
  for (auto& [n, c] : m.children())
    if (n == name) return c;
  return nullptr;
}

void check_attr_name(const std::string& name, const char* what) {
  if (name.empty() || name.find('.') != std::string::npos)
    throw nb::key_error((std::string(what) + ": name '" + name + "' must be non-empty and contain no '.'").c_str());
}

void register_param(PyModule& pm, const std::string& name, const af::Tensor& p) {
  check_attr_name(name, "register_parameter");
  const af::Tensor old = own_tensor(pm, name, true);
  if (old.defined()) {
    if (old.impl() == p.impl()) return;
    throw nb::key_error(("parameter '" + name + "' is already registered in " + pm.type_name() +
                         "; assign new values with module." + name + ".data = tensor")
                            .c_str());
  }
  if (own_tensor(pm, name, false).defined() || own_child(pm, name))
    throw nb::key_error(("attribute '" + name + "' of " + pm.type_name() + " is already a buffer or a submodule").c_str());
  const bool rg = p.requires_grad();
  pm.add_parameter(name, p);
  af::Tensor frozen = p;
  if (!rg) frozen.requires_grad_(false);  // Parameter(t, requires_grad=False): a frozen parameter
}

void register_child(PyModule& pm, const std::string& name, const ModulePtr& child) {
  check_attr_name(name, "add_module");
  ModulePtr old = own_child(pm, name);
  if (old) {
    if (old == child) return;
    throw nb::key_error(("submodule '" + name + "' is already registered in " + pm.type_name() +
                         "; ampforge modules cannot swap a registered submodule (build a new module)")
                            .c_str());
  }
  if (own_tensor(pm, name, true).defined() || own_tensor(pm, name, false).defined())
    throw nb::key_error(("attribute '" + name + "' of " + pm.type_name() + " is already a parameter or a buffer").c_str());
  if (child.get() == &pm) throw nb::value_error("a module cannot be its own submodule");
  pm.add_child(name, child);
}

Module& module_of(nb::handle self) {
  if (!nb::inst_check(self) || !nb::inst_ready(self))
    throw nb::attribute_error("the Module is not initialised: call super().__init__() first in your __init__");
  return *nb::inst_ptr<Module>(self);
}

void module_setattr(nb::handle self, const std::string& name, nb::handle value) {
  Module& m = module_of(self);
  if (auto* pm = dynamic_cast<PyModule*>(&m)) {
    if (nb::isinstance<Parameter>(value)) {
      register_param(*pm, name, nb::cast<af::Tensor>(value));
    } else if (nb::isinstance<Module>(value)) {
      register_child(*pm, name, nb::cast<ModulePtr>(value));
    } else if (nb::isinstance<af::Tensor>(value) && own_tensor(m, name, false).defined()) {
      // a registered buffer assigned a new tensor: rebind its data (every handle follows)
      own_tensor(m, name, false).set_data(nb::cast<af::Tensor>(value));
    } else if (own_tensor(m, name, true).defined() || own_child(m, name)) {
      throw nb::type_error(("cannot assign a " + std::string(nb::type_name(value.type()).c_str()) + " to '" + name +
                            "': it is a registered parameter or submodule")
                               .c_str());
    }
  }
  if (PyObject_GenericSetAttr(self.ptr(), nb::str(name.c_str()).ptr(), value.ptr()) != 0) throw nb::python_error();
}

nb::object module_getattr(nb::handle self, const std::string& name) {
  const Module& m = module_of(self);
  if (ModulePtr c = own_child(m, name)) return nb::cast(c);
  af::Tensor t = own_tensor(m, name, true);
  if (!t.defined()) t = own_tensor(m, name, false);
  if (t.defined()) return nb::cast(t);
  throw nb::attribute_error(("'" + std::string(nb::type_name(self.type()).c_str()) + "' object has no attribute '" +
                             name + "'")
                                .c_str());
}

nb::list named_list(const af::nn::NamedTensors& v, const std::string& prefix) {
  nb::list l;
  for (auto& [n, t] : v) l.append(nb::make_tuple(prefix + n, t));
  return l;
}

void collect_modules(const std::string& prefix, const ModulePtr& m, std::vector<std::pair<std::string, ModulePtr>>& out) {
  out.emplace_back(prefix, m);
  for (auto& [n, c] : m->children()) collect_modules(prefix.empty() ? n : prefix + "." + n, c, out);
}

ModulePtr shared_of(nb::handle self) {
  module_of(self);
  return nb::cast<ModulePtr>(self);
}

// state dict values: ampforge tensors, or anything DLPack / the buffer protocol gives (torch tensors, NumPy arrays).
af::nn::NamedTensors named_tensors_from(nb::handle state) {
  if (!PyMapping_Check(state.ptr())) throw nb::type_error("load_state_dict: expected a mapping name -> tensor");
  af::nn::NamedTensors out;
  nb::object from_dlpack;
  for (nb::handle k : nb::borrow<nb::object>(state)) {
    nb::object v = state[k];
    if (!nb::isinstance<af::Tensor>(v)) {
      if (!from_dlpack.is_valid()) from_dlpack = nb::module_::import_("ampforge").attr("from_dlpack");
      v = from_dlpack(v);
    }
    out.emplace_back(nb::cast<std::string>(k), nb::cast<af::Tensor>(v));
  }
  return out;
}

// A layer tensor as a property: reads the handle, assignment rebinds the data of every handle (set_data).
template <class M>
void tensor_prop(nb::class_<M, Module>& c, const char* name, af::Tensor M::* field) {
  c.def_prop_rw(
      name, [field](M& m) -> nb::object { return (m.*field).defined() ? nb::cast(m.*field) : nb::none(); },
      [field, name](M& m, const af::Tensor& v) {
        if (!(m.*field).defined())
          throw nb::attribute_error((std::string(name) + " is None in this layer (built without it)").c_str());
        (m.*field).set_data(v.detach());
      });
}

int64_t square_kernel(nb::handle k, const char* what) {
  const std::vector<int64_t> v = ints_from_sequence(k, what);
  if (v.size() == 1 || (v.size() == 2 && v[0] == v[1])) return v[0];
  throw nb::value_error((std::string(what) + ": ampforge's layer takes square values (an int or (k, k))").c_str());
}

}  // namespace

void init_nn(nb::module_& m) {
  nb::class_<Module, PyModule> mod(
      m, "Module",
      "Base class of every layer and model (torch.nn.Module). Subclass it in Python: call super().__init__(), assign "
      "Parameters and Modules as attributes (they are registered under the attribute's name) and define forward().");
  mod.def("__init__",
          [](nb::pointer_and_handle<Module> v) {
            const std::string name = nb::type_name(v.h.type()).c_str();
            new ((void*)v.p) PyModule(name.substr(name.rfind('.') + 1));
          })
      .def("forward",
           [](Module& self, const af::Tensor& x) {
             EngineCall call;
             return self.forward(x);
           },
           nb::arg("input"))
      .def("__call__",
           [](nb::handle self, nb::args args, nb::kwargs kwargs) { return self.attr("forward")(*args, **kwargs); },
           "Runs forward().")
      .def("__setattr__", &module_setattr)
      .def("__getattr__", &module_getattr)
      .def("register_parameter",
           [](nb::handle self, const std::string& name, std::optional<af::Tensor> p) {
             if (!p) return;
             auto* pm = dynamic_cast<PyModule*>(&module_of(self));
             if (!pm) throw nb::type_error("register_parameter: only Python-defined modules register parameters");
             register_param(*pm, name, *p);
           },
           nb::arg("name"), nb::arg("param").none())
      .def("register_buffer",
           [](nb::handle self, const std::string& name, const af::Tensor& t) {
             auto* pm = dynamic_cast<PyModule*>(&module_of(self));
             if (!pm) throw nb::type_error("register_buffer: only Python-defined modules register buffers");
             check_attr_name(name, "register_buffer");
             if (own_tensor(*pm, name, false).defined() || own_tensor(*pm, name, true).defined() || own_child(*pm, name))
               throw nb::key_error(("attribute '" + name + "' is already registered").c_str());
             pm->add_buffer(name, t);
           },
           nb::arg("name"), nb::arg("tensor"),
           "A tensor saved in the state dict and moved by to(), but not trained (running statistics).")
      .def("add_module",
           [](nb::handle self, const std::string& name, const ModulePtr& child) { module_setattr(self, name, nb::cast(child)); },
           nb::arg("name"), nb::arg("module"))
      .def("parameters",
           [](nb::handle self, bool recurse) {
             nb::list l;
             const Module& mm = module_of(self);
             for (auto& [n, t] : mm.named_parameters())
               if (recurse || n.find('.') == std::string::npos) l.append(t);
             return l;
           },
           nb::arg("recurse") = true)
      .def("named_parameters",
           [](nb::handle self, const std::string& prefix, bool recurse) {
             af::nn::NamedTensors v;
             for (auto& e : module_of(self).named_parameters())
               if (recurse || e.first.find('.') == std::string::npos) v.push_back(e);
             return named_list(v, prefix.empty() ? prefix : prefix + ".");
           },
           nb::arg("prefix") = "", nb::arg("recurse") = true)
      .def("buffers",
           [](nb::handle self) {
             nb::list l;
             for (auto& [n, t] : module_of(self).named_buffers()) l.append(t);
             return l;
           })
      .def("named_buffers", [](nb::handle self) { return named_list(module_of(self).named_buffers(), ""); })
      .def("children",
           [](nb::handle self) {
             nb::list l;
             for (auto& [n, c] : module_of(self).children()) l.append(c);
             return l;
           })
      .def("named_children",
           [](nb::handle self) {
             nb::list l;
             for (auto& [n, c] : module_of(self).children()) l.append(nb::make_tuple(n, c));
             return l;
           })
      .def("named_modules",
           [](nb::handle self) {
             std::vector<std::pair<std::string, ModulePtr>> v;
             collect_modules("", shared_of(self), v);
             nb::list l;
             for (auto& [n, c] : v) l.append(nb::make_tuple(n, c));
             return l;
           })
      .def("modules",
           [](nb::handle self) {
             std::vector<std::pair<std::string, ModulePtr>> v;
             collect_modules("", shared_of(self), v);
             nb::list l;
             for (auto& [n, c] : v) l.append(c);
             return l;
           })
      .def("get_submodule",
           [](nb::handle self, const std::string& target) {
             ModulePtr cur = shared_of(self);
             size_t pos = 0;
             while (!target.empty() && pos <= target.size()) {
               const size_t dot = target.find('.', pos);
               const std::string part = target.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
               ModulePtr next = own_child(*cur, part);
               if (!next) throw nb::attribute_error(("no submodule '" + part + "' in '" + target + "'").c_str());
               cur = next;
               if (dot == std::string::npos) break;
               pos = dot + 1;
             }
             return cur;
           },
           nb::arg("target"))
      .def("state_dict",
           [](nb::handle self) {
             nb::dict d;
             for (auto& [n, t] : module_of(self).state_dict()) d[n.c_str()] = t.detach();
             return d;
           },
           "name -> tensor (detached, sharing the module's memory), PyTorch's names and order.")
      .def("load_state_dict",
           [](nb::handle self, nb::handle state, bool strict) {
             Module& mm = module_of(self);
             const af::nn::NamedTensors st = named_tensors_from(state);
             af::nn::LoadReport r;
             {
               EngineCall call;
               r = af::nn::compare_state_dict(mm, st);
               mm.load_state_dict(st, strict);
             }
             nb::list missing, unexpected;
             for (auto& k : r.missing_keys) missing.append(k);
             for (auto& k : r.unexpected_keys) unexpected.append(k);
             return nb::make_tuple(missing, unexpected);
           },
           nb::arg("state_dict"), nb::arg("strict") = true,
           "Copies values in by name; returns (missing_keys, unexpected_keys). strict: any missing, unexpected or "
           "mis-shaped key is a ValueError listing them all, and nothing is loaded.")
      .def("train",
           [](nb::handle self, bool mode) {
             module_of(self).train(mode);
             return nb::borrow(self);
           },
           nb::arg("mode") = true)
      .def("eval",
           [](nb::handle self) {
             module_of(self).eval();
             return nb::borrow(self);
           })
      .def_prop_ro("training", [](nb::handle self) { return module_of(self).is_training(); })
      .def("to",
           [](nb::handle self, nb::args args, nb::kwargs kwargs) {
             Module& mm = module_of(self);
             std::optional<af::DType> dt;
             std::optional<af::Device> dev;
             for (nb::handle a : args) {
               if (nb::isinstance<af::DType>(a)) dt = nb::cast<af::DType>(a);
               else dev = device_from(a);
             }
             for (auto [k, v] : kwargs) {
               const std::string key = nb::cast<std::string>(k);
               if (key == "dtype") dt = dtype_from(v);
               else if (key == "device") dev = device_from(v);
               else if (key != "non_blocking") throw nb::type_error(("to(): unexpected keyword '" + key + "'").c_str());
             }
             EngineCall call;
             if (dev) mm.to(*dev);
             if (dt) mm.to(*dt);
             return nb::borrow(self);
           },
           "to(device) / to(dtype) / to(device=..., dtype=...): moves or converts parameters and buffers in place "
           "(running statistics stay float32); returns self.")
      .def("cpu",
           [](nb::handle self) {
             EngineCall call;
             module_of(self).to(af::kCPU);
             return nb::borrow(self);
           })
      .def("cuda",
           [](nb::handle self, std::optional<int> index) {
             Module& mm = module_of(self);
             EngineCall call;
             mm.to(af::Device(af::DeviceType::CUDA, index.value_or(0)));
             return nb::borrow(self);
           },
           nb::arg("device") = nb::none())
      .def("float", [](nb::handle self) { module_of(self).to(af::DType::F32); return nb::borrow(self); })
      .def("half", [](nb::handle self) { module_of(self).to(af::DType::F16); return nb::borrow(self); })
      .def("bfloat16", [](nb::handle self) { module_of(self).to(af::DType::BF16); return nb::borrow(self); })
      .def("double", [](nb::handle self) { module_of(self).to(af::DType::F64); return nb::borrow(self); })
      .def("requires_grad_",
           [](nb::handle self, bool on) {
             for (auto& t : module_of(self).parameters()) t.requires_grad_(on);
             return nb::borrow(self);
           },
           nb::arg("requires_grad") = true)
      .def("zero_grad",
           [](nb::handle self, bool set_to_none) {
             for (auto& t : module_of(self).parameters()) {
               if (!t.grad_as_is().defined()) continue;
               if (set_to_none) t.set_grad(af::Tensor());
               else t.mark_grad_zero();
             }
           },
           nb::arg("set_to_none") = true)
      .def("num_parameters", [](nb::handle self) { return module_of(self).num_parameters(); })
      .def("__repr__", [](nb::handle self) { return module_of(self).describe(); })
      .def_prop_ro("type_name", [](nb::handle self) { return module_of(self).type_name(); });

  // ---- layers ------------------------------------------------------------------------------------------------
  nb::class_<af::nn::Linear, Module> lin(m, "Linear", "y = x W^T + b, as torch.nn.Linear (weight (out, in)).");
  lin.def("__init__",
          [](af::nn::Linear* self, int64_t in, int64_t out, bool bias) {
            new (self) af::nn::Linear(in, out, af::nn::LinearOptions{.bias = bias});
          },
          nb::arg("in_features"), nb::arg("out_features"), nb::arg("bias") = true);
  tensor_prop(lin, "weight", &af::nn::Linear::weight);
  tensor_prop(lin, "bias", &af::nn::Linear::bias);
  lin.def_ro("in_features", &af::nn::Linear::in_features).def_ro("out_features", &af::nn::Linear::out_features);

  nb::class_<af::nn::Conv2d, Module> conv(m, "Conv2d", "2-D convolution, as torch.nn.Conv2d (square kernels).");
  conv.def("__init__",
           [](af::nn::Conv2d* self, int64_t in, int64_t out, nb::handle k, nb::handle stride, nb::handle padding,
              nb::handle dilation, int64_t groups, bool bias) {
             af::nn::Conv2dOptions o;
             o.stride = square_kernel(stride, "stride");
             o.padding = square_kernel(padding, "padding");
             o.dilation = square_kernel(dilation, "dilation");
             o.groups = groups;
             o.bias = bias;
             new (self) af::nn::Conv2d(in, out, square_kernel(k, "kernel_size"), o);
           },
           nb::arg("in_channels"), nb::arg("out_channels"), nb::arg("kernel_size"), nb::arg("stride") = 1,
           nb::arg("padding") = 0, nb::arg("dilation") = 1, nb::arg("groups") = 1, nb::arg("bias") = true);
  tensor_prop(conv, "weight", &af::nn::Conv2d::weight);
  tensor_prop(conv, "bias", &af::nn::Conv2d::bias);
  conv.def_ro("in_channels", &af::nn::Conv2d::in_channels)
      .def_ro("out_channels", &af::nn::Conv2d::out_channels)
      .def_ro("kernel_size", &af::nn::Conv2d::kernel_size);

  nb::class_<af::nn::BatchNorm2d, Module> bn(m, "BatchNorm2d", "Batch normalisation over (N, C, H, W) or (N, C).");
  bn.def("__init__",
         [](af::nn::BatchNorm2d* self, int64_t n, double eps, double momentum, bool affine, bool track) {
           new (self) af::nn::BatchNorm2d(
               n, af::nn::BatchNormOptions{.eps = eps, .momentum = momentum, .affine = affine, .track_running_stats = track});
         },
         nb::arg("num_features"), nb::arg("eps") = 1e-5, nb::arg("momentum") = 0.1, nb::arg("affine") = true,
         nb::arg("track_running_stats") = true);
  tensor_prop(bn, "weight", &af::nn::BatchNorm2d::weight);
  tensor_prop(bn, "bias", &af::nn::BatchNorm2d::bias);
  tensor_prop(bn, "running_mean", &af::nn::BatchNorm2d::running_mean);
  tensor_prop(bn, "running_var", &af::nn::BatchNorm2d::running_var);
  tensor_prop(bn, "num_batches_tracked", &af::nn::BatchNorm2d::num_batches_tracked);
  bn.def_ro("num_features", &af::nn::BatchNorm2d::num_features);

  nb::class_<af::nn::LayerNorm, Module> ln(m, "LayerNorm", "Layer normalisation over the trailing normalized_shape.");
  ln.def("__init__",
         [](af::nn::LayerNorm* self, nb::handle shape, double eps, bool affine) {
           new (self) af::nn::LayerNorm(shape_from_sequence(shape, "normalized_shape"), eps, affine);
         },
         nb::arg("normalized_shape"), nb::arg("eps") = 1e-5, nb::arg("elementwise_affine") = true);
  tensor_prop(ln, "weight", &af::nn::LayerNorm::weight);
  tensor_prop(ln, "bias", &af::nn::LayerNorm::bias);

  nb::class_<af::nn::Embedding, Module> emb(m, "Embedding", "A lookup table: int64 indices (...) -> (..., dim).");
  emb.def("__init__",
          [](af::nn::Embedding* self, int64_t n, int64_t d, std::optional<int64_t> pad) {
            new (self) af::nn::Embedding(n, d, pad.value_or(-1));
          },
          nb::arg("num_embeddings"), nb::arg("embedding_dim"), nb::arg("padding_idx") = nb::none());
  tensor_prop(emb, "weight", &af::nn::Embedding::weight);

  nb::class_<af::nn::Dropout, Module>(m, "Dropout")
      .def(nb::init<double>(), nb::arg("p") = 0.5)
      .def_rw("p", &af::nn::Dropout::p);
  nb::class_<af::nn::ReLU, Module>(m, "ReLU").def(nb::init<>());
  nb::class_<af::nn::SiLU, Module>(m, "SiLU").def(nb::init<>());
  nb::class_<af::nn::GELU, Module>(m, "GELU").def(
      "__init__",
      [](af::nn::GELU* self, const std::string& approximate) {
        if (approximate != "none" && approximate != "tanh")
          throw nb::value_error("GELU: approximate must be 'none' or 'tanh'");
        new (self) af::nn::GELU(approximate == "tanh" ? af::GeluApprox::Tanh : af::GeluApprox::None);
      },
      nb::arg("approximate") = "none");
  nb::class_<af::nn::MaxPool2d, Module>(m, "MaxPool2d")
      .def("__init__",
           [](af::nn::MaxPool2d* self, nb::handle k, nb::handle s, nb::handle p) {
             new (self) af::nn::MaxPool2d(square_kernel(k, "kernel_size"), s.is_none() ? -1 : square_kernel(s, "stride"),
                                          square_kernel(p, "padding"));
           },
           nb::arg("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0);
  nb::class_<af::nn::AvgPool2d, Module>(m, "AvgPool2d")
      .def("__init__",
           [](af::nn::AvgPool2d* self, nb::handle k, nb::handle s, nb::handle p) {
             new (self) af::nn::AvgPool2d(square_kernel(k, "kernel_size"), s.is_none() ? -1 : square_kernel(s, "stride"),
                                          square_kernel(p, "padding"));
           },
           nb::arg("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0);
  nb::class_<af::nn::AdaptiveAvgPool2d, Module>(m, "AdaptiveAvgPool2d")
      .def("__init__",
           [](af::nn::AdaptiveAvgPool2d* self, nb::handle size) {
             const std::vector<int64_t> v = ints_from_sequence(size, "output_size");
             if (v.size() != 1 && v.size() != 2) throw nb::value_error("output_size: an int or (h, w)");
             new (self) af::nn::AdaptiveAvgPool2d(v[0], v.size() == 2 ? v[1] : v[0]);
           },
           nb::arg("output_size"));
  nb::class_<af::nn::Flatten, Module>(m, "Flatten")
      .def(nb::init<int64_t, int64_t>(), nb::arg("start_dim") = 1, nb::arg("end_dim") = -1);
  nb::class_<af::nn::Sequential, Module>(m, "Sequential", "Runs its modules in order; children named '0', '1', ...")
      .def("__init__",
           [](af::nn::Sequential* self, nb::args mods) {
             new (self) af::nn::Sequential();
             for (nb::handle h : mods) self->push_back(nb::cast<ModulePtr>(h));
           })
      .def("append",
           [](nb::handle self, const ModulePtr& mm) {
             nb::cast<af::nn::Sequential&>(self).push_back(mm);
             return nb::borrow(self);
           },
           nb::arg("module"))
      .def("__len__", [](const af::nn::Sequential& s) { return s.size(); })
      .def("__getitem__",
           [](const af::nn::Sequential& s, int64_t i) {
             const int64_t n = static_cast<int64_t>(s.size());
             if (i < -n || i >= n) throw nb::index_error("Sequential index out of range");
             return s.children()[static_cast<size_t>(i < 0 ? i + n : i)].second;
           })
      .def("__iter__",
           [](const af::nn::Sequential& s) {
             nb::list l;
             for (auto& [n, c] : s.children()) l.append(c);
             return nb::iter(l);
           });
}

}  // namespace ampforge::python
