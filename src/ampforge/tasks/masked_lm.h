// Masked-language-model task (BERT pre-training without next-sentence prediction). A batch's x is (B, T) token
// ids as floats (data/text_corpus.h); the model must implement models::MaskedLanguageModel
// (models/task_models.h), as models::BertForMaskedLM does.
//
// Dynamic masking (Hugging Face's DataCollatorForLanguageModeling, MODELS.md §B.3), drawn anew for every batch
// on the batch's device: each token that is not [PAD], [CLS] or [SEP] is selected with probability 0.15; a
// selected token becomes [MASK] with probability 0.8, else a uniformly random id in [0, vocab) with
// probability 0.5, else stays; labels are the original ids at selected positions and -100 elsewhere. The
// attention mask is ids != [PAD]. Training draws from the global generator (so a checkpoint resumes the same
// masks); every evaluation draws from a generator seeded with eval_seed, so evaluations mask identically.
//
// Loss: BertForMaskedLM::mlm_loss (mean cross-entropy over the selected tokens; with the model's
// mlm_masked_positions_only the decoder runs at those rows only, which reads their positions on the host).
// Metrics over an evaluation: masked_loss (mean over every masked token of the split), masked_accuracy
// (argmax == label), perplexity = exp(masked_loss), and, when unigram log-probabilities are given,
// unigram_cross_entropy: the mean of -log p(label) under that context-free distribution (the best a model
// without context can do; the run reports it beside masked_loss).
#pragma once

#include <cstdint>
#include <vector>

#include "ampforge/core/tensor.h"
#include "ampforge/models/registry.h"
#include "ampforge/models/task_models.h"
#include "ampforge/tasks/task.h"

namespace ampforge::tasks {

struct MaskedLMOptions {
  int64_t vocab_size = 30522;
  int64_t pad_id = 0, cls_id = 101, sep_id = 102, mask_id = 103;  // bert-base-uncased's ids
  double mlm_probability = 0.15;
  double mask_probability = 0.8;    // of the selected tokens: [MASK]
  double random_probability = 0.5;  // of the selected tokens not [MASK]: a random id (the rest stay)
  uint64_t eval_seed = 0x6d6c6d;
  // Optional (vocab_size values): log p(token) of a unigram model (e.g. the training split's frequencies,
  // smoothed so that every id has p > 0); enables the unigram_cross_entropy metric.
  std::vector<float> unigram_log_probs;
};

// One masked batch: (B, T) I64 input ids, labels and the Bool attention mask.
struct MaskedBatch {
  Tensor input_ids, labels, attention_mask;
};

// The number of masked rows a meta step assumes (backends/meta/meta.h: nothing has values there): the expected
// count, round(mlm_probability * B * (T - 2)), for sequences of [CLS], T - 2 regular tokens and [SEP] without
// padding (what the synthetic batches and packed text sequences are). A real batch draws a binomial count
// around it (standard deviation sqrt(n p (1 - p)), about 4 rows for 128 tokens).
int64_t meta_masked_rows(const Shape& ids, const MaskedLMOptions& opt);

// Applies the masking rule to ids (B, T) (integer or float holding ids) with `gen` (null: the global
// generator). Pure tensor ops on ids' device: no host reads.
MaskedBatch mask_tokens(const Tensor& ids, const MaskedLMOptions& opt, Generator* gen = nullptr);

// Laplace-smoothed unigram log-probabilities of a token stream: log((count + 1) / (N + V)).
std::vector<float> unigram_log_probs(const std::vector<uint32_t>& tokens, int64_t vocab_size);

class MaskedLMTask final : public Task {
 public:
  // Throws InvalidArgument for probabilities outside [0, 1], special ids outside the vocabulary, or a unigram
  // table of the wrong length.
  explicit MaskedLMTask(MaskedLMOptions opt);
  std::string name() const override { return "masked_lm"; }
  Tensor loss(nn::Module& model, const data::Batch& batch) override;
  std::unique_ptr<Evaluator> evaluator() const override;
  std::string primary_metric() const override { return "masked_accuracy"; }
  std::string model_mismatch(nn::Module& model) const override {
    return models::interface_mismatch<models::MaskedLanguageModel>(model, name());
  }
  const MaskedLMOptions& options() const { return opt_; }

 private:
  MaskedLMOptions opt_;
};

// A synthetic batch for a model built with `mo` (the bench, memory planning: tasks/registry.h):
// [CLS] ids [SEP] sequences of o.seq_len token ids (as floats, as the text
// data sets deliver them) spread over the vocabulary above the special ids; the task masks them, as in training.
data::Batch masked_lm_synthetic_batch(const models::ModelOptions& mo, const SyntheticBatchOptions& o);

}  // namespace ampforge::tasks
