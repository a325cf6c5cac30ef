// Kernel-level tracing into an ONNX graph (see tracer.h for the model of values, views and constants).
// Emitters follow the ONNX operator specs of opset 17 (https://onnx.ai/onnx/operators/): Conv, Gemm, MatMul,
// BatchNormalization, LayerNormalization (opset 17), Resize (nearest / asymmetric / floor, as torch.onnx
// writes nearest upsampling, which TensorRT accepts), Softmax, Gather, Where, Reduce* (ReduceSum takes axes as
// an input since opset 13, the others as an attribute until opset 18).
#include "ampforge/export/tracer.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "ampforge/autograd/node.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::onnx_export {

namespace {

class Tracer;
Tracer* g_tracer = nullptr;
int g_suspend = 0;
// Kernels the tracer itself runs (copying an initializer, making a constant) are not part of the model.
struct Suspend {
  Suspend() { ++g_suspend; }
  ~Suspend() { --g_suspend; }
};

struct Ref {
  std::string name;
  int64_t bm = 0;  // dim 0 is bm x batch (0: independent of the batch; -1: depends on it elsewhere)
};

struct Base {
  Tensor t;  // the layout of the value in its storage
  Ref ref;
  std::string unavailable;  // non-empty: this output is not exported (why)
};

struct Fragment {
  Tensor dst;
  std::optional<Ref> src;  // nullopt: a constant (its values are read from dst when needed)
};

bool dense(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> d;  // (stride, size) of dims with size > 1
  for (int i = 0; i < t.dim(); ++i)
    if (t.size(i) > 1) d.emplace_back(t.stride(i), t.size(i));
  std::sort(d.begin(), d.end(), [](auto& a, auto& b) { return a.first > b.first; });
  int64_t expect = 1;
  for (size_t i = d.size(); i-- > 0;) {
    if (d[i].first != expect) return false;
    expect *= d[i].second;
  }
  return true;
}

bool covers_storage(const Tensor& t) {
  return t.offset() == 0 && dense(t) && static_cast<size_t>(t.nbytes()) == t.storage()->nbytes();
}

std::string shape_key(const Tensor& t) {
  return fmt::format("{}:{}:{}:{}:{}", static_cast<const void*>(t.storage().get()), t.offset(), t.shape().str(),
                     t.strides().str(), static_cast<int>(t.dtype()));
}

// A view of a row-major tensor of L elements, as a slice of a reshape: dims (strides w, sizes n) sorted by
// stride give the box (L / w1, w1 / w2, ..., w_k [when > 1]); the view starts at the mixed-radix digits of its
// offset r. nullopt when the strides do not divide (then no single reshape + slice expresses it).
struct BoxPlan {
  std::vector<int> order;  // indices into the given dims, by decreasing stride
  std::vector<int64_t> box, start, len;
};

std::optional<BoxPlan> plan_box(int64_t L, int64_t r, const std::vector<int64_t>& w_in, const std::vector<int64_t>& n_in) {
  BoxPlan p;
  const int k = static_cast<int>(w_in.size());
  for (int j = 0; j < k; ++j) p.order.push_back(j);
  std::stable_sort(p.order.begin(), p.order.end(), [&](int x, int y) { return w_in[x] > w_in[y]; });
  std::vector<int64_t> w, n;
  for (int j : p.order) w.push_back(w_in[j]), n.push_back(n_in[j]);
  for (int i = 0; i < k; ++i)
    if (w[i] <= 0 || (i + 1 < k && w[i] <= w[i + 1])) return std::nullopt;  // overlapping or negative
  if (k == 0) {
    p.box = {L};
    p.start = {r};
    p.len = {1};
  } else {
    if (L % w[0] != 0) return std::nullopt;
    p.box.push_back(L / w[0]);
    for (int i = 0; i + 1 < k; ++i) {
      if (w[i] % w[i + 1] != 0) return std::nullopt;
      p.box.push_back(w[i] / w[i + 1]);
    }
    if (w[k - 1] > 1) p.box.push_back(w[k - 1]);
    int64_t rem = r;
    for (int i = 0; i < k; ++i) {
      p.start.push_back(rem / w[i]);
      rem %= w[i];
      p.len.push_back(n[i]);
    }
    if (w[k - 1] > 1) p.start.push_back(rem), p.len.push_back(1);
  }
  for (size_t i = 0; i < p.box.size(); ++i)
    if (p.start[i] + p.len[i] > p.box[i]) return std::nullopt;
  return p;
}

class Tracer {
 public:
  Tracer(const nn::Module& model, const TraceOptions& opt) : opt_(opt) {
    for (auto& [n, t] : model.state_dict()) {
      params_[t.impl()] = n;
      keep_.push_back(t);
    }
  }

  Graph graph;

  void add_input(const TraceInput& in) {
    AF_CHECK(in.value.device().is_cpu(), "ONNX export: input '{}' must be on the CPU", in.name);
    Base b;
    b.t = in.value;
    b.ref = {in.name, opt_.dynamic_batch ? 1 : 0};
    bases_[in.value.storage().get()] = std::move(b);
    keep_.push_back(in.value);
    ValueInfo vi{in.name, onnx_type(in.value.dtype()), {}};
    for (int d = 0; d < in.value.dim(); ++d) {
      Dim dim{in.value.size(d), ""};
      if (d == 0 && opt_.dynamic_batch) dim.param = "batch";
      vi.dims.push_back(dim);
    }
    graph.inputs.push_back(vi);
  }

