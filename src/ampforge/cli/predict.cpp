// `ampforge predict (--checkpoint C [--model M] | --model M --random-init) --input X.safetensors --output Y.safetensors
//  [--precision fp32|fp16|bf16] [--device cpu|cuda] [--json]`: runs the model in eval mode under no-grad on the
// input file's tensors (named as the ONNX inputs: "images") and writes the outputs ("output0"). The reference
// the ONNX export tests compare runtimes with. fp16/bf16: weights and activations in that dtype (as an --fp16
// ONNX file), BatchNorm statistics F32.
// JSON schema ampforge.predict/1: docs/ARCHITECTURE.md ("ONNX export").
// Exit codes: 0 written; 2 usage or input error (no weights, another model's checkpoint, a missing or
// mis-shaped input tensor).
#include <chrono>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "ampforge/core/runtime.h"
#include "ampforge/cli/commands.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/autograd/node.h"
#include "ampforge/export/inference.h"

namespace ampforge::cli {

void add_inference_model_flags(CLI::App* sub, onnx_export::InferenceModelOptions& m);

namespace {

struct PredictArgs {
  onnx_export::InferenceModelOptions model;
  std::string input, output, precision = "fp32", device = "cpu";
  bool json = false;
};

int run_predict(const PredictArgs& a) {
  DType dt = DType::F32;
  if (a.precision == "fp16") dt = DType::F16;
  else if (a.precision == "bf16") dt = DType::BF16;
  else AF_CHECK(a.precision == "fp32", "--precision must be fp32, fp16 or bf16, got '{}'", a.precision);
  AF_CHECK(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got '{}'", a.device);
  const Device dev = a.device == "cuda" ? Device{DeviceType::CUDA, 0} : kCPU;
  runtime::check_device_exists(dev, "--device cuda");
  const SafetensorsFile in = load_safetensors(a.input);
  onnx_export::InferenceModel m = onnx_export::load_inference_model(a.model);
  AF_CHECK(!in.tensors.empty(), "'{}' holds no tensors", a.input);
  const int64_t batch = in.tensors.front().second.dim() > 0 ? in.tensors.front().second.size(0) : 0;
  const onnx_export::Signature sig = onnx_export::signature_for(m, batch);
  std::vector<Tensor> xs;
  for (const auto& spec : sig.inputs) {
    AF_CHECK(in.contains(spec.name), "'{}' has no tensor '{}' (the model's inputs: {})", a.input, spec.name,
             spec.name);
    Tensor x = in.at(spec.name);
    AF_CHECK(x.shape() == spec.shape, "'{}': tensor '{}' has shape {}, the model takes {} (batch from the file)",
             a.input, spec.name, x.shape().str(), spec.shape.str());
    if (dtype_is_float(spec.dtype)) x = x.to(dt);
    else AF_CHECK(x.dtype() == spec.dtype, "'{}': tensor '{}' is {}, expected {}", a.input, spec.name,
                  dtype_name(x.dtype()), dtype_name(spec.dtype));
    xs.push_back(x.to(dev));
  }
  m.model->to(dev);
  if (dt != DType::F32) m.model->to(dt);
  std::vector<Tensor> ys;
  const auto t0 = std::chrono::steady_clock::now();
  {
    autograd::NoGradGuard no_grad;
    ys = sig.run(*m.model, xs);
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < ys.size(); ++i) out.emplace_back(sig.outputs[i], ys[i].to(kCPU).contiguous());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  save_safetensors(a.output, out, {{"model", m.entry->name}, {"precision", a.precision}});
  if (a.json) {
    nlohmann::json outs = nlohmann::json::array();
    for (auto& [n, t] : out) outs.push_back({{"name", n}, {"shape", t.shape().vec()}, {"dtype", dtype_name(t.dtype())}});
    const nlohmann::json j = {{"schema", "ampforge.predict/1"}, {"model", m.entry->name}, {"input", a.input},
                              {"output", a.output}, {"precision", a.precision}, {"device", a.device},
                              {"batch", batch}, {"seconds", secs}, {"outputs", outs}};
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
  } else {
    for (auto& [n, t] : out)
      std::printf("%s: %s %s -> %s (%.3f s, %s, %s)\n", m.entry->name.c_str(), n.c_str(), t.shape().str().c_str(),
                  a.output.c_str(), secs, a.precision.c_str(), a.device.c_str());
  }
  return 0;
}

}  // namespace

Command add_predict_command(CLI::App& app) {
  auto a = std::make_shared<PredictArgs>();
  auto* sub = app.add_subcommand("predict", "Run a model in eval mode on tensors from a safetensors file");
  add_inference_model_flags(sub, a->model);
  sub->add_option("--input", a->input, "safetensors file with the model's inputs (images: (B, C, S, S))")->required();
  sub->add_option("--output", a->output, "safetensors file to write the outputs to (output0)")->required();
  sub->add_option("--precision", a->precision, "fp32 | fp16 | bf16 (weights and activations)")->capture_default_str();
  sub->add_option("--device", a->device, "cpu | cuda")->capture_default_str();
  sub->add_flag("--json", a->json, "Print JSON (schema ampforge.predict/1; see docs/ARCHITECTURE.md)");
  sub->footer("Exit codes: 0 written; 2 usage or input error (no weights, another model's checkpoint, bad input).");
  return {sub, [a] { return run_predict(*a); }};
}

}  // namespace ampforge::cli
