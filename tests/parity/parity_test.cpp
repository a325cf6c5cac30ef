// The parity test (label `parity`). For every case of the sample registry (registry.h):
//   Gradcheck/<case>  finite-difference gradient check in F64 (autograd/gradcheck.h);
//   GoldenParity/<case>  outputs and input gradients vs PyTorch 1.13 (tests/parity/golden/golden.safetensors),
//                     in every dtype the golden holds for the case (F32 always; F16/BF16 where PyTorch's
//                     CPU kernels support the op), with the tolerance table of core/tolerance.h. Inputs
//                     and grad_output come from the golden file itself, so a change of the generator never
//                     silently invalidates the comparison.
//   Coverage.*        every differentiable op of the op list has a case named after it, and that case
//                     really dispatches the op (observed through the dispatch observer).
//   Golden.ManifestMatches  the golden was generated from the current sample list.
// No Python is needed: the golden file is a committed fixture (regenerate: scripts/gen_golden.sh).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "ampforge/autograd/gradcheck.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/ops/ops.h"
#include "registry.h"

using namespace ampforge;
using parity::json;

namespace {

const char* kRegenerate = "regenerate goldens with scripts/gen_golden.sh";

struct Golden {
  SafetensorsFile file;
  json manifest;   // the manifest the golden was generated from
  json generated;  // {case: {dtype: "ok" | "skipped: <reason>"}}
  std::string error;
};

const Golden& golden() {
  static const Golden g = [] {
    Golden g;
    const std::string path = std::string(AMPFORGE_PARITY_GOLDEN_DIR) + "/golden.safetensors";
    try {
      g.file = load_safetensors(path);
      g.manifest = json::parse(g.file.metadata.at("manifest"));
      g.generated = json::parse(g.file.metadata.at("generated"));
    } catch (const std::exception& e) {
      g.error = fmt::format("cannot use the golden file {}: {} ({})", path, e.what(), kRegenerate);
    }
    return g;
  }();
  return g;
}

const json* golden_case(const std::string& name) {
  for (const json& c : golden().manifest.at("cases"))
    if (c.at("name") == name) return &c;
  return nullptr;
}

std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (const auto& c : parity::cases()) n.push_back(c.name);
  return n;
}

std::string param_name(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

std::vector<double> values_f64(const Tensor& t) { return ops::to_dtype(t.detach(), DType::F64).tolist<double>(); }

// EXPECTs that `actual` matches `expected` with the table's tolerance for `dtype`; `what` names it.
void expect_close(const Tensor& actual, const Tensor& expected, DType dtype, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what << ": shape differs from PyTorch's";
  EXPECT_EQ(actual.dtype(), expected.dtype()) << what << ": dtype differs from PyTorch's";
  const ToleranceEntry tol = tolerance(dtype);
  const std::vector<double> a = values_f64(actual), e = values_f64(expected);
  const CloseResult r = tolerance_close(
      static_cast<int64_t>(a.size()), [&](int64_t i) { return a[i]; }, [&](int64_t i) { return e[i]; }, tol.rtol,
      tol.atol);
  if (std::getenv("AMPFORGE_PARITY_VERBOSE"))  // the numbers behind the tolerance table's factors
    std::printf("parity-ratio %s %s max_ratio %.4g max_abs_err %.3g scale %.3g\n", dtype_name(dtype).data(), what.c_str(),
                r.max_ratio, r.max_abs_err, r.scale);
  EXPECT_TRUE(r.ok) << what << ": " << r.mismatches << " of " << a.size() << " elements differ from PyTorch beyond "
                    << dtype_name(dtype) << " tolerance (rtol " << tol.rtol << ", atol " << tol.atol << " x scale "
                    << r.scale << "); worst element " << r.worst << ": ampforge " << r.actual_at_worst << ", torch "
                    << r.expected_at_worst << ", |diff| " << std::abs(r.actual_at_worst - r.expected_at_worst)
                    << " (" << r.max_ratio << "x the tolerance)";
}

class Gradcheck : public ::testing::TestWithParam<std::string> {};
class GoldenParity : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Gradcheck, F64) {
  const parity::Case& c = *parity::find_case(GetParam());
  if (!c.gradcheck) GTEST_SKIP() << "case declares no FD check";
  std::vector<Tensor> ins = parity::prepare_inputs(c, parity::generate_inputs(c), DType::F64);
  autograd::GradcheckReport r =
      autograd::gradcheck([&c](const std::vector<Tensor>& x) { return c.fn(x, c.attrs).at(0); }, ins);
  EXPECT_TRUE(r.ok) << c.name << " (" << c.op << "): " << r.message;
  if (std::getenv("AMPFORGE_PARITY_VERBOSE"))  // the numbers behind gradcheck_tolerance()
    for (const auto& i : r.inputs)
      std::printf("gradcheck %s input %d max_abs_err %.3g max_rel_err %.3g\n", c.name.c_str(), i.index, i.max_abs_err,
                  i.max_rel_err);
}

