// `ampforge train`: trains a model on a real data set (default: the small CNN on Fashion-MNIST).
#include <csignal>
#include <cstdio>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/cli/commands.h"
#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/models/models.h"
#include "ampforge/profiler/report.h"
#include "ampforge/train/recipe.h"

namespace ampforge::cli {

namespace {
struct TrainFlags {
  train::TrainConfig cfg;
  std::string precision = "fp32";
  bool json = false;
  bool no_progress = false;
  bool no_channels_last = false;
};
}  // namespace

Command add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  auto& c = flags->cfg;
  auto* sub = app.add_subcommand("train", "Train a model (default: the small CNN on Fashion-MNIST, 5 epochs)");
  sub->footer("Data parallel: started by mpirun/srun, torchrun or `ampforge launch -n N -- ampforge train ...`, each "
               "process is one rank (found in the environment, no flag needed): --batch is per rank, gradients are "
               "averaged over the ranks, rank 0 prints, evaluates and writes --save; --device cuda means "
               "cuda:<LOCAL_RANK>. CPU ranks need an MPI launcher; GPU ranks use NCCL.");
  CLI::Option* model_flag =
      sub->add_option("--model", c.model,
                      "Model (`ampforge models` lists them): cnn, resnet-small, resnet18, resnet50, ... (default: the "
                      "one a --resume or --weights checkpoint of `ampforge train` records, else cnn)")
          ->capture_default_str();
  sub->add_option("--dataset", c.dataset,
                  "Data set: fashion-mnist | mnist | image-folder | synthetic | text (masked-LM models) | detection")
      ->capture_default_str();
  sub->add_option("--data", c.detection_data,
                  "--dataset detection: a YOLO-format DATA.yaml, or fashion-mnist-detection (composed from "
                  "Fashion-MNIST into --data-dir, default ./fashion-mnist-detection, on first use)")
      ->capture_default_str();
  sub->add_option("--mosaic", c.mosaic,
                  "--dataset detection: probability that a training example is a mosaic of 4 images (Ultralytics' "
                  "mosaic; default 1.0 when --epochs > --close-mosaic, else 0)");
  sub->add_option("--close-mosaic", c.close_mosaic, "--dataset detection: no mosaic in the last N epochs")
      ->capture_default_str();
  sub->add_option("--corpus", c.corpus,
                  "Masked-LM models with --dataset text: wordnet (Debian's wordnet-base glosses) or a text file, one "
                  "document per line (tokenised once, cached)");
  sub->add_option("--vocab", c.vocab, "A BERT vocab.txt (default: learn a WordPiece vocabulary from the corpus)");
  sub->add_option("--vocab-size", c.vocab_size, "Size of the learned WordPiece vocabulary (without --vocab)")
      ->capture_default_str();
  sub->add_option("--seq-len", c.seq_len, "Masked-LM sequence length, [CLS] and [SEP] included")->capture_default_str();
  sub->add_option("--data-dir", c.data_dir,
                  "IDX files (default: /usr/share/datasets/<dataset>), or for image-folder a directory with train/ "
                  "and val/ holding one sub-folder of JPEG/PNG files per class");
  sub->add_option("--image-size", c.image_size,
                  "Square image size (0: the data set's own; image folders 224). Gray data are resized and repeated "
                  "to 3 channels for 3-channel models")
      ->capture_default_str();
  sub->add_option("--weights", c.weights,
                  "Initialise the model from this safetensors file by state-dict name (e.g. torchvision weights "
                  "converted by scripts/torchvision_to_safetensors.py); a mis-shaped head is reported and kept");
  sub->add_option("--epochs", c.epochs, "Epochs")->capture_default_str();
  sub->add_option("--batch", c.batch_size, "Batch size (per micro-batch with --accumulate)")->capture_default_str();
  sub->add_option("--eval-batch", c.eval_batch_size,
                  "Evaluation batch size (0: auto, the training batch for masked LM and images larger than 64x64, "
                  "else 1000)")
      ->capture_default_str();
  sub->add_option("--accumulate", c.accumulate,
                  "Gradient accumulation: micro-batches per optimizer step (effective batch = batch x N); 0 auto: "
                  "detection max(round(nbs / batch), 1) (gradients summed, as Ultralytics), else 1")
      ->capture_default_str();
  sub->add_option("--lr", c.lr, "Learning rate (for --lr-reference-batch images when that is set)")
      ->capture_default_str();
  sub->add_option("--lr-reference-batch", c.lr_reference_batch,
                  "Scale --lr linearly by (batch x accumulate) / this (e.g. --lr 0.256 --lr-reference-batch 256, "
                  "NVIDIA's ResNet-50 recipe); 0: off")
      ->capture_default_str();
  sub->add_option("--optimizer", c.optimizer,
                  "adamw | sgd | auto (detection: Ultralytics' rule, SGD lr 0.01 for runs over 10k iterations, else "
                  "AdamW lr 0.002*5/(4+classes), ignoring --lr/--momentum; others: adamw)")
      ->capture_default_str();
  sub->add_option("--weight-decay", c.weight_decay,
                  "Weight decay (default: AdamW 0.01, SGD 0; detection 5e-4 x batch x accumulate / nbs on weights)");
  sub->add_flag("--no-decay-bias-norm", c.no_decay_bias_norm,
                "No weight decay on biases and normalisation weights (a second parameter group)");
  sub->add_option("--label-smoothing", c.label_smoothing, "Cross-entropy label smoothing in [0, 1)")
      ->capture_default_str();
  sub->add_option("--momentum", c.momentum, "SGD momentum (default: detection 0.937, else 0.9)");
  sub->add_flag("--nesterov", c.nesterov, "SGD with Nesterov momentum");
  sub->add_option("--schedule", c.schedule,
                  "LR schedule: constant | step | cosine | linear (each after the warm-up) | auto (detection linear, "
                  "else cosine)")
      ->capture_default_str();
  sub->add_option("--lrf", c.lrf, "Linear/cosine decay to lr x this (default: detection 0.01, else 0)");
  sub->add_option("--warmup", c.warmup_steps,
                  "Linear LR warm-up steps (default: detection max(warmup-epochs x batches, 100) batches, else 0)");
  sub->add_option("--warmup-epochs", c.warmup_epochs, "Detection: the default warm-up in epochs")->capture_default_str();
  sub->add_option("--warmup-bias-lr", c.warmup_bias_lr,
                  "Detection: the bias group's warm-up starts at this lr (0 with AdamW auto)")
      ->capture_default_str();
  sub->add_option("--warmup-momentum", c.warmup_momentum, "Detection with SGD: momentum ramps from this during warm-up")
      ->capture_default_str();
  sub->add_option("--nbs", c.nbs, "Detection: nominal batch size (accumulation target, weight-decay scale)")
      ->capture_default_str();
  sub->add_option("--ema", c.ema,
                  "Average the weights (evaluated and saved): on | off | auto (on for detection, as Ultralytics)")
      ->capture_default_str();
  sub->add_option("--ema-decay", c.ema_decay, "Weight average: decay x (1 - exp(-updates / tau))")->capture_default_str();
  sub->add_option("--ema-tau", c.ema_tau, "Weight average: ramp in updates (0: constant decay)")->capture_default_str();
  sub->add_option("--clip-grad", c.clip_grad_norm, "Clip gradients to this global L2 norm (0: off; default: detection "
                  "10, else off)");
  sub->add_option("--precision", flags->precision, "fp32 | fp16 | bf16 (autocast; fp16 adds a GradScaler)")
      ->capture_default_str();
  sub->add_flag("--master-weights", c.master_weights, "Keep parameters in 16 bits with F32 master weights (Apex O2)");
  sub->add_flag("--recompute", c.recompute,
                "Rebuild batch-norm, relu and residual-sum outputs in backward instead of keeping them: less "
                "activation memory, a few extra elementwise passes, identical gradients (docs/MEMORY.md)");
  sub->add_flag("--stochastic-rounding", c.stochastic_rounding,
                "With --precision bf16 --master-weights: write the BF16 weights from the F32 masters with stochastic "
                "rounding (unbiased; seeded by --seed)");
  sub->add_option("--nan-policy", c.nan_policy, "On a non-finite loss without a scaler: stop | skip")->capture_default_str();
  sub->add_option("--device", c.device, "cpu | cuda | cuda:N")->capture_default_str();
  sub->add_flag("--cuda-graphs", c.cuda_graphs,
                "CUDA: capture one training step as a CUDA graph after 3 warm-up steps and replay it (one launch "
                "per step; full batches only)");
  sub->add_option("--loss-read-interval", c.loss_read_interval,
                  "CUDA: read training losses from the device every N steps (one synchronisation each)")
      ->capture_default_str();
  sub->add_option("--threads", c.threads, "CPU threads (0: all cores)")->capture_default_str();
  sub->add_option("--workers", c.workers, "Data-loader threads")->capture_default_str();
  sub->add_option("--seed", c.seed, "Random seed")->capture_default_str();
  sub->add_option("--max-steps", c.max_steps, "Stop after this many optimizer steps (checkpoint if --save)");
  sub->add_option("--synthetic-size", c.synthetic_size, "Examples in the synthetic data set")->capture_default_str();
  sub->add_option("--synthetic-classes", c.synthetic_classes, "Classes of the synthetic data set")->capture_default_str();
  sub->add_option("--crop-padding", c.crop_padding, "Augmentation: random crop after padding (pixels)")->capture_default_str();
  sub->add_flag("--hflip", c.hflip, "Augmentation: random horizontal flips");
  sub->add_flag("--no-channels-last", flags->no_channels_last, "Use NCHW activations instead of channels-last");
  sub->add_option("--save", c.save, "Checkpoint file (safetensors), written after each epoch and on Ctrl-C");
  sub->add_option("--resume", c.resume, "Resume from this checkpoint");
  sub->add_option("--memory-trace", c.memory_trace,
                  "Record every allocation and free to this file (replay it with `ampforge memory replay`)");
  sub->add_option("--bucket-mb", c.bucket_mb,
                  "Data parallel: gradient bucket size in MiB (each bucket is one all-reduce)")->capture_default_str();
  sub->add_option("--first-bucket-mb", c.first_bucket_mb,
                  "Data parallel: size of the first bucket (the last layers' gradients) in MiB")->capture_default_str();
  sub->add_flag_function("--no-overlap", [&c](int64_t) { c.overlap = false; },
                "Data parallel: all-reduce the gradients after backward instead of starting each bucket from the "
                "backward pass as soon as its gradients are complete (same results)");
  sub->add_option("--zero", c.zero,
                  "Data parallel: 1 = ZeRO stage 1, each rank keeps and steps 1/N of the optimizer state (gradients "
                  "reduce-scattered, parameters all-gathered; same results)")->capture_default_str();
  sub->add_flag("--sync-bn", c.sync_bn,
                "Data parallel: SyncBatchNorm, every BatchNorm2d normalises with the global batch's statistics in "
                "training (torch.nn.SyncBatchNorm); default: each rank's own, as DDP");
  sub->add_option("--dist-timeout", c.dist_timeout,
                  "Data parallel: seconds to wait for every rank at the rendezvous")->capture_default_str();
  sub->add_option("--collective-timeout", c.collective_timeout,
                  "Data parallel: seconds a collective (NCCL or MPI) may run before the job ends with an error "
                  "naming it (a rank that hangs or a failed network; torch.distributed's timeout). The wait for "
                  "rank 0's evaluation is not limited. 0: no limit")->capture_default_str();
  sub->add_flag("--json", flags->json, "Print a JSON summary on stdout");
  sub->add_flag("--no-progress", flags->no_progress, "No progress bar");
  sub->add_flag("--profile", c.profile, "Profile ops, phases and (with a GPU) kernels; print the report at the end");
  sub->add_option("--profile-steps", c.profile_steps, "Profile only global steps A:B (B exclusive), e.g. 10:20");
  sub->add_option("--trace", c.trace, "Write a Chrome trace (Perfetto, chrome://tracing) here; implies --profile");
  return {sub, [flags, model_flag] {
            train::TrainConfig cfg = flags->cfg;
            // A checkpoint records its model (core/checkpoint_format.h): `train --resume C` needs no --model.
            if (model_flag->count() == 0)
              for (const std::string& file : {cfg.resume, cfg.weights}) {
                if (file.empty()) continue;
                const auto record = checkpoint::read_model_record(load_safetensors(file).metadata, file);
                if (record && !record->model.empty()) {
                  cfg.model = record->model;
                  break;
                }
              }
            cfg.precision = dtype_from_string(flags->precision);
            cfg.channels_last = !flags->no_channels_last;
            cfg.progress = !flags->no_progress;
            train::install_stop_signals();
            train::TrainResult r = train::train(cfg);
            // One report per job: rank 0's (every rank has the same numbers).
            // Stopped by a signal: 128 + its number, as a shell reports a process the signal ended (130 for Ctrl-C).
            const int stop_sig = train::stop_signal();
            const int interrupted_code = 128 + (stop_sig != 0 ? stop_sig : SIGINT);
            if (r.rank != 0)
              return r.interrupted ? interrupted_code : r.stopped_reason.rfind("non-finite", 0) == 0 ? 1 : 0;
            // The task's own detail of the final evaluation (detection: the per-class table).
            if (!r.eval_details.text.empty()) std::fprintf(stderr, "\n%s", r.eval_details.text.c_str());
            std::string metrics;
            for (const tasks::Metric& m : r.eval)
              metrics += m.fraction ? fmt::format("test {} {:.2f}%, ", m.name, 100.0 * m.value)
                                    : fmt::format("test {} {:.4f}, ", m.name, m.value);
            std::fprintf(stderr,
                         "\nsummary: %s on %s (%s): %s%lld steps, %.0f train "
                         "samples/s, wall %.1fs, peak memory %.1f MiB%s\n",
                         r.model.c_str(), r.dataset.c_str(), r.precision.c_str(), metrics.c_str(),
                         static_cast<long long>(r.steps), r.train_samples_per_sec, r.wall_seconds,
                         static_cast<double>(r.peak_memory_bytes) / (1 << 20),
                         r.checkpoint.empty() ? "" : (", checkpoint " + r.checkpoint).c_str());
            if (r.loss_scale > 0 || r.skipped_steps > 0)
              std::fprintf(stderr, "mixed precision: loss scale %.0f, skipped steps %lld, overflow events %lld\n",
                           r.loss_scale, static_cast<long long>(r.skipped_steps), static_cast<long long>(r.overflow_events));
            if (r.graph_steps > 0)
              std::fprintf(stderr,
                           "CUDA graph: one step = %lld operations (%lld kernels), each a launch when run eagerly; "
                           "%lld steps replayed, one graph launch each\n",
                           static_cast<long long>(r.graph_nodes), static_cast<long long>(r.graph_kernels),
                           static_cast<long long>(r.graph_steps));
            if (r.device.rfind("cuda", 0) == 0)
              std::fprintf(stderr, "host synchronisations during training: %lld (%lld steps; losses read every %lld)\n",
                           static_cast<long long>(r.host_syncs), static_cast<long long>(r.steps),
                           static_cast<long long>(cfg.loss_read_interval));
            if (!r.stopped_reason.empty()) std::fprintf(stderr, "stopped: %s\n", r.stopped_reason.c_str());
            if (r.interrupted && !r.checkpoint.empty())
              std::fprintf(stderr, "to continue: the same command with --resume %s\n", r.checkpoint.c_str());
            std::optional<profiler::Report> prof;
            if (r.profile) {
              prof = profiler::compute_report(*r.profile);
              std::fprintf(stderr, "\n%s", profiler::format_report(*prof).c_str());
              if (!cfg.trace.empty()) std::fprintf(stderr, "trace: %s\n", cfg.trace.c_str());
            }
            if (flags->json) {
              nlohmann::json j = {{"model", r.model},
                                  {"dataset", r.dataset},
                                  {"precision", r.precision},
                                  {"device", r.device},
                                  {"epochs", r.epochs_completed},
                                  {"steps", r.steps},
                                  {"parameters", r.parameters},
                                  {"task", r.task},
                                  {"test_accuracy", r.test_accuracy},
                                  {"test_loss", r.test_loss},
                                  {"final_train_loss", r.final_train_loss},
                                  {"train_samples_per_sec", r.train_samples_per_sec},
                                  {"train_seconds", r.train_seconds},
                                  {"data_wait_seconds", r.data_wait_seconds},
                                  {"wall_seconds", r.wall_seconds},
                                  {"peak_memory_bytes", r.peak_memory_bytes},
                                  {"memory", r.memory_stats_json.empty() ? nlohmann::json() : nlohmann::json::parse(r.memory_stats_json)},
                                  {"epoch_accuracy", r.epoch_accuracy},
                                  {"loss_scale", r.loss_scale},
                                  {"skipped_steps", r.skipped_steps},
                                  {"overflow_events", r.overflow_events},
                                  {"stopped_reason", r.stopped_reason},
                                  {"checkpoint", r.checkpoint},
                                  {"world_size", r.world_size},
                                  {"host_syncs", r.host_syncs},
                                  {"ema_updates", r.ema_updates},
                                  {"config", nlohmann::json::parse(r.config_json.empty() ? "null" : r.config_json)},
                                  {"cuda_graph", {{"nodes", r.graph_nodes},
                                                  {"kernels", r.graph_kernels},
                                                  {"steps", r.graph_steps}}}};
              nlohmann::json eval = nlohmann::json::object();
              for (const tasks::Metric& m : r.eval) eval[m.name] = m.value;
              j["eval"] = eval;
              j["primary_metric"] = r.primary_metric;
              std::vector<nlohmann::json> per_epoch;
              for (const tasks::Metrics& ms : r.epoch_eval) {
                nlohmann::json e = nlohmann::json::object();
                for (const tasks::Metric& m : ms) e[m.name] = m.value;
                per_epoch.push_back(e);
              }
              j["epoch_eval"] = per_epoch;
              if (!r.eval_details.json.empty()) {
                const nlohmann::json details = nlohmann::json::parse(r.eval_details.json);
                for (const auto& item : details.items()) {
                  AF_CHECK(!j.contains(item.key()), "the evaluation's detail '{}' clashes with a summary key", item.key());
                  j[item.key()] = item.value();
                }
              }
              if (prof) j["profile"] = profiler::report_to_json(*prof, 50);
              std::printf("%s\n", j.dump().c_str());
            }
            if (r.interrupted) return interrupted_code;
            if (r.stopped_reason.rfind("non-finite", 0) == 0) return 1;
            return 0;
          }};
}

}  // namespace ampforge::cli
