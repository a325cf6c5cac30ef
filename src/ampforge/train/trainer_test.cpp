// Trainer: exact resume, checkpoint validation, NaN policy, mixed-precision smoke runs on synthetic data.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/train/recipe.h"

using namespace ampforge;
namespace fs = std::filesystem;

namespace {
train::TrainConfig small_config() {
  train::TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 256;
  c.batch_size = 32;
  c.epochs = 2;
  c.progress = false;
  c.verbose = false;
  c.workers = 1;
  c.seed = 7;
  return c;
}
fs::path tmp(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("ampforge_trainer_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / name;
}
}  // namespace

TEST(Trainer, ResumeGivesBitIdenticalLosses) {
  // N + M uninterrupted steps vs N steps, checkpoint, resume, M more. N = 11 ends mid-epoch (8 per epoch).
  train::TrainConfig full = small_config();
  full.max_steps = 14;
  train::TrainResult a = train::train(full);
  ASSERT_EQ(a.losses.size(), 14u);

  train::TrainConfig first = small_config();
  first.max_steps = 11;
  first.save = tmp("resume.safetensors").string();
  train::TrainResult b1 = train::train(first);
  ASSERT_EQ(b1.losses.size(), 11u);
  train::TrainConfig second = small_config();
  second.max_steps = 14;
  second.resume = first.save;
  train::TrainResult b2 = train::train(second);
  ASSERT_EQ(b2.losses.size(), 3u);
  for (size_t i = 0; i < 11; ++i) EXPECT_EQ(a.losses[i], b1.losses[i]) << "step " << i;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a.losses[11 + i], b2.losses[i]) << "step " << 11 + i;
}

TEST(Trainer, MixedPrecisionResumeKeepsTheScaler) {
  train::TrainConfig full = small_config();
  full.precision = DType::F16;
  full.max_steps = 10;
  train::TrainResult a = train::train(full);
  train::TrainConfig first = full;
  first.max_steps = 6;
  first.save = tmp("resume_fp16.safetensors").string();
  train::train(first);
  train::TrainConfig second = full;
  second.resume = first.save;
  train::TrainResult b = train::train(second);
  ASSERT_EQ(b.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a.losses[6 + i], b.losses[i]);
  EXPECT_EQ(a.loss_scale, b.loss_scale);
}

TEST(Trainer, StochasticRoundingResumesExactlyAndDiffersFromNearest) {
  // BF16 parameters with F32 masters: the rounding noise is counted by the optimizer's step, so a resumed
  // run draws the same noise as an uninterrupted one; and it does change the trajectory.
  train::TrainConfig full = small_config();
  full.precision = DType::BF16;
  full.master_weights = true;
  full.stochastic_rounding = true;
  full.max_steps = 10;
  train::TrainResult a = train::train(full);
  train::TrainConfig first = full;
  first.max_steps = 6;
  first.save = tmp("resume_sr.safetensors").string();
  train::train(first);
  train::TrainConfig second = full;
  second.resume = first.save;
  train::TrainResult b = train::train(second);
  ASSERT_EQ(b.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a.losses[6 + i], b.losses[i]) << "step " << 6 + i;
  train::TrainConfig nearest = full;
  nearest.stochastic_rounding = false;
  train::TrainResult n = train::train(nearest);
  EXPECT_NE(a.losses, n.losses);
  // Without BF16 master weights the option is a configuration error.
  train::TrainConfig bad = small_config();
  bad.stochastic_rounding = true;
  bad.precision = DType::F16;
  EXPECT_THROW(train::train(bad), Error);
}

