// bert-tiny (BertForMaskedLM) against Hugging Face transformers' own BertForMaskedLM (transformers 5.x, its default
// "sdpa" attention; goldens tests/data/models/bert_parity.* made by scripts/gen_bert_golden.py; no Python at test
// time), and bert-base's state-dict keys, shapes and parameter counts against transformers' BertModel (with
// pooler) and BertForMaskedLM.
//
// Both sides hash the same weights (hashed_weights_test_util.h, stream = state-dict index); the generator loads them
// into transformers with from_pretrained as a checkpoint, which reports no missing, unexpected or mismatched key,
// and ampforge's state-dict keys must equal that list. Both read the same token ids, padding mask and MLM labels
// (stored in the golden), run one train-mode forward (dropout 0) and backward, and compare: the prediction scores at
// the masked positions (every 8th vocabulary column, plus each row's logsumexp / max / sum over all 30522 columns),
// the loss, and every parameter's gradient (sum, sum of |g|, L2 norm, max |g|, 32 values). In F32; under
// amp::Autocast(BF16) against torch.autocast("cpu", bfloat16); under amp::Autocast(F16) against
// torch.autocast("cpu", float16). The autocast policies differ in one place: PyTorch's CPU autocast leaves
// layer_norm (and GELU, softmax) in the 16-bit type, ampforge (as PyTorch's CUDA autocast) runs layer_norm in F32;
// both round every GEMM output, so each side is within its own rounding of the F64 answer, which is what the
// tolerances below allow.
//
// Tolerances: core/tolerance.h's table (rtol = atol = 8 eps) times a factor derived from this problem's measured
// sensitivity to rounding (the golden's rounding_vs_f64: transformers in F32, BF16 and F16 against itself in F64,
// same weights), doubled for two implementations erring in opposite directions, rounded up to a power of two:
//   F32 forward: transformers F32 vs F64 2.7e-7 of max |logit| (2.3 eps) -> 4.5 eps <= 8 eps: factor 1.
//   F32 gradients: 1.33e-6 of a tensor's max |g| (11.1 eps; its sdpa path, eager's is 8.2e-7) -> 22 eps: factor 4.
//   BF16 forward: transformers BF16 vs F64 3.3e-3 of max |logit| (0.43 BF16 eps) -> factor 1 (8 BF16 eps).
//   BF16 gradients: 1.87e-2 of a tensor's max |g| (2.4 BF16 eps) -> 4.8 eps: factor 1.
//   F16 forward: transformers F16 vs F64 4.2e-4 of max |logit| (0.43 F16 eps) -> factor 1 (8 F16 eps).
//   F16 gradients: 2.17e-3 of a tensor's max |g| (2.2 F16 eps) -> 4.5 eps: factor 1.
//   16-bit gradients, also: ampforge's RMS error against transformers' F32 answer stays within
//   kLowPrecisionAccuracy (2) of transformers' own 16-bit error.
// Measured (AMPFORGE_PARITY_VERBOSE=1; transformers 5.25, torch 2.14): worst error / bound 0.25 (forward) and 0.27
// (gradients) in F32, 0.04 / 0.13 in BF16, 0.04 / 0.22 in F16; 16-bit gradient RMS error vs F32: ampforge 0.0115,
// transformers 0.0118 (BF16); 0.0016 and 0.0016 (F16).
// The two attention.self.key.bias gradients are exactly 0 in exact arithmetic (softmax ignores a per-row
// constant); both sides return rounding noise, so they are checked against 0 relative to the key weight's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "ampforge/amp/autocast.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/models/parity_golden_testutil.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/models/bert.h"
#include "ampforge/models/hashed_weights_test_util.h"
#include "ampforge/nn/init.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
using namespace ampforge::models;
using nlohmann::json;

