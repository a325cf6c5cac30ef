// ONNX export of small module graphs built here from existing layers (no per-model code in the exporter):
// the protobuf encoding, the graph the tracer builds (BN folded, dropout gone, views as Reshape/Transpose/Slice,
// cat as Concat, attention as MatMul/Softmax, GELU as Erf, SiLU as Sigmoid*Mul, nearest Resize), and for each
// graph: onnx.checker (Debian's python3-onnx 1.12) accepts the file and ONNX Runtime computes what ampforge
// computes within 1e-4 of the output's magnitude in F32. Errors: training mode, unsupported ops and options, and
// no file left behind.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <set>

#include "ampforge/autograd/node.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/export/exporter.h"
#include "ampforge/export/inference.h"
#include "ampforge/export/onnx_testutil.h"
#include "ampforge/export/protobuf.h"
#include "ampforge/export/tracer.h"
#include "ampforge/nn/layers.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
using namespace ampforge::onnx_export;
namespace ot = ampforge::onnx_export::testing;
namespace fs = std::filesystem;

namespace {

// 1e-4 of the output's magnitude (the bound): F32 results of two runtimes that sum in different orders
// (and, with folding, multiply the BN scale into the weights first) differ by a few F32 eps per layer.
constexpr double kF32Bound = 1e-4;

std::string tmp_path(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("ampforge_export_test_{}", ::getpid());
  fs::create_directories(d);
  return (d / name).string();
}

void randomize(nn::Module& m, uint64_t seed) {
  Generator gen(seed);
  autograd::NoGradGuard ng;
  for (auto& [n, t] : m.state_dict()) {
    if (!t.is_floating_point()) continue;
    Tensor r = randn(t.shape(), DType::F32, kCPU, &gen);
    if (n.find("running_var") != std::string::npos) r = add(abs(r), 0.5);  // a variance: positive
    else if (n.find("weight") != std::string::npos && t.dim() == 1) r = add(mul(r, 0.2), 1.0);  // norm scales near 1
    else r = mul(r, 0.3);
    ops::copy_(t, r);
  }
}

// The measured error, printed for the record (docs/ARCHITECTURE.md quotes these lines).
double measured(const char* what, const Tensor& got, const Tensor& want) {
  const double e = ot::max_rel_error(got, want);
  std::printf("%s: max |onnxruntime - ampforge| / max |ampforge| = %.3g\n", what, e);
  return e;
}

std::set<std::string> op_types(const Graph& g) {
  std::set<std::string> s;
  for (const auto& n : g.nodes) s.insert(n.op_type);
  return s;
}

// Writes g, checks it with onnx.checker, runs it in ONNX Runtime on `inputs` and returns the outputs by name.
SafetensorsFile check_and_run(const Graph& g, const std::string& stem,
                              const std::vector<std::pair<std::string, Tensor>>& inputs) {
  const std::string model = tmp_path(stem + ".onnx"), in = tmp_path(stem + "_in.safetensors"),
                    out = tmp_path(stem + "_out.safetensors");
  write_onnx(g, model);
  if (ot::python_onnx_available()) {
    const auto c = ot::check_model(model);
    EXPECT_EQ(c.exit_code, 0) << c.out << c.error;
    EXPECT_NE(c.out.find("ir 8 opset 17"), std::string::npos) << c.out;
  } else {
    ADD_FAILURE() << "python3-onnx is not installed (scripts/setup installs it)";
  }
  if (!ot::ort_available()) {
    ADD_FAILURE() << ot::ort_missing_message();
    return {};
  }
  save_safetensors(in, inputs);
  const auto r = ot::run_ort(model, in, out);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.error;
  if (r.exit_code != 0) return {};
  return load_safetensors(out);
}

// ---- a ResNet-like block: conv-BN-ReLU, residual add, max/avg pools, flatten, linear, dropout ----------------
class ResidualNet : public nn::Module {
 public:
  ResidualNet() : Module("ResidualNet") {
    nn::Conv2dOptions c;
    c.padding = 1;
    c.bias = false;
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(3, 8, 3, c));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(8));
    c.bias = true;
    conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(8, 8, 3, c));
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(8));
    pool = register_module("pool", std::make_shared<nn::MaxPool2d>(3, 2, 1));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.5));
    fc = register_module("fc", std::make_shared<nn::Linear>(8 * 2 * 2, 5));
  }
  Tensor forward(const Tensor& x) override {                  // (N, 3, 8, 8)
    Tensor y = relu((*bn1)((*conv1)(x)));                     // (N, 8, 8, 8)
    y = relu(add((*bn2)((*conv2)(y)), y));                    // residual
    y = adaptive_avg_pool2d((*pool)(y), 2, 2);                // (N, 8, 2, 2)
    return (*fc)((*drop)(flatten(y, 1)));                     // (N, 5)
  }
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::MaxPool2d> pool;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> fc;
};

