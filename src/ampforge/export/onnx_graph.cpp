// ModelProto serialisation (field numbers: onnx/onnx.proto, quoted in ../shared/docs/specs/ONNX.md §E.4) and the
// graph passes (BN folding, dead code, float16).
#include "ampforge/export/onnx_graph.h"

#include <cmath>
#include <cstring>
#include <set>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/half.h"
#include "ampforge/export/protobuf.h"
#include "ampforge/util/build_info.h"

namespace ampforge::onnx_export {

OnnxType onnx_type(DType d) {
  switch (d) {
    case DType::F32: return OnnxType::Float;
    case DType::F16: return OnnxType::Float16;
    case DType::BF16: return OnnxType::BFloat16;
    case DType::F64: return OnnxType::Double;
    case DType::I32: return OnnxType::Int32;
    case DType::I64: return OnnxType::Int64;
    case DType::U8: return OnnxType::Uint8;
    case DType::Bool: return OnnxType::Bool;
  }
  AF_THROW(InvalidArgument, "ONNX export: dtype {} has no ONNX type", dtype_name(d));
}

const char* onnx_type_name(OnnxType t) {
  switch (t) {
    case OnnxType::Float: return "float32";
    case OnnxType::Float16: return "float16";
    case OnnxType::BFloat16: return "bfloat16";
    case OnnxType::Double: return "float64";
    case OnnxType::Int32: return "int32";
    case OnnxType::Int64: return "int64";
    case OnnxType::Uint8: return "uint8";
    case OnnxType::Bool: return "bool";
  }
  return "?";
}

const Attribute* Node::attr(const std::string& n) const {
  for (const auto& a : attributes)
    if (a.name == n) return &a;
  return nullptr;
}

void Graph::add_initializer(const std::string& n, const Tensor& t) {
  AF_ASSERT(!has_initializer(n), "initializer '{}' added twice", n);
  Tensor c = t.device().is_cpu() ? t : t.to(kCPU);
  initializers[n] = ampforge::clone(c.contiguous()).detach();
  initializer_order.push_back(n);
}

void Graph::remove_initializer(const std::string& n) {
  initializers.erase(n);
  std::erase(initializer_order, n);
}

int Graph::use_count(const std::string& value) const {
  int n = 0;
  for (const auto& node : nodes)
    for (const auto& i : node.inputs) n += i == value;
  for (const auto& o : outputs) n += o.name == value;
  return n;
}

int Graph::producer(const std::string& value) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& o : nodes[i].outputs)
      if (o == value) return static_cast<int>(i);
  return -1;
}

void Graph::rename_value(const std::string& from, const std::string& to) {
  for (auto& node : nodes) {
    for (auto& i : node.inputs)
      if (i == from) i = to;
    for (auto& o : node.outputs)
      if (o == from) o = to;
  }
  for (auto& o : outputs)
    if (o.name == from) o.name = to;
}

// ---- serialisation ---------------------------------------------------------------------------------------
namespace {

ProtoWriter tensor_proto(const std::string& name, const Tensor& t) {
  ProtoWriter w;
  for (int d = 0; d < t.dim(); ++d) w.int_field(1, t.size(d));  // dims, unpacked (proto2 `repeated int64`)
  w.int_field(2, static_cast<int32_t>(onnx_type(t.dtype())));
  w.bytes_field(8, name);
  // raw_data: fixed-width little-endian values; ONNX stores bool as one byte per element, as ampforge does.
  w.bytes_field(9, std::string_view(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.nbytes())));
  return w;
}

ProtoWriter attribute_proto(const Attribute& a) {
  // AttributeType: FLOAT 1, INT 2, STRING 3, FLOATS 6, INTS 7. `type` (field 20) is required for IR >= 2.
  ProtoWriter w;
  w.bytes_field(1, a.name);
  if (auto* i = std::get_if<int64_t>(&a.value)) {
    w.int_field(3, *i);
    w.int_field(20, 2);
  } else if (auto* f = std::get_if<float>(&a.value)) {
    w.float_field(2, *f);
    w.int_field(20, 1);
  } else if (auto* s = std::get_if<std::string>(&a.value)) {
    w.bytes_field(4, *s);
    w.int_field(20, 3);
  } else if (auto* is = std::get_if<std::vector<int64_t>>(&a.value)) {
    for (int64_t x : *is) w.int_field(8, x);
    w.int_field(20, 7);
  } else if (auto* fs = std::get_if<std::vector<float>>(&a.value)) {
    for (float x : *fs) w.float_field(7, x);
    w.int_field(20, 6);
  }
  return w;
}

