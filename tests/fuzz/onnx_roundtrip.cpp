// Fuzzes the ONNX writer (export/onnx_graph.cpp's serialize_model over export/protobuf.cpp) by round trip:
// a graph built from the fuzzer's bytes (any names, including empty ones, NULs and invalid UTF-8; negative,
// huge and NaN attribute values; initializers of every dtype; symbolic and fixed dims) is serialised, then
// parsed back by the independent protobuf reader below (written from the wire-format spec and onnx.proto's
// field numbers, ../shared/docs/specs/ONNX.md), and must come back field for field.
#include <cstring>
#include <map>
#include <optional>
#include <variant>

#include "ampforge/export/onnx_graph.h"
#include "ampforge/ops/ops.h"
#include "fuzz_util.h"

using namespace ampforge;
using namespace ampforge::onnx_export;

namespace {

// ---- a protobuf wire-format reader ------------------------------------------------------------------
struct Field {
  int number = 0;
  int wire = 0;
  uint64_t value = 0;     // VARINT, I64, I32
  std::string bytes;      // LEN
};

uint64_t read_varint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    FUZZ_CHECK(pos < s.size(), "truncated varint");
    const uint8_t b = static_cast<uint8_t>(s[pos++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  FUZZ_CHECK(false, "varint longer than 10 bytes");
  return 0;
}

std::vector<Field> parse_message(const std::string& s) {
  std::vector<Field> out;
  for (size_t pos = 0; pos < s.size();) {
    const uint64_t key = read_varint(s, pos);
    Field f;
    f.number = static_cast<int>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    FUZZ_CHECK(f.number > 0, "field number 0");
    if (f.wire == 0) {
      f.value = read_varint(s, pos);
    } else if (f.wire == 2) {
      const uint64_t n = read_varint(s, pos);
      FUZZ_CHECK(n <= s.size() - pos, "length %llu beyond the message", static_cast<unsigned long long>(n));
      f.bytes = s.substr(pos, n);
      pos += n;
    } else if (f.wire == 5 || f.wire == 1) {
      const size_t w = f.wire == 5 ? 4 : 8;
      FUZZ_CHECK(w <= s.size() - pos, "truncated fixed-width field");
      std::memcpy(&f.value, s.data() + pos, w);
      pos += w;
    } else {
      FUZZ_CHECK(false, "wire type %d", f.wire);
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<const Field*> all(const std::vector<Field>& m, int number) {
  std::vector<const Field*> r;
  for (const Field& f : m)
    if (f.number == number) r.push_back(&f);
  return r;
}
const Field& one(const std::vector<Field>& m, int number) {
  const auto r = all(m, number);
  FUZZ_CHECK(r.size() == 1, "field %d appears %zu times", number, r.size());
  return *r[0];
}
uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ---- a graph from the input ----------------------------------------------------------------------------
const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool};

Graph make_graph(fuzz::Reader& r) {
  Graph g;
  g.name = r.str(12);
  for (int n = r.byte() % 5; n > 0; --n) {
    Node node;
    node.op_type = r.str(10);
    node.name = r.str(10);
    for (int k = r.byte() % 4; k > 0; --k) node.inputs.push_back(r.str(6));
    for (int k = r.byte() % 3; k > 0; --k) node.outputs.push_back(r.str(6));
    for (int k = r.byte() % 4; k > 0; --k) {
      Attribute a;
      a.name = r.str(8);
      switch (r.byte() % 5) {
        case 0: a.value = static_cast<int64_t>(r.u64()); break;
        case 1: {
          const uint32_t b = static_cast<uint32_t>(r.u64(4));
          float f;
          std::memcpy(&f, &b, 4);
          a.value = f;
          break;
        }
        case 2: a.value = r.str(12); break;
        case 3: {
          std::vector<int64_t> v;
          for (int i = r.byte() % 5; i > 0; --i) v.push_back(static_cast<int64_t>(r.u64(r.byte() % 9)));
          a.value = v;
          break;
        }
        default: {
          std::vector<float> v;
          for (int i = r.byte() % 5; i > 0; --i) {
            const uint32_t b = static_cast<uint32_t>(r.u64(4));
            float f;
            std::memcpy(&f, &b, 4);
            v.push_back(f);
          }
          a.value = v;
        }
      }
      node.attributes.push_back(std::move(a));
    }
    g.nodes.push_back(std::move(node));
  }
  for (int n = r.byte() % 3; n > 0; --n) {
    const DType dt = kDtypes[r.byte() % 8];
    Shape shape;
    for (int d = r.byte() % 3; d > 0; --d) shape.push_back(r.byte() % 4);
    Tensor bytes = Tensor::empty(shape, dt);
    auto* p = static_cast<uint8_t*>(bytes.data_ptr());
    for (int64_t i = 0; i < bytes.nbytes(); ++i) p[i] = dt == DType::Bool ? r.byte() & 1 : r.byte();
    g.add_initializer(r.str(8) + "#" + std::to_string(n), bytes);
  }
  for (auto* list : {&g.inputs, &g.outputs})
    for (int n = r.byte() % 3; n > 0; --n) {
      ValueInfo v;
      v.name = r.str(8);
      v.type = onnx_type(kDtypes[r.byte() % 8]);
      for (int d = r.byte() % 4; d > 0; --d) {
        Dim dim;
        if (r.byte() & 1) dim.param = r.str(6);
        if (dim.param.empty()) dim.value = static_cast<int64_t>(r.u64(r.byte() % 9));
        v.dims.push_back(dim);
      }
      list->push_back(v);
    }
  for (int n = r.byte() % 3; n > 0; --n) g.metadata[r.str(6)] = r.str(10);
  return g;
}

// ---- the comparison ----------------------------------------------------------------------------------
void check_value_info(const std::string& bytes, const ValueInfo& v) {
  const auto m = parse_message(bytes);
  FUZZ_CHECK(one(m, 1).bytes == v.name);
  const auto type = parse_message(one(m, 2).bytes);
  const auto tensor_type = parse_message(one(type, 1).bytes);
  FUZZ_CHECK(static_cast<int32_t>(one(tensor_type, 1).value) == static_cast<int32_t>(v.type));
  const auto shape = parse_message(one(tensor_type, 2).bytes);
  const auto dims = all(shape, 1);
  FUZZ_CHECK(dims.size() == v.dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const auto d = parse_message(dims[i]->bytes);
    if (!v.dims[i].param.empty()) FUZZ_CHECK(one(d, 2).bytes == v.dims[i].param);
    else FUZZ_CHECK(static_cast<int64_t>(one(d, 1).value) == v.dims[i].value, "dim %zu", i);
  }
}

void check(const std::string& model_bytes, const Graph& g) {
  const auto model = parse_message(model_bytes);
  FUZZ_CHECK(static_cast<int64_t>(one(model, 1).value) == kIrVersion);
  const auto opset = parse_message(one(model, 8).bytes);
  FUZZ_CHECK(one(opset, 1).bytes.empty() && static_cast<int64_t>(one(opset, 2).value) == kOpsetVersion);
  const auto meta = all(model, 14);
  FUZZ_CHECK(meta.size() == g.metadata.size());
  size_t k = 0;
  for (const auto& [key, value] : g.metadata) {
    const auto e = parse_message(meta[k++]->bytes);
    FUZZ_CHECK(one(e, 1).bytes == key && one(e, 2).bytes == value);
  }
  const auto graph = parse_message(one(model, 7).bytes);
  FUZZ_CHECK(one(graph, 2).bytes == g.name);
  const auto nodes = all(graph, 1);
  FUZZ_CHECK(nodes.size() == g.nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const auto m = parse_message(nodes[i]->bytes);
    const auto ins = all(m, 1), outs = all(m, 2), attrs = all(m, 5);
    FUZZ_CHECK(ins.size() == n.inputs.size() && outs.size() == n.outputs.size());
    for (size_t j = 0; j < ins.size(); ++j) FUZZ_CHECK(ins[j]->bytes == n.inputs[j]);
    for (size_t j = 0; j < outs.size(); ++j) FUZZ_CHECK(outs[j]->bytes == n.outputs[j]);
    FUZZ_CHECK(one(m, 3).bytes == n.name && one(m, 4).bytes == n.op_type);
    FUZZ_CHECK(attrs.size() == n.attributes.size());
    for (size_t j = 0; j < attrs.size(); ++j) {
      const Attribute& a = n.attributes[j];
      const auto am = parse_message(attrs[j]->bytes);
      FUZZ_CHECK(one(am, 1).bytes == a.name);
      const uint64_t type = one(am, 20).value;
      if (const auto* v = std::get_if<int64_t>(&a.value)) {
        FUZZ_CHECK(type == 2 && static_cast<int64_t>(one(am, 3).value) == *v);
      } else if (const auto* f = std::get_if<float>(&a.value)) {
        FUZZ_CHECK(type == 1 && one(am, 2).wire == 5 && static_cast<uint32_t>(one(am, 2).value) == bits(*f));
      } else if (const auto* s = std::get_if<std::string>(&a.value)) {
        FUZZ_CHECK(type == 3 && one(am, 4).bytes == *s);
      } else if (const auto* is = std::get_if<std::vector<int64_t>>(&a.value)) {
        const auto got = all(am, 8);
        FUZZ_CHECK(type == 7 && got.size() == is->size());
        for (size_t q = 0; q < got.size(); ++q) FUZZ_CHECK(static_cast<int64_t>(got[q]->value) == (*is)[q]);
      } else if (const auto* fs = std::get_if<std::vector<float>>(&a.value)) {
        const auto got = all(am, 7);
        FUZZ_CHECK(type == 6 && got.size() == fs->size());
        for (size_t q = 0; q < got.size(); ++q) FUZZ_CHECK(static_cast<uint32_t>(got[q]->value) == bits((*fs)[q]));
      }
    }
  }
  const auto inits = all(graph, 5);
  FUZZ_CHECK(inits.size() == g.initializer_order.size());
  for (size_t i = 0; i < inits.size(); ++i) {
    const Tensor& t = g.initializers.at(g.initializer_order[i]);
    const auto m = parse_message(inits[i]->bytes);
    const auto dims = all(m, 1);
    FUZZ_CHECK(dims.size() == static_cast<size_t>(t.dim()));
    for (size_t d = 0; d < dims.size(); ++d) FUZZ_CHECK(static_cast<int64_t>(dims[d]->value) == t.size(d));
    FUZZ_CHECK(static_cast<int32_t>(one(m, 2).value) == static_cast<int32_t>(onnx_type(t.dtype())));
    FUZZ_CHECK(one(m, 8).bytes == g.initializer_order[i]);
    const std::string& raw = one(m, 9).bytes;
    FUZZ_CHECK(raw.size() == static_cast<size_t>(t.nbytes()) &&
               (raw.empty() || std::memcmp(raw.data(), t.data_ptr(), raw.size()) == 0));
  }
  const auto ins = all(graph, 11), outs = all(graph, 12);
  FUZZ_CHECK(ins.size() == g.inputs.size() && outs.size() == g.outputs.size());
  for (size_t i = 0; i < ins.size(); ++i) check_value_info(ins[i]->bytes, g.inputs[i]);
  for (size_t i = 0; i < outs.size(); ++i) check_value_info(outs[i]->bytes, g.outputs[i]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Reader r(data, size);
  const Graph g = make_graph(r);
  check(serialize_model(g), g);
  return 0;
}