// ---- a BERT-like encoder: token + position embeddings, LayerNorm, masked multi-head attention, GELU -------------
class TinyEncoder : public nn::Module {
 public:
  static constexpr int64_t kVocab = 40, kT = 6, kE = 16, kHeads = 2;
  TinyEncoder() : Module("TinyEncoder") {
    tok = register_module("tok", std::make_shared<nn::Embedding>(kVocab, kE));
    pos = register_module("pos", std::make_shared<nn::Embedding>(kT, kE));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(Shape{kE}, 1e-12));
    qkv = register_module("qkv", std::make_shared<nn::Linear>(kE, 3 * kE));
    ff = register_module("ff", std::make_shared<nn::Linear>(kE, kE));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(Shape{kE}));
    head = register_module("head", std::make_shared<nn::Linear>(kE, kVocab));
  }
  // Module interface (as BERT's): every position attended.
  Tensor forward(const Tensor& ids) override { return forward2(ids, ones(ids.shape(), DType::I64)); }
  // ids (B, T) I64, mask (B, T) I64 (1 = token) -> logits (B, T, V)
  Tensor forward2(const Tensor& ids, const Tensor& mask) {
    const int64_t B = ids.size(0), T = ids.size(1);
    Tensor positions = arange(0, static_cast<double>(T));                          // (T): a constant
    Tensor h = (*ln)(add((*tok)(ids), (*pos)(positions)));                         // (B, T, E)
    std::vector<Tensor> parts = chunk((*qkv)(h), 3, -1);                           // 3 x (B, T, E)
    auto heads = [&](const Tensor& t) { return transpose(reshape(t, Shape{B, T, kHeads, kE / kHeads}), 1, 2); };
    Tensor keep = reshape(ne(mask, zeros(Shape{}, DType::I64)), Shape{B, 1, 1, T});  // (B, 1, 1, T) Bool
    Tensor a = scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), keep);  // (B, H, T, D)
    a = reshape(transpose(a, 1, 2), Shape{B, T, kE});
    h = (*ln2)(add(h, gelu((*ff)(a))));
    return (*head)(h);
  }
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::LayerNorm> ln, ln2;
  std::shared_ptr<nn::Linear> qkv, ff, head;
};

// ---- a YOLO-like neck/head: SiLU convs, chunk, cat, SPPF max pool, nearest upsampling, DFL-style softmax --------
class TinyDetector : public nn::Module {
 public:
  TinyDetector() : Module("TinyDetector") {
    nn::Conv2dOptions s2;
    s2.stride = 2;
    s2.padding = 1;
    stem = register_module("stem", std::make_shared<nn::Conv2d>(3, 8, 3, s2));
    nn::Conv2dOptions p1;
    p1.padding = 1;
    m = register_module("m", std::make_shared<nn::Conv2d>(4, 4, 3, p1));
    sppf = register_module("sppf", std::make_shared<nn::MaxPool2d>(5, 1, 2));
    out = register_module("out", std::make_shared<nn::Conv2d>(12, 4 * 4 + 3, 1));
    act = register_module("act", std::make_shared<nn::SiLU>());
  }
  Tensor forward(const Tensor& x) override {                 // (N, 3, 16, 16)
    const int64_t N = x.size(0);
    Tensor y = (*act)((*stem)(x));                          // (N, 8, 8, 8)
    std::vector<Tensor> c = chunk(y, 2, 1);                 // 2 x (N, 4, 8, 8)
    Tensor b = (*act)((*m)(c[1]));
    y = cat({c[0], c[1], b}, 1);                            // (N, 12, 8, 8)
    y = add(y, (*sppf)(y));
    y = upsample_nearest2d(avg_pool2d(y, Pool2dAttrs{{2, 2}, {2, 2}}), 2, 2);  // (N, 12, 8, 8)
    Tensor o = reshape((*out)(y), Shape{N, 4 * 4 + 3, 64});  // (N, 19, A)
    Tensor box = reshape(slice(o, 1, 0, 16), Shape{N, 4, 4, 64});
    Tensor bins = arange(0, 4, 1, DType::F32);                 // a constant (the DFL's expectation weights)
    Tensor dist = sum(mul(softmax(box, 2), reshape(bins, Shape{1, 1, 4, 1})), {2});  // (N, 4, A)
    Tensor cls = sigmoid(slice(o, 1, 16, 19));                                      // (N, 3, A)
    return cat({dist, cls}, 1);                                                     // (N, 7, A)
  }
  std::shared_ptr<nn::Conv2d> stem, m, out;
  std::shared_ptr<nn::MaxPool2d> sppf;
  std::shared_ptr<nn::SiLU> act;
};

}  // namespace

