// Sample registry plumbing: input generation (Philox, per-case seeds), layouts, the manifest.
#include "registry.h"

#include <set>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/generator.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

namespace ampforge::parity {

namespace {

// FNV-1a: a stable hash of the case name (std::hash may differ between standard libraries).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<Case> build() {
  std::vector<Case> all;
  register_core_samples(all);
  register_nn_samples(all);
  std::set<std::string> names;
  for (const Case& c : all) {
    AF_ASSERT(names.insert(c.name).second, "parity: case name '{}' is registered twice", c.name);
    for (char ch : c.name)
      AF_ASSERT(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_', "parity: case name '{}' has '{}'", c.name, ch);
    AF_ASSERT(static_cast<bool>(c.fn), "parity: case '{}' has no function", c.name);
  }
  return all;
}

// Applies a layout to a (contiguous) tensor without changing its logical values.
Tensor apply_layout(const Tensor& t, const std::string& layout, const std::string& what) {
  if (layout == "contiguous") return t;
  if (layout == "channels_last") {
    AF_CHECK(t.dim() == 4, "parity: {}: channels_last needs a 4-D input, got {}", what, t.shape().str());
    return ops::contiguous(t, MemoryFormat::ChannelsLast);
  }
  if (layout == "transposed") {  // same values, last two dims swapped in memory
    AF_CHECK(t.dim() >= 2, "parity: {}: transposed needs >= 2 dims", what);
    std::vector<int64_t> p(static_cast<size_t>(t.dim()));
    for (int i = 0; i < t.dim(); ++i) p[i] = i;
    std::swap(p[t.dim() - 1], p[t.dim() - 2]);
    return ops::permute(ops::contiguous(ops::permute(t, p)), p);
  }
  if (layout == "strided") {  // every other element of a buffer twice as wide in the last dim
    AF_CHECK(t.dim() >= 1, "parity: {}: strided needs >= 1 dim", what);
    Shape wide = t.shape();
    wide[wide.size() - 1] *= 2;
    Tensor buf = ops::zeros(wide, t.dtype(), t.device());
    Tensor v = ops::slice(buf, t.dim() - 1, 0, wide.back(), 2);
    ops::copy_(v, t);
    return v;
  }
  AF_CHECK(false, "parity: {}: unknown layout '{}'", what, layout);
  return t;
}

}  // namespace

const std::vector<Case>& cases() {
  static const std::vector<Case> all = build();
  return all;
}

const Case* find_case(const std::string& name) {
  for (const Case& c : cases())
    if (c.name == name) return &c;
  return nullptr;
}

json case_manifest(const Case& c) {
  json j;
  j["name"] = c.name;
  j["op"] = c.op;
  j["attrs"] = c.attrs;
  j["gradcheck"] = c.gradcheck;
  json ins = json::array();
  for (const InputSpec& s : c.inputs) {
    json i;
    i["name"] = s.name;
    i["shape"] = s.shape.vec();
    i["dtype"] = std::string(dtype_name(s.dtype));
    i["gen"] = s.gen;
    i["lo"] = s.lo;
    i["hi"] = s.hi;
    i["layout"] = s.layout;
    i["requires_grad"] = s.requires_grad;
    i["cast16"] = s.cast16;
    i["ignore_every"] = s.ignore_every;
    i["ignore_value"] = s.ignore_value;
    ins.push_back(i);
  }
  j["inputs"] = ins;
  return j;
}

json manifest() {
  json m;
  m["format"] = 1;
  json cs = json::array();
  for (const Case& c : cases()) cs.push_back(case_manifest(c));
  m["cases"] = cs;
  return m;
}

std::vector<Tensor> generate_inputs(const Case& c) {
  std::vector<Tensor> vals;
  const uint64_t base = fnv1a(c.name);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    Generator gen(base + 0x9e3779b97f4a7c15ull * (i + 1));
    const std::string what = c.name + "." + s.name;
    if (s.gen == "randn") {
      vals.push_back(ops::randn(s.shape, DType::F32, kCPU, &gen));
    } else if (s.gen == "uniform") {
      vals.push_back(ops::rand(s.shape, DType::F32, kCPU, &gen, s.lo, s.hi));
    } else if (s.gen == "int") {
      std::vector<double> u = ops::rand(s.shape, DType::F64, kCPU, &gen).tolist<double>();
      std::vector<int64_t> v(u.size());
      for (size_t k = 0; k < u.size(); ++k) {
        v[k] = static_cast<int64_t>(s.lo) + static_cast<int64_t>(u[k] * (s.hi - s.lo));
        if (s.ignore_every > 0 && k % static_cast<size_t>(s.ignore_every) == 0) v[k] = s.ignore_value;
      }
      vals.push_back(Tensor::from_vector<int64_t>(v, s.shape));
    } else if (s.gen == "bernoulli") {
      std::vector<double> u = ops::rand(s.shape, DType::F64, kCPU, &gen).tolist<double>();
      std::vector<bool> v(u.size());
      const int64_t last = s.shape.empty() ? 1 : s.shape.back();
      for (size_t k = 0; k < u.size(); ++k) v[k] = u[k] < s.lo || static_cast<int64_t>(k) % last == 0;
      vals.push_back(Tensor::from_vector<bool>(v, s.shape));
    } else if (s.gen == "dropout_mask") {
      Generator dg(static_cast<uint64_t>(s.hi));
      Tensor y = dropout(ops::ones(s.shape), s.lo, true, &dg);
      vals.push_back(ops::compare(OpId::ne, y, ops::zeros(s.shape)));
    } else {
      AF_CHECK(false, "parity: {}: unknown generator '{}'", what, s.gen);
    }
  }
  return vals;
}

Tensor generate_grad_output(const Case& c, const Shape& out_shape) {
  Generator gen(fnv1a(c.name) ^ 0x67726164u);
  return ops::randn(out_shape, DType::F32, kCPU, &gen);
}

std::vector<Tensor> prepare_inputs(const Case& c, const std::vector<Tensor>& values, DType dtype, Device device) {
  AF_CHECK(values.size() == c.inputs.size(), "parity: {}: {} input values for {} specs", c.name, values.size(),
           c.inputs.size());
  std::vector<Tensor> out;
  for (size_t i = 0; i < values.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    Tensor v = values[i];
    AF_CHECK(v.shape() == s.shape, "parity: {}.{}: value shape {} differs from the spec's {}", c.name, s.name,
             v.shape().str(), s.shape.str());
    if (v.is_floating_point()) v = ops::to_dtype(v, (s.cast16 || dtype == DType::F64) ? dtype : DType::F32);
    v = ops::to_device(v, device);
    // A fresh buffer even when no cast happened, so a case that updates an input in place (batch_norm's
    // running statistics) never changes the caller's values.
    Tensor t = apply_layout(ops::clone(v, MemoryFormat::Contiguous), s.layout, c.name + "." + s.name);
    if (s.requires_grad) t.requires_grad_(true);
    out.push_back(t);
  }
  return out;
}

}  // namespace ampforge::parity
