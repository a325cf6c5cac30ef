// BERT (Hugging Face's modeling_bert.py structure): see bert.h for the facts kept. Modules are registered in
// HF's order, so state_dict() lists HF's keys in HF's order. Shapes: B batch, T tokens, H hidden, I
// intermediate, V vocabulary, M masked positions, h heads, d = H / h.
#include "ampforge/models/bert.h"

#include <fmt/ranges.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "ampforge/autograd/node.h"
#include "ampforge/nn/init.h"
#include "ampforge/ops/ops.h"

namespace ampforge::models {

using namespace ampforge::nn;

void BertConfig::validate() const {
  AF_CHECK(vocab_size > 0, "BertConfig: vocab_size must be positive, got {}", vocab_size);
  AF_CHECK(hidden_size > 0 && num_hidden_layers > 0 && intermediate_size > 0,
           "BertConfig: hidden_size ({}), num_hidden_layers ({}) and intermediate_size ({}) must be positive",
           hidden_size, num_hidden_layers, intermediate_size);
  AF_CHECK(num_attention_heads > 0 && hidden_size % num_attention_heads == 0,
           "BertConfig: hidden_size {} is not a multiple of num_attention_heads {}", hidden_size, num_attention_heads);
  AF_CHECK(hidden_dropout_prob >= 0 && hidden_dropout_prob < 1 && attention_probs_dropout_prob >= 0 &&
               attention_probs_dropout_prob < 1,
           "BertConfig: dropout probabilities must be in [0, 1), got {} and {}", hidden_dropout_prob,
           attention_probs_dropout_prob);
  AF_CHECK(max_position_embeddings > 0 && type_vocab_size > 0,
           "BertConfig: max_position_embeddings ({}) and type_vocab_size ({}) must be positive",
           max_position_embeddings, type_vocab_size);
  AF_CHECK(pad_token_id >= 0 && pad_token_id < vocab_size, "BertConfig: pad_token_id {} is outside the vocabulary "
           "[0, {})", pad_token_id, vocab_size);
  AF_CHECK(layer_norm_eps > 0 && initializer_range >= 0, "BertConfig: layer_norm_eps must be positive and "
           "initializer_range non-negative, got {} and {}", layer_norm_eps, initializer_range);
}

std::vector<std::string> bert_presets() { return {"bert-base", "bert-mini", "bert-tiny"}; }

BertConfig bert_config(const std::string& preset) {
  BertConfig c;  // bert-base-uncased (MODELS.md §B.1)
  if (preset == "bert-base") return c;
  if (preset == "bert-mini") {  // Google's BERT-Mini (L=4, H=256): 4 heads of 64, intermediate 4H
    c.num_hidden_layers = 4, c.hidden_size = 256, c.num_attention_heads = 4, c.intermediate_size = 1024;
    return c;
  }
  if (preset == "bert-tiny") {  // Google's BERT-Tiny (L=2, H=128)
    c.num_hidden_layers = 2, c.hidden_size = 128, c.num_attention_heads = 2, c.intermediate_size = 512;
    return c;
  }
  AF_THROW(InvalidArgument, "unknown BERT preset '{}': expected one of {}", preset, fmt::join(bert_presets(), ", "));
}

namespace {

// HF's _init_weights for a Linear: weight normal(0, range), bias 0.
std::shared_ptr<Linear> bert_linear(int64_t in, int64_t out, const BertConfig& c) {
  auto l = std::make_shared<Linear>(in, out);
  init::normal_(l->weight, 0.0, c.initializer_range);
  init::zeros_(l->bias);
  return l;
}

std::shared_ptr<Embedding> bert_embedding(int64_t n, int64_t dim, int64_t padding_idx, const BertConfig& c) {
  auto e = std::make_shared<Embedding>(n, dim, padding_idx);
  init::normal_(e->weight, 0.0, c.initializer_range);
  if (padding_idx >= 0 && !init::SkipInitGuard::active()) {
    autograd::NoGradGuard ng;
    ops::fill_(ops::narrow(e->weight, 0, padding_idx, 1), 0.0);
  }
  return e;
}

std::shared_ptr<LayerNorm> bert_layer_norm(const BertConfig& c) {
  return std::make_shared<LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps);  // weight 1, bias 0
}

// A container whose children are "0", "1", ... (HF's nn.ModuleList); it has no forward of its own.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <class M>
  std::shared_ptr<M> append(std::shared_ptr<M> m) {
    return register_module(std::to_string(children().size()), std::move(m));
  }
};

// A module that only names its children (HF's BertOnlyMLMHead / BertPredictionHeadTransform / BertEncoder).
class Container : public Module {
 public:
  explicit Container(std::string type) : Module(std::move(type)) {}
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

}  // namespace

