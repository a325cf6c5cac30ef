// Parity samples of the neural-network functions: convolution, pooling, upsampling, normalisation,
// softmax, losses, embedding, dropout, attention. Kept apart from the tensor-core samples because these
// functions were written concurrently with the harness (see tests/parity/README.md).
#include "ampforge/autograd/functions.h"
#include "registry.h"

namespace ampforge::parity {

namespace {

using Ins = std::vector<Tensor>;
using Outs = std::vector<Tensor>;

void add(std::vector<Case>& out, std::string name, std::string op, json attrs, std::vector<InputSpec> inputs, CaseFn fn) {
  Case c;
  c.name = std::move(name);
  c.op = std::move(op);
  c.attrs = std::move(attrs);
  c.inputs = std::move(inputs);
  c.fn = std::move(fn);
  out.push_back(std::move(c));
}

void pair_of(const json& a, const char* key, int64_t (&dst)[2]) {
  auto v = a.at(key).get<std::vector<int64_t>>();
  dst[0] = v.at(0);
  dst[1] = v.at(1);
}

Conv2dAttrs conv_attrs(const json& a) {
  Conv2dAttrs c;
  pair_of(a, "stride", c.stride);
  pair_of(a, "padding", c.padding);
  pair_of(a, "dilation", c.dilation);
  c.groups = a.at("groups").get<int64_t>();
  return c;
}

Pool2dAttrs pool_attrs(const json& a) {
  Pool2dAttrs p;
  pair_of(a, "kernel", p.kernel);
  pair_of(a, "stride", p.stride);
  pair_of(a, "padding", p.padding);
  if (a.contains("dilation")) pair_of(a, "dilation", p.dilation);
  p.ceil_mode = a.at("ceil_mode").get<bool>();
  if (a.contains("count_include_pad")) p.count_include_pad = a["count_include_pad"].get<bool>();
  return p;
}

Reduction reduction_of(const json& a) {
  const std::string r = a.at("reduction").get<std::string>();
  return r == "none" ? Reduction::None : (r == "sum" ? Reduction::Sum : Reduction::Mean);
}

json conv_json(std::vector<int> stride, std::vector<int> padding, std::vector<int> dilation, int groups) {
  return {{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
}

}  // namespace

void register_nn_samples(std::vector<Case>& out) {
  // ---- conv2d: stride / padding / dilation / groups / bias / channels-last ---------------------------
  auto conv_b = [](const Ins& x, const json& a) { return Outs{conv2d(x[0], x[1], x[2], conv_attrs(a))}; };
  auto conv_nb = [](const Ins& x, const json& a) { return Outs{conv2d(x[0], x[1], Tensor(), conv_attrs(a))}; };
  add(out, "conv2d_pad1", "conv2d", conv_json({1, 1}, {1, 1}, {1, 1}, 1),
      {in("x", {2, 3, 5, 5}), in("w", {4, 3, 3, 3}), in("b", {4})}, conv_b);
  add(out, "conv2d_stride2_nobias", "conv2d", conv_json({2, 2}, {0, 0}, {1, 1}, 1),
      {in("x", {2, 3, 6, 5}), in("w", {2, 3, 3, 2})}, conv_nb);
  add(out, "conv2d_groups2", "conv2d", conv_json({1, 1}, {1, 0}, {1, 1}, 2),
      {in("x", {1, 4, 4, 4}), in("w", {6, 2, 3, 3}), in("b", {6})}, conv_b);
  add(out, "conv2d_depthwise", "conv2d", conv_json({1, 1}, {1, 1}, {1, 1}, 3),
      {in("x", {2, 3, 4, 4}), in("w", {3, 1, 3, 3}), in("b", {3})}, conv_b);
  add(out, "conv2d_dilation2", "conv2d", conv_json({1, 1}, {2, 2}, {2, 2}, 1),
      {in("x", {1, 2, 5, 5}), in("w", {3, 2, 3, 3}), in("b", {3})}, conv_b);
  add(out, "conv2d_asym_stride_pad", "conv2d", conv_json({2, 1}, {1, 0}, {1, 1}, 1),
      {in("x", {2, 2, 5, 4}), in("w", {3, 2, 2, 3}), in("b", {3})}, conv_b);
  add(out, "conv2d_channels_last", "conv2d", conv_json({1, 1}, {1, 1}, {1, 1}, 1),
      {with_layout(in("x", {2, 3, 4, 4}), "channels_last"), with_layout(in("w", {4, 3, 3, 3}), "channels_last"), in("b", {4})},
      conv_b);
  add(out, "conv2d_1x1_channels_last_groups", "conv2d", conv_json({1, 1}, {0, 0}, {1, 1}, 2),
      {with_layout(in("x", {2, 4, 3, 3}), "channels_last"), in("w", {4, 2, 1, 1})}, conv_nb);

  // ---- pooling and upsampling ------------------------------------------------------------------------
  auto maxp = [](const Ins& x, const json& a) { return Outs{max_pool2d(x[0], pool_attrs(a))}; };
  auto avgp = [](const Ins& x, const json& a) { return Outs{avg_pool2d(x[0], pool_attrs(a))}; };
  add(out, "max_pool2d_k3s2p1", "max_pool2d",
      {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}, {"dilation", {1, 1}}, {"ceil_mode", false}},
      {in("x", {2, 2, 5, 5})}, maxp);
  add(out, "max_pool2d_k2_channels_last", "max_pool2d",
      {{"kernel", {2, 2}}, {"stride", {2, 2}}, {"padding", {0, 0}}, {"dilation", {1, 1}}, {"ceil_mode", false}},
      {with_layout(in("x", {2, 3, 4, 6}), "channels_last")}, maxp);
  add(out, "max_pool2d_dilation_ceil", "max_pool2d",
      {{"kernel", {2, 3}}, {"stride", {2, 2}}, {"padding", {0, 1}}, {"dilation", {2, 1}}, {"ceil_mode", true}},
      {in("x", {1, 2, 6, 5})}, maxp);
  // SPPF's pool (YOLOv8): kernel 5, stride 1, padding 2 keeps the size; the padding is -inf, not zero.
  add(out, "max_pool2d_k5s1p2", "max_pool2d",
      {{"kernel", {5, 5}}, {"stride", {1, 1}}, {"padding", {2, 2}}, {"dilation", {1, 1}}, {"ceil_mode", false}},
      {with_layout(in("x", {2, 3, 6, 5}), "channels_last")}, maxp);
  add(out, "avg_pool2d_k3s2p1", "avg_pool2d",
      {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}, {"ceil_mode", false}, {"count_include_pad", true}},
      {in("x", {2, 2, 5, 5})}, avgp);
  add(out, "avg_pool2d_exclude_pad", "avg_pool2d",
      {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}, {"ceil_mode", false}, {"count_include_pad", false}},
      {with_layout(in("x", {2, 3, 5, 4}), "channels_last")}, avgp);
  add(out, "avg_pool2d_ceil", "avg_pool2d",
      {{"kernel", {2, 2}}, {"stride", {2, 2}}, {"padding", {0, 0}}, {"ceil_mode", true}, {"count_include_pad", true}},
      {in("x", {1, 2, 5, 5})}, avgp);
  auto adaptive = [](const Ins& x, const json& a) {
    const auto o = a.at("output_size").get<std::vector<int64_t>>();
    return Outs{adaptive_avg_pool2d(x[0], o.at(0), o.at(1))};
  };
  add(out, "adaptive_avg_pool2d_uneven", "adaptive_avg_pool2d", {{"output_size", {3, 2}}}, {in("x", {2, 2, 5, 5})},
      adaptive);
  add(out, "adaptive_avg_pool2d_global_cl", "adaptive_avg_pool2d", {{"output_size", {1, 1}}},
      {with_layout(in("x", {2, 3, 3, 4}), "channels_last")}, adaptive);
  auto ups = [](const Ins& x, const json& a) {
    return Outs{upsample_nearest2d(x[0], a.at("scale_h").get<int64_t>(), a.at("scale_w").get<int64_t>())};
  };
  add(out, "upsample_nearest2d_x2", "upsample_nearest2d", {{"scale_h", 2}, {"scale_w", 2}}, {in("x", {2, 2, 3, 3})}, ups);
  add(out, "upsample_nearest2d_2x3_cl", "upsample_nearest2d", {{"scale_h", 2}, {"scale_w", 3}},
      {with_layout(in("x", {1, 3, 2, 2}), "channels_last")}, ups);

