// Parity samples of the tensor core: elementwise, reductions, views, cat/stack/split, matmul, linear.
// Input ranges keep every sample away from the points where an op is not differentiable (or where FD in
// F64 cannot resolve it): positive inputs for log/sqrt/rsqrt/pow bases, clamp bounds and relu/abs kinks
// are hit with probability ~ step/range ~ 1e-5 per element, and the seeds are fixed.
#include <optional>

#include "ampforge/autograd/functions.h"
#include "registry.h"

namespace ampforge::parity {

namespace {

using Ins = std::vector<Tensor>;
using Outs = std::vector<Tensor>;

std::vector<int64_t> dims_of(const json& a, const char* key = "dims") { return a.at(key).get<std::vector<int64_t>>(); }

void add(std::vector<Case>& out, std::string name, std::string op, json attrs, std::vector<InputSpec> inputs, CaseFn fn) {
  Case c;
  c.name = std::move(name);
  c.op = std::move(op);
  c.attrs = std::move(attrs);
  c.inputs = std::move(inputs);
  c.fn = std::move(fn);
  out.push_back(std::move(c));
}

// A unary function of one input, sampled on a contiguous and a non-contiguous (transposed) input.
void unary_cases(std::vector<Case>& out, const std::string& op, Tensor (*f)(const Tensor&), const std::string& gen,
                 double lo = 0, double hi = 1) {
  add(out, op, op, json::object(), {in("x", {3, 5}, gen, lo, hi)}, [f](const Ins& x, const json&) { return Outs{f(x[0])}; });
  add(out, op + "_transposed", op, json::object(), {with_layout(in("x", {2, 4, 3}, gen, lo, hi), "transposed")},
      [f](const Ins& x, const json&) { return Outs{f(x[0])}; });
}

void binary_cases(std::vector<Case>& out, const std::string& op, Tensor (*f)(const Tensor&, const Tensor&),
                  const std::string& gen_a, double lo_a, double hi_a, const std::string& gen_b, double lo_b, double hi_b) {
  auto call = [f](const Ins& x, const json&) { return Outs{f(x[0], x[1])}; };
  add(out, op, op, json::object(), {in("a", {3, 4}, gen_a, lo_a, hi_a), in("b", {3, 4}, gen_b, lo_b, hi_b)}, call);
  add(out, op + "_broadcast", op, json::object(),
      {in("a", {2, 1, 4}, gen_a, lo_a, hi_a), in("b", {3, 1}, gen_b, lo_b, hi_b)}, call);
  add(out, op + "_noncontig", op, json::object(),
      {with_layout(in("a", {3, 4}, gen_a, lo_a, hi_a), "transposed"), with_layout(in("b", {3, 4}, gen_b, lo_b, hi_b), "strided")},
      call);
  add(out, op + "_scalar_tensor", op, json::object(), {in("a", {2, 3}, gen_a, lo_a, hi_a), in("b", {}, gen_b, lo_b, hi_b)},
      call);
}

}  // namespace

void register_core_samples(std::vector<Case>& out) {
  // ---- elementwise unary -------------------------------------------------------------------------
  unary_cases(out, "neg", [](const Tensor& x) { return neg(x); }, "randn");
  unary_cases(out, "abs", [](const Tensor& x) { return abs(x); }, "randn");
  unary_cases(out, "exp", [](const Tensor& x) { return exp(x); }, "randn");
  unary_cases(out, "log", [](const Tensor& x) { return log(x); }, "uniform", 0.5, 2.0);
  unary_cases(out, "sqrt", [](const Tensor& x) { return sqrt(x); }, "uniform", 0.5, 2.0);
  unary_cases(out, "rsqrt", [](const Tensor& x) { return rsqrt(x); }, "uniform", 0.5, 2.0);
  unary_cases(out, "relu", [](const Tensor& x) { return relu(x); }, "randn");
  unary_cases(out, "silu", [](const Tensor& x) { return silu(x); }, "randn");
  unary_cases(out, "sigmoid", [](const Tensor& x) { return sigmoid(x); }, "randn");
  unary_cases(out, "tanh", [](const Tensor& x) { return tanh(x); }, "randn");
  unary_cases(out, "atan", [](const Tensor& x) { return atan(x); }, "uniform", -3.0, 3.0);
  add(out, "gelu", "gelu", {{"approximate", "none"}}, {in("x", {3, 5}, "uniform", -3, 3)},
      [](const Ins& x, const json&) { return Outs{gelu(x[0], GeluApprox::None)}; });
  add(out, "gelu_tanh", "gelu", {{"approximate", "tanh"}}, {with_layout(in("x", {2, 4, 3}, "uniform", -3, 3), "transposed")},
      [](const Ins& x, const json&) { return Outs{gelu(x[0], GeluApprox::Tanh)}; });
  add(out, "gelu_channels_last", "gelu", {{"approximate", "none"}},
      {with_layout(in("x", {2, 3, 2, 2}, "randn"), "channels_last")},
      [](const Ins& x, const json&) { return Outs{gelu(x[0], GeluApprox::None)}; });
  for (double s : {2.5, -0.75}) {
    const std::string tag = s > 0 ? "" : "_neg";
    add(out, "add_scalar" + tag, "add_scalar", {{"scalar", s}}, {in("x", {3, 4})},
        [](const Ins& x, const json& a) { return Outs{add(x[0], a["scalar"].get<double>())}; });
    add(out, "mul_scalar" + tag, "mul_scalar", {{"scalar", s}}, {with_layout(in("x", {3, 4}), "strided")},
        [](const Ins& x, const json& a) { return Outs{mul(x[0], a["scalar"].get<double>())}; });
  }
  for (double e : {2.0, 3.5, -1.5}) {
    const std::string tag = e == 2.0 ? "2" : (e > 0 ? "3_5" : "m1_5");
    add(out, "pow_scalar_" + tag, "pow_scalar", {{"exponent", e}}, {in("x", {3, 4}, "uniform", 0.5, 2.0)},
        [](const Ins& x, const json& a) { return Outs{pow(x[0], a["exponent"].get<double>())}; });
  }
  add(out, "pow_scalar_square_of_negative", "pow_scalar", {{"exponent", 2.0}}, {in("x", {3, 4})},
      [](const Ins& x, const json& a) { return Outs{pow(x[0], a["exponent"].get<double>())}; });
  auto clamp_case = [&](const std::string& name, json a) {
    add(out, name, "clamp", a, {in("x", {4, 5}, "uniform", -2, 2)}, [](const Ins& x, const json& a) {
      std::optional<double> lo, hi;
      if (!a["min"].is_null()) lo = a["min"].get<double>();
      if (!a["max"].is_null()) hi = a["max"].get<double>();
      return Outs{clamp(x[0], lo, hi)};
    });
  };
  clamp_case("clamp", {{"min", -0.5}, {"max", 0.75}});
  clamp_case("clamp_min", {{"min", 0.1}, {"max", nullptr}});
  clamp_case("clamp_max", {{"min", nullptr}, {"max", -0.2}});

  // ---- elementwise binary (broadcasting, non-contiguous, 0-d operand) -------------------------------
  binary_cases(out, "add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, "randn", 0, 1, "randn", 0, 1);
  binary_cases(out, "sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, "randn", 0, 1, "randn", 0, 1);
  binary_cases(out, "mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, "randn", 0, 1, "randn", 0, 1);
  binary_cases(out, "div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, "randn", 0, 1, "uniform", 0.5, 2);
  binary_cases(out, "pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, "uniform", 0.5, 2, "uniform", -2, 2);
  binary_cases(out, "maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, "randn", 0, 1, "randn", 0, 1);
  binary_cases(out, "minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, "randn", 0, 1, "randn", 0, 1);
  add(out, "add_channels_last", "add", json::object(),
      {with_layout(in("a", {2, 3, 2, 3}), "channels_last"), in("b", {3, 1, 1})},
      [](const Ins& x, const json&) { return Outs{add(x[0], x[1])}; });
  add(out, "where", "where", json::object(), {in("cond", {3, 4}, "bernoulli", 0.5), in("a", {3, 4}), in("b", {3, 4})},
      [](const Ins& x, const json&) { return Outs{where(x[0], x[1], x[2])}; });
  add(out, "where_broadcast", "where", json::object(),
      {in("cond", {2, 1, 4}, "bernoulli", 0.5), with_layout(in("a", {3, 4}), "transposed"), in("b", {2, 3, 1})},
      [](const Ins& x, const json&) { return Outs{where(x[0], x[1], x[2])}; });

  // ---- reductions -----------------------------------------------------------------------------------
  auto reduce_case = [&](const std::string& name, const std::string& op, Shape shape, json a, std::string layout,
                         Tensor (*f)(const Tensor&, const std::vector<int64_t>&, bool)) {
    add(out, name, op, a, {with_layout(in("x", shape), layout)},
        [f](const Ins& x, const json& a) { return Outs{f(x[0], dims_of(a), a["keepdim"].get<bool>())}; });
  };
  using RF = Tensor (*)(const Tensor&, const std::vector<int64_t>&, bool);
  const RF fsum = [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); };
  const RF fmean = [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); };
  const RF famax = [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amax(x, d, k); };
  const RF famin = [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amin(x, d, k); };
  reduce_case("sum_all", "sum", {3, 4, 5}, {{"dims", json::array()}, {"keepdim", false}}, "contiguous", fsum);
  reduce_case("sum_dim1_keepdim", "sum", {3, 4, 5}, {{"dims", {1}}, {"keepdim", true}}, "transposed", fsum);
  reduce_case("sum_dims02", "sum", {3, 4, 5}, {{"dims", {0, 2}}, {"keepdim", false}}, "strided", fsum);
  reduce_case("sum_long_row", "sum", {2, 256}, {{"dims", {1}}, {"keepdim", false}}, "contiguous", fsum);
  reduce_case("sum_channels_last", "sum", {2, 3, 2, 2}, {{"dims", {1}}, {"keepdim", true}}, "channels_last", fsum);
  reduce_case("mean_all", "mean", {3, 4, 5}, {{"dims", json::array()}, {"keepdim", false}}, "contiguous", fmean);
  reduce_case("mean_dim_neg1", "mean", {3, 4, 5}, {{"dims", {-1}}, {"keepdim", false}}, "transposed", fmean);
  reduce_case("mean_dims01_keepdim", "mean", {3, 4, 5}, {{"dims", {0, 1}}, {"keepdim", true}}, "contiguous", fmean);
  reduce_case("amax_all", "amax", {3, 4, 5}, {{"dims", json::array()}, {"keepdim", false}}, "contiguous", famax);
  reduce_case("amax_dim1", "amax", {3, 4, 5}, {{"dims", {1}}, {"keepdim", true}}, "transposed", famax);
  reduce_case("amin_dims02", "amin", {3, 4, 5}, {{"dims", {0, 2}}, {"keepdim", false}}, "contiguous", famin);
  reduce_case("amin_dim_neg1", "amin", {3, 4, 5}, {{"dims", {-1}}, {"keepdim", false}}, "strided", famin);
  for (int64_t corr : {1, 0}) {
    add(out, "var_dim1_c" + std::to_string(corr), "var", {{"dims", {1}}, {"correction", corr}, {"keepdim", false}},
        {in("x", {3, 6, 2})}, [](const Ins& x, const json& a) {
          return Outs{var(x[0], dims_of(a), a["correction"].get<int64_t>(), a["keepdim"].get<bool>())};
        });
  }
  add(out, "var_all_transposed", "var", {{"dims", json::array()}, {"correction", 1}, {"keepdim", false}},
      {with_layout(in("x", {4, 5}), "transposed")}, [](const Ins& x, const json& a) {
        return Outs{var(x[0], dims_of(a), a["correction"].get<int64_t>(), a["keepdim"].get<bool>())};
      });
  add(out, "max_dim", "max_dim", {{"dim", 1}, {"keepdim", false}}, {in("x", {3, 5, 2})},
      [](const Ins& x, const json& a) { return Outs{max(x[0], a["dim"].get<int64_t>(), a["keepdim"].get<bool>()).first}; });
  add(out, "min_dim_keepdim", "min_dim", {{"dim", -1}, {"keepdim", true}}, {with_layout(in("x", {3, 5}), "transposed")},
      [](const Ins& x, const json& a) { return Outs{min(x[0], a["dim"].get<int64_t>(), a["keepdim"].get<bool>()).first}; });

  // ---- views and shape functions (composites of the view ops) --------------------------------------
  add(out, "reshape_of_transposed", "reshape", {{"shape", {4, -1}}}, {with_layout(in("x", {2, 3, 4}), "transposed")},
      [](const Ins& x, const json& a) { return Outs{mul(reshape(x[0], Shape(a["shape"].get<std::vector<int64_t>>())), x[0].sum())}; });
  add(out, "permute", "permute", {{"dims", {2, 0, 1}}}, {in("x", {2, 3, 4})},
      [](const Ins& x, const json& a) { return Outs{exp(permute(x[0], dims_of(a)))}; });
  add(out, "transpose", "transpose", {{"dim0", 0}, {"dim1", 2}}, {in("x", {2, 3, 4})}, [](const Ins& x, const json& a) {
    return Outs{tanh(transpose(x[0], a["dim0"].get<int64_t>(), a["dim1"].get<int64_t>()))};
  });
  add(out, "narrow", "narrow", {{"dim", 1}, {"start", 1}, {"length", 2}}, {in("x", {3, 4, 2})},
      [](const Ins& x, const json& a) {
        return Outs{narrow(x[0], a["dim"].get<int64_t>(), a["start"].get<int64_t>(), a["length"].get<int64_t>())};
      });
  add(out, "slice_step2", "slice", {{"dim", 1}, {"start", 1}, {"end", 6}, {"step", 2}}, {in("x", {3, 6})},
      [](const Ins& x, const json& a) {
        return Outs{slice(x[0], a["dim"].get<int64_t>(), a["start"].get<int64_t>(), a["end"].get<int64_t>(),
                          a["step"].get<int64_t>())};
      });
  add(out, "select_neg", "select", {{"dim", 0}, {"index", -1}}, {in("x", {3, 4})},
      [](const Ins& x, const json& a) { return Outs{select(x[0], a["dim"].get<int64_t>(), a["index"].get<int64_t>())}; });
  add(out, "expand", "expand", {{"shape", {2, 3, 4}}}, {in("x", {3, 1})},
      [](const Ins& x, const json& a) { return Outs{mul(expand(x[0], Shape(a["shape"].get<std::vector<int64_t>>())), 1.5)}; });
  add(out, "squeeze_unsqueeze", "squeeze_unsqueeze", {{"squeeze", 1}, {"unsqueeze", 0}}, {in("x", {3, 1, 4})},
      [](const Ins& x, const json& a) {
        return Outs{unsqueeze(squeeze(x[0], a["squeeze"].get<int64_t>()), a["unsqueeze"].get<int64_t>())};
      });
  add(out, "flatten", "flatten", {{"start_dim", 1}, {"end_dim", -1}}, {with_layout(in("x", {2, 3, 2, 2}), "channels_last")},
      [](const Ins& x, const json& a) {
        return Outs{flatten(x[0], a["start_dim"].get<int64_t>(), a["end_dim"].get<int64_t>())};
      });
  add(out, "contiguous_channels_last", "contiguous", {{"memory_format", "channels_last"}}, {in("x", {2, 3, 2, 2})},
      [](const Ins& x, const json&) { return Outs{sigmoid(contiguous(x[0], MemoryFormat::ChannelsLast))}; });
  add(out, "clone", "clone", json::object(), {with_layout(in("x", {3, 4}), "strided")},
      [](const Ins& x, const json&) { return Outs{clone(x[0])}; });
  add(out, "cat_dim1", "cat", {{"dim", 1}}, {in("a", {2, 3}), with_layout(in("b", {2, 2}), "transposed"), in("c", {2, 1})},
      [](const Ins& x, const json& a) { return Outs{cat({x[0], x[1], x[2]}, a["dim"].get<int64_t>())}; });
  add(out, "cat_dim0_3d", "cat", {{"dim", 0}}, {in("a", {1, 2, 3}), in("b", {2, 2, 3})},
      [](const Ins& x, const json& a) { return Outs{cat({x[0], x[1]}, a["dim"].get<int64_t>())}; });
  add(out, "stack_dim_neg1", "stack", {{"dim", -1}}, {in("a", {2, 3}), with_layout(in("b", {2, 3}), "strided")},
      [](const Ins& x, const json& a) { return Outs{stack({x[0], x[1]}, a["dim"].get<int64_t>())}; });
  add(out, "split_piece", "split", {{"split_size", 2}, {"dim", 1}, {"piece", 1}}, {in("x", {3, 5})},
      [](const Ins& x, const json& a) {
        return Outs{split(x[0], a["split_size"].get<int64_t>(), a["dim"].get<int64_t>())[a["piece"].get<size_t>()]};
      });
  add(out, "chunk_piece", "chunk", {{"chunks", 3}, {"dim", 0}, {"piece", 2}}, {in("x", {7, 2})},
      [](const Ins& x, const json& a) {
        return Outs{chunk(x[0], a["chunks"].get<int64_t>(), a["dim"].get<int64_t>())[a["piece"].get<size_t>()]};
      });

  // ---- linear algebra -------------------------------------------------------------------------------
  auto mm = [](const Ins& x, const json&) { return Outs{matmul(x[0], x[1])}; };
  add(out, "matmul_2d", "matmul", json::object(), {in("a", {3, 4}), in("b", {4, 5})}, mm);
  add(out, "matmul_transposed", "matmul", json::object(),
      {with_layout(in("a", {3, 4}), "transposed"), with_layout(in("b", {4, 5}), "transposed")}, mm);
  add(out, "matmul_batched_broadcast", "matmul", json::object(), {in("a", {2, 1, 3, 4}), in("b", {3, 4, 2})}, mm);
  add(out, "matmul_vec_mat", "matmul", json::object(), {in("a", {4}), in("b", {2, 4, 3})}, mm);
  add(out, "matmul_mat_vec", "matmul", json::object(), {in("a", {3, 4}), in("b", {4})}, mm);
  add(out, "matmul_dot", "matmul", json::object(), {in("a", {5}), in("b", {5})}, mm);
  add(out, "matmul_long_k", "matmul", json::object(), {in("a", {2, 64}), in("b", {64, 3})}, mm);
  add(out, "linear_bias", "linear", json::object(), {in("x", {4, 3}), in("w", {5, 3}), in("b", {5})},
      [](const Ins& x, const json&) { return Outs{linear(x[0], x[1], x[2])}; });
  add(out, "linear_nobias_3d", "linear", json::object(),
      {in("x", {2, 3, 4}), with_layout(in("w", {2, 4}), "transposed")},
      [](const Ins& x, const json&) { return Outs{linear(x[0], x[1])}; });
  add(out, "linear_input_no_grad", "linear", json::object(), {no_grad(in("x", {3, 4})), in("w", {2, 4}), in("b", {2})},
      [](const Ins& x, const json&) { return Outs{linear(x[0], x[1], x[2])}; });
}

}  // namespace ampforge::parity