// ---- BertEmbeddings: word + position + token type -> LayerNorm -> dropout -------------------------------
BertEmbeddings::BertEmbeddings(const BertConfig& c) : Module("BertEmbeddings") {
  word_embeddings = register_module("word_embeddings", bert_embedding(c.vocab_size, c.hidden_size, c.pad_token_id, c));
  position_embeddings =
      register_module("position_embeddings", bert_embedding(c.max_position_embeddings, c.hidden_size, -1, c));
  token_type_embeddings =
      register_module("token_type_embeddings", bert_embedding(c.type_vocab_size, c.hidden_size, -1, c));
  LayerNorm = register_module("LayerNorm", bert_layer_norm(c));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.hidden_dropout_prob));
}

Tensor BertEmbeddings::forward_ids(const Tensor& ids, const Tensor& token_types) {  // ids (B, T)
  const int64_t T = ids.size(1), P = position_embeddings->weight.size(0);
  AF_CHECK(T <= P, "BERT: sequence length {} exceeds the position table ({} positions, max_position_embeddings)",
           T, P);
  const Device dev = ids.device();
  Tensor words = (*word_embeddings)(ids);                                                        // (B, T, H)
  Tensor pos = (*position_embeddings)(ops::arange(0, static_cast<double>(T), 1, DType::I64, dev));  // (T, H)
  Tensor types = token_types.defined() ? token_types : ops::zeros(ids.shape(), DType::I64, dev);
  Tensor x = add(add(words, (*token_type_embeddings)(types)), pos);  // HF: (words + types) + positions
  return (*dropout)((*LayerNorm)(x));                                // (B, T, H)
}

// ---- BertSelfAttention: softmax(Q K^T / sqrt(d) + mask) -> dropout -> V ------------------------------------
BertSelfAttention::BertSelfAttention(const BertConfig& c)
    : Module("BertSelfAttention"), heads(c.num_attention_heads), head_dim(c.hidden_size / c.num_attention_heads) {
  query = register_module("query", bert_linear(c.hidden_size, c.hidden_size, c));
  key = register_module("key", bert_linear(c.hidden_size, c.hidden_size, c));
  value = register_module("value", bert_linear(c.hidden_size, c.hidden_size, c));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.attention_probs_dropout_prob));
}

Tensor BertSelfAttention::forward_masked(const Tensor& x, const Tensor& mask) {  // x (B, T, H)
  const int64_t B = x.size(0), T = x.size(1);
  auto split = [&](const Tensor& t) {  // (B, T, H) -> (B, h, T, d)
    return permute(reshape(t, {B, T, heads, head_dim}), {0, 2, 1, 3});
  };
  Tensor q = split((*query)(x)), k = split((*key)(x)), v = split((*value)(x));
  Tensor ctx;  // (B, h, T, d), scale 1/sqrt(d)
  if (dropout->is_training() && dropout->p > 0) {
    // The fused op has no dropout: with dropout on the probabilities, HF's composite (the masked scores
    // get -inf, which softmax turns into exact zeros, as HF's finfo.min does).
    Tensor scores = mul(matmul(q, transpose(k, 2, 3)), 1.0 / std::sqrt(static_cast<double>(head_dim)));
    if (mask.defined())
      scores = where(mask, scores,
                     ops::full({}, -std::numeric_limits<double>::infinity(), scores.dtype(), scores.device()));
    ctx = matmul((*dropout)(softmax(scores, -1)), v);  // (B, h, T, T) x (B, h, T, d)
  } else {
    ctx = scaled_dot_product_attention(q, k, v, mask);  // the fused `attention` op
  }
  return reshape(permute(ctx, {0, 2, 1, 3}), {B, T, heads * head_dim});   // (B, T, H)
}

// ---- BertSelfOutput / BertOutput: dense -> dropout -> LayerNorm(x + residual) ------------------------------
BertResidualOutput::BertResidualOutput(const std::string& type, int64_t in, const BertConfig& c) : Module(type) {
  dense = register_module("dense", bert_linear(in, c.hidden_size, c));
  LayerNorm = register_module("LayerNorm", bert_layer_norm(c));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.hidden_dropout_prob));
}

Tensor BertResidualOutput::forward_residual(const Tensor& x, const Tensor& residual) {
  return (*LayerNorm)(add((*dropout)((*dense)(x)), residual));  // post-LN
}

BertAttention::BertAttention(const BertConfig& c) : Module("BertAttention") {
  self = register_module("self", std::make_shared<BertSelfAttention>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>("BertSelfOutput", c.hidden_size, c));
}