  // ---- batch_norm (train: batch statistics + running-stat update; eval: running statistics) --------
  // Running statistics are state, not differentiable inputs; they stay F32 in 16-bit runs (cast16 off),
  // and their updated values are compared as extra outputs.
  auto stats = [](InputSpec s) {
    s.requires_grad = false;
    s.cast16 = false;
    return s;
  };
  auto bn = [](const Ins& x, const json& a) {
    Tensor rm = x.size() > 3 ? x[3] : Tensor(), rv = x.size() > 4 ? x[4] : Tensor();
    Tensor y = batch_norm(x[0], x[1], x[2], rm, rv, a.at("training").get<bool>(), a.at("momentum").get<double>(),
                          a.at("eps").get<double>());
    Outs o{y};
    if (rm.defined() && a.at("training").get<bool>()) o.push_back(rm), o.push_back(rv);
    return o;
  };
  const json bn_train = {{"training", true}, {"momentum", 0.1}, {"eps", 1e-5}};
  const json bn_eval = {{"training", false}, {"momentum", 0.1}, {"eps", 1e-5}};
  add(out, "batch_norm_train", "batch_norm", bn_train,
      {in("x", {4, 3, 2, 2}), in("w", {3}), in("b", {3}), stats(in("running_mean", {3})),
       stats(in("running_var", {3}, "uniform", 0.5, 2))},
      bn);
  add(out, "batch_norm_train_channels_last", "batch_norm", bn_train,
      {with_layout(in("x", {3, 4, 2, 3}), "channels_last"), in("w", {4}), in("b", {4}), stats(in("running_mean", {4})),
       stats(in("running_var", {4}, "uniform", 0.5, 2))},
      bn);
  add(out, "batch_norm_train_2d_no_stats", "batch_norm", bn_train, {in("x", {6, 4}), in("w", {4}), in("b", {4})}, bn);
  add(out, "batch_norm_eval", "batch_norm", bn_eval,
      {in("x", {2, 3, 3, 2}), in("w", {3}), in("b", {3}), stats(in("running_mean", {3})),
       stats(in("running_var", {3}, "uniform", 0.5, 2))},
      bn);
  add(out, "batch_norm_eval_channels_last", "batch_norm", bn_eval,
      {with_layout(in("x", {2, 3, 2, 2}), "channels_last"), in("w", {3}), in("b", {3}), stats(in("running_mean", {3})),
       stats(in("running_var", {3}, "uniform", 0.5, 2))},
      bn);

