#include "ampforge/train/recipe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/runtime.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/data/dataset_factory.h"
#include "ampforge/dist/environment.h"
#include "ampforge/memory/global.h"
#include "ampforge/models/registry.h"
#include "ampforge/nn/state_dict.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/optim/param_groups.h"
#include "ampforge/util/error.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge::train {

int64_t eval_batch_size(const TrainConfig& c, bool token_ids, const Shape& example_shape) {
  if (c.eval_batch_size > 0) return c.eval_batch_size;
  const bool small_images = !token_ids && example_shape.size() == 3 && example_shape[1] * example_shape[2] <= 64 * 64;
  return small_images ? 1000 : c.batch_size;
}

namespace {

// "a, b or c"
std::string either(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

Device parse_device(const std::string& s) {
  try {
    return Device::parse(s);
  } catch (const Error&) {
    AF_THROW(InvalidArgument, "--device must be cpu, cuda or cuda:N, got '{}'", s);
  }
}

// Every flag of `ampforge train` checked here, at the edge, by its name (the Trainer checks its own options again for
// library callers, naming the fields).
void validate(const TrainConfig& c) {
  AF_CHECK(c.epochs >= 1, "--epochs must be >= 1, got {}", c.epochs);
  AF_CHECK(c.batch_size >= 1, "--batch must be >= 1, got {}", c.batch_size);
  AF_CHECK(c.precision == DType::F32 || c.precision == DType::F16 || c.precision == DType::BF16,
           "--precision must be fp32, fp16 or bf16");
  AF_CHECK(!c.master_weights || c.precision != DType::F32, "--master-weights needs --precision fp16 or bf16");
  AF_CHECK(c.clip_grad_norm < 0 || std::isfinite(c.clip_grad_norm), "--clip-grad must be >= 0, got {}",
           c.clip_grad_norm);
  AF_CHECK(c.loss_read_interval >= 1, "--loss-read-interval must be >= 1, got {}", c.loss_read_interval);
  AF_CHECK(!c.cuda_graphs || parse_device(c.device).is_cuda(), "--cuda-graphs needs --device cuda");
  if (!c.profile_steps.empty()) parse_profile_steps(c.profile_steps);
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
  const std::vector<std::string>& known = data::dataset_names();
  AF_CHECK(std::find(known.begin(), known.end(), c.dataset) != known.end(), "--dataset must be {}, got '{}'",
           either(known), c.dataset);
  if (const models::ModelEntry* e = models::model_registry().find(c.model)) {
    const tasks::TaskEntry& task = tasks::task_of(*e);
    AF_CHECK(tasks::trains_on(task, c.dataset), "--model {} is a {} model ({}): --dataset must be {}, got '{}'",
             c.model, task.name, task.description, either(task.datasets), c.dataset);
  }
  AF_CHECK(c.seq_len >= 3, "--seq-len must hold [CLS], a token and [SEP] (>= 3), got {}", c.seq_len);
  AF_CHECK(c.vocab_size >= 64, "--vocab-size must be >= 64, got {}", c.vocab_size);
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
  AF_CHECK(c.mosaic < 0 || data::uses_detection_data(c.dataset), "--mosaic is for --dataset detection (YOLOv8 "
           "models)");
  // Ultralytics leaves mosaic on for the whole run then (its switch-off epoch never comes); a flag that does
  // nothing is worse: say so.
  AF_CHECK(!(c.mosaic > 0) || c.close_mosaic < c.epochs, "--mosaic {} with --close-mosaic {} >= --epochs {} would "
           "never make a mosaic: lower --close-mosaic", c.mosaic, c.close_mosaic, c.epochs);
  AF_CHECK(c.dist_timeout > 0, "--dist-timeout must be positive, got {}", c.dist_timeout);
  AF_CHECK(c.collective_timeout >= 0, "--collective-timeout must be >= 0 seconds (0: no limit), got {}",
           c.collective_timeout);
  AF_CHECK(c.zero == 0 || c.zero == 1, "--zero must be 0 or 1, got {}", c.zero);
  AF_CHECK(c.zero == 0 || dist::detect_world().distributed(), "--zero 1 shards the optimizer state over the "
           "ranks of a data-parallel job: start the ranks with mpirun, srun, torchrun or `ampforge launch`");
  AF_CHECK(!c.sync_bn || dist::detect_world().distributed(), "--sync-bn shares batch-norm statistics between the "
           "ranks of a data-parallel job: start the ranks with mpirun, srun, torchrun or `ampforge launch`");
}

// The default of --mosaic (Ultralytics' recipe): it depends on the epochs only, so the data set can be made with it
// before the rest of the config is resolved (resolve_auto).
double resolved_mosaic(const TrainConfig& c, bool ultralytics) {
  if (c.mosaic >= 0) return c.mosaic;
  return ultralytics && c.epochs > c.close_mosaic ? 1.0 : 0.0;
}

nlohmann::json config_json(const TrainConfig& c) {
  const char* prec = c.precision == DType::F32 ? "fp32" : c.precision == DType::F16 ? "fp16" : "bf16";
  const bool detection_data = data::uses_detection_data(c.dataset);
  return {{"model", c.model},           {"dataset", c.dataset},       {"image_size", c.image_size},
          {"detection_data", detection_data ? c.detection_data : ""},
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
          {"mosaic", detection_data ? resolved_mosaic(c, true) : 0.0}, {"close_mosaic", c.close_mosaic},
          {"world_size", dist::detect_world().size}};
}

// What the config asks of data/dataset_factory.h for a model of `entry` (trained for `task`).
data::DatasetSpec dataset_spec(const TrainConfig& c, const models::ModelEntry& entry, const tasks::TaskEntry& task) {
  data::DatasetSpec s;
  s.name = c.dataset;
  s.data_dir = c.data_dir;
  s.detection_data = c.detection_data;
  s.image_size = c.image_size;
  s.channels = entry.defaults.in_channels;
  s.token_ids = task.input == tasks::InputKind::TokenIds;
  s.model = c.model;
  s.synthetic_size = c.synthetic_size;
  s.synthetic_classes = c.synthetic_classes;
  s.seed = c.seed;
  s.mosaic = resolved_mosaic(c, task.recipe == tasks::TrainingRecipe::Ultralytics);
  s.close_mosaic_epoch = c.epochs - c.close_mosaic;  // <= 0 only with mosaic 0 (validate)
  s.corpus = c.corpus;
  s.vocab = c.vocab;
  s.text_cache = c.text_cache;
  s.vocab_size = c.vocab_size;
  s.seq_len = c.seq_len;
  s.max_positions = entry.max_input_length > 0 ? entry.max_input_length : s.max_positions;
  s.verbose = c.verbose;
  return s;
}

// Data parallel when a launcher started this process: joins the job (one GPU per rank: cuda = cuda:<local rank>;
// on the CPU the host's cores shared among its ranks) and sets `to`'s device and data-parallel options. Ranks
// other than 0 are quietened in `c`. Returns null for a single process.
dist::CommunicatorPtr join_data_parallel(TrainConfig& c, TrainerOptions& to) {
  const dist::WorldInfo world = dist::detect_world();
  if (!world.distributed()) return nullptr;
  if (c.device == "cuda") to.device = Device(DeviceType::CUDA, world.local_rank);
  runtime::check_device_exists(to.device, fmt::format("rank {}: device {}", world.rank, to.device.str()));
  dist::InitOptions io;
  io.device = to.device;
  io.timeout_s = c.dist_timeout;
  io.collective_timeout_s = c.collective_timeout;
  io.compute_stream = runtime::device_runtime(to.device).compute_stream(to.device.index);
  dist::CommunicatorPtr comm = dist::init_process_group(world, io);
  if (comm->rank() != 0) c.verbose = c.progress = false;
  if (c.threads == 0 && to.device.is_cpu())
    set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, world.local_size)));
  to.data_parallel.communicator = comm;
  to.data_parallel.bucket_cap_mb = c.bucket_mb;
  to.data_parallel.first_bucket_mb = c.first_bucket_mb;
  to.data_parallel.overlap = c.overlap;
  to.data_parallel.zero = c.zero;
  to.data_parallel.sync_batchnorm = c.sync_bn;
  return comm;
}

