#include "ampforge/memory/fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "ampforge/memory/stats.h"
#include "ampforge/util/error.h"

namespace ampforge::memory {

FitBreakdown fit_breakdown(const FitMeasure& m) {
  FitBreakdown b;
  std::array<int64_t*, 5> parts{&b.parameters, &b.gradients, &b.optimizer_state, &b.inputs, &b.activations};
  b.parameters = std::max<int64_t>(0, m.parameters);
  b.gradients = std::max<int64_t>(0, m.gradients);
  b.optimizer_state = std::max<int64_t>(0, m.optimizer_state);
  b.inputs = std::max<int64_t>(0, m.inputs);
  b.activations = std::max<int64_t>(0, m.activations);
  const int64_t live = std::max<int64_t>(0, m.peak_live);
  int64_t named = 0;
  for (int64_t* p : parts) named += *p;
  // The named parts were live together at the peak or below it, so they cannot exceed peak live; if a
  // caller's figures disagree, trim the most derived figures first so that the parts still add up.
  for (auto it = parts.rbegin(); it != parts.rend() && named > live; ++it) {
    const int64_t cut = std::min(**it, named - live);
    **it -= cut;
    named -= cut;
  }
  b.workspace = live - named;
  b.fragmentation = std::max<int64_t>(0, m.peak_reserved - live);
  b.total = live + b.fragmentation;
  return b;
}

const FitProbe* FitResult::best_probe() const {  // the full probe when there is one (the confirmation)
  const FitProbe* quick = nullptr;
  for (auto it = probes.rbegin(); it != probes.rend(); ++it)
    if (it->fits && it->batch == best) {
      if (it->full) return &*it;
      if (quick == nullptr) quick = &*it;
    }
  return quick;
}

const FitProbe* FitResult::failing_probe() const {
  for (auto it = probes.rbegin(); it != probes.rend(); ++it)
    if (!it->fits && it->batch == first_failing) return &*it;
  return nullptr;
}

namespace {

struct Prediction {
  int64_t batch = 0;   // where the budget is predicted to run out (the last batch that fits)
  int64_t window = 0;  // how far off that may be, in batches
};

double per_example(const FitProbe& big, const FitProbe& small) {
  return static_cast<double>(big.peak_live - small.peak_live) / static_cast<double>(big.batch - small.batch);
}

// From the two fitting probes with the largest batches: live memory per example (the same tensors,
// larger) and the headroom left under the budget at the larger one.
std::optional<Prediction> predict(const std::vector<FitProbe>& probes, int64_t budget, int64_t granule) {
  if (budget <= 0) return std::nullopt;
  const FitProbe* a = nullptr;  // the largest fitting batch
  const FitProbe* b = nullptr;  // the second largest
  for (const FitProbe& p : probes) {
    if (!p.fits) continue;
    if (a == nullptr || p.batch > a->batch) {
      b = a;
      a = &p;
    } else if (p.batch < a->batch && (b == nullptr || p.batch > b->batch)) {
      b = &p;
    }
  }
  if (a == nullptr || b == nullptr) return std::nullopt;
  const double slope = per_example(*a, *b);
  if (!(slope > 0)) return std::nullopt;
  const double headroom = static_cast<double>(std::max<int64_t>(0, budget - a->peak_reserved));
  const double ahead = std::floor(headroom / slope);
  if (ahead > 1e15) return std::nullopt;
  Prediction p;
  p.batch = a->batch + static_cast<int64_t>(ahead);
  // Reserved memory moves in whole granules, so the headroom is known to about one granule either way.
  p.window = static_cast<int64_t>(std::ceil(static_cast<double>(granule) / slope)) + 1;
  return p;
}

}  // namespace

namespace {

// The search of fit.h over [1, max_batch] with probes of one kind; appends to r.probes and sets
// r.best, r.first_failing and r.limited.
void search(const FitProbeFn& probe, const FitSearchOptions& o, int64_t max_batch, bool full,
            const FitProgressFn& progress, FitResult& r) {
  int64_t lo = 0;       // the largest batch known to fit (0: none)
  int64_t hi = 0;       // the smallest batch known to fail (0: none yet)
  int64_t planned = 0;  // the window check that follows a predicted probe
  int predictions = 0;  // at most kMaxPredictions, so that a misleading curve costs few probes
  constexpr int kMaxPredictions = 4;
  std::vector<FitProbe> same_kind;  // this search's probes, for predictions
  r.limited = false;
  for (;;) {
    if (hi == 0 && lo >= max_batch) {
      r.limited = true;
      break;
    }
    if (hi != 0 && hi <= lo + 1) break;  // done (or batch 1 failed: lo = 0, hi = 1)
    const int64_t top = hi != 0 ? hi - 1 : max_batch;  // the largest batch still worth probing
    int64_t c = 0, window = 0;
    const char* phase = nullptr;
    if (planned > lo && planned <= top) {
      c = planned;
      phase = "check";
    } else if (o.interpolate && hi != 0 && predictions < kMaxPredictions) {
      // Predict while the bracket is wide compared with the prediction's error (inside that, bisection
      // needs few probes), and while the prediction is not already disproven: at or above `top` it points
      // at batches known to fail, and the same fits would predict the same again.
      if (auto pr = predict(same_kind, o.budget, o.granule); pr && hi - lo > 2 * pr->window && pr->batch < top) {
        c = std::max(pr->batch, lo + 1);
        window = pr->window;
        ++predictions;
        phase = "predict";
      }
    }
    planned = 0;
    if (c == 0) {
      c = hi == 0 ? (lo == 0 ? 1 : std::min(2 * lo, max_batch)) : lo + (hi - lo) / 2;
      phase = hi == 0 ? "grow" : "bisect";
    }
    FitProbe p = probe(c, full);
    p.batch = c;
    p.full = full;
    const bool fits = p.fits;
    same_kind.push_back(p);
    r.probes.push_back(std::move(p));
    if (progress) progress(r.probes.back(), phase);
    (fits ? lo : hi) = c;
    if (window > 0) planned = fits ? c + window : c - window;
  }
  r.best = lo;
  r.first_failing = hi;
}

}  // namespace

FitResult fit_search(const FitProbeFn& probe, const FitSearchOptions& o, const FitProgressFn& progress) {
  // 2^40 examples is far beyond any memory; the cap keeps the doubling free of overflow.
  AF_CHECK(o.max_batch >= 1 && o.max_batch <= (int64_t{1} << 40), "--max-batch must be in [1, 2^40], got {}",
           o.max_batch);
  AF_CHECK(o.budget >= 0, "the budget must be >= 0 bytes, got {}", o.budget);
  FitResult r;
  search(probe, o, o.max_batch, !o.quick, progress, r);
  if (!o.quick || r.best == 0) return r;  // a quick failure at batch 1 is a full failure too
  FitProbe p = probe(r.best, true);
  p.batch = r.best;
  p.full = true;
  const bool fits = p.fits;
  r.probes.push_back(std::move(p));
  if (progress) progress(r.probes.back(), "confirm");
  if (fits) return r;
  // The later steps need more than the first (typically a little: the cache they start from is laid out
  // differently). Search down from the failure with full probes: hi - 1, hi - 2, hi - 4, ... until one
  // fits, then bisect.
  auto full_probe = [&](int64_t c, const char* phase) {
    FitProbe q = probe(c, true);
    q.batch = c;
    q.full = true;
    const bool ok = q.fits;
    r.probes.push_back(std::move(q));
    if (progress) progress(r.probes.back(), phase);
    return ok;
  };
  int64_t lo = 0, hi = r.best;
  for (int64_t step = 1; hi > 1; step *= 2) {
    const int64_t c = std::max<int64_t>(1, hi - step);
    if (full_probe(c, "down")) {
      lo = c;
      break;
    }
    hi = c;
  }
  while (lo > 0 && hi > lo + 1) {
    const int64_t c = lo + (hi - lo) / 2;
    (full_probe(c, "bisect") ? lo : hi) = c;
  }
  r.best = lo;
  r.first_failing = hi;
  r.limited = false;
  return r;
}

nlohmann::json fit_result_to_json(const FitResult& r, int64_t budget) {
  nlohmann::json j;
  j["budget"] = budget;
  j["batch"] = r.best;
  j["fits"] = r.best > 0;
  j["limited_by_max_batch"] = r.limited;
  j["first_failing_batch"] = r.first_failing > 0 ? nlohmann::json(r.first_failing) : nlohmann::json();
  j["probes"] = nlohmann::json::array();
  for (const FitProbe& p : r.probes)
    j["probes"].push_back({{"batch", p.batch},
                           {"fits", p.fits},
                           {"full", p.full},
                           {"peak_reserved", p.peak_reserved},
                           {"peak_live", p.peak_live},
                           {"seconds", p.seconds}});
  if (const FitProbe* p = r.best_probe()) {
    const FitBreakdown b = fit_breakdown(p->measure);
    j["breakdown"] = {{"parameters", b.parameters},
                      {"gradients", b.gradients},
                      {"optimizer_state", b.optimizer_state},
                      {"inputs", b.inputs},
                      {"activations", b.activations},
                      {"workspace", b.workspace},
                      {"fragmentation", b.fragmentation}};
    j["total"] = b.total;
    j["peak_live"] = p->measure.peak_live;
    j["peak_reserved"] = p->measure.peak_reserved;
    j["fraction_of_budget"] = budget > 0 ? static_cast<double>(b.total) / static_cast<double>(budget) : 0.0;
  } else {
    j["breakdown"] = nullptr;
  }
  if (r.best == 0) {
    const FitProbe* f = r.failing_probe();
    j["oom_report"] = f != nullptr ? f->oom_report : std::string();
  }
  return j;
}

std::string fit_breakdown_format(const FitBreakdown& b, int64_t budget) {
  const auto pct = [&](int64_t n) {
    return budget > 0 ? fmt::format("{:5.1f}%", 100.0 * static_cast<double>(n) / static_cast<double>(budget))
                      : std::string("     -");
  };
  const std::pair<const char*, int64_t> rows[] = {
      {"parameters", b.parameters},     {"gradients", b.gradients},         {"optimizer state", b.optimizer_state},
      {"inputs", b.inputs},             {"activations", b.activations},     {"workspace/other", b.workspace},
      {"fragmentation", b.fragmentation}};
  std::string s = fmt::format("  {:<22} {:>12}  {}\n", "", "", "of budget");
  for (const auto& [name, n] : rows) s += fmt::format("  {:<22} {:>12}  {}\n", name, format_bytes(n), pct(n));
  s += fmt::format("  {:<22} {:>12}  {}\n", "total (peak reserved)", format_bytes(b.total), pct(b.total));
  return s;
}

}  // namespace ampforge::memory