  void add_output(const Tensor& t, const std::string& name) {
    AF_CHECK(traced(t).has_value(), "ONNX export: output '{}' does not depend on any input (a constant)", name);
    Ref r = *traced(t);
    if (graph.producer(r.name) < 0 || std::any_of(graph.outputs.begin(), graph.outputs.end(),
                                                  [&](const ValueInfo& v) { return v.name == r.name; })) {
      r.name = emit("Identity", {r.name}, {});  // an input or an already named output
    }
    graph.rename_value(r.name, name);
    ValueInfo vi{name, onnx_type(t.dtype()), {}};
    for (int d = 0; d < t.dim(); ++d) {
      Dim dim{t.size(d), ""};
      if (d == 0 && opt_.dynamic_batch) {
        AF_CHECK(r.bm == 1, "ONNX export: --dynamic-batch: dim 0 of output '{}' (shape {}) does not follow the batch",
                 name, t.shape().str());
        dim.param = "batch";
      }
      vi.dims.push_back(dim);
    }
    graph.outputs.push_back(vi);
  }

  // ---- the observer -------------------------------------------------------------------------------------
  void on_kernel(OpId op, const KernelArgs& a) {
    std::vector<std::optional<Ref>> ins;
    bool any = false;
    if (op == OpId::copy) return on_copy(a);
    for (const Tensor& t : a.inputs) {
      ins.push_back(t.defined() ? traced(t) : std::nullopt);
      any = any || ins.back().has_value();
    }
    if (!any) {  // constant folding: the outputs are constants wherever they are read
      for (const Tensor& o : a.outputs)
        AF_CHECK(!o.defined() || !bases_.count(o.storage().get()),
                 "ONNX export: op '{}' overwrites a traced value with a constant (not supported)", op_name(op));
      return;
    }
    current_op_ = op;
    node_prefix_.clear();
    for (const Tensor& t : a.inputs)
      if (t.defined())
        if (auto it = params_.find(t.impl()); it != params_.end() && node_prefix_.empty()) {
          const auto& n = it->second;
          node_prefix_ = n.substr(0, n.rfind('.'));
        }
    Ref out = emit_op(op, a, ins);
    const Tensor& o0 = a.out(0);
    AF_CHECK(covers_storage(o0), "ONNX export: op '{}' writes part of a tensor in place (not supported)", op_name(op));
    set_base(o0, out);
    for (size_t i = 1; i < a.outputs.size(); ++i)
      if (a.out(i).defined() && !a.out(i).is_same(o0)) {
        Base aux;
        aux.t = a.out(i);
        aux.unavailable = fmt::format("output {} of op '{}' is not exported", i, op_name(op));
        bases_[a.out(i).storage().get()] = std::move(aux);
      }
  }

  // Traced value behind t (emitting view nodes as needed), or nullopt when t is a constant.
  std::optional<Ref> traced(const Tensor& t) {
    const StorageImpl* st = t.storage().get();
    if (!bases_.count(st) && frags_.count(st)) assemble_concat(st);
    auto it = bases_.find(st);
    if (it == bases_.end()) return std::nullopt;
    const Base& b = it->second;
    AF_CHECK(b.unavailable.empty(), "ONNX export: the forward reads a tensor the export cannot provide: {}",
             b.unavailable);
    if (b.t.shape() == t.shape() && b.t.strides() == t.strides() && b.t.offset() == t.offset() &&
        b.t.dtype() == t.dtype())
      return b.ref;
    AF_CHECK(b.t.dtype() == t.dtype(), "ONNX export: a tensor reinterprets a traced value's bytes as another dtype");
    const std::string key = b.ref.name + "|" + shape_key(t);
    if (auto v = views_.find(key); v != views_.end()) return v->second;
    Ref r = view(b, t);
    views_[key] = r;
    return r;
  }

  // A traced value or a constant initializer for t.
  Ref input(const Tensor& t) {
    if (auto r = traced(t)) return *r;
    return {constant(t), 0};
  }

 private:
  TraceOptions opt_;
  std::unordered_map<const TensorImpl*, std::string> params_;
  std::unordered_map<const StorageImpl*, Base> bases_;
  std::unordered_map<const StorageImpl*, std::vector<Fragment>> frags_;
  std::map<std::string, Ref> views_, reshapes_;
  std::map<std::string, std::string> consts_;
  std::vector<Tensor> keep_;  // keeps every storage seen alive, so no address is reused during the trace
  std::set<std::string> node_names_;
  int counter_ = 0;
  OpId current_op_ = OpId::fill;
  std::string node_prefix_;
  struct SliceRec {
    std::string input, output;
    int64_t axis, start, end, size;
  };
  std::vector<SliceRec> slices_;  // one-axis Slice nodes, for merge_splits()

 public:
  // Slices that cut one value along one axis into pieces covering it exactly (chunk, split) become one Split
  // node (opset 13+: the sizes as input 2), placed where the first of them was.
  void merge_splits() {
    std::map<std::pair<std::string, int64_t>, std::vector<SliceRec>> groups;
    for (const auto& r : slices_) groups[{r.input, r.axis}].push_back(r);
    for (auto& [key, rs] : groups) {
      if (rs.size() < 2) continue;
      std::sort(rs.begin(), rs.end(), [](auto& a, auto& b) { return a.start < b.start; });
      bool tiles = rs.front().start == 0 && rs.back().end == rs.front().size;
      for (size_t i = 1; i < rs.size(); ++i) tiles = tiles && rs[i].start == rs[i - 1].end;
      if (!tiles) continue;
      std::vector<int64_t> sizes;
      std::vector<std::string> outs;
      for (auto& r : rs) sizes.push_back(r.end - r.start), outs.push_back(r.output);
      size_t first = graph.nodes.size();
      for (auto& r : rs) first = std::min(first, static_cast<size_t>(graph.producer(r.output)));
      Node split{"Split", graph.nodes[first].name + "_split", {key.first, const_ints(sizes)}, outs,
                 {{"axis", key.second}}};
      std::set<std::string> gone(outs.begin(), outs.end());
      std::erase_if(graph.nodes, [&](const Node& n) { return n.op_type == "Slice" && gone.count(n.outputs[0]); });
      graph.nodes.insert(graph.nodes.begin() + static_cast<long>(std::min(first, graph.nodes.size())), split);
    }
  }

 private:

  void set_base(const Tensor& t, const Ref& r) {
    Base b;
    b.t = t;
    b.ref = r;
    bases_[t.storage().get()] = std::move(b);
    frags_.erase(t.storage().get());
    keep_.push_back(t);
  }

