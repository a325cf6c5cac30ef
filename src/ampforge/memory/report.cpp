#include "ampforge/memory/report.h"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ampforge/memory/stats.h"
#include "ampforge/util/error.h"
#include "ampforge/util/file.h"

namespace ampforge::memory {

namespace {
constexpr const char* kFormat = "ampforge-memory-snapshot v1";

int64_t i64(const nlohmann::json& j, const char* key) { return j.at(key).get<int64_t>(); }

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}
}  // namespace

std::vector<int64_t> byte_ticks(int64_t max, int target) {
  if (max < 1) max = 1;
  int64_t unit = 1;
  for (int64_t u : {int64_t{1} << 10, int64_t{1} << 20, int64_t{1} << 30, int64_t{1} << 40})
    if (max >= u) unit = u;
  // Steps that are whole bytes in the unit below too (0.25 and 0.5 of a binary unit are), so labels stay round.
  static const double steps[] = {0.25, 0.5, 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500};
  const double v = static_cast<double>(max) / static_cast<double>(unit);
  double step = 1000;
  for (double s : steps)
    if (v / s <= target && (unit > 1 || s >= 1)) {
      step = s;
      break;
    }
  const auto sb = static_cast<int64_t>(step * static_cast<double>(unit));
  std::vector<int64_t> t{0};
  while (t.back() < max) t.push_back(t.back() + sb);
  return t;
}

std::string byte_tick_label(int64_t value, int64_t axis_max) {
  if (value == 0) return "0";
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  // One unit per axis: the largest that the axis top reaches ("0.5 GiB" beside "1 GiB", not "512 MiB").
  const int64_t ref = std::max(value, axis_max);
  int k = 0;
  while (k < 4 && ref >= (int64_t{1} << (10 * (k + 1)))) ++k;
  std::string s = fmt::format("{:.2f}", static_cast<double>(value) / static_cast<double>(int64_t{1} << (10 * k)));
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s + " " + names[k];
}

namespace {
// Round ticks for a count axis (events): 1, 2 or 5 x 10^k, about `target` of them.
std::vector<int64_t> count_ticks(int64_t max, int target = 6) {
  if (max < 1) max = 1;
  int64_t mag = 1;
  while (mag * 10 <= max / target) mag *= 10;
  int64_t step = mag;
  for (int64_t m : {1, 2, 5, 10})
    if (max / (m * mag) <= target) {
      step = m * mag;
      break;
    }
  std::vector<int64_t> t{0};
  while (t.back() < max) t.push_back(t.back() + step);
  return t;
}

// Width of a label in the chart's 11 px sans-serif font (generous: digits and capitals are ~6.5 px).
double text_width(const std::string& s) { return 6.6 * static_cast<double>(s.size()); }
}  // namespace

namespace {
// What the renderers read, checked once when a file is read: a snapshot that passes renders without an
// exception, and no figure is so large that the chart's arithmetic overflows (sizes up to 2^50 bytes).
class SnapshotChecker {
 public:
  explicit SnapshotChecker(const std::string& path) : path_(path) {}