ProtoWriter node_proto(const Node& n) {
  ProtoWriter w;
  for (const auto& i : n.inputs) w.bytes_field(1, i);
  for (const auto& o : n.outputs) w.bytes_field(2, o);
  w.bytes_field(3, n.name);
  w.bytes_field(4, n.op_type);
  for (const auto& a : n.attributes) w.message_field(5, attribute_proto(a));
  return w;
}

ProtoWriter value_info_proto(const ValueInfo& v) {
  ProtoWriter shape;
  for (const Dim& d : v.dims) {
    ProtoWriter dim;
    if (!d.param.empty()) dim.bytes_field(2, d.param);
    else dim.int_field(1, d.value);
    shape.message_field(1, dim);
  }
  ProtoWriter tensor_type;
  tensor_type.int_field(1, static_cast<int32_t>(v.type));
  tensor_type.message_field(2, shape);
  ProtoWriter type;
  type.message_field(1, tensor_type);
  ProtoWriter w;
  w.bytes_field(1, v.name);
  w.message_field(2, type);
  return w;
}

}  // namespace

std::string serialize_model(const Graph& g) {
  ProtoWriter graph;
  for (const auto& n : g.nodes) graph.message_field(1, node_proto(n));
  graph.bytes_field(2, g.name);
  for (const auto& name : g.initializer_order) graph.message_field(5, tensor_proto(name, g.initializers.at(name)));
  for (const auto& v : g.inputs) graph.message_field(11, value_info_proto(v));
  for (const auto& v : g.outputs) graph.message_field(12, value_info_proto(v));

  ProtoWriter model;
  model.int_field(1, kIrVersion);
  model.bytes_field(2, "ampforge");
  model.bytes_field(3, AMPFORGE_VERSION_STRING);
  model.message_field(7, graph);
  ProtoWriter opset;
  opset.bytes_field(1, "");  // the default domain, ai.onnx
  opset.int_field(2, kOpsetVersion);
  model.message_field(8, opset);
  for (const auto& [k, v] : g.metadata) {
    ProtoWriter entry;
    entry.bytes_field(1, k);
    entry.bytes_field(2, v);
    model.message_field(14, entry);
  }
  return model.take();
}

// ---- passes ----------------------------------------------------------------------------------------------
namespace {

std::vector<double> as_doubles(const Tensor& t) { return t.to(DType::F64).contiguous().tolist<double>(); }

float float_attr(const Node& n, const char* name, float dflt) {
  const Attribute* a = n.attr(name);
  return a ? std::get<float>(a->value) : dflt;
}

std::string unique_name(const Graph& g, const std::string& base) {
  std::string n = base;
  for (int k = 1; g.has_initializer(n) || g.producer(n) >= 0; ++k) n = base + "_" + std::to_string(k);
  return n;
}

}  // namespace