namespace {

const std::string kDir = std::string(AMPFORGE_TEST_DATA_DIR) + "/models";
constexpr const char* kRegenerate =
    "regenerate with HF_HUB_OFFLINE=1 .venv-peer/bin/python scripts/gen_bert_golden.py tests/data/models";
constexpr double kForwardFactorF32 = 1, kGradFactorF32 = 4, kForwardFactorBF16 = 1, kGradFactorBF16 = 1;
constexpr double kForwardFactorF16 = 1, kGradFactorF16 = 1;
constexpr int64_t kColStep = 8;
// ampforge's 16-bit gradients' RMS error against transformers' F32 answer, relative to transformers' own 16-bit
// error (both round every op output of the 16-bit type, in different places). Bound 2.
constexpr double kLowPrecisionAccuracy = 2;

bool verbose() {
  const char* v = std::getenv("AMPFORGE_PARITY_VERBOSE");
  return v && *v && std::string(v) != "0";
}

using ampforge::testutil::ParityGolden;

const ParityGolden& golden() {
  static const ParityGolden g = ampforge::testutil::load_parity_golden(kDir, "bert_parity", "BERT", kRegenerate);
  return g;
}

std::vector<double> f64(const Tensor& t) { return ops::to_dtype(t.detach(), DType::F64).tolist<double>(); }

// |a - e| <= rtol * |e| + atol * scale, scale = max(1, max |e|) unless given; prints the worst ratio if verbose.
void expect_close(const std::string& what, const std::vector<double>& a, const std::vector<double>& e, double rtol,
                  double atol, double scale = -1) {
  ASSERT_EQ(a.size(), e.size()) << what;
  if (scale < 0) {
    scale = 1;
    for (double v : e) scale = std::max(scale, std::abs(v));
  }
  double worst = 0;
  size_t at = 0;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double bound = rtol * std::abs(e[i]) + atol * scale, err = std::abs(a[i] - e[i]);
    const double r = bound > 0 ? err / bound : (err == 0 ? 0 : INFINITY);
    if (r > worst) worst = r, at = i;
    bad += r > 1;
  }
  if (verbose()) std::printf("  %-60s worst error/bound %.3f\n", what.c_str(), worst);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " values outside rtol " << rtol << " atol "
                    << atol << " (scale " << scale << "); worst at " << at << ": ampforge " << a[at]
                    << ", transformers " << e[at];
}