TEST_P(GoldenParity, MatchesPyTorch) {
  const Golden& g = golden();
  ASSERT_TRUE(g.error.empty()) << g.error;
  const parity::Case& c = *parity::find_case(GetParam());
  const json* gc = golden_case(c.name);
  ASSERT_NE(gc, nullptr) << "case " << c.name << " has no golden values: " << kRegenerate;
  ASSERT_EQ(json(*gc), parity::case_manifest(c)) << "case " << c.name << " changed since the goldens were generated: "
                                                  << kRegenerate;
  const json& gen = g.generated.at(c.name);
  ASSERT_EQ(gen.value("f32", std::string("missing")), "ok")
      << "the golden has no F32 values for " << c.name << ": " << gen.dump();
  std::vector<Tensor> values;
  for (size_t i = 0; i < c.inputs.size(); ++i) values.push_back(g.file.at(c.name + "/in/" + std::to_string(i)));
  const Tensor grad_out = g.file.at(c.name + "/grad_out");

  int dtypes_run = 0;
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const std::string dn(dtype_name(dt));
    if (gen.value(dn, std::string("missing")) != "ok") continue;  // PyTorch 1.13 has no CPU kernel: recorded, skipped
    ++dtypes_run;
    SCOPED_TRACE(c.name + " in " + dn);
    const std::string pre = c.name + "/" + dn + "/";
    std::vector<Tensor> ins = parity::prepare_inputs(c, values, dt);
    std::vector<Tensor> outs;
    try {
      outs = c.fn(ins, c.attrs);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << " (" << c.op << ") fails in " << dn << " where PyTorch computes it: " << e.what();
      continue;
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      const std::string key = pre + "out/" + std::to_string(k);
      ASSERT_TRUE(g.file.contains(key)) << "golden lacks " << key << ": " << kRegenerate;
      expect_close(outs[k], g.file.at(key), dt, c.name + " output " + std::to_string(k) + " (" + dn + ")");
    }
    std::vector<Tensor> leaves;
    std::vector<size_t> idx;
    for (size_t i = 0; i < ins.size(); ++i)
      if (c.inputs[i].requires_grad) leaves.push_back(ins[i]), idx.push_back(i);
    if (leaves.empty()) continue;
    std::vector<Tensor> grads;
    try {
      grads = autograd::grad({outs[0]}, leaves, {ops::to_dtype(grad_out, outs[0].dtype())});
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << " backward fails in " << dn << ": " << e.what();
      continue;
    }
    for (size_t j = 0; j < leaves.size(); ++j) {
      const std::string key = pre + "grad/" + std::to_string(idx[j]);
      ASSERT_TRUE(g.file.contains(key)) << "golden lacks " << key << ": " << kRegenerate;
      const Tensor& expected = g.file.at(key);
      Tensor got = grads[j].defined() ? grads[j] : ops::zeros(expected.shape(), expected.dtype());
      expect_close(got, expected, dt,
                   c.name + " gradient of input " + std::to_string(idx[j]) + " '" + c.inputs[idx[j]].name + "' (" + dn + ")");
    }
  }
  EXPECT_GE(dtypes_run, 1);
}

INSTANTIATE_TEST_SUITE_P(Parity, Gradcheck, ::testing::ValuesIn(case_names()), param_name);
INSTANTIATE_TEST_SUITE_P(Parity, GoldenParity, ::testing::ValuesIn(case_names()), param_name);

namespace {
DType g_perturb_dtype = DType::F32;  // EXPECT_NONFATAL_FAILURE's statement may only use globals
void compare_perturbed() {
  const DType dt = g_perturb_dtype;
  const ToleranceEntry tol = tolerance(dt);
  // One element moved by 3x the bound atol*scale + rtol*|e| (scale = 2): exactly representable in 16 bits.
  const float moved = static_cast<float>(2.0 + 3 * (tol.atol * 2 + tol.rtol * 2));
  Tensor e = ops::to_dtype(Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f}), dt);
  Tensor a = ops::to_dtype(Tensor::from_vector<float>({0.5f, -1.0f, moved, 0.25f}), dt);
  expect_close(a, e, dt, "perturbed");
}
}  // namespace

