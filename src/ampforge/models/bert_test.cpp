// BERT (unit): HF's names and tying, presets, initialisation, the padding mask, dropout on attention
// probabilities, the masked-positions head, HF checkpoint aliases, and errors. Numbers against PyTorch:
// bert_parity_test.cpp.
#include "ampforge/models/bert.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ampforge/autograd/node.h"
#include "ampforge/core/generator.h"
#include "ampforge/nn/state_dict.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

using namespace ampforge;
using namespace ampforge::models;

namespace {

BertConfig small(double dropout = 0) {
  BertConfig c = bert_config("bert-tiny");
  c.vocab_size = 97;
  c.max_position_embeddings = 16;
  c.hidden_size = 16, c.num_attention_heads = 2, c.intermediate_size = 32;
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = dropout;
  return c;
}

Tensor ids_2x6() { return Tensor::from_vector<int64_t>({2, 10, 11, 12, 3, 0, 2, 20, 21, 22, 23, 3}, {2, 6}); }
Tensor mask_2x6() { return Tensor::from_vector<int64_t>({1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1}, {2, 6}); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = ops::to_dtype(a, DType::F64).tolist<double>(), y = ops::to_dtype(b, DType::F64).tolist<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Bert, PresetsAndConfigErrors) {
  EXPECT_EQ(bert_config("bert-mini").num_hidden_layers, 4);
  EXPECT_EQ(bert_config("bert-mini").hidden_size, 256);
  EXPECT_EQ(bert_config("bert-mini").intermediate_size, 1024);
  EXPECT_EQ(bert_config("bert-tiny").num_attention_heads, 2);
  EXPECT_EQ(bert_config("bert-base").layer_norm_eps, 1e-12);
  EXPECT_NE(error_of([] { bert_config("bert-huge"); }).find("bert-base, bert-mini, bert-tiny"), std::string::npos);
  BertConfig c = small();
  c.num_attention_heads = 3;
  EXPECT_NE(error_of([&] { BertModel m(c); }).find("not a multiple"), std::string::npos);
}

TEST(Bert, HuggingFaceNamesAndTiedDecoder) {
  BertForMaskedLM m(small());
  const nn::NamedTensors sd = m.state_dict();
  std::vector<std::string> names;
  for (const auto& [n, t] : sd) names.push_back(n);
  EXPECT_EQ(names.front(), "bert.embeddings.word_embeddings.weight");
  EXPECT_EQ(names[1], "bert.embeddings.position_embeddings.weight");
  const std::vector<std::string> want_layer0 = {
      "bert.encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.0.attention.self.query.bias",
      "bert.encoder.layer.0.attention.self.key.weight", "bert.encoder.layer.0.attention.self.key.bias",
      "bert.encoder.layer.0.attention.self.value.weight", "bert.encoder.layer.0.attention.self.value.bias",
      "bert.encoder.layer.0.attention.output.dense.weight", "bert.encoder.layer.0.attention.output.dense.bias",
      "bert.encoder.layer.0.attention.output.LayerNorm.weight", "bert.encoder.layer.0.attention.output.LayerNorm.bias",
      "bert.encoder.layer.0.intermediate.dense.weight", "bert.encoder.layer.0.intermediate.dense.bias",
      "bert.encoder.layer.0.output.dense.weight", "bert.encoder.layer.0.output.dense.bias",
      "bert.encoder.layer.0.output.LayerNorm.weight", "bert.encoder.layer.0.output.LayerNorm.bias"};
  EXPECT_EQ(std::vector<std::string>(names.begin() + 5, names.begin() + 21), want_layer0);
  const std::vector<std::string> want_tail = {"cls.predictions.bias", "cls.predictions.transform.dense.weight",
                                              "cls.predictions.transform.dense.bias",
                                              "cls.predictions.transform.LayerNorm.weight",
                                              "cls.predictions.transform.LayerNorm.bias"};
  EXPECT_EQ(std::vector<std::string>(names.end() - 5, names.end()), want_tail);
  for (const auto& n : names) EXPECT_EQ(n.find("decoder"), std::string::npos) << "tied duplicates are not saved";
  // Tied: the decoder is the word embedding matrix itself, so changing one changes the scores.
  EXPECT_EQ(m.predictions->decoder_weight.data_ptr(), m.bert->embeddings->word_embeddings->weight.data_ptr());
  m.eval();
  autograd::NoGradGuard ng;
  const Tensor before = m.logits(ids_2x6());
  ops::mul_scalar_(m.bert->embeddings->word_embeddings->weight, 2.0);
  EXPECT_GT(max_abs_diff(before, m.logits(ids_2x6())), 1e-3);
}

TEST(Bert, HuggingFaceInitialisation) {
  manual_seed(3);
  BertForMaskedLM m(bert_config("bert-tiny"));
  const Tensor w = m.bert->embeddings->word_embeddings->weight;  // (30522, 128) normal(0, 0.02)
  const auto v = w.tolist<float>();
  double sq = 0;
  for (float x : v) sq += double(x) * x;
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(v.size())), 0.02, 0.0005);
  for (int64_t j = 0; j < 128; ++j) EXPECT_EQ(v[static_cast<size_t>(j)], 0.0f) << "padding row 0 is zero";
  for (float x : m.bert->layers[0]->attention->self->query->bias.tolist<float>()) EXPECT_EQ(x, 0.0f);
  for (float x : m.predictions->bias.tolist<float>()) EXPECT_EQ(x, 0.0f);
  for (float x : m.predictions->transform_LayerNorm->weight.tolist<float>()) EXPECT_EQ(x, 1.0f);
}