double rms(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

BertConfig tiny_without_dropout() {
  BertConfig c = bert_config("bert-tiny");
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  return c;
}

// precision: F32 (no autocast), BF16 or F16 (autocast, against transformers under torch.autocast of that type).
void check(DType precision, bool masked_only) {
  const ParityGolden& g = golden();
  ASSERT_TRUE(g.error.empty()) << g.error;
  const SafetensorsFile& f = g.file;
  const bool bf16 = precision == DType::BF16, f16 = precision == DType::F16;
  const std::string key = std::string("bert_tiny.") + (bf16 ? "bf16." : f16 ? "f16." : "f32.");
  BertConfig cfg = tiny_without_dropout();
  cfg.mlm_masked_positions_only = masked_only;
  BertForMaskedLM model(cfg);

  std::vector<std::string> sd_names, param_names;
  for (const auto& [n, t] : model.state_dict()) sd_names.push_back(n);
  for (const auto& [n, t] : model.named_parameters()) param_names.push_back(n);
  ASSERT_EQ(sd_names, g.manifest.at("state_dict").get<std::vector<std::string>>());
  ASSERT_EQ(param_names, g.manifest.at("parameters").get<std::vector<std::string>>());

  const std::vector<double> wsum = hashinit::set_hashed_weights(model), wsum_e = f64(f.at("bert_tiny.weight_sum"));
  ASSERT_EQ(wsum.size(), wsum_e.size());
  for (size_t i = 0; i < wsum.size(); ++i)
    ASSERT_NEAR(wsum[i], wsum_e[i], 1e-9 * (1 + std::abs(wsum_e[i]))) << "hashed weights of " << sd_names[i];
  const Tensor ids = f.at("bert_tiny.input_ids"), mask = f.at("bert_tiny.attention_mask");
  const Tensor labels = f.at("bert_tiny.labels");
  const int64_t V = cfg.vocab_size;

  model.train();
  Tensor loss, rows;
  {
    amp::Autocast ac(kCPU, f16 ? DType::F16 : DType::BF16, bf16 || f16);
    const MaskedTargets m = masked_targets(labels);
    rows = model.logits(ids, mask, m.positions);  // (M, V)
    ASSERT_EQ(rows.shape(), (Shape{5, V}));
    loss = model.mlm_loss(ids, mask, labels);
  }
  EXPECT_EQ(loss.dtype(), DType::F32);
  const ToleranceEntry t = tolerance(precision);
  const double ff = bf16 ? kForwardFactorBF16 : f16 ? kForwardFactorF16 : kForwardFactorF32;
  const double gf = bf16 ? kGradFactorBF16 : f16 ? kGradFactorF16 : kGradFactorF32;
  const std::string tag = std::string(bf16 ? "bf16" : f16 ? "f16" : "f32") + (masked_only ? " masked-only" : " all-positions");

  // Scores: every 8th column, and logsumexp / max / sum of each row over all columns.
  const std::vector<double> r = f64(rows);
  std::vector<double> sample, stats;
  const int64_t M = rows.size(0);
  for (int64_t i = 0; i < M; ++i) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, r[static_cast<size_t>(i * V + j)]);
    double se = 0;
    for (int64_t j = 0; j < V; ++j) {
      const double v = r[static_cast<size_t>(i * V + j)];
      se += std::exp(v - mx), s += v;
      if (j % kColStep == 0) sample.push_back(v);
    }
    stats.insert(stats.end(), {mx + std::log(se), mx, s});
  }
  expect_close(tag + " logits at masked positions", sample, f64(f.at(key + "logits_sample")), t.rtol * ff, t.atol * ff);
  // Row sums add 30522 values of magnitude ~scale: their rounding is relative to the sum of |terms|.
  std::vector<double> lse_max, lse_max_e, sums, sums_e;
  const std::vector<double> se = f64(f.at(key + "logits_rows"));
  double abs_terms = 0;
  for (double v : r) abs_terms = std::max(abs_terms, std::abs(v));
  for (int64_t i = 0; i < M; ++i) {
    for (int k = 0; k < 2; ++k) lse_max.push_back(stats[i * 3 + k]), lse_max_e.push_back(se[i * 3 + k]);
    sums.push_back(stats[i * 3 + 2]), sums_e.push_back(se[i * 3 + 2]);
  }
  expect_close(tag + " logsumexp and max of each row", lse_max, lse_max_e, t.rtol * ff, t.atol * ff);
  expect_close(tag + " sum of each row", sums, sums_e, 0, t.atol * ff, abs_terms * static_cast<double>(V));
  expect_close(tag + " loss", {loss.item()}, {f.at(key + "loss").item()}, t.rtol * ff, t.atol * ff);

  loss.backward();
  const nn::NamedTensors params = model.named_parameters();
  const std::vector<int64_t> gidx = f.at(key + "grad_index").tolist<int64_t>();
  const int64_t samples = f.at(key + "grad_index").size(1);
  const std::vector<double> gsum = f64(f.at(key + "grad_sum")), gabs = f64(f.at(key + "grad_abs_sum")),
                            gl2 = f64(f.at(key + "grad_l2")), gmax = f64(f.at(key + "grad_absmax")),
                            gval = f64(f.at(key + "grad_sample"));
  const std::vector<double> ref_val = f64(f.at("bert_tiny.f32.grad_sample")),
                            ref_max = f64(f.at("bert_tiny.f32.grad_absmax"));
  double se_ours = 0, se_torch = 0;
  double key_weight_max = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    const std::string& name = params[p].first;
    ASSERT_TRUE(params[p].second.grad().defined()) << name << " got no gradient";
    const std::vector<double> gr = f64(params[p].second.grad());
    double sum = 0, abs_sum = 0, sq = 0, mx = 0;
    for (double v : gr) sum += v, abs_sum += std::abs(v), sq += v * v, mx = std::max(mx, std::abs(v));
    if (name.find("attention.self.key.weight") != std::string::npos) key_weight_max = gmax[p];
    if (name.find("attention.self.key.bias") != std::string::npos) {
      // Exactly 0 in exact arithmetic: a sum over the B * T = 32 key rows that cancels, whose rounding is at
      // most 32 terms x the table's bound x their size (~ the key weight's max |g|); a real gradient is O(that).
      EXPECT_LE(mx, t.atol * gf * static_cast<double>(ids.numel()) * key_weight_max)
          << tag << " " << name << " should be ~0, max |g| " << mx;
      continue;
    }
    std::vector<double> a, e, ref;
    for (int64_t k = 0; k < samples; ++k) {
      const size_t at = p * static_cast<size_t>(samples) + static_cast<size_t>(k);
      a.push_back(gr[static_cast<size_t>(gidx[at])] / gmax[p]);
      e.push_back(gval[at] / gmax[p]);
      ref.push_back(ref_val[at] / ref_max[p]);
    }
    expect_close(tag + " grad samples / max|g| " + name, a, e, t.rtol * gf, t.atol * gf);
    expect_close(tag + " grad summaries " + name, {sum / gabs[p], abs_sum / gabs[p], std::sqrt(sq) / gl2[p], mx / gmax[p]},
                 {gsum[p] / gabs[p], 1, 1, 1}, t.rtol * gf, t.atol * gf);
    if (bf16 || f16) {
      std::vector<double> ours_over_ref(a.size()), torch_over_ref(a.size());
      for (size_t k = 0; k < a.size(); ++k)
        ours_over_ref[k] = a[k] * gmax[p] / ref_max[p], torch_over_ref[k] = e[k] * gmax[p] / ref_max[p];
      se_ours += std::pow(rms(ours_over_ref, ref), 2), se_torch += std::pow(rms(torch_over_ref, ref), 2);
    }
  }
  if (bf16 || f16) {
    if (verbose())
      std::printf("  %s gradient RMS error vs the F32 answer: ampforge %.5f, transformers %.5f\n", tag.c_str(),
                  std::sqrt(se_ours), std::sqrt(se_torch));
    EXPECT_LE(std::sqrt(se_ours), kLowPrecisionAccuracy * std::sqrt(se_torch))
        << "ampforge's " << tag << " gradients are much less accurate than transformers'";
  }
}

}  // namespace