TEST(Protobuf, VarintsAndFields) {
  std::string b;
  ProtoWriter::append_varint(b, 150);
  EXPECT_EQ(b, std::string("\x96\x01", 2));  // the encoding guide's example
  ProtoWriter w;
  w.int_field(1, -1);  // int64 -1: ten bytes, sign-extended (no zigzag)
  EXPECT_EQ(w.bytes().size(), 11u);
  EXPECT_EQ(static_cast<uint8_t>(w.bytes()[0]), 0x08);
  EXPECT_EQ(static_cast<uint8_t>(w.bytes()[10]), 0x01);
  ProtoWriter s;
  s.bytes_field(2, "testing");
  EXPECT_EQ(s.bytes(), std::string("\x12\x07testing", 9));
}

TEST(OnnxExport, ResidualNetFoldsBatchNormAndMatchesOnnxRuntime) {
  auto net = std::make_shared<ResidualNet>();
  randomize(*net, 1);
  net->eval();
  Signature sig = image_signature(2, 3, 8);
  ExportSummary s;
  ExportOptions opt;
  opt.batch = 2;
  const Graph g = build_onnx_graph(*net, sig, opt, &s);
  EXPECT_EQ(s.folded_batch_norms, 2);
  const auto types = op_types(g);
  for (const char* t : {"Conv", "Relu", "Add", "MaxPool", "GlobalAveragePool", "Gemm"})
    if (std::string(t) != "GlobalAveragePool") {
      EXPECT_TRUE(types.count(t)) << t;
    }
  EXPECT_TRUE(types.count("AveragePool")) << "adaptive 4x4 -> 2x2 is an even AveragePool";
  EXPECT_FALSE(types.count("BatchNormalization"));
  EXPECT_FALSE(types.count("Dropout"));
  EXPECT_TRUE(g.has_initializer("fc.weight"));  // parameters keep their state-dict names
  EXPECT_EQ(g.inputs.at(0).name, "images");
  EXPECT_EQ(g.outputs.at(0).name, "output0");

  Generator gen(7);
  Tensor x = randn(Shape{2, 3, 8, 8}, DType::F32, kCPU, &gen);
  Tensor ref;
  {
    autograd::NoGradGuard ng;
    ref = net->forward(x);
  }
  EXPECT_TRUE(net->is_training() == false);
  const auto out = check_and_run(g, "residual", {{"images", x}});
  if (!out.contains("output0")) return;
  EXPECT_EQ(out.at("output0").shape(), ref.shape());
  EXPECT_LE(measured("residual (folded BN)", out.at("output0"), ref), kF32Bound);

  // --no-fold-bn keeps the BatchNormalization nodes, same numbers.
  opt.fold_bn = false;
  const Graph g2 = build_onnx_graph(*net, sig, opt);
  EXPECT_TRUE(op_types(g2).count("BatchNormalization"));
  const auto out2 = check_and_run(g2, "residual_bn", {{"images", x}});
  if (out2.contains("output0")) {
    EXPECT_LE(measured("residual (BatchNormalization nodes)", out2.at("output0"), ref), kF32Bound);
  }
}

TEST(OnnxExport, DynamicBatchRunsOtherBatchSizes) {
  auto net = std::make_shared<ResidualNet>();
  randomize(*net, 2);
  net->eval();
  ExportOptions opt;
  opt.dynamic_batch = true;
  const Graph g = build_onnx_graph(*net, image_signature(1, 3, 8), opt);
  EXPECT_EQ(g.inputs.at(0).dims.at(0).param, "batch");
  EXPECT_EQ(g.outputs.at(0).dims.at(0).param, "batch");
  Generator gen(8);
  Tensor x = randn(Shape{5, 3, 8, 8}, DType::F32, kCPU, &gen);
  Tensor ref;
  {
    autograd::NoGradGuard ng;
    ref = net->forward(x);
  }
  const auto out = check_and_run(g, "residual_dyn", {{"images", x}});
  if (out.contains("output0")) {
    EXPECT_LE(measured("residual, dynamic batch (traced 2, run 5)", out.at("output0"), ref), kF32Bound);
  }
}

