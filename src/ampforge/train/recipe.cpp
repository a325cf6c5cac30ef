#include "ampforge/train/recipe.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/runtime.h"
#include "ampforge/core/generator.h"
#include "ampforge/dist/environment.h"
#include "ampforge/core/safetensors.h"
#include <filesystem>

#include "ampforge/data/dataset.h"
#include "ampforge/data/image_folder.h"
#include "ampforge/data/resized_dataset.h"
#include "ampforge/data/yolo_dataset.h"
#include "ampforge/models/registry.h"
#include "ampforge/nn/state_dict.h"
#include <cstdio>
#include "ampforge/memory/global.h"
#include "ampforge/models/models.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/optim/param_groups.h"
#include "ampforge/tasks/classification.h"
#include "ampforge/tasks/detection.h"
#include "ampforge/tasks/masked_lm.h"
#include "ampforge/data/text_corpus.h"
#include "ampforge/data/wordpiece.h"
#include "ampforge/models/bert.h"
#include <cstdlib>
#include <functional>
#include "ampforge/util/error.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge::train {

int64_t eval_batch_size(const TrainConfig& c, bool masked_lm, const Shape& example_shape) {
  if (c.eval_batch_size > 0) return c.eval_batch_size;
  const bool small_images = !masked_lm && example_shape.size() == 3 && example_shape[1] * example_shape[2] <= 64 * 64;
  return small_images ? 1000 : c.batch_size;
}

namespace {

void validate(const TrainConfig& c) {
  AF_CHECK(c.batch_size >= 1, "--batch must be >= 1, got {}", c.batch_size);
  AF_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr must be a positive number, got {}", c.lr);
  AF_CHECK(c.lr_reference_batch >= 0, "--lr-reference-batch must be >= 0, got {}", c.lr_reference_batch);
  AF_CHECK(c.eval_batch_size >= 0, "--eval-batch must be >= 1 (0: auto), got {}", c.eval_batch_size);
  AF_CHECK(c.optimizer == "adamw" || c.optimizer == "sgd" || c.optimizer == "auto",
           "--optimizer must be adamw, sgd or auto, got '{}'", c.optimizer);
  AF_CHECK(c.accumulate >= 0, "--accumulate must be >= 1 (0: auto), got {}", c.accumulate);
  AF_CHECK(c.nbs >= 1, "--nbs must be >= 1, got {}", c.nbs);
  AF_CHECK(c.warmup_epochs >= 0 && std::isfinite(c.warmup_epochs), "--warmup-epochs must be >= 0, got {}",
           c.warmup_epochs);
  AF_CHECK(c.warmup_bias_lr >= 0 && std::isfinite(c.warmup_bias_lr), "--warmup-bias-lr must be >= 0, got {}",
           c.warmup_bias_lr);
  AF_CHECK(c.warmup_momentum >= 0 && c.warmup_momentum < 1, "--warmup-momentum must be in [0, 1), got {}",
           c.warmup_momentum);
  AF_CHECK(c.lrf < 0 || c.lrf <= 1, "--lrf must be in [0, 1], got {}", c.lrf);
  AF_CHECK(c.momentum < 0 || c.momentum < 1, "--momentum must be in [0, 1), got {}", c.momentum);
  AF_CHECK(c.ema == "on" || c.ema == "off" || c.ema == "auto", "--ema must be on, off or auto, got '{}'", c.ema);
  AF_CHECK(c.ema_decay >= 0 && c.ema_decay < 1, "--ema-decay must be in [0, 1), got {}", c.ema_decay);
  AF_CHECK(c.ema_tau >= 0, "--ema-tau must be >= 0, got {}", c.ema_tau);
  AF_CHECK(c.dataset == "fashion-mnist" || c.dataset == "mnist" || c.dataset == "synthetic" ||
               c.dataset == "image-folder" || c.dataset == "detection" || c.dataset == "text",
           "--dataset must be fashion-mnist, mnist, image-folder, synthetic, text or detection, got '{}'", c.dataset);
  {
    const models::ModelEntry* e = models::model_registry().find(c.model);
    const bool det_model = e && e->task == "detection";
    AF_CHECK(!e || det_model == (c.dataset == "detection"), "--model {} is a {} model; --dataset {} {}", c.model,
             e ? e->task : "", c.dataset, det_model ? "must be detection" : "is for detection models (yolov8n, ...)");
  }
  AF_CHECK(c.dataset != "text" || !c.corpus.empty(), "--dataset text needs --corpus wordnet|FILE");
  AF_CHECK(c.seq_len >= 3, "--seq-len must hold [CLS], a token and [SEP] (>= 3), got {}", c.seq_len);
  AF_CHECK(c.vocab_size >= 64, "--vocab-size must be >= 64, got {}", c.vocab_size);
  AF_CHECK(c.dataset != "image-folder" || !c.data_dir.empty(),
           "--dataset image-folder needs --data-dir DIR (with DIR/train and DIR/val, one sub-folder per class)");
  AF_CHECK(c.image_size == 0 || (c.image_size >= 8 && c.image_size <= 4096), "--image-size must be 0 (the data "
           "set's own) or in [8, 4096], got {}", c.image_size);
  AF_CHECK(c.synthetic_classes >= 1, "--synthetic-classes must be >= 1, got {}", c.synthetic_classes);
  AF_CHECK(c.threads >= 0 && c.threads <= 1024, "--threads must be in [0, 1024], got {}", c.threads);
  AF_CHECK(c.workers >= 0 && c.workers <= 64, "--workers must be in [0, 64], got {}", c.workers);
  AF_CHECK(!c.stochastic_rounding || (c.master_weights && c.precision == DType::BF16),
           "--stochastic-rounding needs --precision bf16 --master-weights (it rounds the BF16 model copy)");
  // The loader shuffles a permutation of every index each epoch (8 bytes each, as PyTorch's RandomSampler's randperm):
  // 1e8 examples hold 800 MB of it; above that a synthetic set is a mistake, not a workload.
  AF_CHECK(c.synthetic_size >= 1 && c.synthetic_size <= 100'000'000,
           "--synthetic-size must be in [1, 100000000], got {}", c.synthetic_size);
  AF_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 1, "--label-smoothing must be in [0, 1), got {}",
           c.label_smoothing);
  if (c.schedule != "auto") optim::schedule_from_string(c.schedule);
  nan_policy_from_string(c.nan_policy);
  AF_CHECK(c.mosaic == -1 || (c.mosaic >= 0 && c.mosaic <= 1), "--mosaic must be a probability in [0, 1], got {}",
           c.mosaic);
  AF_CHECK(c.close_mosaic >= 0, "--close-mosaic must be >= 0 epochs, got {}", c.close_mosaic);
  AF_CHECK(c.mosaic < 0 || c.dataset == "detection", "--mosaic is for --dataset detection (YOLOv8 models)");
  // Ultralytics leaves mosaic on for the whole run then (its switch-off epoch never comes); a flag that does
  // nothing is worse: say so.
  AF_CHECK(!(c.mosaic > 0) || c.close_mosaic < c.epochs, "--mosaic {} with --close-mosaic {} >= --epochs {} would "
           "never make a mosaic: lower --close-mosaic", c.mosaic, c.close_mosaic, c.epochs);
}

