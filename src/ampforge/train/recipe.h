// Recipes: `ampforge train` by name. A TrainConfig holds plain values and names (model, data set,
// optimizer, schedule) as the command line gives them; train() maps each name to its object (a model from
// models/, a data set from data/, a task from tasks/, an optimizer from optim/) and runs them through the
// Trainer (train/trainer.h), which itself never needs a name. C++ users who bring their own objects use
// the Trainer directly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ampforge/core/dtype.h"
#include "ampforge/nn/module.h"
#include "ampforge/optim/optimizer.h"
#include "ampforge/tasks/registry.h"
#include "ampforge/train/trainer.h"

namespace ampforge::train {

// The Trainer's RunOptions (epochs, max_steps, precision, master_weights, recompute, cuda_graphs,
// loss_read_interval, save, resume, memory_trace, progress, verbose, profile, profile_steps, trace) are
// TrainConfig's own, as the Trainer reads them; the fields below are those a recipe decides from.
struct TrainConfig : RunOptions {
  TrainConfig() { epochs = 5; }
  std::string model = "cnn";
  // fashion-mnist | mnist (IDX files) | image-folder (data_dir/train and data_dir/val or /test, one
  // sub-folder per class, as ImageNet) | synthetic. Gray data sets are resized to image_size and repeated to
  // the model's channels when the model takes 3 (the torchvision ResNets).
  // Masked-LM models (bert-*): text (--corpus) | synthetic (random token sequences, for benchmarks).
  std::string dataset = "fashion-mnist";
  std::string data_dir;                    // default: Debian's install dir for the dataset
  // --dataset detection (YOLOv8 models): a YOLO-format data file (data/yolo_dataset.h), or
  // "fashion-mnist-detection": the set composed from Fashion-MNIST (written once into data_dir, default
  // ./fashion-mnist-detection, then read back by the same reader). Examples are letterboxed to image_size
  // (default 320); training examples are flipped at random, HSV-jittered and (mosaic) made mosaics of four.
  std::string detection_data = "fashion-mnist-detection";
  // Detection: the probability that a training example is a mosaic of four images (data/yolo_dataset.h); none in
  // the last close_mosaic epochs. < 0 auto: 1.0 (Ultralytics' mosaic) when epochs > close_mosaic, else 0 (a run
  // that short would have no epoch without mosaic before its final evaluation).
  double mosaic = -1;
  int64_t close_mosaic = 10;
  int64_t image_size = 0;                  // 0: the data set's own (28 for MNIST; 224 for image folders)
  std::string weights;                     // initialise the model from this safetensors file, by name
  int64_t batch_size = 128;
  // "auto" values: detection models (YOLOv8) get Ultralytics 8.x's recipe (ultralytics/cfg/default.yaml and
  // engine/trainer.py: ../shared specs MODELS.md A.6), every other model the plain one noted beside each field.
  int64_t accumulate = 0;                  // micro-batches per optimizer step; 0 auto: detection
                                           // max(round(nbs / batch), 1) with summed gradients, else 1
  double lr = 1e-3;
  // > 0: `lr` is the rate for this batch size and the run uses lr x (batch x accumulate) / reference,
  // the linear scaling rule (NVIDIA's ResNet-50 recipe: 0.256 per 256 images).
  int64_t lr_reference_batch = 0;
  // adamw | sgd | auto: detection as Ultralytics' optimizer=auto (SGD lr 0.01 nesterov when the run has more
  // than 10,000 iterations of max(batch, nbs) images, else AdamW with lr round(0.002 * 5 / (4 + classes), 6),
  // ignoring --lr and --momentum, as Ultralytics does); other models: adamw.
  std::string optimizer = "auto";
  double weight_decay = -1;                // < 0: the optimizer's default (AdamW 1e-2, SGD 0); detection 5e-4,
                                           // scaled by batch x accumulate / nbs on the decayed group
  bool no_decay_bias_norm = false;         // no weight decay on biases and norm weights (optim/param_groups.h)
  double momentum = -1;                    // SGD; < 0 auto: detection 0.937, else 0.9
  bool nesterov = false;
  std::string schedule = "auto";           // constant | step | cosine | linear | auto (detection linear, else cosine)
  int64_t warmup_steps = -1;               // < 0 auto: detection max(round(warmup_epochs x batches), 100)
                                           // batches (in optimizer steps), else 0
  double warmup_epochs = 3.0;              // detection's auto warm-up (Ultralytics' warmup_epochs)
  double warmup_bias_lr = 0.1;             // detection: the bias group's warm-up starts here (0 with AdamW auto)
  double warmup_momentum = 0.8;            // detection with SGD: momentum ramps from here to --momentum
  double lrf = -1;                         // final lr = lr x lrf (linear/cosine); < 0 auto: detection 0.01, else 0
  int64_t nbs = 64;                        // detection: nominal batch (accumulation target, weight-decay scale)
  std::string ema = "auto";                // weight average (train/ema.h): on | off | auto (on for detection)
  double ema_decay = 0.9999, ema_tau = 2000;
  double label_smoothing = 0;              // classification loss
  double clip_grad_norm = -1;              // 0: off; < 0 auto: detection 10 (Ultralytics), else off
  int threads = 0;                         // 0: all cores
  int workers = 1;                         // data-loader threads
  uint64_t seed = 0;
  bool channels_last = true;
  int64_t crop_padding = 0;                // augmentation
  bool hflip = false;
  bool stochastic_rounding = false;        // BF16 master weights: round the model copy stochastically
  std::string nan_policy = "stop";         // stop | skip: what to do with a non-finite loss without a scaler
  int64_t synthetic_size = 2048;           // examples in the synthetic training split
  int64_t synthetic_classes = 10;          // classes of the synthetic data set
  // Evaluation batch. 0 (auto): the training batch for masked LM and for images larger than 64x64 (a batch of 1000
  // 224-px images or BERT sequences would hold GiBs of activations), 1000 for small images (Fashion-MNIST).
  int64_t eval_batch_size = 0;
  // Text (masked-LM models, data/text_corpus.h): the corpus is tokenised once and cached.
  std::string corpus;                      // "wordnet" (Debian's wordnet-base glosses) or a file, one document a line
  std::string vocab;                       // a BERT vocab.txt; empty: learn a WordPiece vocabulary of vocab_size
  int64_t vocab_size = 8192;               // the learned vocabulary's size (with no --vocab)
  int64_t seq_len = 128;                   // tokens per sequence, [CLS] and [SEP] included (<= 512 positions)
  std::string text_cache;                  // where learned vocabularies and token files go (default
                                           // $AMPFORGE_CACHE_DIR, else $HOME/.cache/ampforge, + /text)
  std::string device = "cpu";              // cpu | cuda | cuda:N
  // Data parallel: on when the process was started by mpirun/srun, torchrun or `ampforge launch`
  // (dist/environment.h); batch_size is then per rank. --device cuda means cuda:<LOCAL_RANK>.
  double bucket_mb = 25;                   // gradient bucket size (MiB)
  double first_bucket_mb = 1;              // the first (last layers') bucket
  double dist_timeout = 300;               // seconds for the rendezvous of the ranks
  double collective_timeout = 1800;        // seconds a collective may run before the job ends (0: none)
  bool overlap = true;                     // start buckets' all-reduce from the backward pass
  int zero = 0;                            // 1: ZeRO-1, optimizer state sharded over the ranks
  bool sync_bn = false;                    // SyncBatchNorm: global-batch statistics in every BatchNorm2d
};

// Validates the config (throws InvalidArgument with the flag's name), builds its objects and trains.
TrainResult train(const TrainConfig& cfg);

// The config with every "auto" value decided (see the fields) for a training split of `examples` examples in
// `batches_per_epoch` global batches with `classes` classes, following `recipe` (the model's task's:
// tasks/registry.h), trained by `ranks` data-parallel processes (the global batch is batch x ranks, as
// Ultralytics' DDP splits it).
TrainConfig resolve_auto(const TrainConfig& cfg, tasks::TrainingRecipe recipe, int64_t examples,
                         int64_t batches_per_epoch, int64_t classes, int64_t ranks = 1);

// The evaluation batch the run uses: eval_batch_size, or for 0 (auto) the training batch for token ids and images
// larger than 64x64, and 1000 for smaller images. example_shape: one training example's (C, H, W) or (T).
int64_t eval_batch_size(const TrainConfig& cfg, bool token_ids, const Shape& example_shape);

// The learning rate the run uses (lr, or lr scaled by the batch when lr_reference_batch > 0).
double effective_lr(const TrainConfig& cfg);

// The optimizer the config names, over `model`'s parameters (in decay groups with no_decay_bias_norm).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, nn::Module& model);

}  // namespace ampforge::train
