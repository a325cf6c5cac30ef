#include "ampforge/memory/stats.h"

#include <cctype>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/util/error.h"

namespace ampforge::memory {

namespace {
nlohmann::json counter_json(const StatCounter& c) {
  return {{"current", c.current}, {"peak", c.peak}, {"total", c.total}};
}
}  // namespace

nlohmann::json stats_to_json(const AllocatorStats& s) {
  return {{"requested_bytes", counter_json(s.requested)},
          {"allocated_bytes", counter_json(s.allocated)},
          {"active_bytes", counter_json(s.active)},
          {"reserved_bytes", counter_json(s.reserved)},
          {"num_allocs", s.num_allocs},
          {"num_frees", s.num_frees},
          {"cache_hits", s.cache_hits},
          {"provider_calls", s.provider_calls},
          {"num_retries", s.num_retries},
          {"num_ooms", s.num_ooms},
          {"host_waits", s.host_waits},
          {"largest_free_block", s.largest_free_block},
          {"fragmentation", s.fragmentation},
          {"fragmentation_at_peak", s.fragmentation_at_peak},
          {"peak_reserved_over_peak_requested", s.peak_overhead_ratio()}};
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  const int64_t a = bytes < 0 ? -bytes : bytes;
  if (a < 1024) return fmt::format("{} B", bytes);
  if (a < (int64_t{1} << 20)) return fmt::format("{:.2f} KiB", b / 1024);
  if (a < (int64_t{1} << 30)) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (a < (int64_t{1} << 40)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  return fmt::format("{:.2f} TiB", b / static_cast<double>(int64_t{1} << 40));
}

std::string stats_format(const AllocatorStats& s) {
  std::string out;
  auto row = [&](const char* name, const StatCounter& c) {
    out += fmt::format("  {:<10} current {:>12}  peak {:>12}  total {:>12}\n", name, format_bytes(c.current),
                       format_bytes(c.peak), format_bytes(c.total));
  };
  row("requested", s.requested);
  row("allocated", s.allocated);
  row("active", s.active);
  row("reserved", s.reserved);
  out += fmt::format("  allocs {}  frees {}  cache hits {}  provider calls {}  retries {}  OOMs {}  host waits {}\n",
                     s.num_allocs, s.num_frees, s.cache_hits, s.provider_calls, s.num_retries, s.num_ooms,
                     s.host_waits);
  out += fmt::format("  largest free block {}  fragmentation {:.3f} (at peak reserved {:.3f})  peak reserved / peak "
                     "requested {:.3f}\n",
                     format_bytes(s.largest_free_block), s.fragmentation, s.fragmentation_at_peak,
                     s.peak_overhead_ratio());
  return out;
}

uint64_t parse_size(const std::string& text, const char* what) {
  const char* expected = "a whole number of bytes with an optional unit: B, KiB, MiB, GiB, TiB (or kB, MB, GB, TB), "
                         "e.g. 16GiB or 512MiB";
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  AF_CHECK(i > 0, "{}: '{}' is not a size; expected {}", what, text, expected);
  uint64_t value = 0;
  for (size_t k = 0; k < i; ++k) {
    const uint64_t d = static_cast<uint64_t>(text[k] - '0');
    AF_CHECK(value <= (std::numeric_limits<uint64_t>::max() - d) / 10, "{}: '{}' is too large", what, text);
    value = value * 10 + d;
  }
  const std::string unit = text.substr(i);
  struct Unit {
    const char* name;
    uint64_t factor;
  };
  static const Unit units[] = {{"", 1},
                               {"B", 1},
                               {"KiB", uint64_t{1} << 10},
                               {"MiB", uint64_t{1} << 20},
                               {"GiB", uint64_t{1} << 30},
                               {"TiB", uint64_t{1} << 40},
                               {"kB", 1000},
                               {"MB", 1000 * 1000},
                               {"GB", 1000 * 1000 * 1000},
                               {"TB", uint64_t{1000} * 1000 * 1000 * 1000}};
  for (const Unit& u : units) {
    if (unit == u.name) {
      AF_CHECK(value <= std::numeric_limits<uint64_t>::max() / u.factor, "{}: '{}' is too large", what, text);
      // Sizes past 2^60 bytes (1 EiB) are not memory anyone has; they are typos.
      AF_CHECK(value * u.factor <= (uint64_t{1} << 60), "{}: '{}' is absurdly large (more than 1 EiB)", what, text);
      return value * u.factor;
    }
  }
  AF_THROW(InvalidArgument, "{}: '{}' has an unknown unit '{}'; expected {}", what, text, unit, expected);
}

}  // namespace ampforge::memory