TEST(Trainer, BadCheckpointsAreClearErrors) {
  train::TrainConfig c = small_config();
  c.max_steps = 2;
  c.save = tmp("good.safetensors").string();
  train::train(c);
  // Truncated copy.
  const fs::path trunc = tmp("trunc.safetensors");
  fs::copy_file(c.save, trunc, fs::copy_options::overwrite_existing);
  fs::resize_file(trunc, fs::file_size(trunc) / 2);
  train::TrainConfig r = small_config();
  r.resume = trunc.string();
  try {
    train::train(r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trunc.safetensors"), std::string::npos) << e.what();
  }
  // Another model.
  r.resume = c.save;
  r.model = "resnet-small";
  try {
    train::train(r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cnn"), std::string::npos) << e.what();
  }
  // Not a checkpoint at all.
  const fs::path junk = tmp("junk.safetensors");
  std::ofstream(junk) << "hello";
  r.model = "cnn";
  r.resume = junk.string();
  EXPECT_THROW(train::train(r), Error);
  // Missing file.
  r.resume = tmp("does_not_exist.safetensors").string();
  EXPECT_THROW(train::train(r), Error);
}

TEST(Trainer, CheckpointHasModelAndOptimizerTensors) {
  train::TrainConfig c = small_config();
  c.max_steps = 1;
  c.save = tmp("contents.safetensors").string();
  train::train(c);
  SafetensorsFile f = load_safetensors(c.save);
  EXPECT_TRUE(f.contains("model.0.weight"));
  EXPECT_TRUE(f.contains("model.1.running_mean"));
  EXPECT_TRUE(f.contains("optim.group0.exp_avg"));
  EXPECT_EQ(f.metadata.at("model"), "cnn");
}

TEST(Trainer, NonFiniteLossStopsWithAClearReason) {
  train::TrainConfig c = small_config();
  c.lr = 1e30;  // diverges within a few steps
  c.optimizer = "sgd";
  c.momentum = 0;
  c.epochs = 1;
  train::TrainResult r = train::train(c);
  EXPECT_NE(r.stopped_reason.find("non-finite loss"), std::string::npos) << r.stopped_reason;
  c.nan_policy = "skip";
  r = train::train(c);
  EXPECT_TRUE(r.stopped_reason.empty());
  EXPECT_GT(r.skipped_steps, 0);
}

TEST(Trainer, BadConfigIsRejected) {
  train::TrainConfig c = small_config();
  c.epochs = 0;
  EXPECT_THROW(train::train(c), Error);
  c = small_config();
  c.optimizer = "lamb";
  EXPECT_THROW(train::train(c), Error);
  c = small_config();
  c.device = "tpu";
  EXPECT_THROW(train::train(c), Error);
  c = small_config();
  c.cuda_graphs = true;  // on the CPU
  EXPECT_THROW(train::train(c), Error);
  c = small_config();
  c.loss_read_interval = 0;
  EXPECT_THROW(train::train(c), Error);
  if (cuda::device_count() == 0) {
    c = small_config();
    c.device = "cuda";
    try {
      train::train(c);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no such CUDA device"), std::string::npos) << e.what();
    }
  }
  c = small_config();
  c.dataset = "fashion-mnist";
  c.data_dir = tmp("no_such_dir").string();
  try {
    train::train(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find("no_such_dir"), std::string::npos);
  }
}

// --eval-batch: an explicit size wins; auto (0) keeps 1000 for small images (Fashion-MNIST's 28x28 and the synthetic
// set's 32x32 up to 64x64) and uses the training batch for larger images and for masked LM (sequences).
TEST(Trainer, EvalBatchFollowsTheFlagOrTheImageSize) {
  using train::eval_batch_size;
  train::TrainConfig c;
  c.batch_size = 8;
  EXPECT_EQ(eval_batch_size(c, false, Shape{1, 28, 28}), 1000);
  EXPECT_EQ(eval_batch_size(c, false, Shape{3, 64, 64}), 1000);
  EXPECT_EQ(eval_batch_size(c, false, Shape{3, 224, 224}), 8);
  EXPECT_EQ(eval_batch_size(c, true, Shape{128}), 8);
  c.eval_batch_size = 250;
  EXPECT_EQ(eval_batch_size(c, false, Shape{3, 224, 224}), 250);
  EXPECT_EQ(eval_batch_size(c, true, Shape{128}), 250);
}

TEST(Trainer, LearnsTheSyntheticTask) {
  train::TrainConfig c = small_config();
  c.synthetic_size = 512;
  c.epochs = 3;
  train::TrainResult r = train::train(c);
  EXPECT_GT(r.test_accuracy, 0.5);  // 10 classes: chance is 0.1
  EXPECT_LT(r.losses.back(), r.losses.front());
}

TEST(Trainer, UnwritableCheckpointPathFailsBeforeTraining) {
  for (const std::string& bad : {tmp("no/such/dir/ckpt.safetensors").string(), tmp("").string()}) {
    train::TrainConfig c = small_config();
    c.save = bad;
    c.epochs = 50;  // would take minutes if it trained first
    const auto t0 = std::chrono::steady_clock::now();
    try {
      train::train(c);
      FAIL() << "accepted the checkpoint path " << bad;
    } catch (const Error& e) {
      EXPECT_TRUE(e.kind() == ErrorKind::Io || e.kind() == ErrorKind::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("cannot save checkpoints to '" + bad + "'"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0)
        << "the path must be checked before the first step";
  }
}