// The data sets; those prepared on first use (a learned vocabulary, token files, the composed detection set) are
// written by rank 0 while the other ranks wait, then read by everyone.
data::DatasetSplits prepare_data(const data::DatasetSpec& spec, dist::Communicator* comm) {
  if (comm && comm->rank() != 0) comm->barrier();
  data::DatasetSplits d = data::make_dataset_splits(spec);
  if (comm && comm->rank() == 0) comm->barrier();
  return d;
}

// --weights: not strict, so a classifier for another number of classes keeps its own head (reported), as in
// fine-tuning; everything else must match by name and shape. An ampforge checkpoint gives its weights (the weight
// average when the run kept one, as export takes them); another file is read under the reference
// implementation's names (BERT: Hugging Face's legacy names, tied duplicates).
void load_weights(const TrainConfig& cfg, const models::ModelEntry& entry, nn::Module& model) {
  nn::LoadOptions lopt;
  lopt.strict = false;
  const SafetensorsFile wf = load_safetensors(cfg.weights);
  const nn::NamedTensors state = checkpoint::is_checkpoint(wf.metadata) ? checkpoint::model_weights(wf.tensors)
                                                                        : entry.reference_state(wf.tensors);
  const nn::LoadReport rep = nn::load_state_dict(model, state, lopt);
  AF_CHECK(!rep.loaded_keys.empty(), "--weights {}: no tensor matches --model {} ({})", cfg.weights, cfg.model,
           rep.str());
  if (cfg.verbose) std::fprintf(stderr, "weights %s: %s\n", cfg.weights.c_str(), rep.str().c_str());
}