  // ---- layer_norm ------------------------------------------------------------------------------------
  auto ln = [](const Ins& x, const json& a) {
    const Shape ns(a.at("normalized_shape").get<std::vector<int64_t>>());
    return Outs{layer_norm(x[0], ns, x.size() > 1 ? x[1] : Tensor(), x.size() > 2 ? x[2] : Tensor(), a.at("eps").get<double>())};
  };
  add(out, "layer_norm_affine", "layer_norm", {{"normalized_shape", {5}}, {"eps", 1e-5}},
      {in("x", {2, 3, 5}), in("w", {5}), in("b", {5})}, ln);
  add(out, "layer_norm_2d_shape_transposed", "layer_norm", {{"normalized_shape", {3, 4}}, {"eps", 1e-5}},
      {with_layout(in("x", {2, 3, 4}), "transposed"), in("w", {3, 4}), in("b", {3, 4})}, ln);
  add(out, "layer_norm_no_affine", "layer_norm", {{"normalized_shape", {6}}, {"eps", 1e-3}}, {in("x", {4, 6})}, ln);

  // ---- softmax / log_softmax ----------------------------------------------------------------------
  auto sm = [](const Ins& x, const json& a) { return Outs{softmax(x[0], a.at("dim").get<int64_t>())}; };
  auto lsm = [](const Ins& x, const json& a) { return Outs{log_softmax(x[0], a.at("dim").get<int64_t>())}; };
  add(out, "softmax_last", "softmax", {{"dim", -1}}, {in("x", {3, 7})}, sm);
  add(out, "softmax_dim0_transposed", "softmax", {{"dim", 0}}, {with_layout(in("x", {4, 3, 2}), "transposed")}, sm);
  add(out, "softmax_channels_last", "softmax", {{"dim", 1}}, {with_layout(in("x", {2, 3, 2, 2}), "channels_last")}, sm);
  add(out, "log_softmax_last", "log_softmax", {{"dim", -1}}, {in("x", {3, 7}, "uniform", -4, 4)}, lsm);
  add(out, "log_softmax_dim1_strided", "log_softmax", {{"dim", 1}}, {with_layout(in("x", {2, 5, 3}), "strided")}, lsm);