// The detection default of --mosaic: it depends on the epochs only, so make_datasets can use it before the rest of
// the config is resolved (resolve_auto).
double resolved_mosaic(const TrainConfig& c, bool detection) {
  if (c.mosaic >= 0) return c.mosaic;
  return detection && c.epochs > c.close_mosaic ? 1.0 : 0.0;
}

Device parse_device(const std::string& s) {
  try {
    return Device::parse(s);
  } catch (const Error&) {
    AF_THROW(InvalidArgument, "--device must be cpu, cuda or cuda:N, got '{}'", s);
  }
}

nlohmann::json config_json(const TrainConfig& c) {
  const char* prec = c.precision == DType::F32 ? "fp32" : c.precision == DType::F16 ? "fp16" : "bf16";
  return {{"model", c.model},           {"dataset", c.dataset},       {"image_size", c.image_size},
          {"detection_data", c.dataset == "detection" ? c.detection_data : ""},
          {"epochs", c.epochs},
          {"batch_size", c.batch_size}, {"accumulate", c.accumulate}, {"lr", effective_lr(c)},
          {"optimizer", c.optimizer},   {"weight_decay", c.weight_decay},
          {"no_decay_bias_norm", c.no_decay_bias_norm}, {"schedule", c.schedule},
          {"warmup_steps", c.warmup_steps}, {"label_smoothing", c.label_smoothing}, {"seed", c.seed},
          {"precision", prec}, {"master_weights", c.master_weights}, {"recompute", c.recompute},
          {"stochastic_rounding", c.stochastic_rounding},
          {"channels_last", c.channels_last}, {"device", c.device}, {"cuda_graphs", c.cuda_graphs},
          {"corpus", c.corpus}, {"vocab", c.vocab}, {"vocab_size", c.vocab_size}, {"seq_len", c.seq_len},
          {"momentum", c.momentum}, {"nesterov", c.nesterov}, {"clip_grad_norm", c.clip_grad_norm}, {"lrf", c.lrf},
          {"nbs", c.nbs}, {"warmup_bias_lr", c.warmup_bias_lr}, {"warmup_momentum", c.warmup_momentum},
          {"ema", c.ema}, {"ema_decay", c.ema_decay}, {"ema_tau", c.ema_tau},
          {"mosaic", c.dataset == "detection" ? resolved_mosaic(c, true) : 0.0}, {"close_mosaic", c.close_mosaic},
          {"world_size", dist::detect_world().size}};
}