  std::string fresh(const char* stem) { return fmt::format("{}_{}", stem, counter_++); }

  // With a dynamic batch, a constant made in the forward with the traced batch in dim 0 (zeros token types, a
  // mask of ones) cannot follow the batch; when every slice along dim 0 is the same and the reader broadcasts
  // (elementwise ops), it is written with dim 0 = 1 instead.
  std::string constant_for_broadcast(const Tensor& t) {
    if (!opt_.dynamic_batch || t.dim() < 1 || t.size(0) != opt_.batch_size || params_.count(t.impl())) return constant(t);
    Suspend quiet;
    const Tensor c = t.contiguous();
    const size_t row = static_cast<size_t>(c.nbytes() / c.size(0));
    const char* p = static_cast<const char*>(c.data_ptr());
    for (int64_t i = 1; i < c.size(0); ++i)
      if (std::memcmp(p, p + i * row, row) != 0) return constant(t);
    return constant(c.narrow(0, 0, 1));
  }

  std::string constant(const Tensor& t) {
    const std::string key = shape_key(t);
    if (auto it = consts_.find(key); it != consts_.end()) return it->second;
    std::string name;
    if (auto it = params_.find(t.impl()); it != params_.end()) name = it->second;
    if (name.empty() || graph.has_initializer(name)) name = fresh("const");
    Suspend quiet;
    graph.add_initializer(name, t);
    consts_[key] = name;
    keep_.push_back(t);
    return name;
  }