TEST(BertParity, TinyF32MaskedPositionsOnly) { check(DType::F32, true); }
TEST(BertParity, TinyF32AllPositions) { check(DType::F32, false); }
TEST(BertParity, TinyBF16) { check(DType::BF16, true); }
TEST(BertParity, TinyF16) { check(DType::F16, true); }

// transformers' bert-base state dicts (save_pretrained's keys: the tied decoder weight and bias dropped, in
// state_dict() order) and parameter counts (its num_parameters()).
TEST(BertParity, BertBaseKeysShapesAndCounts) {
  const ParityGolden& g = golden();
  ASSERT_TRUE(g.error.empty()) << g.error;
  nn::init::SkipInitGuard skip;
  const BertConfig c = bert_config("bert-base");
  for (const char* variant : {"BertModel", "BertForMaskedLM"}) {
    nn::ModulePtr m = std::string(variant) == "BertModel" ? nn::ModulePtr(std::make_shared<BertModel>(c, true))
                                                          : nn::ModulePtr(std::make_shared<BertForMaskedLM>(c));
    const json& want = g.manifest.at("bert_base").at(variant);
    const nn::NamedTensors sd = m->state_dict();
    ASSERT_EQ(sd.size(), want.size()) << variant;
    for (size_t i = 0; i < sd.size(); ++i) {
      EXPECT_EQ(sd[i].first, want[i].at("key").get<std::string>()) << variant << " #" << i;
      EXPECT_EQ(sd[i].second.shape().vec(), want[i].at("shape").get<std::vector<int64_t>>()) << sd[i].first;
    }
    EXPECT_EQ(m->num_parameters(), g.manifest.at("bert_base").at("counts").at(variant).get<int64_t>()) << variant;
  }
  EXPECT_EQ(BertModel(c, true).num_parameters(), 109482240);
  EXPECT_EQ(BertForMaskedLM(c).num_parameters(), 109514298);
}

TEST(BertParity, GoldenIsSmall) {
  size_t bytes = 0;
  for (const char* file : {"bert_parity.safetensors", "bert_parity.json"}) {
    std::ifstream in(kDir + "/" + file, std::ios::binary | std::ios::ate);
    ASSERT_TRUE(in) << file << " (" << kRegenerate << ")";
    bytes += static_cast<size_t>(in.tellg());
  }
  EXPECT_LT(bytes, size_t{1} << 20);
  // Made by transformers itself (not a re-statement), and its loader found every key.
  const ParityGolden& g = golden();
  ASSERT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.manifest.at("transformers").get<std::string>().substr(0, 2), "5.") << kRegenerate;
  EXPECT_EQ(g.manifest.at("reference").get<std::string>().rfind("transformers.BertForMaskedLM", 0), 0u);
  for (const auto& [what, keys] : g.manifest.at("loading").at("loading_info").items())
    EXPECT_TRUE(keys.empty()) << "transformers' from_pretrained reported " << what << ": " << keys;
}