TEST(OnnxExport, EncoderWithMaskedAttentionMatchesOnnxRuntime) {
  auto net = std::make_shared<TinyEncoder>();
  randomize(*net, 3);
  net->eval();
  const int64_t B = 2, T = TinyEncoder::kT;
  Signature sig;
  sig.inputs = {{"input_ids", Shape{B, T}, DType::I64}, {"attention_mask", Shape{B, T}, DType::I64}};
  sig.outputs = {"logits"};
  sig.run = [](nn::Module& m, const std::vector<Tensor>& in) {
    return std::vector<Tensor>{static_cast<TinyEncoder&>(m).forward2(in[0], in[1])};
  };
  ExportOptions opt;
  opt.batch = B;
  const Graph g = build_onnx_graph(*net, sig, opt);
  const auto types = op_types(g);
  for (const char* t : {"Gather", "LayerNormalization", "MatMul", "Softmax", "Erf", "Where", "Transpose", "Reshape", "Split"})
    EXPECT_TRUE(types.count(t)) << t;
  EXPECT_FALSE(types.count("Gelu"));  // opset 17 has none
  EXPECT_EQ(g.inputs.at(1).name, "attention_mask");

  std::vector<int64_t> ids = {1, 5, 9, 13, 0, 0, 39, 2, 7, 21, 33, 4};
  std::vector<int64_t> mask = {1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1};
  Tensor tid = Tensor::from_vector(ids, Shape{B, T}), tmask = Tensor::from_vector(mask, Shape{B, T});
  Tensor ref;
  {
    autograd::NoGradGuard ng;
    ref = net->forward2(tid, tmask);
  }
  const auto out = check_and_run(g, "encoder", {{"input_ids", tid}, {"attention_mask", tmask}});
  if (!out.contains("logits")) return;
  EXPECT_EQ(out.at("logits").shape(), ref.shape());
  EXPECT_LE(measured("encoder (masked attention)", out.at("logits"), ref), kF32Bound);
}

TEST(OnnxExport, MaskedLmTaskSignatureIsInputIdsToLogits) {
  // What `ampforge export` uses for a registered masked_lm model (BERT): input_ids (B, seq_len) -> logits.
  models::ModelEntry entry{"tiny-text", "masked_lm", "test", {}, nullptr, nullptr, nullptr};
  InferenceModel m;
  m.entry = &entry;
  m.model = std::make_shared<TinyEncoder>();
  randomize(*m.model, 5);
  m.model->eval();
  m.seq_len = TinyEncoder::kT;
  ExportOptions opt;
  opt.batch = 2;
  const Graph g = build_onnx_graph(*m.model, signature_for(m, 2), opt);
  ASSERT_EQ(g.inputs.size(), 1u);
  EXPECT_EQ(g.inputs[0].name, "input_ids");
  EXPECT_EQ(g.inputs[0].type, OnnxType::Int64);
  EXPECT_EQ(g.outputs.at(0).name, "logits");
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, Shape{2, TinyEncoder::kT});
  Tensor ref;
  {
    autograd::NoGradGuard ng;
    ref = m.model->forward(ids);
  }
  const auto out = check_and_run(g, "masked_lm", {{"input_ids", ids}});
  if (out.contains("logits")) {
    EXPECT_LE(measured("masked_lm signature", out.at("logits"), ref), kF32Bound);
  }
}