struct Datasets {
  std::shared_ptr<data::Dataset> train, test;
};

// The data sets the config names, shaped for a model that takes `channels`-channel images.
Datasets make_datasets(const TrainConfig& cfg, int64_t channels) {
  namespace fs = std::filesystem;
  Datasets d;
  if (cfg.dataset == "synthetic") {
    const int64_t s = cfg.image_size > 0 ? cfg.image_size : 28;
    const Shape shape{channels, s, s};
    d.train = std::make_shared<data::SyntheticDataset>(cfg.synthetic_size, shape, cfg.synthetic_classes, cfg.seed + 1);
    d.test = std::make_shared<data::SyntheticDataset>(std::max<int64_t>(cfg.synthetic_size / 4, 1), shape,
                                                      cfg.synthetic_classes, cfg.seed + 2);
  } else if (cfg.dataset == "detection") {
    std::string data_file = cfg.detection_data;
    if (data_file == "fashion-mnist-detection") {
      const std::string dir = cfg.data_dir.empty() ? std::string("fashion-mnist-detection") : cfg.data_dir;
      data_file = dir + "/data.yaml";
      if (!fs::exists(data_file)) {
        if (cfg.verbose) std::fprintf(stderr, "composing the Fashion-MNIST detection set into %s\n", dir.c_str());
        data::ComposeDetectionOptions co;
        co.seed = cfg.seed;
        data::compose_fashion_mnist_detection(dir, co);
      }
    }
    const data::DetectionDataSpec spec = data::read_detection_data_file(data_file);
    data::DetectionDatasetOptions o;
    o.image_size = cfg.image_size > 0 ? cfg.image_size : 320;
    o.name = cfg.detection_data == "fashion-mnist-detection" ? cfg.detection_data : "detection";
    o.augment = false;
    auto test = std::make_shared<data::YoloDetectionDataset>(spec.val, spec.names, o);
    o.augment = true;
    o.mosaic = resolved_mosaic(cfg, true);
    o.close_mosaic_epoch = cfg.epochs - cfg.close_mosaic;  // <= 0 only with mosaic 0 (validate)
    d.train = std::make_shared<data::YoloDetectionDataset>(spec.train, spec.names, o);
    d.test = test;
    AF_CHECK(channels == 3, "--dataset detection gives RGB images; --model {} takes {} channel(s)", cfg.model, channels);
  } else if (cfg.dataset == "image-folder") {
    const int64_t s = cfg.image_size > 0 ? cfg.image_size : 224;
    const fs::path root(cfg.data_dir), train_dir = root / "train";
    const fs::path eval_dir = fs::is_directory(root / "val") ? root / "val" : root / "test";
    AF_CHECK(fs::is_directory(train_dir), "--data-dir {}: no 'train' folder (expected DIR/train/<class>/<image> and "
             "DIR/val/<class>/<image>)", cfg.data_dir);
    AF_CHECK(fs::is_directory(eval_dir), "--data-dir {}: no 'val' (or 'test') folder for evaluation", cfg.data_dir);
    auto train = std::make_shared<data::ImageFolderDataset>(train_dir.string(), data::ImageFolderOptions::train_defaults(s));
    auto test = std::make_shared<data::ImageFolderDataset>(eval_dir.string(), data::ImageFolderOptions::eval_defaults(s));
    AF_CHECK(train->classes() == test->classes(), "--data-dir {}: the class folders of train ({}) and {} ({}) differ",
             cfg.data_dir, train->classes().size(), eval_dir.filename().string(), test->classes().size());
    AF_CHECK(channels == 3, "--dataset image-folder gives RGB images; --model {} takes {} channel(s)", cfg.model,
             channels);
    d.train = train;
    d.test = test;
  } else {
    const std::string dir = !cfg.data_dir.empty() ? cfg.data_dir
                            : cfg.dataset == "fashion-mnist" ? data::default_fashion_mnist_dir()
                                                             : "/usr/share/datasets/mnist";
    std::shared_ptr<data::Dataset> train = std::make_shared<data::MnistDataset>(dir, true, cfg.dataset);
    std::shared_ptr<data::Dataset> test = std::make_shared<data::MnistDataset>(dir, false, cfg.dataset);
    const int64_t native = train->example_shape()[1];
    const int64_t s = cfg.image_size > 0 ? cfg.image_size : native;
    if (s != native || channels != 1) {  // e.g. 3 x 32 x 32 for the torchvision ResNets
      train = std::make_shared<data::ResizedDataset>(train, channels, s);
      test = std::make_shared<data::ResizedDataset>(test, channels, s);
    }
    d.train = train;
    d.test = test;
  }
  return d;
}