  void check(const nlohmann::json& j) {
    for (const char* key : {"policy", "device", "provider"})
      if (j.contains(key)) need(j.at(key).is_string(), key, "a string");
    if (j.contains("granularity")) size(j, "granularity", "");
    if (j.contains("expandable_segments")) need(j.at("expandable_segments").is_boolean(), "expandable_segments", "true or false");
    const nlohmann::json& st = member(j, "stats", "", nlohmann::json::value_t::object, "an object");
    for (const char* k : {"requested_bytes", "allocated_bytes", "active_bytes", "reserved_bytes"}) {
      const nlohmann::json& c = member(st, k, "stats.", nlohmann::json::value_t::object, "an object");
      size(c, "current", std::string("stats.") + k + ".");
      size(c, "peak", std::string("stats.") + k + ".");
    }
    for (const char* k : {"largest_free_block", "num_allocs", "num_frees", "cache_hits", "provider_calls", "num_ooms"})
      size(st, k, "stats.");
    for (const char* k : {"fragmentation", "fragmentation_at_peak", "peak_reserved_over_peak_requested"}) {
      need(st.contains(k) && st.at(k).is_number() && std::isfinite(st.at(k).get<double>()), std::string("stats.") + k,
           "a finite number");
    }
    const nlohmann::json& segs = member(j, "segments", "", nlohmann::json::value_t::array, "an array");
    for (size_t i = 0; i < segs.size(); ++i) {
      const std::string at = fmt::format("segments[{}].", i);
      need(segs[i].is_object(), at, "an object");
      size(segs[i], "extent", at);
      if (segs[i].contains("pool")) need(segs[i].at("pool").is_string(), at + "pool", "a string");
      const nlohmann::json& blocks = member(segs[i], "blocks", at, nlohmann::json::value_t::array, "an array");
      for (size_t k = 0; k < blocks.size(); ++k) {
        const std::string bat = fmt::format("{}blocks[{}].", at, k);
        need(blocks[k].is_object(), bat, "an object");
        for (const char* f : {"offset", "size", "requested"}) size(blocks[k], f, bat);
        need(blocks[k].contains("state") && blocks[k].at("state").is_string(), bat + "state", "a string");
      }
      const nlohmann::json& mapped = member(segs[i], "mapped", at, nlohmann::json::value_t::array, "an array");
      for (size_t k = 0; k < mapped.size(); ++k) {
        const nlohmann::json& m = mapped[k];
        need(m.is_array() && m.size() == 2 && fits(m[0]) && fits(m[1]), fmt::format("{}mapped[{}]", at, k),
             "a pair [offset, bytes] of integers in [0, 2^50]");
      }
    }
    const nlohmann::json& tl = member(j, "timeline", "", nlohmann::json::value_t::array, "an array");
    for (size_t i = 0; i < tl.size(); ++i) {
      const std::string at = fmt::format("timeline[{}].", i);
      need(tl[i].is_object(), at, "an object");
      for (const char* f : {"step", "allocated", "reserved", "peak_allocated", "peak_reserved"}) size(tl[i], f, at);
    }
  }

 private:
  static constexpr int64_t kMax = int64_t{1} << 50;
  static bool fits(const nlohmann::json& v) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(kMax);
    return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= kMax;
  }
  void need(bool ok, const std::string& what, const char* expected) const {
    AF_CHECK(ok, "{}: not a valid memory snapshot: '{}' must be {}", path_, what, expected);
  }
  void size(const nlohmann::json& obj, const char* key, const std::string& at) const {
    need(obj.contains(key) && fits(obj.at(key)), at + key, "an integer in [0, 2^50]");
  }
  const nlohmann::json& member(const nlohmann::json& obj, const char* key, const std::string& at,
                               nlohmann::json::value_t type, const char* expected) const {
    need(obj.contains(key) && obj.at(key).type() == type, at + key, expected);
    return obj.at(key);
  }
  std::string path_;
};
}  // namespace

nlohmann::json snapshot_read(const std::string& path) {
  check_readable_file(path, "memory snapshot");
  std::ifstream in(path);
  if (!in) AF_THROW(Io, "cannot open the memory snapshot '{}': {}", path, std::strerror(errno));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    AF_THROW(InvalidArgument, "{}: not valid JSON: {}", path, excerpt_for_message(e.what(), 300));
  }
  AF_CHECK(j.is_object() && j.contains("format") && j.at("format").is_string() && j.at("format") == kFormat,
           "{}: not an ampforge memory snapshot (expected \"format\": \"{}\")", path, kFormat);
  SnapshotChecker(path).check(j);
  return j;
}

