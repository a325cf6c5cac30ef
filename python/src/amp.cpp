// ampforge.amp: autocast (the C++ amp::Autocast guard, held between __enter__ and __exit__ on the thread that entered)
// and GradScaler (PyTorch's defaults and method names; its scale lives on the loss's device), plus the grad-mode
// switch behind ampforge.no_grad() / enable_grad() / set_grad_enabled() (autograd.py).
#include <memory>

#include "common.h"

namespace ampforge::python {

namespace {

struct AutocastContext {
  AutocastContext(af::Device d, af::DType t, bool e) : device(d), dtype(t), enabled(e) {}
  AutocastContext(const AutocastContext&) = delete;
  AutocastContext& operator=(const AutocastContext&) = delete;
  af::Device device;
  af::DType dtype;
  bool enabled;
  std::vector<std::unique_ptr<af::amp::Autocast>> active;  // one per nesting of this object's with-blocks
};

}  // namespace

void init_amp(nb::module_& m) {
  nb::class_<AutocastContext>(m, "_Autocast", "The autocast region behind ampforge.autocast (amp.py).")
      .def("__init__",
           [](AutocastContext* self, const std::string& device_type, std::optional<af::DType> dtype, bool enabled) {
             const af::Device d = af::Device::parse(device_type);
             // PyTorch's defaults: float16 on CUDA, bfloat16 on the CPU.
             const af::DType dt = dtype.value_or(d.is_cuda() ? af::DType::F16 : af::DType::BF16);
             if (!af::dtype_is_16bit_float(dt) && enabled)
               throw nb::value_error("autocast: dtype must be ampforge.float16 or ampforge.bfloat16");
             new (self) AutocastContext(d, dt, enabled);
           },
           nb::arg("device_type"), nb::arg("dtype") = nb::none(), nb::arg("enabled") = true)
      .def("__enter__",
           [](AutocastContext& c) {
             c.active.push_back(std::make_unique<af::amp::Autocast>(c.device, c.dtype, c.enabled));
           })
      .def("__exit__",
           [](AutocastContext& c, nb::handle, nb::handle, nb::handle) {
             if (!c.active.empty()) c.active.pop_back();
           },
           nb::arg("exc_type").none(), nb::arg("exc").none(), nb::arg("tb").none())
      .def_ro("dtype", &AutocastContext::dtype)
      .def_ro("enabled", &AutocastContext::enabled)
      .def_prop_ro("device", [](const AutocastContext& c) { return std::string(af::device_type_name(c.device.type)); });
  m.def("is_autocast_enabled",
        [](const std::string& device_type) { return af::amp::is_autocast_enabled(af::Device::parse(device_type).type); },
        nb::arg("device_type") = "cuda");
  m.def("get_autocast_dtype",
        [](const std::string& device_type) { return af::amp::autocast_dtype(af::Device::parse(device_type).type); },
        nb::arg("device_type"));

  m.def("is_grad_enabled", &af::autograd::grad_enabled);
  m.def("_set_grad_enabled", &af::autograd::set_grad_enabled, nb::arg("mode"));

  nb::class_<af::amp::GradScaler>(
      m, "GradScaler",
      "Dynamic loss scaling, torch.amp.GradScaler's defaults and methods: scale(loss).backward(), step(optimizer) "
      "(skipped when a gradient is Inf/NaN), update(). The scale lives on the device of the first scaled loss.")
      .def("__init__",
           [](af::amp::GradScaler* self, nb::handle device, double init_scale, double growth_factor,
              double backoff_factor, int64_t growth_interval, bool enabled) {
             if (!device.is_none()) device_from(device);  // validated; the scale follows the loss's device
             af::amp::GradScalerOptions o;
             o.init_scale = init_scale, o.growth_factor = growth_factor, o.backoff_factor = backoff_factor;
             o.growth_interval = growth_interval, o.enabled = enabled;
             new (self) af::amp::GradScaler(o);
           },
           nb::arg("device") = "cuda", nb::arg("init_scale") = 65536.0, nb::arg("growth_factor") = 2.0,
           nb::arg("backoff_factor") = 0.5, nb::arg("growth_interval") = 2000, nb::arg("enabled") = true)
      .def("scale", [](af::amp::GradScaler& s, const af::Tensor& loss) { return s.scale(loss); }, nb::arg("outputs"))
      .def("unscale_",
           [](af::amp::GradScaler& s, af::optim::Optimizer& o) {
             EngineCall call;
             s.unscale_(o);
           },
           nb::arg("optimizer"))
      .def("step",
           [](af::amp::GradScaler& s, af::optim::Optimizer& o) {
             EngineCall call;
             s.step(o);
           },
           nb::arg("optimizer"), "Unscales (unless unscale_ was called) and steps, unless a gradient was Inf/NaN.")
      .def("update",
           [](af::amp::GradScaler& s, std::optional<double> new_scale) {
             EngineCall call;
             s.update(new_scale);
           },
           nb::arg("new_scale") = nb::none())
      .def("get_scale", &af::amp::GradScaler::get_scale)
      .def("is_enabled", &af::amp::GradScaler::is_enabled)
      .def("get_growth_factor", [](const af::amp::GradScaler& s) { return s.options().growth_factor; })
      .def("get_backoff_factor", [](const af::amp::GradScaler& s) { return s.options().backoff_factor; })
      .def("get_growth_interval", [](const af::amp::GradScaler& s) { return s.options().growth_interval; })
      .def_prop_ro("skipped_steps", &af::amp::GradScaler::skipped_steps,
                   "Optimizer steps skipped because of Inf/NaN gradients (an ampforge addition).")
      .def("state_dict", &af::amp::GradScaler::state_dict,
           "PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker (+ version).")
      .def("load_state_dict", &af::amp::GradScaler::load_state_dict, nb::arg("state_dict"));
}

}  // namespace ampforge::python