TEST(Bert, PaddingIsInvisibleToRealTokens) {
  // A padded sequence gives the same scores at its real tokens whatever the padding ids are.
  manual_seed(5);
  BertForMaskedLM m(small());
  m.eval();
  autograd::NoGradGuard ng;
  Tensor a = Tensor::from_vector<int64_t>({2, 10, 11, 3, 0, 0}, {1, 6});
  Tensor b = Tensor::from_vector<int64_t>({2, 10, 11, 3, 50, 60}, {1, 6});
  Tensor mask = Tensor::from_vector<int64_t>({1, 1, 1, 1, 0, 0}, {1, 6});
  const Tensor la = ops::narrow(m.logits(a, mask), 1, 0, 4), lb = ops::narrow(m.logits(b, mask), 1, 0, 4);
  EXPECT_LT(max_abs_diff(la, lb), 1e-5);
  // Without the mask the padding ids matter.
  EXPECT_GT(max_abs_diff(ops::narrow(m.logits(a), 1, 0, 4), ops::narrow(m.logits(b), 1, 0, 4)), 1e-4);
}

TEST(Bert, MaskedPositionsHeadEqualsTheFullHead) {
  manual_seed(7);
  BertForMaskedLM m(small());
  m.eval();
  const Tensor labels = Tensor::from_vector<int64_t>({-100, 10, -100, -100, -100, -100, -100, -100, 21, -100, 23, -100},
                                                     {2, 6});
  const MaskedTargets t = masked_targets(labels);
  EXPECT_EQ(t.positions.tolist<int64_t>(), (std::vector<int64_t>{1, 8, 10}));
  EXPECT_EQ(t.targets.tolist<int64_t>(), (std::vector<int64_t>{10, 21, 23}));
  autograd::NoGradGuard ng;
  const Tensor full = ops::reshape(m.logits(ids_2x6(), mask_2x6()), {12, 97});
  const Tensor rows = m.logits(ids_2x6(), mask_2x6(), t.positions);
  ASSERT_EQ(rows.shape(), (Shape{3, 97}));
  EXPECT_LT(max_abs_diff(ops::narrow(rows, 0, 0, 1), ops::narrow(full, 0, 1, 1)), 1e-5);
  EXPECT_LT(max_abs_diff(ops::narrow(rows, 0, 1, 1), ops::narrow(full, 0, 8, 1)), 1e-5);
  const double a = m.mlm_loss(ids_2x6(), mask_2x6(), labels).item();
  m.masked_positions_only = false;
  const double b = m.mlm_loss(ids_2x6(), mask_2x6(), labels).item();
  EXPECT_NEAR(a, b, 1e-5);
}