// ---- text data for masked-LM models ----------------------------------------------------------------------
struct TextSetup {
  Datasets data;
  tasks::MaskedLMOptions task;
};

std::string text_cache_dir(const TrainConfig& cfg) {
  if (!cfg.text_cache.empty()) return cfg.text_cache;
  if (const char* d = std::getenv("AMPFORGE_CACHE_DIR"); d && *d) return std::string(d) + "/text";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/ampforge/text";
  return (std::filesystem::temp_directory_path() / "ampforge-text").string();
}

// The corpus' documents, its vocabulary (given, or learned from the training split once and cached) and its
// token file (cached by corpus, vocabulary and their sizes), then the two splits as fixed-length sequences.
TextSetup make_text_setup(const TrainConfig& cfg, int64_t max_positions) {
  namespace fs = std::filesystem;
  AF_CHECK(cfg.seq_len <= max_positions, "--seq-len {} is longer than the model's position table ({} positions, "
           "max_position_embeddings)", cfg.seq_len, max_positions);
  TextSetup t;
  data::TextSplitOptions so;
  so.seq_len = cfg.seq_len;
  if (cfg.dataset == "synthetic") {
    const int64_t vocab = cfg.vocab.empty() ? 30522 : data::Vocab::load(cfg.vocab).size();
    t.data.train = std::make_shared<data::SyntheticTokenDataset>(cfg.synthetic_size, cfg.seq_len, vocab, cfg.seed + 1);
    t.data.test = std::make_shared<data::SyntheticTokenDataset>(std::max<int64_t>(cfg.synthetic_size / 4, 1),
                                                               cfg.seq_len, vocab, cfg.seed + 2);
    t.task.vocab_size = vocab;
    t.task.pad_id = 0, t.task.cls_id = 2, t.task.sep_id = 3, t.task.mask_id = 4;  // SyntheticTokenDataset's ids
    return t;
  }
  const bool wordnet = cfg.corpus == "wordnet";
  const std::vector<std::string> docs =
      wordnet ? data::read_wordnet_glosses() : data::read_text_lines(cfg.corpus);
  const std::string corpus_id = wordnet ? std::string("wordnet") : fs::path(cfg.corpus).filename().string();
  // A key for the cache: the corpus (name, size, document count), the vocabulary and the split rule.
  uint64_t h = std::hash<std::string>{}(wordnet ? std::string(data::kDefaultWordNetDir) : fs::absolute(cfg.corpus).string());
  h ^= docs.size() * 0x9E3779B97F4A7C15ull;
  for (const auto& d : docs) h = h * 1099511628211ull ^ std::hash<std::string>{}(d);
  const fs::path dir = fs::path(text_cache_dir(cfg)) / fmt::format("{}-{:016x}", corpus_id, h);
  fs::create_directories(dir);
  so.held_out_every = 20;
  std::string vocab_path = cfg.vocab;
  if (vocab_path.empty()) {
    vocab_path = (dir / fmt::format("vocab-{}.txt", cfg.vocab_size)).string();
    if (!fs::exists(vocab_path)) {
      std::vector<std::string> train_docs;
      for (size_t d = 0; d < docs.size(); ++d)
        if (d % static_cast<size_t>(so.held_out_every) != 0) train_docs.push_back(docs[d]);
      data::VocabLearnOptions vo;
      vo.vocab_size = cfg.vocab_size;
      const data::Vocab v = data::learn_wordpiece_vocab(train_docs, vo);
      v.save(vocab_path + ".tmp");
      fs::rename(vocab_path + ".tmp", vocab_path);
      if (cfg.verbose)
        std::fprintf(stderr, "vocab: learned %lld WordPiece tokens from the training split of %s -> %s\n",
                     static_cast<long long>(v.size()), corpus_id.c_str(), vocab_path.c_str());
    }
  }
  const data::WordPieceTokenizer tok = data::WordPieceTokenizer::from_file(vocab_path);
  const std::string tok_path =
      (dir / fmt::format("tokens-{:016x}.tok", std::hash<std::string>{}(fs::absolute(vocab_path).string()) ^
                                                   static_cast<uint64_t>(tok.vocab().size()))).string();
  if (!fs::exists(tok_path)) data::TokenFile::write(tok_path, docs, tok);
  auto tf = std::make_shared<const data::TokenFile>(data::TokenFile::read(tok_path));
  AF_CHECK(tf->vocab_size() == tok.vocab().size(), "token file {} was made with a vocabulary of {} tokens, --vocab has "
           "{}; delete it to re-tokenise", tok_path, tf->vocab_size(), tok.vocab().size());
  auto train = std::make_shared<data::TextSequenceDataset>(tf, true, so, tok.cls_id(), tok.sep_id(), tok.pad_id(),
                                                           "text:" + corpus_id);
  auto test = std::make_shared<data::TextSequenceDataset>(tf, false, so, tok.cls_id(), tok.sep_id(), tok.pad_id(),
                                                          "text:" + corpus_id + ":held-out");
  if (cfg.verbose)
    std::fprintf(stderr, "text: %s, %lld documents, %lld tokens (vocabulary %lld); %lld training and %lld held-out "
                 "sequences of %lld\n", corpus_id.c_str(), static_cast<long long>(tf->documents()),
                 static_cast<long long>(tf->tokens()), static_cast<long long>(tok.vocab().size()),
                 static_cast<long long>(train->size()), static_cast<long long>(test->size()),
                 static_cast<long long>(cfg.seq_len));
  t.task.vocab_size = tok.vocab().size();
  t.task.pad_id = tok.pad_id(), t.task.cls_id = tok.cls_id(), t.task.sep_id = tok.sep_id();
  t.task.mask_id = tok.mask_id();
  t.task.unigram_log_probs = tasks::unigram_log_probs(train->stream(), tok.vocab().size());
  t.data.train = train;
  t.data.test = test;
  return t;
}

}  // namespace

