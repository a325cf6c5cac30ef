// BERT as Hugging Face's transformers builds it (modeling_bert.py; facts in ../shared/docs/specs/MODELS.md §B):
// the same module tree and state-dict names, post-LN layers, LayerNorm eps 1e-12, exact erf GELU, the MLM
// decoder tied to the word embeddings with its own bias, and HF's _init_weights (normal(0, 0.02), biases 0,
// LayerNorm 1/0, the padding row of the word embeddings zeroed). A `model.safetensors` saved by HF loads by
// name (load_bert_state below adds HF's legacy aliases).
//
//   BertEmbeddings   word (V, H, padding_idx 0) + position (P, H) + token type (2, H) -> LayerNorm -> dropout
//   BertLayer x L    self-attention (query/key/value with biases, scale 1/sqrt(H/heads), padding mask,
//                    dropout on the probabilities) -> dense -> dropout -> LayerNorm(x + input)
//                    -> intermediate dense (H -> I) -> GELU -> output dense (I -> H) -> dropout
//                    -> LayerNorm(x + attention output)
//   BertPooler       dense + tanh on token 0 (BertModel only; BertForMaskedLM builds none, as HF)
//   MLM head         transform (dense -> GELU -> LayerNorm) -> decoder (weight = word embeddings) + bias
//
// Attention goes through scaled_dot_product_attention: the fused `attention` op when dropout is off (eval,
// or attention_dropout 0), the composite with dropout on the probabilities in training. The padding mask is
// Bool (true = attend), which masks exactly as HF's additive (1 - mask) * finfo.min for every row that
// attends at least one key; a sequence whose every token is masked gives NaN here (HF: uniform weights).
//
// State dict (HF's save_pretrained set): the tied decoder weight is the word embedding
// (`bert.embeddings.word_embeddings.weight`) and its bias `cls.predictions.bias`; neither
// `cls.predictions.decoder.weight` nor `cls.predictions.decoder.bias` is a separate entry, as HF drops tied
// duplicates when it saves safetensors. load_bert_state() accepts checkpoints that carry them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ampforge/models/task_models.h"
#include "ampforge/nn/layers.h"

namespace ampforge::models {

// Hugging Face's BertConfig fields that change the structure or the numbers (defaults: bert-base-uncased).
struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;  // must divide hidden_size
  int64_t intermediate_size = 3072;
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-12;
  int64_t pad_token_id = 0;
  // MLM head: compute the decoder (H -> V GEMM) only at the masked positions (NVIDIA's recipe, §B.5).
  bool mlm_masked_positions_only = true;

  // Throws InvalidArgument naming the field when a value is out of range.
  void validate() const;
};

// Presets: "bert-base" (12 x 768, 12 heads, 3072), "bert-mini" (4 x 256, 4 heads, 1024), "bert-tiny"
// (2 x 128, 2 heads, 512); vocabulary 30522 and 512 positions for all. Unknown names throw, listing these.
BertConfig bert_config(const std::string& preset);
std::vector<std::string> bert_presets();

class BertEmbeddings : public nn::Module {
 public:
  explicit BertEmbeddings(const BertConfig& c);
  // input_ids (B, T) I64, token_type_ids (B, T) I64 or undefined (zeros) -> (B, T, H).
  Tensor forward_ids(const Tensor& input_ids, const Tensor& token_type_ids);

  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  std::shared_ptr<nn::Dropout> dropout;
};

class BertSelfAttention : public nn::Module {
 public:
  explicit BertSelfAttention(const BertConfig& c);
  // x (B, T, H), mask Bool broadcastable to (B, heads, T, T) (true = attend) or undefined -> (B, T, H).
  Tensor forward_masked(const Tensor& x, const Tensor& mask);

  std::shared_ptr<nn::Linear> query, key, value;
  std::shared_ptr<nn::Dropout> dropout;  // on the attention probabilities (its p; applied in training)
  int64_t heads, head_dim;
};

// dense -> dropout -> LayerNorm(x + residual): BertSelfOutput (H -> H) and BertOutput (I -> H).
class BertResidualOutput : public nn::Module {
 public:
  BertResidualOutput(const std::string& type, int64_t in, const BertConfig& c);
  Tensor forward_residual(const Tensor& x, const Tensor& residual);  // (B, T, in), (B, T, H) -> (B, T, H)

  std::shared_ptr<nn::Linear> dense;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  std::shared_ptr<nn::Dropout> dropout;
};

class BertAttention : public nn::Module {
 public:
  explicit BertAttention(const BertConfig& c);
  Tensor forward_masked(const Tensor& x, const Tensor& mask);  // (B, T, H) -> (B, T, H)

  std::shared_ptr<BertSelfAttention> self;
  std::shared_ptr<BertResidualOutput> output;
};

class BertIntermediate : public nn::Module {
 public:
  explicit BertIntermediate(const BertConfig& c);
  Tensor forward(const Tensor& x) override;  // (B, T, H) -> GELU(dense) (B, T, I)

  std::shared_ptr<nn::Linear> dense;
};

class BertLayer : public nn::Module {
 public:
  explicit BertLayer(const BertConfig& c);
  Tensor forward_masked(const Tensor& x, const Tensor& mask);  // (B, T, H) -> (B, T, H)

