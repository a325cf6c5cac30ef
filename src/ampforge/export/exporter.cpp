#include "ampforge/export/exporter.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "ampforge/autograd/functions.h"
#include "ampforge/export/tracer.h"
#include "ampforge/util/file.h"

namespace ampforge::onnx_export {

Signature image_signature(int64_t batch, int64_t channels, int64_t image_size) {
  Signature s;
  s.inputs = {{"images", Shape{batch, channels, image_size, image_size}, DType::F32}};
  s.outputs = {"output0"};
  s.run = [](nn::Module& m, const std::vector<Tensor>& in) { return std::vector<Tensor>{m.forward(in.at(0))}; };
  return s;
}

std::vector<Tensor> sample_inputs(const Signature& sig) {
  Generator gen(20261201);
  std::vector<Tensor> out;
  for (const auto& in : sig.inputs) {
    if (dtype_is_float(in.dtype)) out.push_back(randn(in.shape, in.dtype, kCPU, &gen));
    else if (in.dtype == DType::Bool) out.push_back(ones(in.shape, DType::Bool));
    else out.push_back(zeros(in.shape, in.dtype));
  }
  return out;
}

namespace {

struct TrainModeRestore {
  nn::Module& m;
  bool was;
  explicit TrainModeRestore(nn::Module& m) : m(m), was(m.is_training()) { m.eval(); }
  ~TrainModeRestore() { m.train(was); }
};

}  // namespace

Graph build_onnx_graph(nn::Module& model, const Signature& sig, const ExportOptions& opt, ExportSummary* summary) {
  AF_CHECK(opt.opset == kOpsetVersion, "--opset {}: only opset {} is supported (IR version {}; the opset Debian's "
           "onnx 1.12 checker knows, and TensorRT 10 reads 9-20)", opt.opset, kOpsetVersion, kIrVersion);
  for (const auto& [n, t] : model.state_dict()) {
    AF_CHECK(t.device().is_cpu(), "ONNX export: parameter '{}' is on {}; export runs on the CPU", n, t.device().str());
    AF_CHECK(!t.is_floating_point() || t.dtype() == DType::F32 || n.find("running_") != std::string::npos,
             "ONNX export: parameter '{}' is {}; export traces a float32 model (use --fp16 for a float16 file)", n,
             dtype_name(t.dtype()));
  }
  const int64_t batch = opt.dynamic_batch ? std::max<int64_t>(opt.batch, 2) : opt.batch;
  Signature s = sig;
  for (auto& in : s.inputs) in.shape[0] = batch;
  std::vector<Tensor> values = sample_inputs(s);
  std::vector<TraceInput> ins;
  for (size_t i = 0; i < s.inputs.size(); ++i) ins.push_back({s.inputs[i].name, values[i]});
  TraceOptions to;
  to.dynamic_batch = opt.dynamic_batch;
  to.batch_size = batch;
  Graph g;
  {
    TrainModeRestore eval(model);
    g = trace_graph(model, ins, [&] { return s.run(model, values); }, s.outputs, to);
  }
  int folded = opt.fold_bn ? fold_batch_norm(g) : 0;
  if (opt.fp16) convert_to_float16(g);
  g.metadata["ampforge.fold_bn"] = opt.fold_bn ? "true" : "false";
  g.metadata["ampforge.precision"] = opt.fp16 ? "float16" : "float32";
  if (summary) {
    summary->nodes = static_cast<int>(g.nodes.size());
    summary->initializers = static_cast<int>(g.initializers.size());
    summary->parameters_bytes = 0;
    for (auto& [n, t] : g.initializers) summary->parameters_bytes += t.nbytes();
    summary->folded_batch_norms = folded;
    std::set<std::string> types;
    for (const auto& n : g.nodes) types.insert(n.op_type);
    summary->op_types.assign(types.begin(), types.end());
  }
  return g;
}

void write_onnx(const Graph& g, const std::string& path) {
  write_file_atomically(path, serialize_model(g), "ONNX file");
}

}  // namespace ampforge::onnx_export
