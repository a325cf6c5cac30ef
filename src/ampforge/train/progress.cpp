#include "ampforge/train/progress.h"

#include <unistd.h>

#include <fmt/format.h>

#include "ampforge/util/timer.h"

namespace ampforge::train {

Progress::Progress(std::string label, int64_t total, bool enabled, int tty)
    : label_(std::move(label)), total_(total), enabled_(enabled), tty_(tty < 0 ? isatty(2) != 0 : tty != 0),
      start_ns_(now_ns()) {}

namespace {
std::string fmt_eta(double s) {
  if (s < 0 || s > 1e7) return "--:--";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60) : fmt::format("{:02d}:{:02d}", t / 60, t % 60);
}
}  // namespace

void Progress::update(int64_t done, const std::string& status) {
  if (!enabled_ || total_ <= 0) return;
  const int64_t now = now_ns();
  const double elapsed = (now - start_ns_) * 1e-9;
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const double eta = done > 0 ? elapsed * (1.0 - frac) / frac : -1;
  if (tty_) {
    if (now - last_draw_ns_ < 100'000'000 && done < total_) return;  // redraw at most 10x per second
    last_draw_ns_ = now;
    const int width = 24, filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r\033[K%s [%s] %3d%% %s ETA %s", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100),
                 status.c_str(), fmt_eta(eta).c_str());
    std::fflush(stderr);
  } else {
    const int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_ || decile >= 10) return;
    last_decile_ = decile;
    std::fprintf(stderr, "%s %3d%% (%lld/%lld) %s ETA %s\n", label_.c_str(), decile * 10, static_cast<long long>(done),
                 static_cast<long long>(total_), status.c_str(), fmt_eta(eta).c_str());
  }
}

void Progress::finish(const std::string& status) {
  if (!enabled_) return;
  const double elapsed = (now_ns() - start_ns_) * 1e-9;
  if (tty_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s done in %.1fs %s\n", label_.c_str(), elapsed, status.c_str());
}

}  // namespace ampforge::train
