// ONNX export of an nn::Module: trace (tracer.h), passes (onnx_graph.h), atomic write.
//
// Contract:
//   - The model is run once in eval mode, on the CPU, in float32, under no-grad, on sample inputs made from the
//     signature (their values do not matter for the graph; shapes do). Its mode is restored afterwards.
//   - The file is an ONNX ModelProto, IR version 8, opset 17, weights as initializers with raw_data, named
//     inputs and outputs from the signature. BatchNorm is folded into the preceding Conv unless fold_bn is
//     false; dropout is absent (eval mode). fp16: float initializers, inputs and outputs are float16.
//   - write_onnx writes `<path>.tmp.<pid>` and renames it over `path`: a failed export (an error while
//     tracing, a full disk) leaves no file, or the old one untouched.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ampforge/export/onnx_graph.h"
#include "ampforge/nn/module.h"

namespace ampforge::onnx_export {

// How a model is called for inference, by name: what `ampforge export` traces and `ampforge predict` runs.
struct InputSpec {
  std::string name;  // "images", "input_ids", "attention_mask"
  Shape shape;       // with the batch in dim 0
  DType dtype = DType::F32;
};
struct Signature {
  std::vector<InputSpec> inputs;
  std::vector<std::string> outputs;  // "output0", "logits"
  // Calls the model on tensors matching `inputs` (same order) and returns the outputs (same order).
  std::function<std::vector<Tensor>(nn::Module& model, const std::vector<Tensor>& inputs)> run;
};

// The image signature every classification and detection model uses: images (B, C, S, S) F32 -> output0,
// through Module::forward (as Ultralytics and torchvision name them).
Signature image_signature(int64_t batch, int64_t channels, int64_t image_size);

// Sample inputs for tracing: floats N(0, 1) from a fixed seed, integer ids 0, masks all ones (Bool: true).
std::vector<Tensor> sample_inputs(const Signature& sig);

struct ExportOptions {
  int64_t opset = kOpsetVersion;  // only 17 is supported (IR 8; Debian's checker stops at 17)
  bool fp16 = false;
  bool dynamic_batch = false;
  bool fold_bn = true;
  int64_t batch = 1;  // traced batch (2 when dynamic_batch, so batch-scaled dims can be told apart)
};

struct ExportSummary {
  int nodes = 0;
  int initializers = 0;
  int64_t parameters_bytes = 0;  // bytes of all initializers
  int folded_batch_norms = 0;
  std::vector<std::string> op_types;  // distinct, sorted
};

// Builds the graph (does not write). Throws InvalidArgument for unsupported options or ops.
Graph build_onnx_graph(nn::Module& model, const Signature& sig, const ExportOptions& opt, ExportSummary* summary = nullptr);
// Serialises and writes atomically (see above).
void write_onnx(const Graph& g, const std::string& path);

}  // namespace ampforge::onnx_export
