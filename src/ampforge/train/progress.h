// A progress display for long loops: a single redrawn line with a bar on a terminal, plain lines at
// ~10% intervals otherwise (logs, CI). Writes to stderr so stdout stays clean for --json.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ampforge::train {

class Progress {
 public:
  // `enabled` false: prints nothing. `tty` decides the style (auto-detected when not forced).
  Progress(std::string label, int64_t total, bool enabled, int tty = -1);
  // Reports `done` of `total` with a free-form status (loss, samples/s, ...), and an ETA from the rate.
  void update(int64_t done, const std::string& status);
  void finish(const std::string& status);

 private:
  std::string label_;
  int64_t total_;
  bool enabled_, tty_;
  int64_t start_ns_, last_draw_ns_ = 0;
  int last_decile_ = -1;
};

}  // namespace ampforge::train