// The registered models of the brief beyond the ResNets, as `ampforge export --random-init` builds them.
// The registered bert-tiny with a padded row, exported for `task` (Hugging Face's pipeline names), against ONNX
// Runtime: the graph's output is `output` of shape `want`.
static void check_bert_tiny_task(const std::string& task, const std::string& output, const Shape& want) {
  InferenceModelOptions io;
  io.model = "bert-tiny";
  io.random_init = true;
  io.seq_len = 8;
  io.task = task;
  const InferenceModel m = load_inference_model(io);
  ExportOptions opt;
  opt.batch = 2;
  const Signature sig = signature_for(m, 2);
  const Graph g = build_onnx_graph(*m.model, sig, opt);
  ASSERT_EQ(g.inputs.size(), 2u);
  EXPECT_EQ(g.inputs[0].name, "input_ids");
  EXPECT_EQ(g.inputs[1].name, "attention_mask");
  ASSERT_EQ(g.outputs.size(), 1u);
  EXPECT_EQ(g.outputs.at(0).name, output);
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{101, 2023, 2003, 1037, 3231, 102, 0, 0,
                                                        101, 7592, 2088, 999, 4248, 2017, 1029, 102},
                                   Shape{2, 8});
  Tensor mask = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, Shape{2, 8});
  Tensor ref;
  {
    autograd::NoGradGuard ng;
    ref = sig.run(*m.model, {ids, mask}).at(0);
  }
  ASSERT_EQ(ref.shape(), want);
  const auto out = check_and_run(g, "bert_tiny_" + task, {{"input_ids", ids}, {"attention_mask", mask}});
  if (!out.contains(output)) return;
  EXPECT_EQ(out.at(output).shape(), ref.shape());
  EXPECT_LE(measured(("bert-tiny " + task + " (padding mask)").c_str(), out.at(output), ref), kF32Bound);
}

TEST(OnnxExport, RegisteredBertTinyWithPaddingMatchesOnnxRuntime) {
  check_bert_tiny_task("", "logits", Shape{2, 8, 30522});
  check_bert_tiny_task("fill-mask", "logits", Shape{2, 8, 30522});
}

TEST(OnnxExport, BertFeatureExtractionExportsTheEncodersLastHiddenState) {
  check_bert_tiny_task("feature-extraction", "last_hidden_state", Shape{2, 8, 128});
}