// The loaders: images normalised with the data set's constants in the config's memory format, token ids as they
// are; evaluation in order, without augmentation, in batches the task's evaluator can hold.
void set_loaders(const TrainConfig& cfg, const tasks::TaskEntry& task, const data::Dataset& train_set,
                 TrainerOptions& to) {
  const bool token_ids = task.input == tasks::InputKind::TokenIds;
  const data::Normalization norm = train_set.normalization();
  data::LoaderOptions lo;
  lo.batch_size = cfg.batch_size;
  lo.seed = cfg.seed;
  lo.workers = cfg.workers;
  lo.mean = norm.mean;
  lo.std = norm.std;
  lo.crop_padding = cfg.crop_padding;
  lo.hflip = cfg.hflip;
  lo.format = cfg.channels_last && !token_ids ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  lo.normalize = !token_ids;
  data::LoaderOptions elo = lo;
  elo.shuffle = false;
  elo.batch_size = eval_batch_size(cfg, token_ids, train_set.example_shape());
  if (task.eval_batch_cap > 0) elo.batch_size = std::min(elo.batch_size, task.eval_batch_cap);
  elo.crop_padding = 0;
  elo.hflip = false;
  to.loader = lo;
  to.eval_loader = elo;
}

// The Trainer's options the resolved config gives, and the recipe's choices that are the Trainer's (Ultralytics:
// summed accumulation, momentum warm-up with SGD).
void set_run_options(const TrainConfig& cfg, const tasks::TaskEntry& task, TrainerOptions& to) {
  const bool ultralytics = task.recipe == tasks::TrainingRecipe::Ultralytics;
  static_cast<RunOptions&>(to) = cfg;  // as they are
  to.accumulate = cfg.accumulate;
  to.accumulate_sum = ultralytics;
  to.clip_grad_norm = cfg.clip_grad_norm;
  to.nan_policy = nan_policy_from_string(cfg.nan_policy);
  to.schedule.kind = optim::schedule_from_string(cfg.schedule);
  to.schedule.warmup_steps = cfg.warmup_steps;
  to.schedule.final_factor = cfg.lrf;
  if (ultralytics && cfg.optimizer == "sgd" && cfg.warmup_steps > 0) to.schedule.warmup_momentum = cfg.warmup_momentum;
  to.ema = EmaOptions{cfg.ema == "on", cfg.ema_decay, cfg.ema_tau};
  to.checkpoint_label = cfg.model;
  to.config_json = config_json(cfg).dump();
}

// One line with every value of Ultralytics' recipe the run uses, given or decided.
void print_ultralytics_recipe(const TrainConfig& cfg, const TrainerOptions& to) {
  std::fprintf(stderr, "recipe (Ultralytics 8.x defaults unless given): %s lr %g%s, weight decay %g x %lld / %lld, "
               "%s schedule to lr x %g, warm-up %lld steps (bias lr from %g%s), accumulate %lld (summed), clip %g, "
               "EMA %s, mosaic %s\n", cfg.optimizer.c_str(), effective_lr(cfg), cfg.nesterov ? " nesterov" : "",
               cfg.weight_decay, static_cast<long long>(cfg.batch_size * cfg.accumulate),
               static_cast<long long>(cfg.nbs), cfg.schedule.c_str(), cfg.lrf,
               static_cast<long long>(cfg.warmup_steps), cfg.warmup_bias_lr,
               to.schedule.warmup_momentum >= 0 ? fmt::format(", momentum from {}", cfg.warmup_momentum).c_str() : "",
               static_cast<long long>(cfg.accumulate), cfg.clip_grad_norm, cfg.ema.c_str(),
               cfg.mosaic > 0 ? fmt::format("{} (none in the last {} epochs)", cfg.mosaic, cfg.close_mosaic).c_str()
                              : "off");
}

}  // namespace