int fold_batch_norm(Graph& g) {
  int folded = 0;
  for (size_t bi = 0; bi < g.nodes.size(); ++bi) {
    const Node& bn = g.nodes[bi];
    if (bn.op_type != "BatchNormalization" || bn.outputs.size() != 1) continue;
    const int ci = g.producer(bn.inputs[0]);
    if (ci < 0 || g.nodes[ci].op_type != "Conv" || g.use_count(bn.inputs[0]) != 1) continue;
    const Node& conv = g.nodes[ci];
    bool all_const = g.has_initializer(conv.inputs[1]) && (conv.inputs.size() < 3 || g.has_initializer(conv.inputs[2]));
    for (int k = 1; k <= 4; ++k) all_const = all_const && g.has_initializer(bn.inputs[k]);
    if (!all_const) continue;
    const Tensor W = g.initializers.at(conv.inputs[1]);  // (C_out, C_in / groups, kH, kW)
    const int64_t cout = W.size(0), per = W.numel() / cout;
    const std::vector<double> w = as_doubles(W), gamma = as_doubles(g.initializers.at(bn.inputs[1])),
                              beta = as_doubles(g.initializers.at(bn.inputs[2])),
                              mean = as_doubles(g.initializers.at(bn.inputs[3])),
                              var = as_doubles(g.initializers.at(bn.inputs[4]));
    std::vector<double> b(cout, 0.0);
    if (conv.inputs.size() >= 3 && !conv.inputs[2].empty()) b = as_doubles(g.initializers.at(conv.inputs[2]));
    const double eps = float_attr(bn, "epsilon", 1e-5f);
    std::vector<float> w2(w.size()), b2(cout);
    for (int64_t c = 0; c < cout; ++c) {
      const double s = gamma[c] / std::sqrt(var[c] + eps);
      for (int64_t i = 0; i < per; ++i) w2[c * per + i] = static_cast<float>(w[c * per + i] * s);
      b2[c] = static_cast<float>((b[c] - mean[c]) * s + beta[c]);
    }
    // The conv's weight keeps its name when only this conv reads it (the usual case); the bias is new
    // ("<conv>.bias") unless the conv had one of its own.
    const std::string old_w = conv.inputs[1];
    const std::string old_b = conv.inputs.size() >= 3 ? conv.inputs[2] : "";
    std::string wname = old_w, bname = old_b;
    const Tensor nw = Tensor::from_vector(w2, W.shape()).to(W.dtype()).contiguous();
    const Tensor nb = Tensor::from_vector(b2, Shape{cout}).to(W.dtype()).contiguous();
    if (g.use_count(old_w) == 1) g.initializers[old_w] = nw;
    else g.add_initializer(wname = unique_name(g, conv.name + ".weight"), nw);
    if (!old_b.empty() && g.use_count(old_b) == 1) g.initializers[old_b] = nb;
    else g.add_initializer(bname = unique_name(g, conv.name + ".bias"), nb);
    Node& c = g.nodes[ci];
    c.inputs.resize(3);
    c.inputs[1] = wname;
    c.inputs[2] = bname;
    const std::string out = g.nodes[bi].outputs[0];
    c.outputs[0] = out;
    g.nodes.erase(g.nodes.begin() + static_cast<long>(bi));
    --bi;
    ++folded;
  }
  remove_dead_code(g);
  return folded;
}

void remove_dead_code(Graph& g) {
  std::set<std::string> graph_outputs;
  for (const auto& o : g.outputs) graph_outputs.insert(o.name);
  // Identity bypass: readers of y = Identity(x) read x (unless y is a graph output).
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.op_type != "Identity" || graph_outputs.count(n.outputs[0])) continue;
    const std::string from = n.outputs[0], to = n.inputs[0];
    for (auto& m : g.nodes)
      for (auto& in : m.inputs)
        if (in == from) in = to;
  }
  bool changed = true;
  while (changed) {
    changed = false;
    std::set<std::string> used(graph_outputs);
    for (const auto& n : g.nodes)
      for (const auto& i : n.inputs) used.insert(i);
    for (size_t i = g.nodes.size(); i-- > 0;) {
      bool live = false;
      for (const auto& o : g.nodes[i].outputs) live = live || used.count(o);
      if (!live) {
        g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
        changed = true;
      }
    }
  }
  std::set<std::string> used(graph_outputs);
  for (const auto& n : g.nodes)
    for (const auto& i : n.inputs) used.insert(i);
  for (const auto& name : std::vector<std::string>(g.initializer_order))
    if (!used.count(name)) g.remove_initializer(name);
}

void convert_to_float16(Graph& g) {
  std::set<std::string> keep_f32;  // Resize's scales must be tensor(float)
  for (const auto& n : g.nodes)
    if (n.op_type == "Resize" && n.inputs.size() >= 3) keep_f32.insert(n.inputs[2]);
  for (auto& [name, t] : g.initializers)
    if (t.dtype() == DType::F32 && !keep_f32.count(name)) t = t.to(DType::F16).contiguous();
  for (auto* list : {&g.inputs, &g.outputs})
    for (auto& v : *list)
      if (v.type == OnnxType::Float) v.type = OnnxType::Float16;
  for (auto& n : g.nodes)
    if (n.op_type == "Cast")
      for (auto& a : n.attributes)
        if (a.name == "to" && std::get<int64_t>(a.value) == static_cast<int64_t>(OnnxType::Float))
          a.value = static_cast<int64_t>(OnnxType::Float16);
}

}  // namespace ampforge::onnx_export
