// Creation functions (zeros, ones, full, arange, rand, randn, ...) and the differentiable functions of
// autograd/functions.h under PyTorch's names and argument orders: ampforge.<op> and ampforge.nn.functional.<op>
// (cross_entropy, conv2d, batch_norm, ...). Products and convolutions run as EngineCalls (common.h).
#include "common.h"

namespace ampforge::python {

namespace {

af::Tensor finish(af::Tensor t, bool requires_grad) {
  if (requires_grad) t.requires_grad_(true);
  return t;
}

af::DType float_or(std::optional<af::DType> d) { return d.value_or(af::DType::F32); }
af::Device device_or(std::optional<af::Device> d) { return d.value_or(af::kCPU); }

std::pair<int64_t, int64_t> pair_of(nb::handle h, const char* what) {
  const std::vector<int64_t> v = ints_from_sequence(h, what);
  if (v.size() == 1) return {v[0], v[0]};
  if (v.size() == 2) return {v[0], v[1]};
  throw nb::value_error((std::string(what) + ": expected an int or a pair of ints").c_str());
}

af::Reduction reduction_from(const std::string& r) {
  if (r == "mean") return af::Reduction::Mean;
  if (r == "sum") return af::Reduction::Sum;
  if (r == "none") return af::Reduction::None;
  throw nb::value_error(("reduction must be 'mean', 'sum' or 'none', got '" + r + "'").c_str());
}

af::Pool2dAttrs pool_attrs(nb::handle kernel, nb::handle stride, nb::handle padding, bool ceil_mode) {
  af::Pool2dAttrs a;
  auto [kh, kw] = pair_of(kernel, "kernel_size");
  auto [sh, sw] = stride.is_none() ? std::pair<int64_t, int64_t>{kh, kw} : pair_of(stride, "stride");
  auto [ph, pw] = pair_of(padding, "padding");
  a.kernel[0] = kh, a.kernel[1] = kw;
  a.stride[0] = sh, a.stride[1] = sw;
  a.padding[0] = ph, a.padding[1] = pw;
  a.ceil_mode = ceil_mode;
  return a;
}

af::Tensor opt_tensor(const std::optional<af::Tensor>& t) { return t ? *t : af::Tensor(); }

}  // namespace

void init_ops(nb::module_& m) {
  // ---- creation --------------------------------------------------------------------------------------------
  m.def("zeros",
        [](nb::args size, std::optional<af::DType> dtype, std::optional<af::Device> device, bool rg) {
          return finish(af::zeros(shape_from_args(size, "zeros"), float_or(dtype), device_or(device)), rg);
        },
        nb::arg("size"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
        nb::arg("requires_grad") = false, "A tensor of zeros: zeros(2, 3) or zeros((2, 3)).");
  m.def("ones",
        [](nb::args size, std::optional<af::DType> dtype, std::optional<af::Device> device, bool rg) {
          return finish(af::ones(shape_from_args(size, "ones"), float_or(dtype), device_or(device)), rg);
        },
        nb::arg("size"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
        nb::arg("requires_grad") = false);
  m.def("empty",
        [](nb::args size, std::optional<af::DType> dtype, std::optional<af::Device> device, bool rg) {
          return finish(af::Tensor::empty(shape_from_args(size, "empty"), float_or(dtype), device_or(device)), rg);
        },
        nb::arg("size"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
        nb::arg("requires_grad") = false, "An uninitialised tensor.");
  m.def("full",
        [](nb::handle size, double value, std::optional<af::DType> dtype, std::optional<af::Device> device, bool rg) {
          return finish(af::full(shape_from_sequence(size, "full"), value, float_or(dtype), device_or(device)), rg);
        },
        nb::arg("size"), nb::arg("fill_value"), nb::kw_only(), nb::arg("dtype") = nb::none(),
        nb::arg("device") = nb::none(), nb::arg("requires_grad") = false);
  m.def("rand",
        [](nb::args size, std::optional<af::DType> dtype, std::optional<af::Device> device, bool rg) {
          return finish(af::rand(shape_from_args(size, "rand"), float_or(dtype), device_or(device)), rg);
        },
        nb::arg("size"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
        nb::arg("requires_grad") = false, "Uniform in [0, 1), from the default generator (manual_seed).");
  m.def("randn",
        [](nb::args size, std::optional<af::DType> dtype, std::optional<af::Device> device, bool rg) {
          return finish(af::randn(shape_from_args(size, "randn"), float_or(dtype), device_or(device)), rg);
        },
        nb::arg("size"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
        nb::arg("requires_grad") = false, "Standard normal, from the default generator (manual_seed).");
  m.def("arange",
        [](nb::handle start, nb::handle end, nb::handle step, std::optional<af::DType> dtype,
           std::optional<af::Device> device, bool rg) {
          const bool ints = PyLong_Check(start.ptr()) && (end.is_none() || PyLong_Check(end.ptr())) &&
                            PyLong_Check(step.ptr());
          // arange(end) or arange(start, end)
          const double s = end.is_none() ? 0.0 : nb::cast<double>(start);
          const double e = nb::cast<double>(end.is_none() ? start : end);
          const af::DType dt = dtype.value_or(ints ? af::DType::I64 : af::DType::F32);
          return finish(af::arange(s, e, nb::cast<double>(step), dt, device_or(device)), rg);
        },
        nb::arg("start"), nb::arg("end") = nb::none(), nb::arg("step") = 1, nb::kw_only(),
        nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), nb::arg("requires_grad") = false,
        "arange(end) or arange(start, end, step); int64 when every argument is an int, else float32.");
  m.def("zeros_like",
        [](const af::Tensor& t, std::optional<af::DType> dtype) {
          return af::zeros(t.shape(), dtype.value_or(t.dtype()), t.device());
        },
        nb::arg("input"), nb::kw_only(), nb::arg("dtype") = nb::none());
  m.def("ones_like",
        [](const af::Tensor& t, std::optional<af::DType> dtype) {
          return af::ones(t.shape(), dtype.value_or(t.dtype()), t.device());
        },
        nb::arg("input"), nb::kw_only(), nb::arg("dtype") = nb::none());
  m.def("full_like",
        [](const af::Tensor& t, double v, std::optional<af::DType> dtype) {
          return af::full(t.shape(), v, dtype.value_or(t.dtype()), t.device());
        },
        nb::arg("input"), nb::arg("fill_value"), nb::kw_only(), nb::arg("dtype") = nb::none());
  m.def("rand_like", [](const af::Tensor& t) { return af::rand(t.shape(), t.dtype(), t.device()); }, nb::arg("input"));
  m.def("randn_like", [](const af::Tensor& t) { return af::randn(t.shape(), t.dtype(), t.device()); }, nb::arg("input"));
  m.def("manual_seed", [](uint64_t seed) { af::manual_seed(seed); }, nb::arg("seed"),
        "Seeds the default generator (rand, randn, dropout, the layers' initialisation).");

  // ---- tensor functions ----------------------------------------------------------------------------------
  m.def("cat", [](const std::vector<af::Tensor>& xs, int64_t dim) { return af::cat(xs, dim); }, nb::arg("tensors"),
        nb::arg("dim") = 0);
  m.def("stack", [](const std::vector<af::Tensor>& xs, int64_t dim) { return af::stack(xs, dim); },
        nb::arg("tensors"), nb::arg("dim") = 0);
  m.def("where", [](const af::Tensor& c, const af::Tensor& a, const af::Tensor& b) { return af::where(c, a, b); },
        nb::arg("condition"), nb::arg("input"), nb::arg("other"));
  m.def("matmul",
        [](const af::Tensor& a, const af::Tensor& b) {
          EngineCall call;
          return af::matmul(a, b);
        },
        nb::arg("input"), nb::arg("other"));
  m.def("maximum", [](const af::Tensor& a, const af::Tensor& b) { return af::maximum(a, b); });
  m.def("minimum", [](const af::Tensor& a, const af::Tensor& b) { return af::minimum(a, b); });
  m.def("exp", [](const af::Tensor& x) { return af::exp(x); });
  m.def("log", [](const af::Tensor& x) { return af::log(x); });
  m.def("sqrt", [](const af::Tensor& x) { return af::sqrt(x); });
  m.def("abs", [](const af::Tensor& x) { return af::abs(x); });
  m.def("tanh", [](const af::Tensor& x) { return af::tanh(x); });
  m.def("sigmoid", [](const af::Tensor& x) { return af::sigmoid(x); });
  m.def("relu", [](const af::Tensor& x) { return af::relu(x); }, nb::arg("input"));
  m.def("silu", [](const af::Tensor& x) { return af::silu(x); }, nb::arg("input"));
  m.def("gelu",
        [](const af::Tensor& x, const std::string& approximate) {
          if (approximate != "none" && approximate != "tanh")
            throw nb::value_error("gelu: approximate must be 'none' or 'tanh'");
          return af::gelu(x, approximate == "tanh" ? af::GeluApprox::Tanh : af::GeluApprox::None);
        },
        nb::arg("input"), nb::arg("approximate") = "none");
  m.def("softmax", [](const af::Tensor& x, int64_t dim) { return af::softmax(x, dim); }, nb::arg("input"),
        nb::arg("dim"));
  m.def("log_softmax", [](const af::Tensor& x, int64_t dim) { return af::log_softmax(x, dim); }, nb::arg("input"),
        nb::arg("dim"));
  m.def("clamp",
        [](const af::Tensor& x, std::optional<double> lo, std::optional<double> hi) { return af::clamp(x, lo, hi); },
        nb::arg("input"), nb::arg("min") = nb::none(), nb::arg("max") = nb::none());
  m.def("sum", [](const af::Tensor& x, nb::handle d, bool k) { return af::sum(x, dims_from(d), k); }, nb::arg("input"),
        nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  m.def("mean", [](const af::Tensor& x, nb::handle d, bool k) { return af::mean(x, dims_from(d), k); },
        nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  m.def("argmax", [](const af::Tensor& x, int64_t d, bool k) { return af::argmax(x, d, k); }, nb::arg("input"),
        nb::arg("dim"), nb::arg("keepdim") = false);
  m.def("flatten", [](const af::Tensor& x, int64_t s, int64_t e) { return af::flatten(x, s, e); }, nb::arg("input"),
        nb::arg("start_dim") = 0, nb::arg("end_dim") = -1);

  // ---- nn.functional ---------------------------------------------------------------------------------------
  m.def("linear",
        [](const af::Tensor& x, const af::Tensor& w, std::optional<af::Tensor> b) {
          EngineCall call;
          return af::linear(x, w, opt_tensor(b));
        },
        nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none());
  m.def("conv2d",
        [](const af::Tensor& x, const af::Tensor& w, std::optional<af::Tensor> b, nb::handle stride,
           nb::handle padding, nb::handle dilation, int64_t groups) {
          af::Conv2dAttrs a;
          auto [sh, sw] = pair_of(stride, "stride");
          auto [ph, pw] = pair_of(padding, "padding");
          auto [dh, dw] = pair_of(dilation, "dilation");
          a.stride[0] = sh, a.stride[1] = sw, a.padding[0] = ph, a.padding[1] = pw;
          a.dilation[0] = dh, a.dilation[1] = dw, a.groups = groups;
          EngineCall call;
          return af::conv2d(x, w, opt_tensor(b), a);
        },
        nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), nb::arg("stride") = 1,
        nb::arg("padding") = 0, nb::arg("dilation") = 1, nb::arg("groups") = 1);
  m.def("max_pool2d",
        [](const af::Tensor& x, nb::handle k, nb::handle s, nb::handle p, bool ceil) {
          return af::max_pool2d(x, pool_attrs(k, s, p, ceil));
        },
        nb::arg("input"), nb::arg("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0,
        nb::arg("ceil_mode") = false);
  m.def("avg_pool2d",
        [](const af::Tensor& x, nb::handle k, nb::handle s, nb::handle p, bool ceil) {
          return af::avg_pool2d(x, pool_attrs(k, s, p, ceil));
        },
        nb::arg("input"), nb::arg("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0,
        nb::arg("ceil_mode") = false);
  m.def("adaptive_avg_pool2d",
        [](const af::Tensor& x, nb::handle size) {
          auto [h, w] = pair_of(size, "output_size");
          return af::adaptive_avg_pool2d(x, h, w);
        },
        nb::arg("input"), nb::arg("output_size"));
  m.def("batch_norm",
        [](const af::Tensor& x, std::optional<af::Tensor> rm, std::optional<af::Tensor> rv,
           std::optional<af::Tensor> w, std::optional<af::Tensor> b, bool training, double momentum, double eps) {
          EngineCall call;
          return af::batch_norm(x, opt_tensor(w), opt_tensor(b), opt_tensor(rm), opt_tensor(rv), training, momentum, eps);
        },
        nb::arg("input"), nb::arg("running_mean").none(), nb::arg("running_var").none(),
        nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(), nb::arg("training") = false,
        nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5);
  m.def("layer_norm",
        [](const af::Tensor& x, nb::handle shape, std::optional<af::Tensor> w, std::optional<af::Tensor> b, double eps) {
          return af::layer_norm(x, shape_from_sequence(shape, "normalized_shape"), opt_tensor(w), opt_tensor(b), eps);
        },
        nb::arg("input"), nb::arg("normalized_shape"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
        nb::arg("eps") = 1e-5);
  m.def("dropout", [](const af::Tensor& x, double p, bool training) { return af::dropout(x, p, training); },
        nb::arg("input"), nb::arg("p") = 0.5, nb::arg("training") = true);
  m.def("embedding",
        [](const af::Tensor& idx, const af::Tensor& w, std::optional<int64_t> padding_idx) {
          return af::embedding(idx, w, padding_idx.value_or(-1));
        },
        nb::arg("input"), nb::arg("weight"), nb::arg("padding_idx") = nb::none());
  m.def("cross_entropy",
        [](const af::Tensor& logits, const af::Tensor& target, int64_t ignore_index, const std::string& reduction,
           double label_smoothing) {
          af::CrossEntropyAttrs a;
          a.ignore_index = ignore_index;
          a.reduction = reduction_from(reduction);
          a.label_smoothing = label_smoothing;
          return af::cross_entropy(logits, target, a);
        },
        nb::arg("input"), nb::arg("target"), nb::arg("ignore_index") = -100, nb::arg("reduction") = "mean",
        nb::arg("label_smoothing") = 0.0,
        "Cross-entropy of (N, C) logits against (N) int64 class indices, as torch.nn.functional.cross_entropy.");
  m.def("binary_cross_entropy_with_logits",
        [](const af::Tensor& logits, const af::Tensor& target, const std::string& reduction) {
          return af::binary_cross_entropy_with_logits(logits, target, reduction_from(reduction));
        },
        nb::arg("input"), nb::arg("target"), nb::arg("reduction") = "mean");
  m.def("scaled_dot_product_attention",
        [](const af::Tensor& q, const af::Tensor& k, const af::Tensor& v, std::optional<af::Tensor> mask,
           bool causal, std::optional<double> scale) {
          EngineCall call;
          return af::scaled_dot_product_attention(q, k, v, opt_tensor(mask), causal, scale.value_or(0));
        },
        nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("attn_mask") = nb::none(),
        nb::arg("is_causal") = false, nb::arg("scale") = nb::none());
  m.def("upsample_nearest2d", [](const af::Tensor& x, int64_t sh, int64_t sw) { return af::upsample_nearest2d(x, sh, sw); },
        nb::arg("input"), nb::arg("scale_h") = 2, nb::arg("scale_w") = 2);
}

}  // namespace ampforge::python