std::string snapshot_summary(const nlohmann::json& snap) {
  const auto& st = snap.at("stats");
  auto counter = [&](const char* k) { return st.at(k); };
  std::string r = fmt::format("memory snapshot: policy '{}', device {}, provider {}, granularity {}{}\n",
                              snap.value("policy", "?"), snap.value("device", "?"), snap.value("provider", "?"),
                              format_bytes(snap.value("granularity", int64_t{0})),
                              snap.value("expandable_segments", false) ? ", expandable segments" : "");
  for (const char* k : {"requested_bytes", "allocated_bytes", "active_bytes", "reserved_bytes"}) {
    const auto& c = counter(k);
    r += fmt::format("  {:<16} now {:>12}  peak {:>12}\n", k, format_bytes(i64(c, "current")),
                     format_bytes(i64(c, "peak")));
  }
  r += fmt::format("  largest free block {}  fragmentation {:.1f}% (at peak reserved {:.1f}%)\n",
                   format_bytes(i64(st, "largest_free_block")), 100 * st.at("fragmentation").get<double>(),
                   100 * st.at("fragmentation_at_peak").get<double>());
  r += fmt::format("  peak reserved / peak requested {:.3f}\n", st.at("peak_reserved_over_peak_requested").get<double>());
  r += fmt::format("  allocations {}  frees {}  cache hits {}  provider calls {}  OOMs {}\n", i64(st, "num_allocs"),
                   i64(st, "num_frees"), i64(st, "cache_hits"), i64(st, "provider_calls"), i64(st, "num_ooms"));
  int64_t nblocks = 0, nalloc = 0, nfree = 0;
  std::vector<int64_t> live;
  for (const auto& s : snap.at("segments")) {
    for (const auto& b : s.at("blocks")) {
      ++nblocks;
      if (b.at("state") == "allocated") {
        ++nalloc;
        live.push_back(i64(b, "requested"));
      } else if (b.at("state") == "free") {
        ++nfree;
      }
    }
  }
  r += fmt::format("  segments {}  blocks {} ({} allocated, {} free)\n", snap.at("segments").size(), nblocks, nalloc,
                   nfree);
  std::sort(live.begin(), live.end(), std::greater<>());
  if (!live.empty()) {
    r += "  largest live blocks:";
    for (size_t i = 0; i < std::min<size_t>(5, live.size()); ++i) {
      r += ' ';  // not `" " + string`: GCC 12 warns falsely on it (-Wrestrict, its bug 105329)
      r += format_bytes(live[i]);
    }
    r += "\n";
  }
  const auto& tl = snap.at("timeline");
  if (!tl.empty()) {
    size_t at = 0;
    for (size_t i = 0; i < tl.size(); ++i)
      if (i64(tl[i], "peak_reserved") > i64(tl[at], "peak_reserved")) at = i;
    r += fmt::format("  timeline: {} steps; reserved peaked at step {} ({})\n", tl.size(), i64(tl[at], "step"),
                     format_bytes(i64(tl[at], "peak_reserved")));
  }
  return r;
}