TrainConfig resolve_auto(const TrainConfig& cfg, const std::string& task, int64_t examples, int64_t batches_per_epoch,
                         int64_t classes, int64_t ranks) {
  TrainConfig c = cfg;
  const bool det = task == "detection";
  const int64_t global_batch = c.batch_size * std::max<int64_t>(ranks, 1);
  if (c.accumulate == 0)
    c.accumulate = det ? std::max<int64_t>(std::llround(static_cast<double>(c.nbs) / static_cast<double>(global_batch)), 1)
                       : 1;
  if (c.schedule == "auto") c.schedule = det ? "linear" : "cosine";
  if (c.lrf < 0) c.lrf = det ? 0.01 : 0.0;
  if (c.clip_grad_norm < 0) c.clip_grad_norm = det ? 10.0 : 0.0;
  if (c.ema == "auto") c.ema = det ? "on" : "off";
  c.mosaic = resolved_mosaic(c, det);
  if (c.momentum < 0) c.momentum = det ? 0.937 : 0.9;
  if (det && c.weight_decay < 0) c.weight_decay = 5e-4;
  if (c.optimizer == "auto") {
    if (det) {
      // Ultralytics 8.x build_optimizer(name="auto"): iterations of max(batch, nbs) images over the run.
      const int64_t per = std::max(global_batch, c.nbs);
      const int64_t iterations = (examples + per - 1) / per * c.epochs;
      if (iterations > 10000) {
        c.optimizer = "sgd";
        c.lr = 0.01;
        c.nesterov = true;
      } else {
        c.optimizer = "adamw";
        c.lr = std::round(0.002 * 5.0 / (4.0 + static_cast<double>(classes)) * 1e6) / 1e6;
        c.warmup_bias_lr = 0;  // Ultralytics: no bias warm-up with AdamW auto
      }
      c.lr_reference_batch = 0;
    } else {
      c.optimizer = "adamw";
    }
  }
  if (c.warmup_steps < 0) {
    if (det) {
      // Ultralytics: nw = max(round(warmup_epochs x batches per epoch), 100) batches, here in optimizer steps; a
      // run shorter than that warms up over all but its last step.
      const int64_t nw = std::max<int64_t>(std::llround(c.warmup_epochs * static_cast<double>(batches_per_epoch)), 100);
      const int64_t steps = (nw + c.accumulate - 1) / c.accumulate;
      const int64_t total = (batches_per_epoch + c.accumulate - 1) / c.accumulate * c.epochs;
      c.warmup_steps = std::max<int64_t>(0, std::min(steps, total - 1));
    } else {
      c.warmup_steps = 0;
    }
  }
  return c;
}

