#include "ampforge/tasks/masked_lm.h"

#include <algorithm>
#include <cmath>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/generator.h"
#include "ampforge/models/bert.h"
#include "ampforge/models/task_models.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/device_sum.h"
#include "ampforge/util/error.h"

namespace ampforge::tasks {

namespace {

models::MaskedLanguageModel& as_mlm(nn::Module& model) {
  return models::model_as<models::MaskedLanguageModel>(model, "masked_lm");
}

void check_ids(const Tensor& x) {
  AF_CHECK(x.defined() && x.dim() == 2, "masked_lm: a batch must be (batch, tokens) token ids, got {}",
           x.defined() ? x.shape().str() : std::string("none"));
}

// Bool -> F32 0/1 and back: the masks combine as products (and) without a logical-op kernel.
Tensor f32(const Tensor& b) { return ops::to_dtype(b, DType::F32); }
Tensor is_set(const Tensor& f) { return ops::compare(OpId::gt, f, ops::full({}, 0.5, DType::F32, f.device())); }

class MaskedLMEvaluator final : public Evaluator {
 public:
  explicit MaskedLMEvaluator(const MaskedLMOptions& opt) : opt_(opt), gen_(opt.eval_seed) {}

  void add(nn::Module& model, const data::Batch& b) override {
    check_ids(b.x);
    models::MaskedLanguageModel& mlm = as_mlm(model);
    const MaskedBatch mb = mask_tokens(b.x, opt_, &gen_);
    const models::MaskedTargets m = models::masked_targets(mb.labels);  // (M) positions and labels
    const int64_t count = m.positions.numel();
    if (count == 0) return;
    Tensor logits = mlm.logits(mb.input_ids, mb.attention_mask, m.positions).to(DType::F32);  // (M, V)
    CrossEntropyAttrs ce;
    ce.reduction = Reduction::Sum;
    loss_.add(cross_entropy(logits, m.targets, ce));
    correct_.add(sum(eq(argmax(logits, 1), m.targets).to(DType::F32)));
    if (!opt_.unigram_log_probs.empty()) {
      if (!logp_.defined() || logp_.device() != logits.device())
        logp_ = ops::to_device(Tensor::from_vector(opt_.unigram_log_probs, {opt_.vocab_size, 1}), logits.device());
      unigram_.add(ops::sum(ops::mul_scalar(ops::embedding(m.targets, logp_), -1.0)));
    }
    count_ += count;
  }

  Metrics result() override {
    Metrics r;
    if (count_ == 0) return r;
    const double n = static_cast<double>(count_), loss = loss_.value() / n;
    r.push_back({"masked_loss", loss, false});
    r.push_back({"masked_accuracy", correct_.value() / n, true});
    r.push_back({"perplexity", std::exp(loss), false});
    if (!opt_.unigram_log_probs.empty()) r.push_back({"unigram_cross_entropy", unigram_.value() / n, false});
    r.push_back({"masked_tokens", n, false});
    return r;
  }

 private:
  MaskedLMOptions opt_;
  Generator gen_;
  Tensor logp_;
  DeviceSum loss_, correct_, unigram_;
  int64_t count_ = 0;
};

}  // namespace

int64_t meta_masked_rows(const Shape& ids, const MaskedLMOptions& o) {
  AF_CHECK(ids.size() == 2, "meta_masked_rows: ids must be (batch, tokens), got {}", ids.str());
  const int64_t eligible = ids[0] * std::max<int64_t>(ids[1] - 2, 0);
  return std::min<int64_t>(eligible, std::llround(o.mlm_probability * static_cast<double>(eligible)));
}

MaskedBatch mask_tokens(const Tensor& x, const MaskedLMOptions& o, Generator* gen) {
  check_ids(x);
  autograd::NoGradGuard ng;
  const Device dev = x.device();
  const Shape s = x.shape();
  Tensor ids = ops::to_dtype(x, DType::I64);  // exact: ids < 2^24 travel as floats
  auto id_is = [&](int64_t id) { return f32(ops::compare(OpId::eq, ids, ops::full({}, static_cast<double>(id), DType::I64, dev))); };
  // 1 where a token may be selected: not [PAD], [CLS] or [SEP].
  Tensor regular = ops::mul(ops::mul(ops::add_scalar(ops::mul_scalar(id_is(o.pad_id), -1), 1),
                                     ops::add_scalar(ops::mul_scalar(id_is(o.cls_id), -1), 1)),
                            ops::add_scalar(ops::mul_scalar(id_is(o.sep_id), -1), 1));
  auto bernoulli = [&](double p) {
    return f32(ops::compare(OpId::lt, ops::rand(s, DType::F32, dev, gen), ops::full({}, p, DType::F32, dev)));
  };
  const Tensor selected = ops::mul(regular, bernoulli(o.mlm_probability));
  const Tensor to_mask = ops::mul(selected, bernoulli(o.mask_probability));
  const Tensor to_random = ops::mul(ops::sub(selected, to_mask), bernoulli(o.random_probability));
  // floor(u * V) in [0, V): the product can round up to V in F32, hence the clamp.
  Tensor random_ids = ops::to_dtype(ops::clamp(ops::mul_scalar(ops::rand(s, DType::F32, dev, gen),
                                                               static_cast<double>(o.vocab_size)),
                                               0.0, static_cast<double>(o.vocab_size - 1)),
                                    DType::I64);
  MaskedBatch mb;
  Tensor input = ops::where(is_set(to_random), random_ids, ids);
  mb.input_ids = ops::where(is_set(to_mask), ops::full({}, static_cast<double>(o.mask_id), DType::I64, dev), input);
  mb.labels = ops::where(is_set(selected), ids, ops::full({}, -100.0, DType::I64, dev));
  mb.attention_mask = ops::compare(OpId::ne, ids, ops::full({}, static_cast<double>(o.pad_id), DType::I64, dev));
  return mb;
}

std::vector<float> unigram_log_probs(const std::vector<uint32_t>& tokens, int64_t vocab_size) {
  AF_CHECK(vocab_size > 0, "unigram_log_probs: vocab_size must be positive");
  std::vector<double> counts(static_cast<size_t>(vocab_size), 1.0);  // add-one smoothing
  for (uint32_t t : tokens) {
    AF_CHECK(t < static_cast<uint64_t>(vocab_size), "unigram_log_probs: id {} outside the vocabulary of {}", t,
             vocab_size);
    counts[t] += 1;
  }
  const double total = static_cast<double>(tokens.size()) + static_cast<double>(vocab_size);
  std::vector<float> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) out[i] = static_cast<float>(std::log(counts[i] / total));
  return out;
}