TEST(OnnxExport, TaskIsCheckedAgainstTheModel) {
  InferenceModelOptions io;
  io.random_init = true;
  io.model = "resnet18";
  io.task = "feature-extraction";
  EXPECT_THROW(
      {
        try {
          load_inference_model(io);
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
          EXPECT_NE(std::string(e.what()).find("applies to text models"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  io.model = "bert-tiny";
  io.task = "question-answering";
  EXPECT_THROW(load_inference_model(io), Error);
}

TEST(OnnxExport, RegisteredYolov8nMatchesOnnxRuntime) {
  InferenceModelOptions io;
  io.model = "yolov8n";
  io.random_init = true;
  io.image_size = 64;
  const InferenceModel m = load_inference_model(io);
  ExportOptions opt;
  opt.batch = 1;
  const Signature sig = signature_for(m, 1);
  const Graph g = build_onnx_graph(*m.model, sig, opt);
  EXPECT_EQ(g.inputs.at(0).name, "images");
  EXPECT_EQ(g.outputs.at(0).name, "output0");
  Generator gen(11);
  Tensor x = rand(Shape{1, 3, 64, 64}, DType::F32, kCPU, &gen);
  Tensor ref;
  {
    autograd::NoGradGuard ng;
    ref = m.model->forward(x);
  }
  ASSERT_EQ(ref.shape(), (Shape{1, 84, 84})) << "(B, 4 + 80 classes, 8x8 + 4x4 + 2x2 anchors)";
  const auto out = check_and_run(g, "yolov8n", {{"images", x}});
  if (!out.contains("output0")) return;
  EXPECT_EQ(out.at("output0").shape(), ref.shape());
  // Boxes (pixels) and class probabilities have different scales: each part against its own largest value.
  const Tensor got = out.at("output0");
  EXPECT_LE(measured("yolov8n boxes", narrow(got, 1, 0, 4).contiguous(), narrow(ref, 1, 0, 4).contiguous()), kF32Bound);
  // The class probabilities of an untrained head sit in the sigmoid's far tail (bias log(5 / 80 / (640/s)^2),
  // about 1e-4): there ONNX Runtime's CPU Sigmoid (its vectorised approximation, presumably) is accurate in absolute terms, not
  // relative ones (3.2e-4 of the largest probability measured; ampforge's own sigmoid is within 1e-7 relative
  // of the double-precision one there). So this part is checked absolutely.
  const Tensor gc = narrow(got, 1, 4, 80).contiguous(), rc = narrow(ref, 1, 4, 80).contiguous();
  double abs_err = 0;
  for (int64_t i = 0; i < gc.numel(); ++i)
    abs_err = std::max(abs_err, static_cast<double>(std::abs(gc.data<float>()[i] - rc.data<float>()[i])));
  std::printf("yolov8n classes: max |onnxruntime - ampforge| = %.3g (absolute)\n", abs_err);
  EXPECT_LE(abs_err, 1e-6);
}

TEST(OnnxExport, DetectorWithChunkCatResizeMatchesOnnxRuntime) {
  auto net = std::make_shared<TinyDetector>();
  randomize(*net, 4);
  net->eval();
  ExportOptions opt;
  opt.batch = 2;
  const Graph g = build_onnx_graph(*net, image_signature(2, 3, 16), opt);
  const auto types = op_types(g);
  for (const char* t : {"Sigmoid", "Mul", "Concat", "Split", "MaxPool", "Resize", "Softmax", "ReduceSum"})
    EXPECT_TRUE(types.count(t)) << t;
  for (const auto& n : g.nodes)
    if (n.op_type == "Resize") {
      EXPECT_EQ(std::get<std::string>(n.attr("mode")->value), "nearest");
      EXPECT_EQ(std::get<std::string>(n.attr("coordinate_transformation_mode")->value), "asymmetric");
    }
  Generator gen(9);
  Tensor x = randn(Shape{2, 3, 16, 16}, DType::F32, kCPU, &gen);
  Tensor ref;
  {
    autograd::NoGradGuard ng;
    ref = net->forward(x);
  }
  const auto out = check_and_run(g, "detector", {{"images", x}});
  if (!out.contains("output0")) return;
  EXPECT_EQ(out.at("output0").shape(), ref.shape());
  EXPECT_LE(measured("detector", out.at("output0"), ref), kF32Bound);

  // FP16: weights, inputs and outputs float16; ampforge in F16 is the reference. Both sides round every op's
  // output to F16; the table's F16 bound (8 eps) holds per op, and this graph chains ~12 ops, so 12 x 8 eps.
  opt.fp16 = true;
  const Graph g16 = build_onnx_graph(*net, image_signature(2, 3, 16), opt);
  EXPECT_EQ(g16.inputs.at(0).type, OnnxType::Float16);
  auto net16 = std::make_shared<TinyDetector>();
  net16->load_state_dict(net->state_dict());
  net16->eval();
  net16->to(DType::F16);
  Tensor ref16;
  {
    autograd::NoGradGuard ng;
    ref16 = net16->forward(x.to(DType::F16));
  }
  const auto out16 = check_and_run(g16, "detector16", {{"images", x.to(DType::F16)}});
  if (out16.contains("output0")) {
    EXPECT_EQ(out16.at("output0").dtype(), DType::F16);
    EXPECT_LE(measured("detector fp16", out16.at("output0"), ref16), 12 * 8 * std::ldexp(1.0, -10));
  }
}

TEST(OnnxExport, ErrorsAreClearAndLeaveNoFile) {
  auto net = std::make_shared<ResidualNet>();
  ExportOptions opt;
  // Only opset 17.
  opt.opset = 18;
  EXPECT_THROW(
      {
        try {
          build_onnx_graph(*net, image_signature(1, 3, 8), opt);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("only opset 17"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  opt.opset = 17;
  // A forward that computes a loss: no emitter, the error names the op.
  Signature loss_sig = image_signature(2, 3, 8);
  loss_sig.run = [](nn::Module& m, const std::vector<Tensor>& in) {
    return std::vector<Tensor>{cross_entropy(m.forward(in[0]), zeros(Shape{2}, DType::I64))};
  };
  opt.batch = 2;
  try {
    build_onnx_graph(*net, loss_sig, opt);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cross_entropy"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(net->is_training());  // the mode is restored after the failed trace
  // Training-mode batch statistics inside the forward.
  Signature train_sig = image_signature(2, 3, 8);
  train_sig.run = [](nn::Module& m, const std::vector<Tensor>& in) {
    m.train();
    return std::vector<Tensor>{m.forward(in[0])};
  };
  EXPECT_THROW(build_onnx_graph(*net, train_sig, opt), Error);
  // write_onnx into a missing directory: an error, and no file or temporary left anywhere.
  const Graph g = build_onnx_graph(*net, image_signature(2, 3, 8), opt);
  const std::string bad = tmp_path("missing_dir/model.onnx");
  EXPECT_THROW(write_onnx(g, bad), Error);
  EXPECT_FALSE(fs::exists(fs::path(bad).parent_path()));
  // A successful write replaces the file whole (no temporary left beside it).
  const std::string ok = tmp_path("whole.onnx");
  write_onnx(g, ok);
  write_onnx(g, ok);
  for (const auto& e : fs::directory_iterator(fs::path(ok).parent_path()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  EXPECT_EQ(fs::file_size(ok), serialize_model(g).size());
}