double effective_lr(const TrainConfig& c) {
  if (c.lr_reference_batch <= 0) return c.lr;
  return c.lr * static_cast<double>(c.batch_size * c.accumulate) / static_cast<double>(c.lr_reference_batch);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& given, nn::Module& model) {
  // Values still "auto" (callers that run steps without a data set: memory fit, tests) are decided for a nominal
  // data set of one batch; train() passes a config it resolved against the real data set.
  const models::ModelEntry* entry = models::model_registry().find(given.model);
  const TrainConfig cfg = resolve_auto(given, entry ? entry->task : "classification", given.batch_size, 1,
                                       entry ? entry->defaults.num_classes : 10);
  const double lr = effective_lr(cfg);
  const bool adamw = cfg.optimizer == "adamw";
  AF_CHECK(adamw || cfg.optimizer == "sgd", "--optimizer must be adamw or sgd here (auto is decided by train()), got "
           "'{}'", cfg.optimizer);
  const double wd = cfg.weight_decay >= 0 ? cfg.weight_decay : adamw ? optim::AdamWOptions{}.weight_decay
                                                                     : optim::SGDOptions{}.weight_decay;
  std::vector<optim::ParamGroupSpec> groups;
  if (entry && entry->task == "detection") {
    // Ultralytics' three groups; the decay scaled to the nominal batch: wd x batch x accumulate / nbs.
    const double images = static_cast<double>(cfg.batch_size * cfg.accumulate * dist::detect_world().size);
    groups = optim::ultralytics_groups(model, wd * images / static_cast<double>(cfg.nbs), cfg.warmup_bias_lr);
  } else if (cfg.no_decay_bias_norm) {
    groups = optim::decay_groups(model, wd);
  } else {
    optim::ParamGroupSpec all;
    all.params = model.parameters();
    groups.push_back(std::move(all));
  }
  // Frozen parameters (YOLOv8's DFL conv) are not the optimizer's: it steps every parameter it holds.
  for (auto& g : groups)
    g.params.erase(std::remove_if(g.params.begin(), g.params.end(), [](const Tensor& p) { return !p.requires_grad(); }),
                   g.params.end());
  groups.erase(std::remove_if(groups.begin(), groups.end(), [](const optim::ParamGroupSpec& g) { return g.params.empty(); }),
               groups.end());
  if (adamw) {
    optim::AdamWOptions o;
    o.lr = lr;
    o.weight_decay = wd;
    o.rounding = {cfg.stochastic_rounding, cfg.seed};
    return std::make_unique<optim::AdamW>(groups, o);
  }
  optim::SGDOptions o;
  o.lr = lr;
  o.momentum = cfg.momentum;
  o.nesterov = cfg.nesterov;
  o.weight_decay = wd;
  o.rounding = {cfg.stochastic_rounding, cfg.seed};
  return std::make_unique<optim::SGD>(groups, o);
}

