// Reading a memory snapshot (CachingAllocator::snapshot(), format "ampforge-memory-snapshot v1") back:
// a text summary and a chart (SVG, or a self-contained HTML page around the same SVG) with the timeline
// (allocated / reserved per step) and the segment map (blocks by state, mapped granules underneath).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ampforge::memory {

// Loads and checks a snapshot file (InvalidArgument / Io errors name the file and what is wrong).
nlohmann::json snapshot_read(const std::string& path);
std::string snapshot_summary(const nlohmann::json& snapshot);
std::string snapshot_svg(const nlohmann::json& snapshot);
std::string snapshot_html(const nlohmann::json& snapshot);

}  // namespace ampforge::memory
