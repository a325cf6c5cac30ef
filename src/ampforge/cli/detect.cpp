// `ampforge detect --model yolov8n --checkpoint C --source DIR_OR_FILE [--out detections.jsonl]`: runs a trained
// YOLOv8 on images and writes one JSON line per image: {"image", "width", "height", "detections": [{"box": [x1,
// y1, x2, y2] in the image's pixels, "class", "name", "score"}]}. Images are letterboxed to --image-size as in
// training (data/yolo_dataset.h), the boxes mapped back; Ultralytics' prediction defaults: conf 0.25, IoU 0.7,
// at most 300 per image. The class count comes from the checkpoint (the class convs' bias size).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "ampforge/autograd/node.h"
#include "ampforge/cli/commands.h"
#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/data/image.h"
#include "ampforge/data/transforms.h"
#include "ampforge/data/yolo_dataset.h"
#include "ampforge/models/yolo.h"
#include "ampforge/nn/state_dict.h"
#include "ampforge/tasks/detection.h"
#include "ampforge/util/error.h"

namespace ampforge::cli {

namespace {

namespace fs = std::filesystem;

struct DetectArgs {
  std::string model, checkpoint, source, out = "detections.jsonl", data;  // model "": the checkpoint's, else yolov8n
  int64_t image_size = 0;                                                 // 0: the checkpoint's, else 320
  double conf = 0.25, iou = 0.7;
};

int run_detect(const DetectArgs& given) {
  DetectArgs a = given;
  const SafetensorsFile ck = load_safetensors(a.checkpoint);
  // A training checkpoint records its model and the image size it was trained at (core/checkpoint_format.h).
  if (const auto record = checkpoint::read_model_record(ck.metadata, a.checkpoint)) {
    AF_CHECK(a.model.empty() || record->model.empty() || a.model == record->model,
             "checkpoint '{}' was saved from model '{}', not '{}' (drop --model)", a.checkpoint, record->model, a.model);
    if (a.model.empty()) a.model = record->model;
    if (a.image_size == 0 && record->image_size > 0) a.image_size = record->image_size;
  }
  if (a.model.empty()) a.model = "yolov8n";
  if (a.image_size == 0) a.image_size = 320;
  AF_CHECK(a.model.size() == 7 && a.model.rfind("yolov8", 0) == 0, "--model must be yolov8n|s|m|l|x, got '{}'", a.model);
  AF_CHECK(a.image_size >= 32 && a.image_size % 32 == 0, "--image-size must be a positive multiple of 32, got {}",
           a.image_size);
  // A training checkpoint: its weight average when the run kept one (what its mAP was measured on); else a state dict
  // under Ultralytics' names.
  const nn::NamedTensors weights =
      checkpoint::is_checkpoint(ck.metadata) ? checkpoint::model_weights(ck.tensors) : ck.tensors;
  const char* bias_key = "model.22.cv3.0.2.bias";  // the last class conv of the first level: (nc)
  const auto bias = std::find_if(weights.begin(), weights.end(), [&](const auto& kv) { return kv.first == bias_key; });
  AF_CHECK(bias != weights.end(), "{}: not a YOLOv8 checkpoint (no {})", a.checkpoint, bias_key);
  const int64_t nc = bias->second.shape()[0];
  auto model = models::yolov8(a.model[6], nc, 3);
  nn::load_state_dict(*model, weights, nn::LoadOptions{});  // strict: throws listing every mismatch
  model->eval();
  std::vector<std::string> names;
  if (!a.data.empty()) names = data::read_detection_data_file(a.data).names;

  std::vector<std::string> files;
  if (fs::is_directory(a.source)) {
    for (const auto& e : fs::directory_iterator(a.source)) {
      std::string ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      if (e.is_regular_file() && (ext == ".png" || ext == ".jpg" || ext == ".jpeg")) files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(a.source);
  }
  AF_CHECK(!files.empty(), "--source {}: no .png/.jpg/.jpeg images", a.source);
  std::ofstream out(a.out);
  AF_CHECK(out.good(), "cannot write {}", a.out);
  tasks::DetectionTaskOptions nms;
  nms.conf = a.conf, nms.nms_iou = a.iou;
  const int64_t S = a.image_size;
  std::vector<float> x(static_cast<size_t>(3 * S * S));
  int64_t total = 0;
  for (const std::string& f : files) {
    data::Image img = data::decode_image_file(f);
    const double r = std::min(static_cast<double>(S) / static_cast<double>(img.height),
                              static_cast<double>(S) / static_cast<double>(img.width));
    const int64_t nw = std::llround(static_cast<double>(img.width) * r), nh = std::llround(static_cast<double>(img.height) * r);
    const int64_t left = std::llround((static_cast<double>(S - nw)) / 2 - 0.1), top = std::llround((static_cast<double>(S - nh)) / 2 - 0.1);
    const data::Image rs = (nw == img.width && nh == img.height) ? img : data::resize(img, nh, nw);
    std::fill(x.begin(), x.end(), 114.0f / 255.0f);
    for (int64_t yy = 0; yy < nh; ++yy)
      for (int64_t xx = 0; xx < nw; ++xx)
        for (int64_t c = 0; c < 3; ++c)
          x[static_cast<size_t>(c * S * S + (yy + top) * S + xx + left)] = static_cast<float>(rs.at(yy, xx)[c]) / 255.0f;
    Tensor dec;
    {
      autograd::NoGradGuard ng;
      dec = contiguous((*model)(Tensor::from_vector(x, {1, 3, S, S})));
    }
    const auto dets = tasks::non_max_suppression(dec.data<float>(), nc, dec.shape()[2], nms);
    nlohmann::json line = {{"image", f}, {"width", img.width}, {"height", img.height}};
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& d : dets) {
      auto unmap = [&](float v, int64_t pad, int64_t lim) {
        return std::clamp((static_cast<double>(v) - static_cast<double>(pad)) / r, 0.0, static_cast<double>(lim));
      };
      nlohmann::json j = {{"box", {unmap(d.x1, left, img.width), unmap(d.y1, top, img.height), unmap(d.x2, left, img.width),
                                   unmap(d.y2, top, img.height)}},
                          {"class", d.cls},
                          {"score", d.score}};
      if (d.cls < static_cast<int64_t>(names.size())) j["name"] = names[static_cast<size_t>(d.cls)];
      arr.push_back(j);
    }
    total += static_cast<int64_t>(dets.size());
    line["detections"] = arr;
    out << line.dump() << "\n";
  }
  std::printf("%zu images, %lld detections -> %s\n", files.size(), static_cast<long long>(total), a.out.c_str());
  return 0;
}

}  // namespace

Command add_detect_command(CLI::App& app) {
  auto args = std::make_shared<DetectArgs>();
  auto* sub = app.add_subcommand("detect", "Run a trained YOLOv8 checkpoint on images (JSON lines of boxes)");
  sub->add_option("--model", args->model,
                  "yolov8n | yolov8s | yolov8m | yolov8l | yolov8x (default: the checkpoint's, else yolov8n)");
  sub->add_option("--checkpoint", args->checkpoint, "A checkpoint of `ampforge train --save` (or a state dict)")
      ->required();
  sub->add_option("--source", args->source, "An image, or a folder of .png/.jpg/.jpeg images")->required();
  sub->add_option("--out", args->out, "Output (JSON lines)")->capture_default_str();
  sub->add_option("--data", args->data, "The data file, for class names (optional)");
  sub->add_option("--image-size", args->image_size,
                  "Letterbox size (default: the size the checkpoint was trained at, else 320)");
  sub->add_option("--conf", args->conf, "Confidence threshold")->capture_default_str();
  sub->add_option("--iou", args->iou, "NMS IoU threshold")->capture_default_str();
  return {sub, [args] {
            try {
              return run_detect(*args);
            } catch (const Error& e) {
              std::fprintf(stderr, "ampforge detect: %s\n", e.what());
              return 2;
            }
          }};
}

}  // namespace ampforge::cli
