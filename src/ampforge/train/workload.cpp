#include "ampforge/train/workload.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "ampforge/core/generator.h"
#include "ampforge/nn/init.h"
#include "ampforge/models/registry.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/classification.h"
#include "ampforge/tasks/detection.h"
#include "ampforge/tasks/masked_lm.h"
#include "ampforge/util/error.h"

namespace ampforge::train {

namespace {

// Where images are drawn: on the CPU and then moved, except on the meta device, where values do not exist (a
// batch of 256 224x224 images would cost a second of drawing for nothing).
Device image_device(const WorkloadOptions& o) { return o.device.is_meta() ? o.device : kCPU; }

// Images N(0, 1) (what normalised inputs look like) and labels spread over the classes.
void classification_batch(Workload& w, const models::ModelOptions& mo, const WorkloadOptions& o) {
  Generator gen(o.seed + 1);
  Tensor x = randn({o.batch, mo.in_channels, mo.image_size, mo.image_size}, DType::F32, image_device(o), &gen);
  if (o.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  std::vector<int64_t> labels(static_cast<size_t>(o.batch));
  // A stride coprime with typical class counts, so a small batch still sees different classes.
  for (int64_t i = 0; i < o.batch; ++i) labels[static_cast<size_t>(i)] = (i * 379 + 11) % mo.num_classes;
  w.batch.x = x.device() != o.device ? x.to(o.device) : x;
  w.batch.y = Tensor::from_vector(labels);
  if (!o.device.is_cpu()) w.batch.y = w.batch.y.to(o.device);
  w.task = std::make_shared<tasks::ClassificationTask>();
  w.input = fmt::format("{}x{}x{}", mo.in_channels, mo.image_size, mo.image_size);
}

// Images uniform in [0, 1) (YOLO inputs are pixels / 255) and kTargets boxes per image (class, cx, cy, w, h,
// normalised), spread over the canvas and the classes, so that the assigner finds foreground anchors.
void detection_batch(Workload& w, const models::ModelOptions& mo, const WorkloadOptions& o) {
  constexpr int64_t kTargets = 4;
  Generator gen(o.seed + 1);
  Tensor x = rand({o.batch, mo.in_channels, mo.image_size, mo.image_size}, DType::F32, image_device(o), &gen);
  if (o.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  const Tensor u = rand({o.batch, kTargets, 4}, DType::F32, kCPU, &gen);
  Tensor t = Tensor::empty({o.batch, kTargets, 5}, DType::F32);
  const float* r = u.data<float>();
  float* rows = t.data<float>();
  for (int64_t i = 0; i < o.batch * kTargets; ++i) {
    rows[5 * i + 0] = static_cast<float>((i * 7 + 3) % mo.num_classes);
    rows[5 * i + 1] = 0.2f + 0.6f * r[4 * i + 0];   // centre in [0.2, 0.8)
    rows[5 * i + 2] = 0.2f + 0.6f * r[4 * i + 1];
    rows[5 * i + 3] = 0.05f + 0.3f * r[4 * i + 2];  // size in [0.05, 0.35)
    rows[5 * i + 4] = 0.05f + 0.3f * r[4 * i + 3];
  }
  w.batch.x = x.device() != o.device ? x.to(o.device) : x;
  w.batch.targets = !o.device.is_cpu() ? t.to(o.device) : t;
  w.task = std::make_shared<tasks::DetectionTask>();
  w.input = fmt::format("{}x{}x{}", mo.in_channels, mo.image_size, mo.image_size);
}

// Token ids (as floats, as the text data sets deliver them): [CLS] ids... [SEP], ids spread over the
// vocabulary above the special tokens; the task masks them dynamically, as in training.
void masked_lm_batch(Workload& w, const models::ModelOptions& mo, const WorkloadOptions& o) {
  tasks::MaskedLMOptions mlm;
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
  w.batch.x = !o.device.is_cpu() ? ids.to(o.device) : ids;
  w.task = std::make_shared<tasks::MaskedLMTask>(mlm);
  w.input = fmt::format("seq {}", o.seq_len);
}

}  // namespace

bool has_workload(const std::string& task_kind) {
  return task_kind == "classification" || task_kind == "detection" || task_kind == "masked_lm";
}

Workload make_workload(const std::string& model, const WorkloadOptions& o) {
  AF_CHECK(o.batch >= 1, "workload: batch must be >= 1, got {}", o.batch);
  AF_CHECK(o.image_size == 0 || (o.image_size >= 8 && o.image_size <= 4096),
           "workload: image size must be 0 (the model's default) or in [8, 4096], got {}", o.image_size);
  AF_CHECK(o.seq_len >= 1, "workload: sequence length must be >= 1, got {}", o.seq_len);
  const models::ModelEntry& entry = models::model_registry().at(model);
  Workload w;
  w.model = model;
  w.task_kind = entry.task;
  w.samples = o.batch;
  models::ModelOptions mo = entry.defaults;
  if (entry.task == "masked_lm") mo.image_size = o.seq_len;  // sequence models: image_size is the length
  else if (o.image_size > 0) mo.image_size = o.image_size;
  manual_seed(o.seed);
  {
    // On the meta device the parameters' values are dropped: skip drawing them (seconds for BERT-base).
    std::optional<nn::init::SkipInitGuard> skip;
    if (o.device.is_meta()) skip.emplace();
    w.module = entry.build(mo);
  }
  w.module->train();
  if (!o.device.is_cpu()) w.module->to(o.device);
  if (entry.task == "classification") {
    classification_batch(w, mo, o);
  } else if (entry.task == "detection") {
    detection_batch(w, mo, o);
  } else if (entry.task == "masked_lm") {
    masked_lm_batch(w, mo, o);
  } else {
    AF_THROW(NotImplemented, "workload: no synthetic batch for models of task '{}' (model {})", entry.task, model);
  }
  return w;
}

}  // namespace ampforge::train