TrainConfig resolve_auto(const TrainConfig& cfg, tasks::TrainingRecipe recipe, int64_t examples,
                         int64_t batches_per_epoch, int64_t classes, int64_t ranks) {
  TrainConfig c = cfg;
  const bool ul = recipe == tasks::TrainingRecipe::Ultralytics;
  const int64_t global_batch = c.batch_size * std::max<int64_t>(ranks, 1);
  if (c.accumulate == 0)
    c.accumulate = ul ? std::max<int64_t>(std::llround(static_cast<double>(c.nbs) / static_cast<double>(global_batch)), 1)
                      : 1;
  if (c.schedule == "auto") c.schedule = ul ? "linear" : "cosine";
  if (c.lrf < 0) c.lrf = ul ? 0.01 : 0.0;
  if (c.clip_grad_norm < 0) c.clip_grad_norm = ul ? 10.0 : 0.0;
  if (c.ema == "auto") c.ema = ul ? "on" : "off";
  c.mosaic = resolved_mosaic(c, ul);
  if (c.momentum < 0) c.momentum = ul ? 0.937 : 0.9;
  if (ul && c.weight_decay < 0) c.weight_decay = 5e-4;
  if (c.optimizer == "auto") {
    if (ul) {
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
    if (ul) {
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
  const tasks::TrainingRecipe recipe = entry ? tasks::task_of(*entry).recipe : tasks::TrainingRecipe::Plain;
  const TrainConfig cfg =
      resolve_auto(given, recipe, given.batch_size, 1, entry ? entry->defaults.num_classes : 10);
  const double lr = effective_lr(cfg);
  const bool adamw = cfg.optimizer == "adamw";
  AF_CHECK(adamw || cfg.optimizer == "sgd", "--optimizer must be adamw or sgd here (auto is decided by train()), got "
           "'{}'", cfg.optimizer);
  const double wd = cfg.weight_decay >= 0 ? cfg.weight_decay : adamw ? optim::AdamWOptions{}.weight_decay
                                                                     : optim::SGDOptions{}.weight_decay;
  std::vector<optim::ParamGroupSpec> groups;
  if (recipe == tasks::TrainingRecipe::Ultralytics) {
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
  TrainConfig given = config;  // the data-parallel setup may quiet this rank
  TrainerOptions to;
  to.device = parse_device(given.device);
  const dist::CommunicatorPtr comm = join_data_parallel(given, to);
  if (!comm) runtime::check_device_exists(to.device, "--device " + to.device.str());
  if (given.threads > 0) set_num_threads(given.threads);
  manual_seed(given.seed);
  memory::install_host_caching_allocator();  // before the model: its parameters come from the cache too
  const models::ModelEntry& entry = models::model_registry().at(given.model);
  const tasks::TaskEntry& task = tasks::task_of(entry);
  const data::DatasetSplits ds = prepare_data(dataset_spec(given, entry, task), comm.get());

  // Every "auto" value decided, now that the data set is known; `cfg` is what the run uses (and records). With
  // data parallel the global batch is --batch x ranks.
  const int64_t ranks = comm ? comm->size() : 1;
  const int64_t global_batch = given.batch_size * ranks;
  const int64_t batches_per_epoch = (ds.train->size() + global_batch - 1) / global_batch;
  const TrainConfig cfg =
      resolve_auto(given, task.recipe, ds.train->size(), batches_per_epoch, ds.train->num_classes(), ranks);
  set_loaders(cfg, task, *ds.train, to);
  set_run_options(cfg, task, to);

  // The model for the data: its channels and classes (masked LM: the vocabulary), its image size (token ids: the
  // sequence length).
  const bool token_ids = task.input == tasks::InputKind::TokenIds;
  models::ModelOptions mo;
  mo.in_channels = token_ids ? 1 : ds.train->example_shape()[0];
  mo.num_classes = ds.train->num_classes();
  mo.image_size = token_ids ? cfg.seq_len : ds.train->example_shape()[1];
  nn::ModulePtr model = entry.build(mo);
  to.model_record = {cfg.model, entry.task, mo.in_channels, mo.num_classes, mo.image_size};
  if (!cfg.weights.empty()) load_weights(cfg, entry, *model);
  tasks::TrainingContext tc;
  tc.model = mo;
  tc.data = &ds;
  tc.label_smoothing = cfg.label_smoothing;
  std::shared_ptr<tasks::Task> run_task = tasks::make_training_task(task, tc);
  if (task.recipe == tasks::TrainingRecipe::Ultralytics && cfg.verbose) print_ultralytics_recipe(cfg, to);

  Trainer trainer(model, run_task, [&cfg](nn::Module& m) { return make_optimizer(cfg, m); }, to);
  TrainResult r = trainer.fit(ds.train, ds.test);
  r.model = cfg.model;
  r.dataset = cfg.dataset;
  return r;
}

}  // namespace ampforge::train