TEST(Bert, DropoutOnAttentionProbabilitiesInTrainingOnly) {
  manual_seed(9);
  BertSelfAttention att(small(0.5));
  const Tensor x = ops::randn({2, 6, 16});
  att.eval();
  autograd::NoGradGuard ng;
  const Tensor e1 = att.forward_masked(x, Tensor()), e2 = att.forward_masked(x, Tensor());
  EXPECT_EQ(max_abs_diff(e1, e2), 0.0) << "eval: deterministic, no dropout";
  att.train();
  const Tensor t1 = att.forward_masked(x, Tensor());
  EXPECT_GT(max_abs_diff(t1, e1), 1e-3) << "training drops attention probabilities";
  // With p = 0 in training the composite path is not taken and the fused op gives the eval result.
  att.dropout->p = 0;
  EXPECT_LT(max_abs_diff(att.forward_masked(x, Tensor()), e1), 1e-6);
}

TEST(Bert, HuggingFaceCheckpointAliasesLoad) {
  manual_seed(11);
  BertForMaskedLM src(small());
  nn::NamedTensors hf;
  for (const auto& [k, t] : src.state_dict()) {
    std::string key = k;
    if (key.size() > 16 && key.compare(key.size() - 16, 16, "LayerNorm.weight") == 0)
      key = key.substr(0, key.size() - 6) + "gamma";
    if (key.size() > 14 && key.compare(key.size() - 14, 14, "LayerNorm.bias") == 0)
      key = key.substr(0, key.size() - 4) + "beta";
    hf.emplace_back(key, t);
  }
  hf.emplace_back("cls.predictions.decoder.weight", src.bert->embeddings->word_embeddings->weight);
  hf.emplace_back("cls.predictions.decoder.bias", src.predictions->bias);
  hf.emplace_back("bert.embeddings.position_ids", ops::arange(0, 16).reshape({1, 16}));
  manual_seed(12);
  BertForMaskedLM dst(small());
  EXPECT_FALSE(nn::compare_state_dict(dst, hf).ok());
  const nn::LoadReport r = nn::load_state_dict(dst, bert_state_from_hf(hf));
  EXPECT_TRUE(r.ok()) << r.str();
  EXPECT_EQ(max_abs_diff(dst.bert->embeddings->LayerNorm->weight, src.bert->embeddings->LayerNorm->weight), 0.0);
  EXPECT_EQ(max_abs_diff(dst.predictions->decoder_weight, src.predictions->decoder_weight), 0.0);
}

TEST(Bert, BadInputsGetClearErrors) {
  BertForMaskedLM m(small());
  const Tensor long_ids = ops::zeros({1, 17}, DType::I64);  // 17 > 16 positions
  std::string e = error_of([&] { m.logits(long_ids); });
  EXPECT_NE(e.find("exceeds the position table"), std::string::npos) << e;
  e = error_of([&] { m.logits(Tensor::from_vector<int64_t>({1, 97}, {1, 2})); });  // id 97 of 97
  EXPECT_FALSE(e.empty()) << "an id outside the vocabulary is an error";
  e = error_of([&] { m.logits(ids_2x6(), ops::ones({2, 5}, DType::I64)); });
  EXPECT_NE(e.find("attention_mask"), std::string::npos) << e;
  e = error_of([&] { m.logits(ops::zeros({2, 6})); });
  EXPECT_NE(e.find("integer token ids"), std::string::npos) << e;
}
