#include "ampforge/hw/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/util/error.h"

namespace ampforge::hw {

namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') cur += '"', ++i;
      else if (c == '"') quoted = false;
      else cur += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::optional<double> number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (!end || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<double> json_number(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

// A "nice" tick step (1, 2, 5 x 10^k) giving about `target` ticks over `span`.
double nice_step(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};

}  // namespace

std::vector<PlotPoint> read_monitor_log(const std::string& path) {
  std::ifstream f(path);
  if (!f) AF_THROW(Io, "cannot read monitor log '{}'", path);
  std::vector<PlotPoint> pts;
  std::string line;
  std::vector<std::string> header;
  bool jsonl = false, decided = false;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!decided) {
      jsonl = line[line.find_first_not_of(" \t")] == '{';
      decided = true;
      if (!jsonl) {
        header = split_csv(line);
        AF_CHECK(std::find(header.begin(), header.end(), "elapsed_s") != header.end() &&
                     std::find(header.begin(), header.end(), "gpu") != header.end(),
                 "'{}' is not a monitor log: expected a CSV header with elapsed_s and gpu, found '{}'", path, line);
        continue;
      }
    }
    PlotPoint p;
    if (jsonl) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      AF_CHECK(j.is_object() && json_number(j, "elapsed_s") && json_number(j, "gpu"),
               "'{}' line {}: expected a monitor JSON object with elapsed_s and gpu", path, lineno);
      if (j.value("status", "ok") == "lost") continue;
      p.t = *json_number(j, "elapsed_s");
      p.gpu = static_cast<unsigned>(*json_number(j, "gpu"));
      p.temperature_c = json_number(j, "temperature_c");
      p.power_w = json_number(j, "power_w");
      p.sm_clock_mhz = json_number(j, "sm_clock_mhz");
      p.mem_clock_mhz = json_number(j, "mem_clock_mhz");
    } else {
      auto cells = split_csv(line);
      std::map<std::string, std::string> row;
      for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
      auto t = number(row["elapsed_s"]);
      auto g = number(row["gpu"]);
      AF_CHECK(t && g, "'{}' line {}: elapsed_s and gpu must be numbers", path, lineno);
      if (row["status"] == "lost") continue;
      p.t = *t;
      p.gpu = static_cast<unsigned>(*g);
      p.temperature_c = number(row["temperature_c"]);
      p.power_w = number(row["power_w"]);
      p.sm_clock_mhz = number(row["sm_clock_mhz"]);
      p.mem_clock_mhz = number(row["mem_clock_mhz"]);
    }
    pts.push_back(p);
  }
  AF_CHECK(!pts.empty(), "'{}' holds no samples to plot", path);
  return pts;
}

std::string render_monitor_svg(const std::vector<PlotPoint>& points, const std::string& title) {
  constexpr double W = 960, panel_h = 220, top = 50, gap = 40, left = 70, right = 150;
  struct Series {
    const char* label;
    std::optional<double> PlotPoint::*field;
    const char* dash;
  };
  struct Panel {
    const char* title;
    const char* unit;
    std::vector<Series> series;
  };
  const Panel panels[] = {
      {"Temperature", "°C", {{"temp", &PlotPoint::temperature_c, ""}}},
      {"Power", "W", {{"power", &PlotPoint::power_w, ""}}},
      {"Clocks", "MHz", {{"SM", &PlotPoint::sm_clock_mhz, ""}, {"memory", &PlotPoint::mem_clock_mhz, "6,4"}}},
  };
  const double H = top + 3 * panel_h + 2 * gap + 50;
  double t0 = points.front().t, t1 = points.front().t;
  std::set<unsigned> gpus;
  for (const auto& p : points) {
    t0 = std::min(t0, p.t);
    t1 = std::max(t1, p.t);
    gpus.insert(p.gpu);
  }
  if (t1 <= t0) t1 = t0 + 1;
  const double plot_w = W - left - right;
  auto xof = [&](double t) { return left + (t - t0) / (t1 - t0) * plot_w; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"28\" font-size=\"16\" font-weight=\"bold\">{3}</text>\n",
      W, H, left, esc(title));
  for (int pi = 0; pi < 3; ++pi) {
    const Panel& panel = panels[pi];
    const double y0 = top + pi * (panel_h + gap);
    double lo = 0, hi = 0;
    bool any = false;
    for (const auto& s : panel.series)
      for (const auto& p : points)
        if (auto v = p.*(s.field)) {
          lo = any ? std::min(lo, *v) : *v;
          hi = any ? std::max(hi, *v) : *v;
          any = true;
        }
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{} ({})</text>\n", left, y0 - 6, panel.title, panel.unit);
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", left, y0,
                       plot_w, panel_h);
    if (!any) {
      svg += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#888\">n/a (no values in the log)</text>\n", left + 10, y0 + panel_h / 2);
      continue;
    }
    const double pad = std::max((hi - lo) * 0.08, 1.0);
    lo = std::max(0.0, lo - pad);
    hi += pad;
    const double step = nice_step(hi - lo, 5);
    lo = std::floor(lo / step) * step;
    hi = std::ceil(hi / step) * step;
    auto yof = [&](double v) { return y0 + panel_h - (v - lo) / (hi - lo) * panel_h; };
    for (double v = lo; v <= hi + step * 1e-9; v += step) {
      svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eee\"/>\n", left, yof(v), left + plot_w, yof(v));
      svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n", left - 6, yof(v) + 4, v);
    }
    const double tstep = nice_step(t1 - t0, 8);
    for (double t = std::ceil(t0 / tstep) * tstep; t <= t1 + tstep * 1e-9; t += tstep)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n", xof(t), y0 + panel_h + 15, t);
    int legend = 0;
    for (const auto& s : panel.series) {
      for (unsigned g : gpus) {
        const char* colour = kColours[g % (sizeof(kColours) / sizeof(kColours[0]))];
        std::string pts;
        auto flush = [&] {
          if (!pts.empty())
            svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"{}\" points=\"{}\"/>\n",
                               colour, s.dash, pts);
          pts.clear();
        };
        for (const auto& p : points) {
          if (p.gpu != g) continue;
          auto v = p.*(s.field);
          if (!v) {  // a gap in the data breaks the line
            flush();
            continue;
          }
          pts += fmt::format("{:.1f},{:.1f} ", xof(p.t), yof(*v));
        }
        flush();
        const double ly = y0 + 14 + 16 * legend++;
        svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"{}\"/>"
                           "<text x=\"{}\" y=\"{}\">GPU{} {}</text>\n",
                           left + plot_w + 10, ly - 4, left + plot_w + 34, ly - 4, colour, s.dash, left + plot_w + 40, ly, g, s.label);
      }
    }
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time (s)</text>\n</svg>\n", left + plot_w / 2, H - 12);
  return svg;
}

}  // namespace ampforge::hw