std::string snapshot_svg(const nlohmann::json& snap) {
  const auto& segs = snap.at("segments");
  const size_t max_rows = 200;
  const size_t rows = std::min(segs.size(), max_rows);
  const auto& tl = snap.at("timeline");
  int64_t ymax = 1;
  for (const auto& p : tl) ymax = std::max({ymax, i64(p, "peak_reserved"), i64(p, "peak_allocated")});
  const std::vector<int64_t> ticks = byte_ticks(ymax);
  auto seg_label = [&](const nlohmann::json& s) { return fmt::format("{} {}", s.value("pool", "?"), format_bytes(i64(s, "extent"))); };
  // The left margin holds the longest label (segment rows and axis ticks) whole.
  double label_w = 0;
  for (int64_t v : ticks) label_w = std::max(label_w, text_width(byte_tick_label(v, ticks.back())));
  for (size_t i = 0; i < rows; ++i) label_w = std::max(label_w, text_width(seg_label(segs[i])));
  const double left = std::max(80.0, label_w + 14), right = 20, W = std::max(1000.0, left + 700), plot_w = W - left - right;
  const double tl_top = 40, tl_h = 240;
  const double map_top = tl_top + tl_h + 70, row_h = 14;
  const double H = map_top + static_cast<double>(rows) * (row_h + 4) + 40;
  std::ostringstream o;
  o << fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                   "font-family=\"sans-serif\" font-size=\"11\">\n",
                   W, H);
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << fmt::format("<text x=\"{}\" y=\"20\" font-size=\"14\">{}</text>\n", left,
                   xml_escape(fmt::format("ampforge memory: policy '{}' on {}", snap.value("policy", "?"),
                                          snap.value("device", "?"))));
  // ---- timeline ----
  ymax = ticks.back();
  for (int64_t v : ticks) {
    const double y = tl_top + tl_h - tl_h * static_cast<double>(v) / static_cast<double>(ymax);
    o << fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>\n", left, y,
                     left + plot_w, y);
    o << fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, y + 4,
                     xml_escape(byte_tick_label(v, ymax)));
  }
  o << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", left,
                   tl_top, plot_w, tl_h);
  if (tl.empty()) {
    o << fmt::format("<text x=\"{}\" y=\"{}\">no timeline (no step boundaries were recorded)</text>\n", left + 10,
                     tl_top + 20);
  } else {
    const size_t n = tl.size();
    auto line = [&](const char* key, const char* color, const char* dash) {
      o << fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{} points=\"", color, dash);
      for (size_t i = 0; i < n; ++i) {
        const double x = left + (n == 1 ? 0.0 : plot_w * static_cast<double>(i) / static_cast<double>(n - 1));
        const double y = tl_top + tl_h - tl_h * static_cast<double>(i64(tl[i], key)) / static_cast<double>(ymax);
        o << fmt::format("{:.1f},{:.1f} ", x, y);
      }
      o << "\"/>\n";
    };
    line("peak_reserved", "#e07b00", " stroke-dasharray=\"4 3\"");
    line("reserved", "#e07b00", "");
    line("peak_allocated", "#1f5fbf", " stroke-dasharray=\"4 3\"");
    line("allocated", "#1f5fbf", "");
    o << fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step (0 .. {})</text>\n", left + plot_w / 2,
                     tl_top + tl_h + 16, i64(tl.back(), "step"));
  }
  o << fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#1f5fbf\">allocated (dashed: peak in step)</text>", left,
                   tl_top + tl_h + 32);
  o << fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#e07b00\">reserved (dashed: peak in step)</text>\n", left + 260,
                   tl_top + tl_h + 32);
  // ---- segment map ----
  o << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\">segments ({}; blue allocated, grey free, yellow "
                   "waiting for another stream; green line: mapped memory)</text>\n",
                   left, map_top - 12, segs.size());
  int64_t max_extent = 1;
  for (size_t i = 0; i < rows; ++i) max_extent = std::max(max_extent, i64(segs[i], "extent"));
  const double scale = plot_w / static_cast<double>(max_extent);
  for (size_t i = 0; i < rows; ++i) {
    const auto& s = segs[i];
    const double y = map_top + static_cast<double>(i) * (row_h + 4);
    const int64_t extent = i64(s, "extent");
    o << fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, y + 10,
                     xml_escape(seg_label(s)));
    for (const auto& b : s.at("blocks")) {
      const int64_t off = i64(b, "offset");
      if (off >= extent) continue;
      const int64_t size = std::min(i64(b, "size"), extent - off);
      const std::string st = b.at("state").get<std::string>();
      const char* fill = st == "allocated" ? "#1f5fbf" : st == "pending" ? "#e8c000" : "#dddddd";
      o << fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"white\" "
                       "stroke-width=\"0.3\"/>\n",
                       left + static_cast<double>(off) * scale, y, std::max(0.5, static_cast<double>(size) * scale),
                       row_h - 3, fill);
    }
    for (const auto& m : s.at("mapped")) {
      const double x0 = left + static_cast<double>(m.at(0).get<int64_t>()) * scale;
      const double w = static_cast<double>(m.at(1).get<int64_t>()) * scale;
      o << fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"2\" fill=\"#2a9d3a\"/>\n", x0,
                       y + row_h - 2, std::max(0.5, w));
    }
  }
  if (segs.size() > rows)
    o << fmt::format("<text x=\"{}\" y=\"{:.1f}\">... {} more segments not drawn</text>\n", left,
                     map_top + static_cast<double>(rows) * (row_h + 4) + 14, segs.size() - rows);
  o << "</svg>\n";
  return o.str();
}