  std::string const_ints(const std::vector<int64_t>& v) {
    const std::string key = "i64:" + fmt::format("{}", fmt::join(v, ","));
    if (auto it = consts_.find(key); it != consts_.end()) return it->second;
    const std::string name = fresh("shape");
    Suspend quiet;
    graph.add_initializer(name, Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}));
    consts_[key] = name;
    return name;
  }

  std::string const_scalar(double v, DType dt) {
    const std::string key = fmt::format("s:{}:{}", v, static_cast<int>(dt));
    if (auto it = consts_.find(key); it != consts_.end()) return it->second;
    const std::string name = fresh("scalar");
    Suspend quiet;
    graph.add_initializer(name, Tensor::from_vector(std::vector<double>{v}, Shape{}).to(dt));
    consts_[key] = name;
    return name;
  }

  std::string node_name(const std::string& op_type) {
    std::string base = node_prefix_.empty() ? op_type : node_prefix_;
    std::string n = base;
    for (int k = 1; node_names_.count(n); ++k) n = fmt::format("{}_{}", base, k);
    node_names_.insert(n);
    return n;
  }

  std::string emit(const std::string& op_type, std::vector<std::string> inputs, std::vector<Attribute> attrs,
                   int n_outputs = 1) {
    Node n{op_type, node_name(op_type), std::move(inputs), {}, std::move(attrs)};
    for (int i = 0; i < n_outputs; ++i) n.outputs.push_back(fresh("t"));
    std::string out = n.outputs[0];
    graph.nodes.push_back(std::move(n));
    return out;
  }

  // Reshape with dim 0 written as -1 when it scales with the batch (dynamic batch).
  Ref reshape(const Ref& x, const std::vector<int64_t>& shape) {
    std::vector<int64_t> s = shape;
    Ref r{"", 0};
    if (opt_.dynamic_batch && x.bm != 0) {
      AF_CHECK(x.bm > 0 && !s.empty() && s[0] % opt_.batch_size == 0,
               "ONNX export: --dynamic-batch: a reshape to {} does not keep the batch in dim 0 (op '{}')",
               fmt::join(shape, "x"), op_name(current_op_));
      r.bm = s[0] / opt_.batch_size;
      s[0] = -1;
    }
    // The same reshape of the same value is one node (chunk's pieces then share their input, so they merge
    // into one Split).
    const std::string key = x.name + "|" + fmt::format("{}", fmt::join(s, ","));
    if (auto it = reshapes_.find(key); it != reshapes_.end()) return it->second;
    r.name = emit("Reshape", {x.name, const_ints(s)}, {});
    reshapes_[key] = r;
    return r;
  }

  // ---- views: U = f(B) from strides (see tracer.h) ----------------------------------------------------
  Ref view(const Base& b, const Tensor& u) {
    const Tensor& B = b.t;
    AF_CHECK(dense(B), "ONNX export: internal: traced value is not dense");
    const int64_t r = u.offset() - B.offset();
    AF_CHECK(r >= 0 && u.numel() > 0, "ONNX export: a view reaches outside the traced value it reads (op '{}')",
             op_name(current_op_));
    // Current expression: name + logical shape, with one pending reshape (flushed before any other node).
    Ref cur = b.ref;
    std::vector<int64_t> cur_shape = B.shape().vec(), want = cur_shape;
    bool dyn = opt_.dynamic_batch && b.ref.bm > 0;
    auto flush = [&] {
      if (want != cur_shape) {
        const int64_t bm = cur.bm;
        cur = reshape(cur, want);
        if (!dyn) cur.bm = bm == 0 ? 0 : -1;
        cur_shape = want;
      }
    };
    // 1. B in memory order (a transpose when B is not row-major, e.g. channels-last).
    std::vector<int> bd;
    for (int i = 0; i < B.dim(); ++i)
      if (B.size(i) > 1) bd.push_back(i);
    std::vector<int> bsorted = bd;
    std::stable_sort(bsorted.begin(), bsorted.end(), [&](int x, int y) { return B.stride(x) > B.stride(y); });
    if (bsorted != bd) {
      std::vector<int64_t> keep1 = cur_shape;  // drop size-1 dims, then transpose
      std::vector<int64_t> s;
      for (int i : bd) s.push_back(B.size(i));
      want = s;
      flush();
      std::vector<int64_t> perm;
      for (int i : bsorted) perm.push_back(std::find(bd.begin(), bd.end(), i) - bd.begin());
      if (dyn && !bsorted.empty() && bsorted[0] != bd[0]) dyn = false, cur.bm = -1;
      cur.name = emit("Transpose", {cur.name}, {{"perm", perm}});
      cur_shape.clear();
      for (int i : bsorted) cur_shape.push_back(B.size(i));
      want = cur_shape;
    }
    const int64_t L = B.numel();
    // 2. U without broadcast (stride 0) and size-1 dims.
    std::vector<int> ud;
    for (int i = 0; i < u.dim(); ++i)
      if (u.size(i) > 1 && u.stride(i) != 0) ud.push_back(i);
    std::vector<int64_t> ustr, n_ud;  // U's strides (elements of the current row-major tensor) and sizes, ud order
    for (int i : ud) ustr.push_back(u.stride(i)), n_ud.push_back(u.size(i));
    auto fail = [&] {
      AF_THROW(InvalidArgument, "ONNX export: a view of shape {} with strides {} and offset {} of a value of shape {} "
               "cannot be expressed with Reshape/Slice/Transpose (op '{}')", u.shape().str(), u.strides().str(),
               u.offset(), B.shape().str(), op_name(current_op_));
    };
    std::optional<BoxPlan> plan = plan_box(L, r, ustr, n_ud);
    if (!plan) {
      // 3a. Not a slice of the flat buffer's box: first Slice the value in its own dims to the bounding box of
      // the view's corners (e.g. channels 0..15 of (N, 19, 8, 8) viewed as (N, 4, 4, 64)), then retry on that.
      std::vector<int64_t> S;
      for (int i : bsorted) S.push_back(B.size(i));
      if (S.empty()) fail();
      auto coords = [&](int64_t pos) {
        std::vector<int64_t> c(S.size());
        for (size_t i = S.size(); i-- > 0;) c[i] = pos % S[i], pos /= S[i];
        return c;
      };
      const size_t nd = ud.size();
      if (nd > 12) fail();
      std::vector<std::vector<int64_t>> corners;
      for (uint32_t mask = 0; mask < (1u << nd); ++mask) {
        int64_t pos = r;
        for (size_t j = 0; j < nd; ++j)
          if (mask & (1u << j)) pos += (n_ud[j] - 1) * ustr[j];
        corners.push_back(coords(pos));
      }
      std::vector<int64_t> lo = corners[0], hi = corners[0];
      for (auto& c : corners)
        for (size_t i = 0; i < S.size(); ++i) lo[i] = std::min(lo[i], c[i]), hi[i] = std::max(hi[i], c[i]);
      std::vector<int64_t> S2(S.size()), st2(S.size());
      for (size_t i = 0; i < S.size(); ++i) S2[i] = hi[i] - lo[i] + 1;
      int64_t L2 = 1;
      for (size_t i = S.size(); i-- > 0;) st2[i] = L2, L2 *= S2[i];
      auto pos2 = [&](int64_t pos) {
        const auto c = coords(pos);
        int64_t q = 0;
        for (size_t i = 0; i < S.size(); ++i) {
          if (c[i] < lo[i] || c[i] > hi[i]) return int64_t{-1};
          q += (c[i] - lo[i]) * st2[i];
        }
        return q;
      };
      const int64_t r2 = pos2(r);
      std::vector<int64_t> w2(nd);
      for (size_t j = 0; j < nd; ++j) w2[j] = pos2(r + ustr[j]) - r2;
      for (uint32_t mask = 0; mask < (1u << nd); ++mask) {  // linear in the sliced tensor at every corner
        int64_t pos = r, q = r2;
        for (size_t j = 0; j < nd; ++j)
          if (mask & (1u << j)) pos += (n_ud[j] - 1) * ustr[j], q += (n_ud[j] - 1) * w2[j];
        if (pos2(pos) != q) fail();
      }
      plan = plan_box(L2, r2, w2, n_ud);
      if (!plan) fail();
      want = S;
      std::vector<int64_t> axes, starts, ends;
      for (size_t i = 0; i < S.size(); ++i) {
        if (lo[i] == 0 && hi[i] == S[i] - 1) continue;
        AF_CHECK(!(dyn && i == 0), "ONNX export: --dynamic-batch: the graph slices along the batch (op '{}')",
                 op_name(current_op_));
        axes.push_back(static_cast<int64_t>(i)), starts.push_back(lo[i]), ends.push_back(hi[i] + 1);
      }
      flush();
      cur.name = emit("Slice", {cur.name, const_ints(starts), const_ints(ends), const_ints(axes)}, {});
      cur_shape = S2;
      want = S2;
    }
    // 3. The box: the (current) value as (L / w1, w1 / w2, ..., w_{k-1} / w_k, w_k); the view is a slice of it.
    const std::vector<int64_t>& box = plan->box;
    std::vector<int> usorted;
    for (int j : plan->order) usorted.push_back(ud[j]);
    std::vector<int64_t> n;
    for (int j : plan->order) n.push_back(n_ud[j]);
    want = box;  // pending: emitted only when a Slice follows
    std::vector<int64_t> axes, starts, ends;
    for (size_t i = 0; i < box.size(); ++i) {
      if (plan->start[i] == 0 && plan->len[i] == box[i]) continue;
      AF_CHECK(!(dyn && i == 0), "ONNX export: --dynamic-batch: the graph slices along the batch (op '{}')",
               op_name(current_op_));
      axes.push_back(static_cast<int64_t>(i));
      starts.push_back(plan->start[i]);
      ends.push_back(plan->start[i] + plan->len[i]);
    }
    if (!axes.empty()) {
      flush();
      const std::string from = cur.name;
      cur.name = emit("Slice", {cur.name, const_ints(starts), const_ints(ends), const_ints(axes)}, {});
      if (axes.size() == 1) slices_.push_back({from, cur.name, axes[0], starts[0], ends[0], box[axes[0]]});
      cur_shape = box;
      for (size_t i = 0; i < box.size(); ++i) cur_shape[i] = plan->len[i];
      want = cur_shape;
    }
    want = n;  // drop the unit remainder dim
    // 4. Back to U's dim order.
    std::vector<int64_t> perm;
    for (int i : ud) perm.push_back(std::find(usorted.begin(), usorted.end(), i) - usorted.begin());
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
    if (!identity) {
      flush();
      if (dyn && perm[0] != 0) dyn = false, cur.bm = -1;
      cur.name = emit("Transpose", {cur.name}, {{"perm", perm}});
      cur_shape.clear();
      for (int i : ud) cur_shape.push_back(u.size(i));
      want = cur_shape;
    }
    // 5. U's shape with 1 for broadcast dims, then Expand.
    std::vector<int64_t> ones, full = u.shape().vec();
    bool expand = false;
    for (int i = 0; i < u.dim(); ++i) {
      const bool bc = u.stride(i) == 0 && u.size(i) > 1;
      ones.push_back(bc ? 1 : u.size(i));
      expand = expand || bc;
    }
    if (dyn && !ud.empty() && (ud[0] != 0)) dyn = false, cur.bm = -1;
    want = ones;
    flush();
    if (expand) {
      std::vector<int64_t> es = full;
      if (dyn) es[0] = 1;  // Expand broadcasts: 1 keeps the input's (batch) size
      cur.name = emit("Expand", {cur.name, const_ints(es)}, {});
    }
    if (!opt_.dynamic_batch) cur.bm = 0;
    return cur;
  }

  // ---- cat / stack: copies into parts of one fresh buffer -------------------------------------------
  void on_copy(const KernelArgs& a) {
    const Tensor& src = a.in(0);
    const Tensor& dst = a.out(0);
    std::optional<Ref> s = traced(src);
    const StorageImpl* st = dst.storage().get();
    if (covers_storage(dst)) {
      if (!s) {
        AF_CHECK(!bases_.count(st), "ONNX export: a copy overwrites a traced value with a constant");
        frags_.erase(st);
        return;
      }
      current_op_ = OpId::copy;
      node_prefix_.clear();
      Ref r = *s;
      if (src.dtype() != dst.dtype()) r.name = emit("Cast", {r.name}, {{"to", int64_t(onnx_type(dst.dtype()))}});
      else r.name = emit("Identity", {r.name}, {});
      set_base(dst, r);
      return;
    }
    AF_CHECK(!bases_.count(st), "ONNX export: a copy writes into part of a traced value (in-place slice assignment "
             "is not supported)");
    std::optional<Ref> r = s;
    if (r && src.dtype() != dst.dtype()) {
      current_op_ = OpId::copy;
      node_prefix_.clear();
      r->name = emit("Cast", {r->name}, {{"to", int64_t(onnx_type(dst.dtype()))}});
    }
    frags_[st].push_back({dst, r});
    keep_.push_back(dst);
  }

  void assemble_concat(const StorageImpl* st) {
    std::vector<Fragment> fs = frags_.at(st);
    frags_.erase(st);
    if (std::none_of(fs.begin(), fs.end(), [](const Fragment& f) { return f.src.has_value(); }))
      return;  // every part is a constant: so is the buffer
    const Tensor& t0 = fs[0].dst;
    int64_t min_off = t0.offset();
    for (auto& f : fs) {
      AF_CHECK(f.dst.strides() == t0.strides() && f.dst.dim() == t0.dim(),
               "ONNX export: a buffer filled by copies is not a concatenation of equal layouts");
      min_off = std::min(min_off, f.dst.offset());
    }
    // The concatenation dim: where the shapes differ, else where the offsets differ.
    int d = -1;
    for (auto& f : fs)
      for (int i = 0; i < t0.dim(); ++i)
        if (f.dst.size(i) != t0.size(i)) {
          AF_CHECK(d < 0 || d == i, "ONNX export: copies into one buffer differ in more than one dim");
          d = i;
        }
    if (d < 0 && fs.size() > 1) {
      const int64_t diff = std::abs(fs[1].dst.offset() - fs[0].dst.offset());
      for (int i = 0; i < t0.dim(); ++i)
        if (t0.stride(i) != 0 && diff % t0.stride(i) == 0 && diff / t0.stride(i) == t0.size(i)) d = i;
    }
    if (d < 0) d = 0;
    std::sort(fs.begin(), fs.end(), [](auto& x, auto& y) { return x.dst.offset() < y.dst.offset(); });
    Shape full = t0.shape();
    full[d] = 0;
    int64_t pos = 0;
    for (auto& f : fs) {
      AF_CHECK(f.dst.offset() - min_off == pos * t0.stride(d),
               "ONNX export: copies into one buffer leave a gap or overlap (not a concatenation)");
      pos += f.dst.size(d);
      full[d] += f.dst.size(d);
    }
    Tensor whole = t0.as_strided_raw(full, t0.strides(), min_off);
    AF_CHECK(covers_storage(whole), "ONNX export: copies fill only part of a buffer (not a concatenation)");
    current_op_ = OpId::copy;
    node_prefix_.clear();
    Ref r{"", 0};
    if (fs.size() == 1) {
      r = *fs[0].src;
    } else {
      std::vector<std::string> names;
      int64_t bm = fs[0].src ? fs[0].src->bm : 0;
      for (auto& f : fs) {
        const Ref part = f.src ? *f.src : Ref{constant(f.dst), 0};  // a constant part: the values copied there
        names.push_back(part.name);
        if (part.bm != bm) bm = -1;
      }
      if (d == 0 && bm != 0) bm = -1;
      r.name = emit("Concat", names, {{"axis", int64_t(d)}});
      r.bm = bm;
    }
    set_base(whole, r);
  }

  // ---- one emitter per kernel ------------------------------------------------------------------------
  Ref first_bm(const std::vector<std::optional<Ref>>& ins, const KernelArgs& a, std::string name) {
    Ref r{std::move(name), 0};
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i] || ins[i]->bm == 0) continue;
      if (ins[i]->bm < 0) return {r.name, -1};
      if (a.in(i).dim() > 0 && a.out(0).dim() > 0 && a.in(i).size(0) == a.out(0).size(0)) return {r.name, ins[i]->bm};
      r.bm = -1;
    }
    return r;
  }

  Ref emit_op(OpId op, const KernelArgs& a, const std::vector<std::optional<Ref>>& ins) {
    auto in = [&](size_t i) { return ins[i] ? ins[i]->name : input(a.in(i)).name; };
    auto out = [&](std::string name) { return first_bm(ins, a, std::move(name)); };
    const DType dt = a.out(0).dtype();
    auto unary = [&](const char* type) { return out(emit(type, {in(0)}, {})); };
    // CPU kernels of binary ops read 16-bit operands of an F32 op as they are (ops/ result_type); ONNX wants
    // both operands in the computation's type, so the narrower one gets a Cast.
    auto bin_in = [&](size_t i) {
      std::string name = ins[i] ? ins[i]->name : constant_for_broadcast(a.in(i));
      if (a.inputs.size() != 2) return name;  // where: the condition is Bool, the values share a type
      const DType common = a.out(0).dtype() == DType::Bool ? promote_types(a.in(0).dtype(), a.in(1).dtype()) : dt;
      if (a.in(i).dtype() != common) name = emit("Cast", {name}, {{"to", int64_t(onnx_type(common))}});
      return name;
    };
    auto binary = [&](const char* type) { return out(emit(type, {bin_in(0), bin_in(1)}, {})); };
    switch (op) {
      case OpId::neg: return unary("Neg");
      case OpId::abs: return unary("Abs");
      case OpId::sign: return unary("Sign");
      case OpId::exp: return unary("Exp");
      case OpId::log: return unary("Log");
      case OpId::sqrt: return unary("Sqrt");
      case OpId::relu: return unary("Relu");
      case OpId::sigmoid: return unary("Sigmoid");
      case OpId::tanh: return unary("Tanh");
      case OpId::rsqrt: return out(emit("Reciprocal", {emit("Sqrt", {in(0)}, {})}, {}));
      case OpId::silu: {  // opset 17 has no SiLU: x * sigmoid(x)
        const std::string x = in(0);
        return out(emit("Mul", {x, emit("Sigmoid", {x}, {})}, {}));
      }
      case OpId::gelu: {
        const std::string x = in(0);
        if (a.attr<GeluAttrs>().approximate == GeluApprox::None) {  // 0.5 x (1 + erf(x / sqrt 2)); no Gelu before opset 20
          std::string e = emit("Erf", {emit("Mul", {x, const_scalar(M_SQRT1_2, dt)}, {})}, {});
          e = emit("Add", {e, const_scalar(1.0, dt)}, {});
          return out(emit("Mul", {emit("Mul", {x, e}, {}), const_scalar(0.5, dt)}, {}));
        }
        // tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        std::string x3 = emit("Mul", {emit("Mul", {x, x}, {}), x}, {});
        std::string inner = emit("Add", {x, emit("Mul", {x3, const_scalar(0.044715, dt)}, {})}, {});
        std::string t = emit("Tanh", {emit("Mul", {inner, const_scalar(std::sqrt(2.0 / M_PI), dt)}, {})}, {});
        t = emit("Add", {t, const_scalar(1.0, dt)}, {});
        return out(emit("Mul", {emit("Mul", {x, t}, {}), const_scalar(0.5, dt)}, {}));
      }
      case OpId::add_scalar: return out(emit("Add", {in(0), const_scalar(a.attr<ScalarAttrs>().scalar, dt)}, {}));
      case OpId::mul_scalar: return out(emit("Mul", {in(0), const_scalar(a.attr<ScalarAttrs>().scalar, dt)}, {}));
      case OpId::pow_scalar: return out(emit("Pow", {in(0), const_scalar(a.attr<ScalarAttrs>().scalar, dt)}, {}));
      case OpId::clamp: {
        const auto& c = a.attr<ClampAttrs>();
        return out(emit("Clip", {in(0), c.has_min ? const_scalar(c.min, dt) : "", c.has_max ? const_scalar(c.max, dt) : ""}, {}));
      }
      case OpId::add: return binary("Add");
      case OpId::sub: return binary("Sub");
      case OpId::mul: return binary("Mul");
      case OpId::div: return binary("Div");
      case OpId::pow: return binary("Pow");
      case OpId::maximum: return binary("Max");
      case OpId::minimum: return binary("Min");
      case OpId::eq: return binary("Equal");
      case OpId::ne: return out(emit("Not", {emit("Equal", {bin_in(0), bin_in(1)}, {})}, {}));
      case OpId::lt: return binary("Less");
      case OpId::le: return binary("LessOrEqual");
      case OpId::gt: return binary("Greater");
      case OpId::ge: return binary("GreaterOrEqual");
      case OpId::where: return out(emit("Where", {bin_in(0), bin_in(1), bin_in(2)}, {}));
      case OpId::sum:
      case OpId::mean:
      case OpId::amax:
      case OpId::amin:
      case OpId::var:
      case OpId::argmax:
      case OpId::argmin: return reduce(op, a, ins);
      case OpId::matmul: return out(emit("MatMul", {in(0), in(1)}, {}));
      case OpId::linear: {  // x (M, K) @ W^T + b
        std::vector<std::string> xs{in(0), in(1)};
        if (a.inputs.size() > 2 && a.in(2).defined()) xs.push_back(in(2));
        return out(emit("Gemm", xs, {{"transB", int64_t{1}}}));
      }
      case OpId::conv2d: {
        const auto& c = a.attr<Conv2dAttrs>();
        const Tensor& w = a.in(1);
        std::vector<std::string> xs{in(0), in(1)};
        if (a.inputs.size() > 2 && a.in(2).defined()) xs.push_back(in(2));
        AF_CHECK(!ins[1], "ONNX export: conv2d weights must be constants (TensorRT requires initializers)");
        return out(emit("Conv", xs,
                        {{"kernel_shape", std::vector<int64_t>{w.size(2), w.size(3)}},
                         {"strides", std::vector<int64_t>{c.stride[0], c.stride[1]}},
                         {"pads", std::vector<int64_t>{c.padding[0], c.padding[1], c.padding[0], c.padding[1]}},
                         {"dilations", std::vector<int64_t>{c.dilation[0], c.dilation[1]}},
                         {"group", c.groups}}));
      }
      case OpId::max_pool2d:
      case OpId::avg_pool2d: {
        const auto& p = a.attr<Pool2dAttrs>();
        std::vector<Attribute> at{{"kernel_shape", std::vector<int64_t>{p.kernel[0], p.kernel[1]}},
                                  {"strides", std::vector<int64_t>{p.stride[0], p.stride[1]}},
                                  {"pads", std::vector<int64_t>{p.padding[0], p.padding[1], p.padding[0], p.padding[1]}},
                                  {"ceil_mode", int64_t{p.ceil_mode}}};
        if (op == OpId::max_pool2d) {
          at.push_back({"dilations", std::vector<int64_t>{p.dilation[0], p.dilation[1]}});
          return out(emit("MaxPool", {in(0)}, at));
        }
        AF_CHECK(p.dilation[0] == 1 && p.dilation[1] == 1, "ONNX export: avg_pool2d with dilation needs opset 19");
        at.push_back({"count_include_pad", int64_t{p.count_include_pad}});
        return out(emit("AveragePool", {in(0)}, at));
      }
      case OpId::adaptive_avg_pool2d: {
        const auto& p = a.attr<Pool2dAttrs>();
        const int64_t H = a.in(0).size(2), W = a.in(0).size(3), oh = p.output_size[0], ow = p.output_size[1];
        if (oh == 1 && ow == 1) return out(emit("GlobalAveragePool", {in(0)}, {}));
        AF_CHECK(H % oh == 0 && W % ow == 0, "ONNX export: adaptive_avg_pool2d from {}x{} to {}x{} has uneven windows "
                 "(ONNX has no adaptive pooling; only output sizes that divide the input export)", H, W, oh, ow);
        return out(emit("AveragePool", {in(0)}, {{"kernel_shape", std::vector<int64_t>{H / oh, W / ow}},
                                                 {"strides", std::vector<int64_t>{H / oh, W / ow}}}));
      }
      case OpId::upsample_nearest2d: {
        const auto& u = a.attr<UpsampleAttrs>();
        const std::string scales = fresh("scales");
        Suspend quiet;
        graph.add_initializer(scales, Tensor::from_vector(std::vector<float>{1.f, 1.f, float(u.scale_h), float(u.scale_w)}, Shape{4}));
        return out(emit("Resize", {in(0), "", scales},
                        {{"mode", std::string("nearest")},
                         {"coordinate_transformation_mode", std::string("asymmetric")},
                         {"nearest_mode", std::string("floor")}}));
      }
      case OpId::batch_norm: {
        const auto& b = a.attr<BatchNormAttrs>();
        AF_CHECK(!b.training, "ONNX export: batch_norm runs with batch statistics: put the model in eval mode");
        const int64_t C = a.in(0).size(1);
        const std::string w = a.in(1).defined() ? in(1) : constant(ampforge::ones(Shape{C}, a.in(3).dtype()));
        const std::string bias = a.in(2).defined() ? in(2) : constant(ampforge::zeros(Shape{C}, a.in(3).dtype()));
        std::string y = emit("BatchNormalization", {in(0), w, bias, in(3), in(4)}, {{"epsilon", float(b.eps)}});
        if (a.in(5).defined()) y = emit("Add", {y, in(5)}, {});  // batch_norm_add_act: the residual's sum
        if (b.act == NormAct::ReLU) y = emit("Relu", {y}, {});  // batch_norm_act: the activation as its own node
        if (b.act == NormAct::SiLU) y = emit("Mul", {y, emit("Sigmoid", {y}, {})}, {});
        return out(y);
      }
      case OpId::layer_norm: {
        const auto& l = a.attr<LayerNormAttrs>();
        Shape ns;
        for (int i = a.in(0).dim() - l.normalized_dims; i < a.in(0).dim(); ++i) ns.push_back(a.in(0).size(i));
        const std::string w = a.in(1).defined() ? in(1) : constant(ampforge::ones(ns, a.in(0).dtype()));
        const std::string bias = a.in(2).defined() ? in(2) : constant(ampforge::zeros(ns, a.in(0).dtype()));
        return out(emit("LayerNormalization", {in(0), w, bias},
                        {{"axis", int64_t(-l.normalized_dims)}, {"epsilon", float(l.eps)}}));
      }
      case OpId::softmax: return out(emit("Softmax", {in(0)}, {{"axis", int64_t(a.attr<SoftmaxAttrs>().dim)}}));
      case OpId::log_softmax: return out(emit("LogSoftmax", {in(0)}, {{"axis", int64_t(a.attr<SoftmaxAttrs>().dim)}}));
      case OpId::embedding: return out(emit("Gather", {in(1), in(0)}, {{"axis", int64_t{0}}}));
      case OpId::attention: return attention(a, ins);
      case OpId::dropout:
        AF_THROW(InvalidArgument, "ONNX export: dropout ran in training mode: put the model in eval mode");
      default:
        AF_THROW(InvalidArgument, "ONNX export: op '{}' has no ONNX emitter (inference graphs only: no losses, "
                 "backward or optimizer ops)", op_name(op));
    }
  }

  Ref reduce(OpId op, const KernelArgs& a, const std::vector<std::optional<Ref>>& ins) {
    const auto& r = a.attr<ReduceAttrs>();
    std::vector<int64_t> axes(r.dims.begin(), r.dims.end());
    const std::string x = ins[0] ? ins[0]->name : input(a.in(0)).name;
    Ref o = first_bm(ins, a, "");
    for (int64_t ax : axes)
      if (ax == 0 && o.bm != 0) o.bm = -1;
    const std::vector<Attribute> keep{{"axes", axes}, {"keepdims", int64_t{1}}};
    switch (op) {
      case OpId::sum: o.name = emit("ReduceSum", {x, const_ints(axes)}, {{"keepdims", int64_t{1}}}); break;
      case OpId::mean: o.name = emit("ReduceMean", {x}, keep); break;
      case OpId::amax: o.name = emit("ReduceMax", {x}, keep); break;
      case OpId::amin: o.name = emit("ReduceMin", {x}, keep); break;
      case OpId::argmax:
      case OpId::argmin:
        AF_CHECK(axes.size() == 1, "ONNX export: {} over {} dims (ONNX's ArgMax takes one axis)", op_name(op), axes.size());
        o.name = emit(op == OpId::argmax ? "ArgMax" : "ArgMin", {x}, {{"axis", axes[0]}, {"keepdims", int64_t{1}}});
        break;
      default: {  // var: sum((x - mean)^2) / (n - correction)
        int64_t n = 1;
        for (int64_t ax : axes) n *= a.in(0).size(static_cast<int>(ax));
        const std::string m = emit("ReduceMean", {x}, keep);
        const std::string dv = emit("Sub", {x, m}, {});
        const std::string s = emit("ReduceSum", {emit("Mul", {dv, dv}, {}), const_ints(axes)}, {{"keepdims", int64_t{1}}});
        o.name = emit("Div", {s, const_scalar(double(n - r.correction), a.out(0).dtype())}, {});
      }
    }
    return o;
  }

  // Fused attention as MatMul / Softmax: softmax(scale q k^T, masked) v. q (N, Tq, D), k (N, Tk, D), v (N, Tk, Dv),
  // mask Bool (N1, N2, Tq, Tk) with N1 N2 = N, true = attend.
  Ref attention(const KernelArgs& a, const std::vector<std::optional<Ref>>& ins) {
    const auto& at = a.attr<AttentionAttrs>();
    auto in = [&](size_t i) { return ins[i] ? ins[i]->name : input(a.in(i)).name; };
    const DType dt = a.in(0).dtype();
    const int64_t N = a.in(0).size(0), Tq = a.in(0).size(1), Tk = a.in(1).size(1);
    Ref o = first_bm(ins, a, "");
    std::string s = emit("MatMul", {in(0), emit("Transpose", {in(1)}, {{"perm", std::vector<int64_t>{0, 2, 1}}})}, {});
    s = emit("Mul", {s, const_scalar(at.scale, dt)}, {});
    const std::string neg_inf = const_scalar(-std::numeric_limits<double>::infinity(), dt);
    if (a.inputs.size() > 3 && a.in(3).defined()) {
      Ref m = ins[3] ? *ins[3] : Ref{input(a.in(3)).name, 0};
      const int64_t n1 = a.in(3).size(0), n2 = a.in(3).size(1);
      // (N1, N2, Tq, Tk) -> (N, Tq, Tk): N1 follows the batch when the mask comes from an input.
      Ref m3 = reshape(m, {n1 * n2, Tq, Tk});
      (void)N;
      s = emit("Where", {m3.name, s, neg_inf}, {});
    }
    if (at.causal) {
      std::vector<uint8_t> tri(static_cast<size_t>(Tq * Tk));
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j) tri[i * Tk + j] = j <= i;
      Tensor t = Tensor::empty(Shape{Tq, Tk}, DType::Bool);
      std::copy(tri.begin(), tri.end(), static_cast<uint8_t*>(t.data_ptr()));
      s = emit("Where", {constant(t), s, neg_inf}, {});
    }
    s = emit("Softmax", {s}, {{"axis", int64_t{-1}}});
    o.name = emit("MatMul", {s, in(2)}, {});
    return o;
  }
};

