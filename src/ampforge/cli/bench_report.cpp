#include "ampforge/cli/bench_report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace ampforge::cli {

const char* const kBriefEnvironment =
    "the brief's table: RTX 4080, Ubuntu 22.04, PyTorch 2.0.1, CUDA 12.1 (FP32 vs FP16 samples/s; YOLOv8's size "
    "not stated)";

std::optional<BenchReference> brief_reference(const std::string& model) {
  if (model == "resnet50") return BenchReference{312, 478, "ResNet50 bs256"};
  if (model == "bert-base") return BenchReference{87, 142, "BERT-base bs64"};
  if (model == "yolov8n" || model == "yolov8s") return BenchReference{24, 38, "YOLOv8 bs16"};
  return std::nullopt;
}

void compute_derived(BenchReport& r) {
  for (BenchRow& row : r.rows) {
    row.gain_vs_fp32_percent.reset();
    row.ratio.reset();
    row.ratio_compiled.reset();
    if (row.ours.ok && row.peer && row.peer->ok && row.peer->samples_per_sec > 0)
      row.ratio = row.ours.samples_per_sec / row.peer->samples_per_sec;
    if (row.ours.ok && row.compiled && row.compiled->ok && row.compiled->samples_per_sec > 0)
      row.ratio_compiled = row.ours.samples_per_sec / row.compiled->samples_per_sec;
    if (!row.ours.ok || row.precision == "fp32") continue;
    for (const BenchRow& base : r.rows)
      if (base.model == row.model && base.precision == "fp32" && base.batch == row.batch && base.ours.ok &&
          base.ours.samples_per_sec > 0)
        row.gain_vs_fp32_percent = 100.0 * (row.ours.samples_per_sec / base.ours.samples_per_sec - 1.0);
  }
}

namespace {

nlohmann::json side_json(const BenchSide& s) {
  if (!s.ok) return {{"error", s.error}};
  nlohmann::json j = {{"samples_per_sec", s.samples_per_sec},
                      {"mean_samples_per_sec", s.mean_samples_per_sec},
                      {"ms_per_step", 1e3 * s.median_seconds},
                      {"step_seconds", s.step_seconds},
                      {"parameters", s.parameters},
                      {"last_loss", s.last_loss},
                      {"timer", s.timer}};
  j["peak_allocated_bytes"] = s.peak_allocated_bytes >= 0 ? nlohmann::json(s.peak_allocated_bytes) : nlohmann::json();
  j["peak_reserved_bytes"] = s.peak_reserved_bytes >= 0 ? nlohmann::json(s.peak_reserved_bytes) : nlohmann::json();
  if (!s.memory_format.empty()) j["memory_format"] = s.memory_format;
  if (!s.skipped.empty()) j["skipped"] = s.skipped;
  if (!s.profile.is_null()) j["profile"] = s.profile;
  return j;
}

nlohmann::json opt_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); }