Tensor BertAttention::forward_masked(const Tensor& x, const Tensor& mask) {
  return output->forward_residual(self->forward_masked(x, mask), x);
}

BertIntermediate::BertIntermediate(const BertConfig& c) : Module("BertIntermediate") {
  dense = register_module("dense", bert_linear(c.hidden_size, c.intermediate_size, c));
}

Tensor BertIntermediate::forward(const Tensor& x) { return gelu((*dense)(x), GeluApprox::None); }  // exact erf

// ---- BertLayer: attention -> intermediate -> output ----------------------------------------------------------
BertLayer::BertLayer(const BertConfig& c) : Module("BertLayer") {
  attention = register_module("attention", std::make_shared<BertAttention>(c));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>("BertOutput", c.intermediate_size, c));
}

Tensor BertLayer::forward_masked(const Tensor& x, const Tensor& mask) {   // (B, T, H)
  Tensor a = attention->forward_masked(x, mask);                          // (B, T, H)
  return output->forward_residual((*intermediate)(a), a);                 // (B, T, I) -> (B, T, H)
}

BertPooler::BertPooler(const BertConfig& c) : Module("BertPooler") {
  dense = register_module("dense", bert_linear(c.hidden_size, c.hidden_size, c));
}

Tensor BertPooler::forward(const Tensor& seq) { return tanh((*dense)(select(seq, 1, 0))); }  // (B, H)

// ---- BertModel ------------------------------------------------------------------------------------------------
BertModel::BertModel(const BertConfig& c, bool add_pooling_layer) : Module("BertModel"), config_(c) {
  c.validate();
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  auto enc = std::make_shared<Container>("BertEncoder");
  auto list = enc->add("layer", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers.push_back(list->append(std::make_shared<BertLayer>(c)));
  encoder = register_module("encoder", std::static_pointer_cast<Module>(enc));
  if (add_pooling_layer) pooler = register_module("pooler", std::make_shared<BertPooler>(c));
}

Tensor BertModel::encode(const Tensor& ids, const Tensor& attention_mask, const Tensor& token_types) {
  AF_CHECK(ids.defined() && ids.dim() == 2, "BERT: input_ids must be (batch, tokens), got {}",
           ids.defined() ? ids.shape().str() : std::string("an undefined tensor"));
  AF_CHECK(ids.dtype() == DType::I64 || ids.dtype() == DType::I32, "BERT: input_ids must be integer token ids, got {}",
           dtype_name(ids.dtype()));
  if (token_types.defined())
    AF_CHECK(token_types.shape() == ids.shape(), "BERT: token_type_ids {} must have input_ids' shape {}",
             token_types.shape().str(), ids.shape().str());
  Tensor mask;  // (B, 1, 1, T) Bool: every query of sequence b attends the keys that are not padding
  if (attention_mask.defined()) {
    AF_CHECK(attention_mask.shape() == ids.shape(), "BERT: attention_mask {} must have input_ids' shape {}",
             attention_mask.shape().str(), ids.shape().str());
    Tensor m = attention_mask.dtype() == DType::Bool
                   ? attention_mask
                   : ops::compare(OpId::ne, attention_mask, ops::zeros({}, attention_mask.dtype(), ids.device()));
    mask = ops::view_as_shape(ops::contiguous(m), {ids.size(0), 1, 1, ids.size(1)});
  }
  Tensor x = embeddings->forward_ids(ids.dtype() == DType::I64 ? ids : ids.to(DType::I64), token_types);
  for (auto& layer : layers) x = layer->forward_masked(x, mask);  // (B, T, H)
  return x;
}

Tensor BertModel::pool(const Tensor& seq) {
  AF_CHECK(pooler != nullptr, "BertModel::pool: this model was built without the pooling layer");
  return (*pooler)(seq);
}

Tensor BertModel::forward(const Tensor& ids) { return encode(ids); }

// ---- MLM head: transform (dense -> GELU -> LayerNorm) -> decoder tied to the word embeddings + bias ----------
BertLMPredictionHead::BertLMPredictionHead(const BertConfig& c, Tensor tied)
    : Module("BertLMPredictionHead"), decoder_weight(std::move(tied)) {
  bias = register_parameter("bias", ops::zeros({c.vocab_size}));
  auto t = std::make_shared<Container>("BertPredictionHeadTransform");
  transform_dense = t->add("dense", bert_linear(c.hidden_size, c.hidden_size, c));
  transform_LayerNorm = t->add("LayerNorm", bert_layer_norm(c));
  transform = register_module("transform", std::static_pointer_cast<Module>(t));
}

Tensor BertLMPredictionHead::forward(const Tensor& h) {                       // (..., H)
  Tensor t = (*transform_LayerNorm)(gelu((*transform_dense)(h), GeluApprox::None));
  return linear(t, decoder_weight, bias);                                     // (..., V)
}

BertForMaskedLM::BertForMaskedLM(const BertConfig& c)
    : MaskedLanguageModel("BertForMaskedLM"), masked_positions_only(c.mlm_masked_positions_only) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/false));
  auto head = std::make_shared<Container>("BertOnlyMLMHead");
  predictions = head->add("predictions",
                          std::make_shared<BertLMPredictionHead>(c, bert->embeddings->word_embeddings->weight));
  cls = register_module("cls", std::static_pointer_cast<Module>(head));
}