TrainResult train(const TrainConfig& config) {
  validate(config);
  AF_CHECK(config.dist_timeout > 0, "--dist-timeout must be positive, got {}", config.dist_timeout);
  AF_CHECK(config.collective_timeout >= 0, "--collective-timeout must be >= 0 seconds (0: no limit), got {}",
           config.collective_timeout);
  AF_CHECK(config.zero == 0 || config.zero == 1, "--zero must be 0 or 1, got {}", config.zero);
  AF_CHECK(config.zero == 0 || dist::detect_world().distributed(), "--zero 1 shards the optimizer state over the "
           "ranks of a data-parallel job: start the ranks with mpirun, srun, torchrun or `ampforge launch`");
  AF_CHECK(!config.sync_bn || dist::detect_world().distributed(), "--sync-bn shares batch-norm statistics between the "
           "ranks of a data-parallel job: start the ranks with mpirun, srun, torchrun or `ampforge launch`");
  TrainConfig given = config;  // the data-parallel setup below may quiet this rank
  TrainerOptions to;
  to.device = parse_device(given.device);
  // Data parallel when a launcher started this process: one GPU per rank (cuda = cuda:<local rank>), and on the
  // CPU the cores shared among the host's ranks.
  const dist::WorldInfo world = dist::detect_world();
  dist::CommunicatorPtr comm;
  if (world.distributed()) {
    if (given.device == "cuda") to.device = Device(DeviceType::CUDA, world.local_rank);
    runtime::check_device_exists(to.device, fmt::format("rank {}: device {}", world.rank, to.device.str()));
    dist::InitOptions io;
    io.device = to.device;
    io.timeout_s = given.dist_timeout;
    io.collective_timeout_s = given.collective_timeout;
    io.compute_stream = runtime::device_runtime(to.device).compute_stream(to.device.index);
    comm = dist::init_process_group(world, io);
    if (comm->rank() != 0) given.verbose = given.progress = false;
    if (given.threads == 0 && to.device.is_cpu())
      set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, world.local_size)));
    to.data_parallel.communicator = comm;
    to.data_parallel.bucket_cap_mb = given.bucket_mb;
    to.data_parallel.first_bucket_mb = given.first_bucket_mb;
    to.data_parallel.overlap = given.overlap;
    to.data_parallel.zero = given.zero;
    to.data_parallel.sync_batchnorm = given.sync_bn;
  }
  if (given.threads > 0) set_num_threads(given.threads);
  manual_seed(given.seed);
  memory::install_host_caching_allocator();  // before the model: its parameters come from the cache too
  const models::ModelEntry& entry = models::model_registry().at(given.model);
  const bool masked_lm = entry.task == "masked_lm";
  AF_CHECK(!masked_lm || given.dataset == "text" || given.dataset == "synthetic", "--model {} is a masked language "
           "model: use --dataset text --corpus wordnet|FILE (or --dataset synthetic)", given.model);
  AF_CHECK(masked_lm || given.dataset != "text", "--dataset text needs a masked language model (--model bert-mini, ...)");
  // Data sets that are prepared on first use (a learned vocabulary, token files, the composed detection set)
  // are written by rank 0 while the others wait, then read by everyone.
  if (comm && comm->rank() != 0) comm->barrier();
  std::optional<TextSetup> text;
  if (masked_lm) text = make_text_setup(given, models::bert_config(given.model).max_position_embeddings);
  const Datasets ds = masked_lm ? text->data : make_datasets(given, entry.defaults.in_channels);
  if (comm && comm->rank() == 0) comm->barrier();

  // Every "auto" value decided, now that the data set is known; `cfg` is what the run uses (and records). With
  // data parallel the global batch is --batch x ranks.
  const int64_t ranks = comm ? comm->size() : 1;
  const int64_t global_batch = given.batch_size * ranks;
  const int64_t batches_per_epoch = (ds.train->size() + global_batch - 1) / global_batch;
  const TrainConfig cfg =
      resolve_auto(given, entry.task, ds.train->size(), batches_per_epoch, ds.train->num_classes(), ranks);
  const data::Normalization norm = ds.train->normalization();
  data::LoaderOptions lo;
  lo.batch_size = cfg.batch_size;
  lo.seed = cfg.seed;
  lo.workers = cfg.workers;
  lo.mean = norm.mean;
  lo.std = norm.std;
  lo.crop_padding = cfg.crop_padding;
  lo.hflip = cfg.hflip;
  lo.format = cfg.channels_last && !masked_lm ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  lo.normalize = !masked_lm;  // token ids stay ids
  data::LoaderOptions elo = lo;
  elo.shuffle = false;
  elo.batch_size = eval_batch_size(cfg, masked_lm, ds.train->example_shape());
  elo.crop_padding = 0;
  elo.hflip = false;

  models::ModelOptions mo;
  mo.in_channels = masked_lm ? 1 : ds.train->example_shape()[0];
  mo.num_classes = ds.train->num_classes();  // masked LM: the vocabulary
  mo.image_size = masked_lm ? cfg.seq_len : ds.train->example_shape()[1];
  nn::ModulePtr model = entry.build(mo);
  to.model_record = {cfg.model, entry.task, mo.in_channels, mo.num_classes, mo.image_size};
  int64_t to_eval_batch_cap = 0;
  if (!cfg.weights.empty()) {
    // Not strict: a classifier for another number of classes keeps its own head (reported), as in
    // fine-tuning; everything else must match by name and shape.
    nn::LoadOptions lopt;
    lopt.strict = false;
    // The reference implementation's names are mapped first (BERT: Hugging Face's legacy names, tied duplicates).
    // An ampforge checkpoint: its weights (the weight average when the run kept one, as export takes them).
    const SafetensorsFile wf = load_safetensors(cfg.weights);
    nn::NamedTensors wstate;
    if (checkpoint::is_checkpoint(wf.metadata)) {
      wstate = checkpoint::model_weights(wf.tensors);
    } else {
      wstate = entry.reference_state(wf.tensors);
    }
    const nn::LoadReport rep = nn::load_state_dict(*model, wstate, lopt);
    AF_CHECK(!rep.loaded_keys.empty(), "--weights {}: no tensor matches --model {} ({})", cfg.weights, cfg.model,
             rep.str());
    if (cfg.verbose) std::fprintf(stderr, "weights %s: %s\n", cfg.weights.c_str(), rep.str().c_str());
  }

  std::shared_ptr<tasks::Task> task;
  if (entry.task == "detection") {
    tasks::DetectionTaskOptions dto;
    if (const auto* yolo = dynamic_cast<const data::YoloDetectionDataset*>(ds.test.get()))
      dto.class_names = yolo->class_names();  // the data file's names, for the per-class table
    task = std::make_shared<tasks::DetectionTask>(dto);
    // Detection evaluation keeps every image's activations of a large batch: cap it.
    to_eval_batch_cap = 32;
  } else if (masked_lm) {
    task = std::make_shared<tasks::MaskedLMTask>(text->task);
  } else {
    tasks::ClassificationOptions co;
    co.label_smoothing = cfg.label_smoothing;
    task = std::make_shared<tasks::ClassificationTask>(co);
  }

  to.epochs = cfg.epochs;
  to.max_steps = cfg.max_steps;
  to.accumulate = cfg.accumulate;
  to.precision = cfg.precision;
  to.master_weights = cfg.master_weights;
  to.recompute = cfg.recompute;
  to.clip_grad_norm = cfg.clip_grad_norm;
  to.nan_policy = nan_policy_from_string(cfg.nan_policy);
  to.schedule.kind = optim::schedule_from_string(cfg.schedule);
  to.schedule.warmup_steps = cfg.warmup_steps;
  to.schedule.final_factor = cfg.lrf;
  const bool detection = entry.task == "detection";
  // Ultralytics: momentum warm-up (SGD), gradients of the accumulated batches summed, not averaged.
  if (detection && cfg.optimizer == "sgd" && cfg.warmup_steps > 0) to.schedule.warmup_momentum = cfg.warmup_momentum;
  to.accumulate_sum = detection;
  to.ema = EmaOptions{cfg.ema == "on", cfg.ema_decay, cfg.ema_tau};
  if (detection && cfg.verbose)
    std::fprintf(stderr, "recipe (Ultralytics 8.x defaults unless given): %s lr %g%s, weight decay %g x %lld / %lld, "
                 "%s schedule to lr x %g, warm-up %lld steps (bias lr from %g%s), accumulate %lld (summed), clip %g, "
                 "EMA %s, mosaic %s\n", cfg.optimizer.c_str(), effective_lr(cfg), cfg.nesterov ? " nesterov" : "", cfg.weight_decay,
                 static_cast<long long>(cfg.batch_size * cfg.accumulate), static_cast<long long>(cfg.nbs),
                 cfg.schedule.c_str(), cfg.lrf, static_cast<long long>(cfg.warmup_steps), cfg.warmup_bias_lr,
                 to.schedule.warmup_momentum >= 0 ? fmt::format(", momentum from {}", cfg.warmup_momentum).c_str() : "",
                 static_cast<long long>(cfg.accumulate), cfg.clip_grad_norm, cfg.ema.c_str(),
                 cfg.mosaic > 0 ? fmt::format("{} (none in the last {} epochs)", cfg.mosaic, cfg.close_mosaic).c_str()
                                : "off");
  to.loader = lo;
  if (to_eval_batch_cap > 0) elo.batch_size = std::min(elo.batch_size, to_eval_batch_cap);
  to.eval_loader = elo;
  to.cuda_graphs = cfg.cuda_graphs;
  to.loss_read_interval = cfg.loss_read_interval;
  to.save = cfg.save;
  to.resume = cfg.resume;
  to.checkpoint_label = cfg.model;
  to.config_json = config_json(cfg).dump();
  to.memory_trace = cfg.memory_trace;
  to.progress = cfg.progress;
  to.verbose = cfg.verbose;
  to.profile = cfg.profile;
  to.profile_steps = cfg.profile_steps;
  to.trace = cfg.trace;

  Trainer trainer(model, task, [&cfg](nn::Module& m) { return make_optimizer(cfg, m); }, to);
  TrainResult r = trainer.fit(ds.train, ds.test);
  r.model = cfg.model;
  r.dataset = cfg.dataset;
  return r;
}

}  // namespace ampforge::train