  // ---- cross_entropy (mean/sum/none, label smoothing, ignore_index out of and inside the class range) --
  auto ce = [](const Ins& x, const json& a) {
    CrossEntropyAttrs at;
    at.ignore_index = a.at("ignore_index").get<int64_t>();
    at.label_smoothing = a.at("label_smoothing").get<double>();
    at.reduction = reduction_of(a);
    return Outs{cross_entropy(x[0], x[1], at)};
  };
  auto ce_json = [](int64_t ignore, double smoothing, const char* red) {
    return json{{"ignore_index", ignore}, {"label_smoothing", smoothing}, {"reduction", red}};
  };
  auto target = [](Shape s, int64_t classes, int64_t ignore_every = 0, int64_t ignore_value = -100) {
    InputSpec t = in("target", s, "int", 0, static_cast<double>(classes));
    t.ignore_every = ignore_every;
    t.ignore_value = ignore_value;
    return t;
  };
  add(out, "cross_entropy_mean", "cross_entropy", ce_json(-100, 0.0, "mean"), {in("logits", {5, 4}), target({5}, 4)}, ce);
  add(out, "cross_entropy_sum_smoothing", "cross_entropy", ce_json(-100, 0.1, "sum"),
      {in("logits", {6, 5}, "uniform", -3, 3), target({6}, 5)}, ce);
  add(out, "cross_entropy_none", "cross_entropy", ce_json(-100, 0.0, "none"),
      {with_layout(in("logits", {4, 3}), "transposed"), target({4}, 3)}, ce);
  add(out, "cross_entropy_ignore_index", "cross_entropy", ce_json(-100, 0.0, "mean"),
      {in("logits", {7, 4}), target({7}, 4, 3, -100)}, ce);
  add(out, "cross_entropy_ignore_in_range_smoothing", "cross_entropy", ce_json(1, 0.2, "mean"),
      {in("logits", {8, 4}), target({8}, 4, 4, 1)}, ce);
  add(out, "cross_entropy_ignore_none_smoothing", "cross_entropy", ce_json(-100, 0.15, "none"),
      {in("logits", {5, 3}), target({5}, 3, 2, -100)}, ce);

  // ---- binary_cross_entropy_with_logits -------------------------------------------------------------
  auto bce = [](const Ins& x, const json& a) { return Outs{binary_cross_entropy_with_logits(x[0], x[1], reduction_of(a))}; };
  for (const char* red : {"mean", "sum", "none"})
    add(out, std::string("bce_with_logits_") + red, "bce_with_logits", {{"reduction", red}},
        {in("logits", {3, 4}, "uniform", -4, 4), no_grad(in("target", {3, 4}, "uniform", 0, 1))}, bce);
  add(out, "bce_with_logits_hard_targets_noncontig", "bce_with_logits", {{"reduction", "mean"}},
      {with_layout(in("logits", {4, 3}), "transposed"), in("target", {4, 3}, "bernoulli", 0.5)},
      [](const Ins& x, const json& a) {
        return Outs{binary_cross_entropy_with_logits(x[0], to(x[1], x[0].dtype()), reduction_of(a))};
      });

