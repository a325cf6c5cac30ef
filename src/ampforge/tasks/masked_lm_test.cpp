// Masked-LM task (unit): the masking rule's rates and invariants, the unigram bound, metrics, errors, and a few
// steps of bert-tiny-sized training that reduce the masked loss.
#include "ampforge/tasks/masked_lm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ampforge/autograd/node.h"
#include "ampforge/core/generator.h"
#include "ampforge/models/bert.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"

using namespace ampforge;
using namespace ampforge::tasks;

namespace {

MaskedLMOptions small_options() {
  MaskedLMOptions o;
  o.vocab_size = 50;
  o.pad_id = 0, o.cls_id = 2, o.sep_id = 3, o.mask_id = 4;
  return o;
}

models::BertConfig small_bert() {
  models::BertConfig c = models::bert_config("bert-tiny");
  c.vocab_size = 50, c.hidden_size = 32, c.num_attention_heads = 2, c.intermediate_size = 64;
  c.max_position_embeddings = 32;
  return c;
}

// (B, T) F32 ids: [CLS] 5..49 ... [SEP] [PAD] [PAD] per row.
Tensor batch_ids(int64_t B, int64_t T) {
  std::vector<float> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      v.push_back(t == 0 ? 2.f : t == T - 3 ? 3.f : t >= T - 2 ? 0.f : static_cast<float>(5 + (b * 7 + t * 3) % 45));
  return Tensor::from_vector(v, {B, T});
}

}  // namespace

TEST(MaskedLM, MaskingRatesAndInvariants) {
  const MaskedLMOptions o = small_options();
  const Tensor x = batch_ids(64, 128);
  Generator g(1);
  const MaskedBatch mb = mask_tokens(x, o, &g);
  const auto in = ops::to_dtype(x, DType::I64).tolist<int64_t>();
  const auto ids = mb.input_ids.tolist<int64_t>(), labels = mb.labels.tolist<int64_t>();
  const auto att = ops::to_dtype(mb.attention_mask, DType::I64).tolist<int64_t>();
  int64_t regular = 0, selected = 0, masked = 0, kept = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool special = in[i] == 0 || in[i] == 2 || in[i] == 3;
    EXPECT_EQ(att[i], in[i] != 0 ? 1 : 0);
    if (special) {
      EXPECT_EQ(labels[i], -100) << "special tokens are never selected";
      EXPECT_EQ(ids[i], in[i]);
      continue;
    }
    ++regular;
    if (labels[i] == -100) {
      EXPECT_EQ(ids[i], in[i]) << "unselected tokens are unchanged";
      continue;
    }
    ++selected;
    EXPECT_EQ(labels[i], in[i]) << "labels are the original ids";
    EXPECT_TRUE(ids[i] >= 0 && ids[i] < 50);
    if (ids[i] == 4) ++masked;
    else if (ids[i] == in[i]) ++kept;
  }
  // 64 x 125 regular tokens: 15% selected (+- 4 sigma), 80% of them [MASK], ~10% kept (random ids equal to the
  // original 1 time in 50 add to kept).
  const double p = static_cast<double>(selected) / static_cast<double>(regular);
  EXPECT_NEAR(p, 0.15, 4 * std::sqrt(0.15 * 0.85 / static_cast<double>(regular)));
  EXPECT_NEAR(static_cast<double>(masked) / static_cast<double>(selected), 0.8, 0.04);
  EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(selected), 0.1, 0.03);
  // Same generator state, same masks; the next draw differs (dynamic masking).
  Generator g2(1);
  EXPECT_EQ(mask_tokens(x, o, &g2).labels.tolist<int64_t>(), labels);
  EXPECT_NE(mask_tokens(x, o, &g2).labels.tolist<int64_t>(), labels);
}

TEST(MaskedLM, UnigramLogProbsAreSmoothedFrequencies) {
  const std::vector<float> lp = unigram_log_probs({1, 1, 1, 2}, 4);  // counts+1: 1, 4, 2, 1 over 8
  ASSERT_EQ(lp.size(), 4u);
  EXPECT_NEAR(lp[1], std::log(4.0 / 8), 1e-6);
  EXPECT_NEAR(lp[3], std::log(1.0 / 8), 1e-6);
  EXPECT_THROW(unigram_log_probs({9}, 4), Error);
}

TEST(MaskedLM, OptionErrors) {
  MaskedLMOptions o = small_options();
  o.mask_id = 50;
  EXPECT_THROW(MaskedLMTask{o}, Error);
  o = small_options();
  o.mlm_probability = 1.5;
  EXPECT_THROW(MaskedLMTask{o}, Error);
  o = small_options();
  o.unigram_log_probs = {0.f, 0.f};
  EXPECT_THROW(MaskedLMTask{o}, Error);
  // A model that is not BertForMaskedLM.
  MaskedLMTask task(small_options());
  nn::Linear lin(4, 4);
  data::Batch b;
  b.x = batch_ids(2, 8);
  EXPECT_THROW(task.loss(lin, b), Error);
}

TEST(MaskedLM, TrainingReducesTheMaskedLossAndMetricsAreConsistent) {
  manual_seed(0);
  MaskedLMOptions o = small_options();
  o.mlm_probability = 0.3;
  std::vector<uint32_t> stream;
  const Tensor x = batch_ids(8, 24);
  for (float v : x.tolist<float>()) stream.push_back(static_cast<uint32_t>(v));
  o.unigram_log_probs = unigram_log_probs(stream, 50);
  MaskedLMTask task(o);
  auto model = std::make_shared<models::BertForMaskedLM>(small_bert());
  optim::AdamWOptions ao;
  ao.lr = 3e-3;
  optim::AdamW opt(model->parameters(), ao);
  data::Batch b;
  b.x = x;
  auto eval = [&] {
    model->eval();
    autograd::NoGradGuard ng;
    auto e = task.evaluator();
    e->add(*model, b);
    model->train();
    return e->result();
  };
  const Metrics before = eval();
  EXPECT_EQ(metric_value(before, "masked_loss"), metric_value(eval(), "masked_loss")) << "evaluations mask alike";
  EXPECT_NEAR(metric_value(before, "perplexity"), std::exp(metric_value(before, "masked_loss")), 1e-6);
  EXPECT_GT(metric_value(before, "masked_tokens"), 10);
  EXPECT_GT(metric_value(before, "unigram_cross_entropy"), 0);
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    Tensor loss = task.loss(*model, b);
    loss.backward();
    opt.step();
  }
  const Metrics after = eval();
  EXPECT_LT(metric_value(after, "masked_loss"), 0.7 * metric_value(before, "masked_loss"));
  EXPECT_GT(metric_value(after, "masked_accuracy"), metric_value(before, "masked_accuracy"));
}