std::string mib(int64_t bytes) {
  if (bytes < 0) return "-";
  return fmt::format("{:.0f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string rate(const BenchSide& s) { return s.ok ? fmt::format("{:.1f}", s.samples_per_sec) : "failed"; }

std::string reference_cell(const BenchRow& row) {
  const auto ref = brief_reference(row.model);
  if (!ref) return "-";
  if (row.precision == "fp32") return fmt::format("{:.0f}", ref->fp32);
  if (row.precision == "fp16") return fmt::format("{:.0f}", ref->fp16);
  return "-";
}

// The max-batch column: the batch, ">= N" when the search's cap fitted, "none" when batch 1 does not fit.
std::string max_batch_cell(const BenchRow& row) {
  if (!row.max_batch) return "-";
  if (!row.max_batch->error.empty()) return "failed";
  if (row.max_batch->batch == 0) return "none";
  return fmt::format("{}{}", row.max_batch->limited ? ">= " : "", row.max_batch->batch);
}

std::string peer_cell(const BenchRow& row) {
  if (!row.peer) return "-";
  return rate(*row.peer);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A side whose steps --peer-seconds cut short: "resnet50 bf16 PyTorch: 1 of 3 timed steps (13.3 s each: --peer-seconds
// stopped it)"; "" otherwise.
// A layout the peer did not time adds "; channels_last not timed: its warm-up step took 312.4 s, nchw's 288.0 s".
std::string capped_note(const BenchReport& r, const BenchRow& row, const char* who, const BenchSide& side) {
  if (!side.ok) return "";
  const bool capped = !side.step_seconds.empty() && std::ssize(side.step_seconds) < r.steps;
  if (!capped && side.skipped.empty()) return "";
  std::string s = fmt::format("{} {} {}: ", row.model, row.precision, who);
  if (capped)
    s += fmt::format("{} of {} timed steps ({:.1f} s each: --peer-seconds stopped it)", side.step_seconds.size(),
                     r.steps, side.median_seconds);
  if (!side.skipped.empty()) s += (capped ? "; " : "") + side.skipped;
  return s;
}

std::string header_lines(const BenchReport& r) {
  std::string s = fmt::format("ampforge {} bench on {}{}: full training steps (forward, loss, backward, {}{}), "
                              "synthetic data, {} warm-up + {} timed steps, median (mean) samples/s, {} thread(s)",
                              r.version, r.device, r.device_name.empty() ? "" : " (" + r.device_name + ")",
                              r.optimizer, "; GradScaler for fp16", r.warmup, r.steps, r.threads);
  if (r.recompute) s += "\nampforge recomputes batch-norm, relu and residual-sum outputs in backward (--recompute)";
  if (!r.sizes_note.empty()) s += "\nsizes: " + r.sizes_note;
  if (!r.blas_core.empty())
    s += fmt::format("\nCPU BLAS: {}, {} kernels (chosen by {}; the peer loads the same library and kernels)",
                     r.blas_library, r.blas_core, r.blas_source);
  if (!r.cpu_products.empty()) s += "\nampforge's matrix products: " + r.cpu_products;
  if (!r.cpu_convolutions.empty()) s += "\nampforge's convolutions: " + r.cpu_convolutions;
  if (!r.peer_torch.empty()) s += fmt::format("\npeer: PyTorch {} ({}), same threads, its faster memory format{}",
                                              r.peer_torch, r.peer_python,
                                              r.interleaved ? "; interleaved: one PyTorch step (per memory format) "
                                                              "after each of ampforge's, both in the same seconds"
                                                            : "");
  if (r.max_batch_budget > 0)
    s += fmt::format("\nmax batch: the largest batch whose training step fits {:.2f} GiB, planned on the {}",
                     static_cast<double>(r.max_batch_budget) / static_cast<double>(int64_t{1} << 30),
                     r.max_batch_planner);
  if (!r.unavailable_models.empty()) {
    s += "\nnot in this build (skipped):";
    for (const auto& m : r.unavailable_models) s += " " + m;
  }
  if (r.interrupted)
    s += fmt::format("\ninterrupted ({}): measured {} of the {} cells asked for", r.interrupted_by, r.rows.size(),
                     r.cells_asked);
  return s;
}

}  // namespace

std::string peer_profile_text(const nlohmann::json& profile) {
  try {
    const double step_ms = profile.at("step_ms").get<double>();
    std::string s = fmt::format("one profiled step (torch.profiler, not timed), {:.1f} ms\n", step_ms);
    s += fmt::format("  {:<48} {:>6} {:>10} {:>6}\n", "operator", "calls", "self ms", "%step");
    for (const auto& op : profile.at("ops")) {
      const double self_ms = op.at("self_ms").get<double>();
      s += fmt::format("  {:<48} {:>6} {:>10.2f} {:>5.1f}%\n", op.at("name").get<std::string>(),
                       op.at("calls").get<int64_t>(), self_ms, step_ms > 0 ? 100.0 * self_ms / step_ms : 0.0);
    }
    return s;
  } catch (const std::exception& e) {
    return fmt::format("unreadable profile from the peer ({})\n", e.what());
  }
}

nlohmann::json bench_to_json(const BenchReport& r) {
  nlohmann::json j;
  j["schema"] = "ampforge-bench v1";
  j["ampforge"] = r.version;
  j["device"] = r.device;
  j["device_name"] = r.device_name;
  j["threads"] = r.threads;
  j["blas"] = r.blas_core.empty() ? nlohmann::json()
                                  : nlohmann::json{{"library", r.blas_library}, {"core", r.blas_core},
                                                   {"source", r.blas_source}};
  j["cpu_products"] = r.cpu_products.empty() ? nlohmann::json() : nlohmann::json(r.cpu_products);
  j["cpu_convolutions"] = r.cpu_convolutions.empty() ? nlohmann::json() : nlohmann::json(r.cpu_convolutions);
  j["settings"] = {{"warmup", r.warmup},         {"steps", r.steps},
                   {"optimizer", r.optimizer},   {"channels_last", r.channels_last},
                   {"cuda_graphs", r.cuda_graphs}, {"full", r.full}, {"recompute", r.recompute}, {"interleaved", r.interleaved},
                   {"sizes", r.sizes_note}};
  j["settings"]["max_batch"] = r.max_batch_budget > 0 ? nlohmann::json{{"budget_bytes", r.max_batch_budget},
                                                                        {"planner", r.max_batch_planner}}
                                                      : nlohmann::json();
  j["peer"] = r.peer_torch.empty() ? nlohmann::json() : nlohmann::json{{"python", r.peer_python}, {"torch", r.peer_torch}};
  j["unavailable_models"] = r.unavailable_models;
  j["interrupted"] = r.interrupted;
  if (r.interrupted) j["interrupted_by"] = r.interrupted_by;
  j["cells_asked"] = r.cells_asked;
  j["rows"] = nlohmann::json::array();
  for (const BenchRow& row : r.rows) {
    nlohmann::json jr = {{"model", row.model}, {"precision", row.precision}, {"batch", row.batch},
                         {"input", row.input}, {"ampforge", side_json(row.ours)}};
    jr["peer"] = row.peer ? side_json(*row.peer) : nlohmann::json();
    jr["peer_compiled"] = row.compiled ? side_json(*row.compiled) : nlohmann::json();
    jr["gain_vs_fp32_percent"] = opt_json(row.gain_vs_fp32_percent);
    if (!row.max_batch)
      jr["max_batch"] = nullptr;
    else if (!row.max_batch->error.empty())
      jr["max_batch"] = {{"error", row.max_batch->error}};
    else
      jr["max_batch"] = {{"batch", row.max_batch->batch}, {"limited", row.max_batch->limited},
                         {"seconds", row.max_batch->seconds}};
    jr["ratio"] = opt_json(row.ratio);
    jr["ratio_compiled"] = opt_json(row.ratio_compiled);
    if (!row.round_ratios.empty()) jr["round_ratios"] = row.round_ratios;
    if (const auto ref = brief_reference(row.model))
      jr["reference"] = {{"fp32", ref->fp32}, {"fp16", ref->fp16}, {"what", ref->label}, {"source", kBriefEnvironment}};
    else
      jr["reference"] = nullptr;
    j["rows"].push_back(std::move(jr));
  }
  return j;
}

std::string bench_table(const BenchReport& r) {
  std::string s = header_lines(r) + "\n\n";
  const bool mb = r.max_batch_budget > 0;
  bool comp = false;
  for (const BenchRow& row : r.rows) comp |= row.compiled.has_value();
  auto ratio_cell = [](const std::optional<double>& v) { return v ? fmt::format("{:.2f}x", *v) : std::string("-"); };
  s += fmt::format("{:<12} {:<5} {:>6} {:<10} {:>16} {:>9} {:>10} {:>10} {:>8} {:>10} {:>7}", "model", "prec", "batch",
                   "input", "samples/s (mean)", "ms/step", "peak alloc", "peak resv", "vs fp32", "PyTorch", "ratio");
  if (comp) s += fmt::format(" {:>10} {:>7}", "compiled", "ratio");
  s += fmt::format(" {:>9}", "brief4080");
  s += mb ? fmt::format(" {:>10}\n", "max batch") : "\n";
  for (const BenchRow& row : r.rows) {
    const BenchSide& o = row.ours;
    s += fmt::format("{:<12} {:<5} {:>6} {:<10} {:>16} {:>9} {:>10} {:>10} {:>8} {:>10} {:>7}", row.model,
                     row.precision, row.batch, row.input,
                     o.ok ? fmt::format("{:.1f} ({:.1f})", o.samples_per_sec, o.mean_samples_per_sec) : "failed",
                     o.ok ? fmt::format("{:.1f}", 1e3 * o.median_seconds) : "-", mib(o.peak_allocated_bytes),
                     mib(o.peak_reserved_bytes),
                     row.gain_vs_fp32_percent ? fmt::format("{:+.0f}%", *row.gain_vs_fp32_percent) : "-",
                     peer_cell(row), ratio_cell(row.ratio));
    if (comp) s += fmt::format(" {:>10} {:>7}", row.compiled ? rate(*row.compiled) : "-", ratio_cell(row.ratio_compiled));
    s += fmt::format(" {:>9}", reference_cell(row));
    s += mb ? fmt::format(" {:>10}\n", max_batch_cell(row)) : "\n";
  }
  bool notes = false;
  for (const BenchRow& row : r.rows) {
    auto note = [&](const char* who, const BenchSide& side) {
      const std::string capped = capped_note(r, row, who, side);
      if (side.ok && capped.empty()) return;
      if (!notes) s += "\n";
      notes = true;
      if (!capped.empty())
        s += "  " + capped + "\n";
      else
        s += fmt::format("  {} {} {}: {}\n", row.model, row.precision, who, side.error);
    };
    note("ampforge", row.ours);
    if (row.peer) note("PyTorch", *row.peer);
    if (row.compiled) note("PyTorch compiled", *row.compiled);
    if (row.max_batch && !row.max_batch->error.empty()) {
      if (!notes) s += "\n";
      notes = true;
      s += fmt::format("  {} {} max batch: {}\n", row.model, row.precision, row.max_batch->error);
    }
  }
  bool rounds_title = false;
  for (const BenchRow& row : r.rows) {
    if (row.round_ratios.empty()) continue;
    if (!rounds_title) s += "\nrounds (ampforge and PyTorch alternating; the row shows the median round):\n";
    rounds_title = true;
    std::string list;
    for (double r : row.round_ratios) list += fmt::format("{}{:.2f}x", list.empty() ? "" : " ", r);
    s += fmt::format("  {} {}: {}\n", row.model, row.precision, list);
  }
  s += "\nratio = ampforge / PyTorch samples/s (> 1: ampforge is faster)";
  if (comp) s += "; compiled = PyTorch under torch.compile (inductor), its ratio likewise";
  s += "; brief4080 = ";
  s += kBriefEnvironment;
  s += "\n";
  return s;
}

std::string bench_markdown(const BenchReport& r) {
  std::string s = header_lines(r);
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("  \n") : std::string(1, c);
  const bool mb = r.max_batch_budget > 0;
  bool comp = false;
  for (const BenchRow& row : r.rows) comp |= row.compiled.has_value();
  out += "\n\n| model | precision | batch | input | samples/s | mean | ms/step | peak allocated | peak reserved | "
         "vs FP32 | PyTorch samples/s | ratio |";
  if (comp) out += " PyTorch compiled samples/s | ratio (compiled) |";
  out += " brief RTX 4080 |";
  out += mb ? " max batch |\n" : "\n";
  const int columns = 13 + (comp ? 2 : 0) + (mb ? 1 : 0);
  for (int c = 0; c < columns; ++c) out += "|---";
  out += "|\n";
  for (const BenchRow& row : r.rows) {
    const BenchSide& o = row.ours;
    std::string peer = peer_cell(row);
    if (row.peer && !row.peer->ok) peer = "failed: " + row.peer->error;
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |", row.model, row.precision,
                       row.batch, row.input, o.ok ? fmt::format("{:.1f}", o.samples_per_sec) : "failed: " + o.error,
                       o.ok ? fmt::format("{:.1f}", o.mean_samples_per_sec) : "-",
                       o.ok ? fmt::format("{:.1f}", 1e3 * o.median_seconds) : "-", mib(o.peak_allocated_bytes),
                       mib(o.peak_reserved_bytes),
                       row.gain_vs_fp32_percent ? fmt::format("{:+.0f}%", *row.gain_vs_fp32_percent) : "-", peer,
                       row.ratio ? fmt::format("{:.2f}x", *row.ratio) : "-");
    if (comp) {
      std::string c = !row.compiled ? "-" : row.compiled->ok ? rate(*row.compiled) : "failed: " + row.compiled->error;
      out += fmt::format(" {} | {} |", c, row.ratio_compiled ? fmt::format("{:.2f}x", *row.ratio_compiled) : "-");
    }
    out += fmt::format(" {} |", reference_cell(row));
    if (mb)
      out += fmt::format(" {} |", row.max_batch && !row.max_batch->error.empty() ? "failed: " + row.max_batch->error
                                                                                  : max_batch_cell(row));
    out += "\n";
  }
  for (const BenchRow& row : r.rows)
    for (const auto& [who, side] : {std::pair<const char*, const std::optional<BenchSide>*>{"PyTorch", &row.peer},
                                    {"PyTorch compiled", &row.compiled}})
      if (*side)
        if (const std::string c = capped_note(r, row, who, **side); !c.empty()) out += "\n" + c + ".  ";
  out += fmt::format("\nratio = ampforge / PyTorch samples/s; brief RTX 4080 = {}.\n", kBriefEnvironment);
  return out;
}

namespace {

// The smallest "round" step (1, 2 or 5 times a power of ten) that splits [0, vmax] into at most `max_ticks` parts.
double nice_step(double vmax, int max_ticks) {
  const double raw = vmax / max_ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string tick_label(double v) { return v >= 100 || v == std::floor(v) ? fmt::format("{:.0f}", v) : fmt::format("{:g}", v); }

}  // namespace

std::string bench_svg(const BenchReport& r) {
  struct Bar {
    std::string label, who;
    double value;
  };
  static const std::pair<const char*, const char*> kWho[] = {
      {"ampforge", "#3b6fb6"}, {"PyTorch", "#e08a2c"}, {"PyTorch compiled", "#5a9e4b"}};
  // Models in order of first appearance; within a model, the rows as measured: ampforge, then the peer beside it.
  std::vector<std::string> models;
  for (const BenchRow& row : r.rows)
    if (std::find(models.begin(), models.end(), row.model) == models.end()) models.push_back(row.model);
  std::vector<std::vector<Bar>> groups;
  bool has[3] = {false, false, false};
  for (const std::string& m : models) {
    std::vector<Bar> g;
    for (const BenchRow& row : r.rows) {
      if (row.model != m) continue;
      if (row.ours.ok) g.push_back({row.precision, kWho[0].first, row.ours.samples_per_sec}), has[0] = true;
      if (row.peer && row.peer->ok) g.push_back({row.precision, kWho[1].first, row.peer->samples_per_sec}), has[1] = true;
      if (row.compiled && row.compiled->ok)
        g.push_back({row.precision, kWho[2].first, row.compiled->samples_per_sec}), has[2] = true;
    }
    groups.push_back(std::move(g));
  }
  // One panel per model, each with its own axis: the models' samples/s differ by 100x and more (a small CNN's
  // thousands beside ResNet-50's tens), and on one shared axis the slow models' bars are a line at zero.
  const double bar_w = 30, axis_w = 46, pad = 14, gap = 22, ylabel_w = 22, top = 64, plot_h = 260, bottom = 46;
  std::vector<double> panel_w;
  double width = ylabel_w;
  for (const auto& g : groups) {
    // At least two bars' width, so that the model's name fits under a panel of one bar.
    panel_w.push_back(axis_w + static_cast<double>(std::max<size_t>(g.size(), 2)) * bar_w + pad);
    width += panel_w.back() + gap;
  }
  const std::string title = "Training samples/s on " + r.device + (r.device_name.empty() ? "" : " (" + r.device_name + ")");
  // Wide enough for the title (about 7.5 px a character at 14 px) and the legend (6.5 px a character at 11 px).
  double legend_w = 0;
  for (int k = 0; k < 3; ++k)
    if (has[k])
      legend_w += 34 + 6.5 * static_cast<double>(std::string(kWho[k].first).size() +
                                                  (k > 0 && !r.peer_torch.empty() ? r.peer_torch.size() + 1 : 0));
  width = std::max({width, 120.0 + 7.5 * static_cast<double>(title.size()), ylabel_w + axis_w + legend_w + 20, 420.0});
  const double height = top + plot_h + bottom;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<title>{}</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, xml_escape("ampforge bench on " + r.device + ": samples/s per model and precision"));
  s += fmt::format("<text x=\"{:.0f}\" y=\"20\" font-size=\"14\">{}</text>\n", ylabel_w + axis_w, xml_escape(title));
  // Legend: one swatch per side that has a bar.
  double lx = ylabel_w + axis_w;
  for (int k = 0; k < 3; ++k) {
    if (!has[k]) continue;
    std::string name = kWho[k].first;
    if (k > 0 && !r.peer_torch.empty()) name += " " + r.peer_torch;
    s += fmt::format("<rect x=\"{:.0f}\" y=\"32\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                     "<text x=\"{:.0f}\" y=\"42\">{}</text>\n",
                     lx, kWho[k].second, lx + 16, xml_escape(name));
    lx += 16 + 6.5 * static_cast<double>(name.size()) + 18;
  }
  s += fmt::format("<text x=\"14\" y=\"{:.0f}\" transform=\"rotate(-90 14 {:.0f})\" text-anchor=\"middle\">samples/s</text>\n",
                   top + plot_h / 2, top + plot_h / 2);
  double px = ylabel_w;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const std::vector<Bar>& g = groups[gi];
    double vmax = 0;
    for (const Bar& b : g) vmax = std::max(vmax, b.value);
    // Head room above the tallest bar for its value, written upright above it (about 30 px of the 260).
    vmax = vmax <= 0 ? 1 : vmax * 1.12;
    const double step = nice_step(vmax, 5);
    const double axis_max = std::ceil(vmax / step) * step;
    const double ax = px + axis_w, right = px + panel_w[gi];
    // This panel's axis with round ticks and light grid lines.
    s += fmt::format("<line x1=\"{0:.0f}\" y1=\"{1:.0f}\" x2=\"{0:.0f}\" y2=\"{2:.0f}\" stroke=\"#333\"/>\n", ax, top,
                     top + plot_h);
    for (double v = 0; v <= axis_max + step / 2; v += step) {
      const double y = top + plot_h - plot_h * v / axis_max;
      s += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", ax, y, right,
                       y);
      s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", ax - 5, y + 4, tick_label(v));
    }
    double x = ax + 6;
    for (const Bar& b : g) {
      const double h = plot_h * b.value / axis_max;
      const char* color = kWho[0].second;
      for (const auto& [who, c] : kWho)
        if (b.who == who) color = c;
      s += fmt::format("<rect class=\"bar\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
                       "<title>{}</title></rect>\n",
                       x, top + plot_h - h, bar_w - 4, h, color,
                       xml_escape(fmt::format("{} {} {}: {:.1f} samples/s", models[gi], b.label, b.who, b.value)));
      // The value on the bar (above it), rotated to fit a narrow bar.
      const double vx = x + (bar_w - 4) / 2 + 3, vy = top + plot_h - h - 4;
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"9\" transform=\"rotate(-90 {:.1f} {:.1f})\">{}</text>\n",
                       vx, vy, vx, vy, b.value >= 100 ? fmt::format("{:.0f}", b.value) : fmt::format("{:.1f}", b.value));
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"9\" text-anchor=\"middle\">{}</text>\n",
                       x + (bar_w - 4) / 2, top + plot_h + 14, xml_escape(b.label));
      x += bar_w;
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">{}</text>\n", ax + 6, top + plot_h + 34,
                     xml_escape(models[gi]));
    px += panel_w[gi] + gap;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace ampforge::cli