TEST(GoldenFile, ComparisonCatchesAPerturbedValue) {
  // The comparison is not vacuous: one element moved by 3x its tolerance fails, in every dtype.
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    g_perturb_dtype = dt;
    EXPECT_NONFATAL_FAILURE(compare_perturbed(), "1 of 4 elements differ");
    Tensor e = ops::to_dtype(Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f}), dt);
    expect_close(e, e, dt, "identical");
  }
}

TEST(GoldenFile, EveryCaseHasF32F16AndBF16Goldens) {
  // Where PyTorch 1.13 has no 16-bit CPU kernel the generator computes the reference in F64 from the rounded
  // inputs (README.md, "16-bit goldens"): no case may be left without a 16-bit comparison.
  const Golden& g = golden();
  ASSERT_TRUE(g.error.empty()) << g.error;
  for (const parity::Case& c : parity::cases()) {
    const json& gen = g.generated.at(c.name);
    for (const char* dn : {"f32", "f16", "bf16"})
      EXPECT_EQ(gen.value(dn, std::string("missing")), "ok") << c.name << " has no " << dn << " golden: " << gen.dump();
  }
}

TEST(GoldenFile, ManifestMatches) {
  const Golden& g = golden();
  ASSERT_TRUE(g.error.empty()) << g.error;
  const json current = parity::manifest();
  std::set<std::string> now, then;
  for (const json& c : current.at("cases")) now.insert(c.at("name").get<std::string>());
  for (const json& c : g.manifest.at("cases")) then.insert(c.at("name").get<std::string>());
  std::string diff;
  for (const auto& n : now)
    if (!then.count(n)) diff += " added:" + n;
  for (const auto& n : then)
    if (!now.count(n)) diff += " removed:" + n;
  for (const json& c : current.at("cases")) {
    const json* gc = golden_case(c.at("name").get<std::string>());
    if (gc && *gc != c) diff += " changed:" + c.at("name").get<std::string>();
  }
  EXPECT_TRUE(diff.empty() && current == g.manifest) << "the sample list differs from the golden's manifest (" << diff
                                                     << " ): " << kRegenerate;
}

TEST(GoldenFile, SmallAndComplete) {
  const Golden& g = golden();
  ASSERT_TRUE(g.error.empty()) << g.error;
  int64_t bytes = 0;
  for (const auto& [name, t] : g.file.tensors) bytes += t.nbytes();
  EXPECT_LT(bytes, 2 * 1024 * 1024) << "keep the committed fixture small (small shapes)";
  EXPECT_EQ(g.generated.size(), parity::cases().size());
  EXPECT_TRUE(g.file.metadata.count("torch_version"));
}

// ---- coverage ----------------------------------------------------------------------------------------
namespace {
std::mutex g_seen_mu;
std::set<int> g_seen;
void* on_begin(OpId op, const KernelArgs&) {
  std::lock_guard<std::mutex> lock(g_seen_mu);
  g_seen.insert(static_cast<int>(op));
  return nullptr;
}
void on_end(void*) {}
}  // namespace

TEST(Coverage, EveryDifferentiableOpHasASample) {
  std::string missing, not_dispatched;
  for (int i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    if (!op_differentiable(op)) continue;
    bool named = false, dispatched = false;
    for (const parity::Case& c : parity::cases()) {
      if (c.op != op_name(op)) continue;
      named = true;
      {
        std::lock_guard<std::mutex> lock(g_seen_mu);
        g_seen.clear();
      }
      const DispatchObserver obs{on_begin, on_end};
      set_dispatch_observer(&obs);
      try {
        c.fn(parity::prepare_inputs(c, parity::generate_inputs(c), DType::F32), c.attrs);
      } catch (...) {
        set_dispatch_observer(nullptr);
        throw;
      }
      set_dispatch_observer(nullptr);
      std::lock_guard<std::mutex> lock(g_seen_mu);
      if (g_seen.count(i)) dispatched = true;
    }
    if (!named) missing += std::string(" ") + op_name(op);
    else if (!dispatched) not_dispatched += std::string(" ") + op_name(op);
  }
  EXPECT_TRUE(missing.empty()) << "differentiable ops without a parity sample (add one in tests/parity/samples_*.cpp, "
                                  "then "
                               << kRegenerate << "):" << missing;
  EXPECT_TRUE(not_dispatched.empty()) << "samples named after these ops never dispatch them:" << not_dispatched;
}