  // ---- embedding -----------------------------------------------------------------------------------
  auto emb = [](const Ins& x, const json& a) { return Outs{embedding(x[0], x[1], a.at("padding_idx").get<int64_t>())}; };
  add(out, "embedding", "embedding", {{"padding_idx", -1}}, {in("indices", {2, 5}, "int", 0, 6), in("weight", {6, 3})}, emb);
  add(out, "embedding_padding_idx", "embedding", {{"padding_idx", 2}},
      {in("indices", {3, 4}, "int", 0, 5), in("weight", {5, 4})}, emb);

  // ---- dropout -------------------------------------------------------------------------------------
  // p = 0 and eval are the identity. The fixed-mask case draws the mask from a generator seeded inside the
  // function (deterministic, so FD works); the golden multiplies by the same mask, stored as an input.
  auto drop = [](const Ins& x, const json& a) {
    Generator g(a.at("seed").get<uint64_t>());
    return Outs{dropout(x[0], a.at("p").get<double>(), a.at("training").get<bool>(), &g)};
  };
  add(out, "dropout_p0", "dropout", {{"p", 0.0}, {"training", true}, {"seed", 7}}, {in("x", {3, 4})}, drop);
  add(out, "dropout_eval", "dropout", {{"p", 0.5}, {"training", false}, {"seed", 7}}, {in("x", {3, 4})}, drop);
  add(out, "dropout_fixed_mask", "dropout", {{"p", 0.25}, {"training", true}, {"seed", 1234}},
      {in("x", {4, 6}), in("mask", {4, 6}, "dropout_mask", 0.25, 1234)}, drop);

  // ---- scaled_dot_product_attention: the fused `attention` op where it applies (same dtype and leading dims),
  // the composite (matmul, where, softmax) otherwise (sdpa_broadcast_kv) ------------------------------------
  auto sdpa = [](const Ins& x, const json& a) {
    return Outs{scaled_dot_product_attention(x[0], x[1], x[2], x.size() > 3 ? x[3] : Tensor(), a.at("causal").get<bool>(),
                                             a.at("scale").get<double>())};
  };
  add(out, "sdpa", "attention", {{"causal", false}, {"scale", 0.0}},
      {in("q", {2, 2, 3, 4}), in("k", {2, 2, 5, 4}), in("v", {2, 2, 5, 3})}, sdpa);
  add(out, "sdpa_causal", "attention", {{"causal", true}, {"scale", 0.0}},
      {in("q", {1, 2, 4, 4}), with_layout(in("k", {1, 2, 4, 4}), "transposed"), in("v", {1, 2, 4, 2})}, sdpa);
  add(out, "sdpa_padding_mask", "attention", {{"causal", false}, {"scale", 0.3}},
      {in("q", {2, 1, 3, 4}), in("k", {2, 1, 5, 4}), in("v", {2, 1, 5, 3}), in("mask", {2, 1, 1, 5}, "bernoulli", 0.6)},
      sdpa);
  add(out, "sdpa_causal_and_padding", "attention", {{"causal", true}, {"scale", 0.0}},
      {in("q", {2, 2, 4, 3}), in("k", {2, 2, 4, 3}), in("v", {2, 2, 4, 3}), in("mask", {2, 1, 1, 4}, "bernoulli", 0.5)},
      sdpa);
  add(out, "sdpa_causal_tq_gt_tk", "attention", {{"causal", true}, {"scale", 0.0}},
      {in("q", {1, 2, 5, 3}), in("k", {1, 2, 3, 3}), in("v", {1, 2, 3, 4})}, sdpa);
  add(out, "sdpa_broadcast_kv", "scaled_dot_product_attention", {{"causal", false}, {"scale", 0.0}},
      {in("q", {2, 2, 3, 4}), in("k", {1, 2, 5, 4}), in("v", {1, 2, 5, 3})}, sdpa);
}

}  // namespace ampforge::parity