MaskedLMTask::MaskedLMTask(MaskedLMOptions opt) : opt_(std::move(opt)) {
  for (double p : {opt_.mlm_probability, opt_.mask_probability, opt_.random_probability})
    AF_CHECK(p >= 0 && p <= 1, "masked_lm: probabilities must be in [0, 1], got {}", p);
  AF_CHECK(opt_.vocab_size > 0, "masked_lm: vocab_size must be positive, got {}", opt_.vocab_size);
  for (int64_t id : {opt_.pad_id, opt_.cls_id, opt_.sep_id, opt_.mask_id})
    AF_CHECK(id >= 0 && id < opt_.vocab_size, "masked_lm: special token id {} is outside the vocabulary of {}", id,
             opt_.vocab_size);
  AF_CHECK(opt_.unigram_log_probs.empty() || static_cast<int64_t>(opt_.unigram_log_probs.size()) == opt_.vocab_size,
           "masked_lm: the unigram table has {} entries for a vocabulary of {}", opt_.unigram_log_probs.size(),
           opt_.vocab_size);
}

Tensor MaskedLMTask::loss(nn::Module& model, const data::Batch& b) {
  models::MaskedLanguageModel& mlm = as_mlm(model);
  AF_CHECK(mlm.vocab_size() == opt_.vocab_size, "masked_lm: the model's vocabulary ({}) differs from the "
           "data's ({})", mlm.vocab_size(), opt_.vocab_size);
  const MaskedBatch mb = mask_tokens(b.x, opt_);
  return mlm.mlm_loss(mb.input_ids, mb.attention_mask, mb.labels, meta_masked_rows(b.x.shape(), opt_));
}

std::unique_ptr<Evaluator> MaskedLMTask::evaluator() const { return std::make_unique<MaskedLMEvaluator>(opt_); }

data::Batch masked_lm_synthetic_batch(const models::ModelOptions& mo, const SyntheticBatchOptions& o) {
  MaskedLMOptions mlm;
  mlm.vocab_size = mo.num_classes;
  AF_CHECK(mlm.vocab_size > mlm.mask_id + 1, "workload: a vocabulary of {} ids has no room for BERT's special ids",
           mlm.vocab_size);
  AF_CHECK(o.seq_len >= 3, "workload: a masked-LM sequence needs [CLS], a token and [SEP] (>= 3), got {}", o.seq_len);
  const int64_t first = mlm.mask_id + 1, span = mlm.vocab_size - first;
  Generator gen(o.seed + 1);
  const Tensor u = rand({o.batch, o.seq_len}, DType::F32, kCPU, &gen);
  Tensor ids = Tensor::empty({o.batch, o.seq_len}, DType::F32);
  const float* r = u.data<float>();
  float* p = ids.data<float>();
  for (int64_t b = 0; b < o.batch; ++b)
    for (int64_t t = 0; t < o.seq_len; ++t) {
      const int64_t i = b * o.seq_len + t;
      const int64_t id = t == 0 ? mlm.cls_id
                         : t == o.seq_len - 1 ? mlm.sep_id
                                               : first + std::min<int64_t>(static_cast<int64_t>(r[i] * span), span - 1);
      p[i] = static_cast<float>(id);
    }
  data::Batch batch;
  batch.x = !o.device.is_cpu() ? ids.to(o.device) : ids;
  return batch;
}

}  // namespace ampforge::tasks