  std::shared_ptr<BertAttention> attention;
  std::shared_ptr<BertIntermediate> intermediate;
  std::shared_ptr<BertResidualOutput> output;
};

class BertPooler : public nn::Module {
 public:
  explicit BertPooler(const BertConfig& c);
  Tensor forward(const Tensor& sequence_output) override;  // (B, T, H) -> tanh(dense(x[:, 0])) (B, H)

  std::shared_ptr<nn::Linear> dense;
};

class BertModel : public nn::Module {
 public:
  explicit BertModel(const BertConfig& c, bool add_pooling_layer = true);
  // input_ids (B, T) I64 in [0, vocab); attention_mask (B, T) Bool/integer/float (non-zero = attend) or
  // undefined (every token attends); token_type_ids (B, T) I64 or undefined. Returns (B, T, H).
  // Throws InvalidArgument when T exceeds max_position_embeddings.
  Tensor encode(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                const Tensor& token_type_ids = Tensor());
  // The pooled output (B, H) of encode()'s result; throws when the model has no pooler.
  Tensor pool(const Tensor& sequence_output);
  // Module interface: encode(input_ids) without a mask.
  Tensor forward(const Tensor& input_ids) override;

  const BertConfig& config() const { return config_; }

  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<nn::Module> encoder;  // "layer": children "0".."L-1" (HF's ModuleList)
  std::vector<std::shared_ptr<BertLayer>> layers;
  std::shared_ptr<BertPooler> pooler;  // null without the pooling layer

 private:
  BertConfig config_;
};

class BertLMPredictionHead : public nn::Module {
 public:
  // decoder_weight: the word embedding matrix (V, H) the decoder is tied to (not registered here).
  BertLMPredictionHead(const BertConfig& c, Tensor decoder_weight);
  Tensor forward(const Tensor& hidden) override;  // (..., H) -> (..., V)

  Tensor bias;  // (V), registered first (HF's order: the module's own parameter, then its children)
  std::shared_ptr<nn::Module> transform;  // dense, LayerNorm (GELU between them)
  std::shared_ptr<nn::Linear> transform_dense;
  std::shared_ptr<nn::LayerNorm> transform_LayerNorm;
  Tensor decoder_weight;  // = bert.embeddings.word_embeddings.weight
};

class BertForMaskedLM : public MaskedLanguageModel {
 public:
  explicit BertForMaskedLM(const BertConfig& c);

  // Prediction scores. positions undefined: every position, (B, T, V). positions (M) I64 indices into the
  // flattened (B * T) tokens: the hidden rows are gathered before the head, so the V-wide GEMM runs on M rows
  // only, (M, V). Inputs as BertModel::encode.
  Tensor logits(const Tensor& input_ids, const Tensor& attention_mask = Tensor(), const Tensor& positions = Tensor(),
                const Tensor& token_type_ids = Tensor()) override;
  // HF's masked-LM loss: cross-entropy over the tokens whose label is not -100 (mean), labels (B, T) I64.
  // With masked_positions_only the decoder runs only at those positions (their indices are read
  // back to the host to size the gather: one synchronisation on a device). Same value either way.
  // meta_rows: on the meta device, how many rows are masked (masked_targets below); unused elsewhere.
  Tensor mlm_loss(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& labels,
                  int64_t meta_rows = -1) override;
  // bert->encode(input_ids, attention_mask): the last hidden state (B, T, H).
  Tensor encode(const Tensor& input_ids, const Tensor& attention_mask = Tensor()) override {
    return bert->encode(input_ids, attention_mask);
  }
  int64_t vocab_size() const override { return config().vocab_size; }
  // Module interface: logits(input_ids) for every position, no mask.
  Tensor forward(const Tensor& input_ids) override;

  const BertConfig& config() const { return bert->config(); }

  // Whether mlm_loss gathers the masked rows before the head (from config.mlm_masked_positions_only).
  bool masked_positions_only = true;
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<nn::Module> cls;  // "predictions": BertLMPredictionHead
  std::shared_ptr<BertLMPredictionHead> predictions;
};

// The flat (B * T) indices of labels != ignore_index, in order, and those labels (both (M) I64 on labels'
// device): the rows the MLM head computes. Reads labels on the host.
// On the meta device labels have no values, so M cannot be read: the caller says it (meta_rows, e.g. the
// expected number of masked tokens, MaskedLMTask) and gets (meta_rows) meta tensors; without it (-1) a meta
// call is refused with NotImplemented.
struct MaskedTargets {
  Tensor positions, targets;
};
MaskedTargets masked_targets(const Tensor& labels, int64_t ignore_index = -100, int64_t meta_rows = -1);

// A Hugging Face BERT state dict in this implementation's names: LayerNorm `gamma`/`beta` (the original
// checkpoints' names, which HF renames on load) become `weight`/`bias`; the tied duplicates
// `cls.predictions.decoder.weight` (kept only when the word embeddings are absent, as their value) and
// `cls.predictions.decoder.bias`, and the non-persistent buffers `*.position_ids` / `*.token_type_ids`, are
// dropped. Other keys (a BertForPreTraining's pooler and NSP head) stay, so a strict load reports them.
nn::NamedTensors bert_state_from_hf(const nn::NamedTensors& state);

}  // namespace ampforge::models