Tensor BertForMaskedLM::logits(const Tensor& ids, const Tensor& attention_mask, const Tensor& positions,
                               const Tensor& token_types) {
  Tensor seq = bert->encode(ids, attention_mask, token_types);  // (B, T, H)
  if (!positions.defined()) return (*predictions)(seq);          // (B, T, V)
  const int64_t H = seq.size(2);
  // Gather M hidden rows before the head (embedding() is the differentiable row gather: its backward adds
  // the rows' gradients back into the (B*T, H) matrix).
  Tensor rows = embedding(positions, reshape(seq, {-1, H}));  // (M, H)
  return (*predictions)(rows);                                 // (M, V)
}

MaskedTargets masked_targets(const Tensor& labels, int64_t ignore_index, int64_t meta_rows) {
  if (labels.device().is_meta()) {
    if (meta_rows < 0)
      AF_THROW(NotImplemented, "masked_targets: on the meta device the number of masked rows cannot be read from the "
               "labels (they have no values); pass meta_rows");
    AF_CHECK(meta_rows <= labels.numel(), "masked_targets: meta_rows {} exceeds the {} labels", meta_rows,
             labels.numel());
    return {Tensor::empty({meta_rows}, DType::I64, labels.device()), Tensor::empty({meta_rows}, DType::I64, labels.device())};
  }
  Tensor l = ops::contiguous(ops::to_device(labels, kCPU));
  if (l.dtype() != DType::I64) l = ops::to_dtype(l, DType::I64);
  const int64_t* p = l.data<int64_t>();
  std::vector<int64_t> pos, tgt;
  for (int64_t i = 0; i < l.numel(); ++i)
    if (p[i] != ignore_index) pos.push_back(i), tgt.push_back(p[i]);
  const int64_t m = static_cast<int64_t>(pos.size());
  return {ops::to_device(Tensor::from_vector(pos, {m}), labels.device()),
          ops::to_device(Tensor::from_vector(tgt, {m}), labels.device())};
}

Tensor BertForMaskedLM::mlm_loss(const Tensor& ids, const Tensor& attention_mask, const Tensor& labels,
                                 int64_t meta_rows) {
  AF_CHECK(labels.defined() && labels.shape() == ids.shape(), "BertForMaskedLM: labels must have input_ids' shape {}",
           ids.shape().str());
  if (!masked_positions_only) {
    Tensor scores = logits(ids, attention_mask);  // (B, T, V)
    return cross_entropy(reshape(scores, {-1, config().vocab_size}), reshape(labels.to(DType::I64), {-1}));
  }
  const MaskedTargets m = masked_targets(labels, -100, meta_rows);
  return cross_entropy(logits(ids, attention_mask, m.positions), m.targets);  // (M, V), (M)
}

Tensor BertForMaskedLM::forward(const Tensor& ids) { return logits(ids); }

nn::NamedTensors bert_state_from_hf(const nn::NamedTensors& state) {
  auto ends_with = [](const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
  };
  std::set<std::string> names;
  for (const auto& [k, t] : state) names.insert(k);
  nn::NamedTensors out;
  for (const auto& [k0, t] : state) {
    std::string k = k0;
    if (ends_with(k, "LayerNorm.gamma")) k = k.substr(0, k.size() - 5) + "weight";
    if (ends_with(k, "LayerNorm.beta")) k = k.substr(0, k.size() - 4) + "bias";
    if (ends_with(k, ".position_ids") || ends_with(k, ".token_type_ids")) continue;  // HF's non-persistent buffers
    if (k == "cls.predictions.decoder.bias") continue;                              // = cls.predictions.bias
    if (k == "cls.predictions.decoder.weight") {                                   // = the word embeddings
      if (names.count("bert.embeddings.word_embeddings.weight")) continue;
      k = "bert.embeddings.word_embeddings.weight";
    }
    out.emplace_back(k, t);
  }
  return out;
}

}  // namespace ampforge::models