void* trace_begin(OpId op, const KernelArgs& args) {
  if (g_suspend > 0) return nullptr;  // the tracer's own copies (initializers)
  g_tracer->on_kernel(op, args);
  return nullptr;
}
void trace_end(void*) {}

struct ObserverGuard {
  DispatchObserver obs{&trace_begin, &trace_end};
  explicit ObserverGuard(Tracer* t) {
    AF_CHECK(g_tracer == nullptr, "ONNX export: a trace is already running");
    g_tracer = t;
    set_dispatch_observer(&obs);
  }
  ~ObserverGuard() {
    set_dispatch_observer(nullptr);
    g_tracer = nullptr;
  }
};

}  // namespace

Graph trace_graph(const nn::Module& model, const std::vector<TraceInput>& inputs,
                  const std::function<std::vector<Tensor>()>& forward, const std::vector<std::string>& output_names,
                  const TraceOptions& options) {
  AF_CHECK(!model.is_training(), "ONNX export: the model is in training mode (call eval() first)");
  AF_CHECK(!options.dynamic_batch || options.batch_size >= 2,
           "ONNX export: trace a dynamic-batch graph with a batch of at least 2 (got {})", options.batch_size);
  Tracer tracer(model, options);
  for (const auto& in : inputs) {
    AF_CHECK(in.value.is_contiguous(), "ONNX export: input '{}' must be contiguous", in.name);
    AF_CHECK(in.value.dim() >= 1 && in.value.size(0) == options.batch_size,
             "ONNX export: input '{}' has shape {}, expected batch {} in dim 0", in.name, in.value.shape().str(),
             options.batch_size);
    tracer.add_input(in);
  }
  std::vector<Tensor> outs;
  {
    autograd::NoGradGuard no_grad;
    ObserverGuard guard(&tracer);
    outs = forward();
    AF_CHECK(outs.size() == output_names.size(), "ONNX export: the forward returned {} outputs, expected {} ({})",
             outs.size(), output_names.size(), fmt::join(output_names, ", "));
    for (size_t i = 0; i < outs.size(); ++i) tracer.add_output(outs[i], output_names[i]);
  }
  tracer.merge_splits();
  Graph g = std::move(tracer.graph);
  remove_dead_code(g);
  return g;
}

}  // namespace ampforge::onnx_export
