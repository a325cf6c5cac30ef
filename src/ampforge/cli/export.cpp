// `ampforge export (--checkpoint C [--model M] | --model M --random-init) -o model.onnx [--opset 17] [--fp16]
//  [--dynamic-batch] [--no-fold-bn] [--image-size N] [--json]`: writes an ONNX file (IR 8, opset 17) that
// TensorRT (`trtexec --onnx=model.onnx --fp16`), ONNX Runtime and other runtimes read. The graph is traced from
// one eval forward (export/tracer.h); the file is written atomically (never a partial file).
// JSON schema ampforge.export/1: docs/ARCHITECTURE.md ("ONNX export").
// Exit codes: 0 written; 2 usage or input error (no weights, a checkpoint of another model, an unsupported
// option or op), nothing written.
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "ampforge/cli/commands.h"
#include "ampforge/export/exporter.h"
#include "ampforge/export/inference.h"

namespace ampforge::cli {

namespace {

struct ExportArgs {
  onnx_export::InferenceModelOptions model;
  onnx_export::ExportOptions opt;
  std::string output;
  bool no_fold_bn = false;
  bool json = false;
};

nlohmann::json value_json(const onnx_export::ValueInfo& v) {
  nlohmann::json dims = nlohmann::json::array();
  for (const auto& d : v.dims) {
    if (d.param.empty()) dims.push_back(d.value);
    else dims.push_back(d.param);
  }
  return {{"name", v.name}, {"dtype", onnx_export::onnx_type_name(v.type)}, {"shape", dims}};
}

int run_export(ExportArgs a) {
  AF_CHECK(!a.output.empty(), "-o/--output is required");
  AF_CHECK(a.opt.batch >= 1, "--batch must be at least 1, got {}", a.opt.batch);
  AF_CHECK(!a.opt.dynamic_batch || a.opt.batch == 1, "--batch and --dynamic-batch exclude each other");
  a.opt.fold_bn = !a.no_fold_bn;
  onnx_export::InferenceModel m = onnx_export::load_inference_model(a.model);
  onnx_export::ExportSummary s;
  const onnx_export::Graph g =
      onnx_export::build_onnx_graph(*m.model, onnx_export::signature_for(m, a.opt.batch), a.opt, &s);
  onnx_export::write_onnx(g, a.output);
  const auto bytes = std::filesystem::file_size(a.output);
  if (a.json) {
    nlohmann::json ins = nlohmann::json::array(), outs = nlohmann::json::array();
    for (const auto& v : g.inputs) ins.push_back(value_json(v));
    for (const auto& v : g.outputs) outs.push_back(value_json(v));
    const nlohmann::json j = {{"schema", "ampforge.export/1"},
                              {"model", m.entry->name},
                              {"task", m.task.empty() ? nlohmann::json() : nlohmann::json(m.task)},
                              {"file", a.output},
                              {"bytes", bytes},
                              {"ir_version", onnx_export::kIrVersion},
                              {"opset", onnx_export::kOpsetVersion},
                              {"precision", a.opt.fp16 ? "float16" : "float32"},
                              {"dynamic_batch", a.opt.dynamic_batch},
                              {"fold_bn", a.opt.fold_bn},
                              {"weights", a.model.random_init ? "random-init" : a.model.checkpoint},
                              {"nodes", s.nodes},
                              {"initializers", s.initializers},
                              {"folded_batch_norms", s.folded_batch_norms},
                              {"op_types", s.op_types},
                              {"inputs", ins},
                              {"outputs", outs}};
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
  } else {
    std::printf("%s -> %s: %zu bytes, %d nodes (%s), %d initializers, %d BatchNorms folded, opset %lld, %s%s\n",
                m.entry->name.c_str(), a.output.c_str(), static_cast<size_t>(bytes), s.nodes,
                fmt::format("{}", fmt::join(s.op_types, " ")).c_str(), s.initializers, s.folded_batch_norms,
                static_cast<long long>(onnx_export::kOpsetVersion), a.opt.fp16 ? "float16" : "float32",
                a.opt.dynamic_batch ? ", dynamic batch" : "");
  }
  return 0;
}

}  // namespace

// The model-selection flags export and predict share.
void add_inference_model_flags(CLI::App* sub, onnx_export::InferenceModelOptions& m) {
  sub->add_option("--model", m.model,
                  "Model (`ampforge models` lists them; default: the one an `ampforge train` checkpoint records)");
  sub->add_option("--checkpoint", m.checkpoint,
                  "Weights: an `ampforge train --save` checkpoint, or a safetensors state dict (e.g. converted "
                  "torchvision weights)");
  sub->add_flag("--random-init", m.random_init,
                "Use the untrained random initialisation (runtime tests; without it a missing --checkpoint is an error)");
  sub->add_option("--seed", m.seed, "--random-init: seed of the initialisation")->capture_default_str();
  sub->add_option("--image-size", m.image_size,
                  "Square input size (default: the checkpoint's record, else the model's; ResNets any size)");
  sub->add_option("--in-channels", m.in_channels, "Input channels (default: the checkpoint's record, else the model's)");
  sub->add_option("--classes", m.num_classes, "Classes (default: the checkpoint's record, else the model's)");
  sub->add_option("--seq-len", m.seq_len, "Sequence length (text models; default: the checkpoint's record, else 128)");
  sub->add_option("--task", m.task,
                  "Text models' output, as Hugging Face names it: fill-mask (MLM logits, default) or "
                  "feature-extraction (the encoder's last_hidden_state)")
      ->check(CLI::IsMember({"fill-mask", "feature-extraction"}));
}

Command add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* sub = app.add_subcommand("export", "Export a model to ONNX (for TensorRT, ONNX Runtime, ...)");
  add_inference_model_flags(sub, a->model);
  sub->add_option("-o,--output", a->output, "The .onnx file to write (atomically)")->required();
  sub->add_option("--opset", a->opt.opset, "ONNX opset (only 17: IR version 8)")->capture_default_str();
  sub->add_flag("--fp16", a->opt.fp16, "Float16 weights, inputs, outputs and activations");
  sub->add_option("--batch", a->opt.batch, "Batch size of the (static) input shape")->capture_default_str();
  sub->add_flag("--dynamic-batch", a->opt.dynamic_batch, "Batch dim of inputs and outputs named 'batch' (any size)");
  sub->add_flag("--no-fold-bn", a->no_fold_bn, "Keep BatchNormalization nodes (default: folded into the Conv)");
  sub->add_flag("--json", a->json, "Print JSON (schema ampforge.export/1; see docs/ARCHITECTURE.md)");
  sub->footer(
      "Inputs/outputs: images (B, C, S, S) -> output0; BERT: input_ids, attention_mask (B, T) int64 -> logits\n"
      "(--task fill-mask) or last_hidden_state (--task feature-extraction). TensorRT: trtexec --onnx=model.onnx --fp16\n"
      "Example: ampforge export --model resnet50 --checkpoint r50.safetensors -o resnet50.onnx --dynamic-batch\n"
      "Exit codes: 0 written; 2 usage or input error (no weights, another model's checkpoint, unsupported option);\n"
      "nothing is written on error.");
  return {sub, [a] { return run_export(*a); }};
}

}  // namespace ampforge::cli
