// Reading a memory snapshot (CachingAllocator::snapshot(), format "ampforge-memory-snapshot v1") back:
// a text summary and a chart (SVG, or a self-contained HTML page around the same SVG) with the timeline
// (allocated / reserved per step) and the segment map (blocks by state, mapped granules underneath).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/memory/trace.h"

namespace ampforge::memory {

// Loads and checks a snapshot file (InvalidArgument / Io errors name the file and what is wrong).
nlohmann::json snapshot_read(const std::string& path);
std::string snapshot_summary(const nlohmann::json& snapshot);
std::string snapshot_svg(const nlohmann::json& snapshot);
std::string snapshot_html(const nlohmann::json& snapshot);

// A chart of replays: one panel per policy with live (blue) and reserved (orange) bytes over the trace's events,
// the same y scale in every panel (so panels compare), a dashed line at `budget` when > 0.
struct ReplayPanel {
  std::string policy;
  std::vector<ReplayPoint> series;
  int64_t peak_live = 0;
  int64_t peak_reserved = 0;
};
std::string replay_timeline_svg(const std::string& title, const std::vector<ReplayPanel>& panels, int64_t budget);

// Round axis ticks for a byte axis from 0 to at least `max`: a step of 1, 2 or 5 x 10^k in the largest binary unit
// (KiB, MiB, GiB, TiB) that keeps the labels short ("0", "500 MiB", "1 GiB", "1.5 GiB"). Returns the tick values;
// the last is the axis top (>= max).
std::vector<int64_t> byte_ticks(int64_t max, int target = 5);
// The label of a tick in the unit of the axis (the largest unit `axis_max` reaches).
std::string byte_tick_label(int64_t value, int64_t axis_max = 0);

}  // namespace ampforge::memory
