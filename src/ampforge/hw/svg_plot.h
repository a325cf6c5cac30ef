// `ampforge monitor --plot LOG --out FILE.svg`: temperature, power and clocks over time, one line per GPU,
// drawn from a monitor log (CSV or JSONL as `monitor --csv/--jsonl` writes them). Plain SVG, no scripts.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ampforge::hw {

struct PlotPoint {
  double t = 0;  // elapsed seconds
  unsigned gpu = 0;
  std::optional<double> temperature_c, power_w, sm_clock_mhz, mem_clock_mhz;
};

// Throws ampforge::Error: Io when the file cannot be read, InvalidArgument when it is not a monitor log.
std::vector<PlotPoint> read_monitor_log(const std::string& path);
std::string render_monitor_svg(const std::vector<PlotPoint>& points, const std::string& title);

}  // namespace ampforge::hw