std::string replay_timeline_svg(const std::string& title, const std::vector<ReplayPanel>& panels, int64_t budget) {
  int64_t ymax = std::max<int64_t>(1, budget), xmax = 1;
  for (const ReplayPanel& p : panels) {
    ymax = std::max({ymax, p.peak_live, p.peak_reserved});
    for (const ReplayPoint& q : p.series) {
      ymax = std::max({ymax, q.live, q.reserved});
      xmax = std::max(xmax, q.event);
    }
  }
  const std::vector<int64_t> ticks = byte_ticks(ymax, 4);
  const std::vector<int64_t> xticks = count_ticks(xmax);
  ymax = ticks.back();
  const int64_t xtop = xticks.back();
  double label_w = 0;
  for (int64_t v : ticks) label_w = std::max(label_w, text_width(byte_tick_label(v, ymax)));
  const double left = label_w + 16, right = 24, W = 960, plot_w = W - left - right;
  const double top = 70, panel_h = 150, gap = 58;
  const double H = top + static_cast<double>(panels.size()) * (panel_h + gap) + 10;
  std::ostringstream o;
  o << fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                   "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                   W, H);
  o << fmt::format("<text x=\"{}\" y=\"22\" font-size=\"14\">{}</text>\n", left, xml_escape(title));
  // Legend, inside the picture under the title.
  o << fmt::format("<line x1=\"{0}\" y1=\"40\" x2=\"{1}\" y2=\"40\" stroke=\"#1f5fbf\" stroke-width=\"2\"/>"
                   "<text x=\"{2}\" y=\"44\">live (requested bytes)</text>\n",
                   left, left + 24, left + 30);
  o << fmt::format("<line x1=\"{0}\" y1=\"40\" x2=\"{1}\" y2=\"40\" stroke=\"#e07b00\" stroke-width=\"2\"/>"
                   "<text x=\"{2}\" y=\"44\">reserved (held by the allocator)</text>\n",
                   left + 190, left + 214, left + 220);
  if (budget > 0)
    o << fmt::format("<line x1=\"{0}\" y1=\"40\" x2=\"{1}\" y2=\"40\" stroke=\"#c0392b\" stroke-dasharray=\"5 3\"/>"
                     "<text x=\"{2}\" y=\"44\">budget {3}</text>\n",
                     left + 420, left + 444, left + 450, xml_escape(byte_tick_label(budget)));
  for (size_t k = 0; k < panels.size(); ++k) {
    const ReplayPanel& p = panels[k];
    const double y0 = top + static_cast<double>(k) * (panel_h + gap) + 16;
    const double ratio = p.peak_live > 0 ? static_cast<double>(p.peak_reserved) / static_cast<double>(p.peak_live) : 0.0;
    // One text element: the renderer places the bold name and the figures after it, whatever the font.
    o << fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"12\"><tspan font-weight=\"bold\">{}</tspan>"
                     "<tspan dx=\"10\">peak live {}, peak reserved {} ({:.3f}x)</tspan></text>\n",
                     left, y0 - 6, xml_escape(p.policy), xml_escape(format_bytes(p.peak_live)),
                     xml_escape(format_bytes(p.peak_reserved)), ratio);
    auto Y = [&](int64_t v) { return y0 + panel_h - panel_h * static_cast<double>(v) / static_cast<double>(ymax); };
    auto X = [&](int64_t e) { return left + plot_w * static_cast<double>(e) / static_cast<double>(xtop); };
    for (int64_t v : ticks) {
      o << fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>"
                       "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
                       left, Y(v), left + plot_w, Y(v), left - 6, Y(v) + 4, xml_escape(byte_tick_label(v, ymax)));
    }
    for (int64_t e : xticks)
      o << fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#999\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
                       X(e), y0 + panel_h, y0 + panel_h + 4, y0 + panel_h + 16, e);
    o << fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#555\">event</text>\n",
                     left + plot_w, y0 + panel_h + 30);
    o << fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", left,
                     y0, plot_w, panel_h);
    auto line = [&](bool reserved, const char* color) {
      o << fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"", color);
      o << fmt::format("{:.1f},{:.1f} ", X(0), Y(0));
      int64_t prev = 0;
      for (const ReplayPoint& q : p.series) {
        const int64_t v = reserved ? q.reserved : q.live;
        o << fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", X(prev), Y(v), X(q.event), Y(v));
        prev = q.event;
      }
      o << "\"/>\n";
    };
    line(true, "#e07b00");
    line(false, "#1f5fbf");
    if (budget > 0)
      o << fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#c0392b\" stroke-dasharray=\"5 3\"/>\n",
                       left, Y(budget), left + plot_w, Y(budget));
  }
  o << "</svg>\n";
  return o.str();
}

std::string snapshot_html(const nlohmann::json& snap) {
  return "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ampforge memory report</title></head>\n"
         "<body style=\"font-family:sans-serif\">\n<pre>" +
         xml_escape(snapshot_summary(snap)) + "</pre>\n" + snapshot_svg(snap) + "</body></html>\n";
}

}  // namespace ampforge::memory
