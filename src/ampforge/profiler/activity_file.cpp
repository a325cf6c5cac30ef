#include "ampforge/profiler/activity_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "ampforge/util/error.h"

namespace ampforge::profiler {

namespace {

constexpr const char* kHeader = "ampforge-activity 1";

std::string clean(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return out;
}

// Splits into at most `n` fields; the last keeps the rest of the line (names with spaces).
std::vector<std::string> split(const std::string& line, size_t n) {
  std::vector<std::string> f;
  size_t pos = 0;
  while (f.size() + 1 < n) {
    size_t tab = line.find('\t', pos);
    if (tab == std::string::npos) break;
    f.push_back(line.substr(pos, tab - pos));
    pos = tab + 1;
  }
  f.push_back(line.substr(pos));
  return f;
}

int64_t to_i64(const std::string& s) {
  size_t used = 0;
  long long v = std::stoll(s, &used);
  if (used != s.size()) throw std::invalid_argument(s);
  return v;
}

bool copy_kind_from_name(const std::string& s, CopyKind* out) {
  for (int i = 0; i <= static_cast<int>(CopyKind::PtoP); ++i)
    if (s == copy_kind_name(static_cast<CopyKind>(i))) {
      *out = static_cast<CopyKind>(i);
      return true;
    }
  return false;
}

}  // namespace

void write_activity_file(const ProfileData& d, const std::string& path) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) AF_THROW(Io, "cannot write the activity file '{}': {}", path, std::strerror(errno));
  f << kHeader << '\n';
  for (const auto& [b, e] : d.windows) f << fmt::format("W\t{}\t{}\n", b, e);
  for (const auto& [tid, name] : d.thread_names) f << fmt::format("T\t{}\t{}\n", tid, clean(name));
  for (const HostRange& r : d.ranges)
    f << fmt::format("R\t{}\t{}\t{}\t{}\t{}\t{}\n", r.tid, range_kind_name(r.kind), r.begin_ns, r.end_ns,
                     r.correlation_id, clean(r.name));
  for (const DeviceActivity& a : d.activities) {
    switch (a.kind) {
      case ActivityKind::Kernel:
        f << fmt::format("K\t{}\t{}\t{}\t{}\t{}\t{}\n", a.device, a.stream, a.begin_ns, a.end_ns, a.correlation_id,
                         clean(a.name));
        break;
      case ActivityKind::Memcpy:
        f << fmt::format("M\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n", a.device, a.stream, a.begin_ns, a.end_ns,
                         a.correlation_id, a.bytes, copy_kind_name(a.copy));
        break;
      case ActivityKind::Memset:
        f << fmt::format("S\t{}\t{}\t{}\t{}\t{}\t{}\n", a.device, a.stream, a.begin_ns, a.end_ns, a.correlation_id,
                         a.bytes);
        break;
    }
  }
  for (const CounterSample& c : d.counters) f << fmt::format("C\t{}\t{}\t{}\n", c.ts_ns, c.value, clean(c.name));
  if (d.memory.valid)
    f << fmt::format("P\t{}\t{}\t{}\t{}\n", d.memory.peak_allocated, d.memory.peak_reserved, d.memory.fragmentation,
                     clean(d.memory.source));
  if (!d.device_note.empty()) f << "N\t" << clean(d.device_note) << '\n';
  f.flush();
  if (!f) AF_THROW(Io, "error while writing the activity file '{}': {}", path, std::strerror(errno));
}

ProfileData read_activity_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) AF_THROW(Io, "cannot open the activity file '{}': {}", path, std::strerror(errno));
  std::string line;
  if (!std::getline(f, line) || line != kHeader)
    AF_THROW(InvalidArgument, "'{}' is not an ampforge activity file (first line '{}', expected '{}')", path, line,
             kHeader);
  ProfileData d;
  std::unordered_map<uint32_t, int64_t> corr_tid;  // from I lines
  std::vector<size_t> api_like;                     // indices of ranges whose tid I lines may override
  int64_t began = -1, ended = -1, dropped = 0, bad = 0;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    try {
      const char tag = line[0];
      if (line.size() < 2 || line[1] != '\t') throw std::invalid_argument("tag");
      const std::string rest = line.substr(2);
      switch (tag) {
        case 'B': began = to_i64(rest); d.device_observed = true; break;
        case 'E': ended = to_i64(rest); break;
        case 'D': dropped += to_i64(rest); break;
        case 'N': d.device_note = rest; break;
        case 'W': {
          auto v = split(rest, 2);
          if (v.size() != 2) throw std::invalid_argument("W");
          d.windows.emplace_back(to_i64(v[0]), to_i64(v[1]));
          break;
        }
        case 'T': {
          auto v = split(rest, 2);
          if (v.size() != 2) throw std::invalid_argument("T");
          d.thread_names[to_i64(v[0])] = v[1];
          break;
        }
        case 'I': {
          auto v = split(rest, 2);
          if (v.size() != 2) throw std::invalid_argument("I");
          corr_tid[static_cast<uint32_t>(to_i64(v[0]))] = to_i64(v[1]);
          break;
        }
        case 'R': {
          auto v = split(rest, 6);
          HostRange r;
          if (v.size() != 6 || !range_kind_from_name(v[1], &r.kind)) throw std::invalid_argument("R");
          r.tid = to_i64(v[0]);
          r.begin_ns = to_i64(v[2]);
          r.end_ns = to_i64(v[3]);
          r.correlation_id = static_cast<uint32_t>(to_i64(v[4]));
          r.name = v[5];
          d.ranges.push_back(std::move(r));
          break;
        }
        case 'A':
        case 'Y': {
          auto v = split(rest, 5);
          if (v.size() != 5) throw std::invalid_argument("A/Y");
          HostRange r;
          r.kind = tag == 'A' ? RangeKind::CudaApi : RangeKind::Sync;
          r.tid = to_i64(v[0]);
          r.begin_ns = to_i64(v[1]);
          r.end_ns = to_i64(v[2]);
          r.correlation_id = static_cast<uint32_t>(to_i64(v[3]));
          r.name = v[4];
          api_like.push_back(d.ranges.size());
          d.ranges.push_back(std::move(r));
          break;
        }
        case 'K':
        case 'M':
        case 'S': {
          const size_t n = tag == 'M' ? 7 : 6;
          auto v = split(rest, n);
          if (v.size() != n) throw std::invalid_argument("K/M/S");
          DeviceActivity a;
          a.kind = tag == 'K' ? ActivityKind::Kernel : tag == 'M' ? ActivityKind::Memcpy : ActivityKind::Memset;
          a.device = static_cast<int32_t>(to_i64(v[0]));
          a.stream = to_i64(v[1]);
          a.begin_ns = to_i64(v[2]);
          a.end_ns = to_i64(v[3]);
          a.correlation_id = static_cast<uint32_t>(to_i64(v[4]));
          if (tag == 'K') a.name = v[5];
          else a.bytes = to_i64(v[5]);
          if (tag == 'M' && !copy_kind_from_name(v[6], &a.copy)) throw std::invalid_argument("copy kind");
          if (a.end_ns < a.begin_ns) throw std::invalid_argument("end < begin");
          d.activities.push_back(std::move(a));
          break;
        }
        case 'C': {
          auto v = split(rest, 3);
          if (v.size() != 3) throw std::invalid_argument("C");
          d.counters.push_back({v[2], to_i64(v[0]), std::stod(v[1])});
          break;
        }
        case 'P': {
          auto v = split(rest, 4);
          if (v.size() != 4) throw std::invalid_argument("P");
          d.memory = {true, v[3], to_i64(v[0]), to_i64(v[1]), std::stod(v[2])};
          break;
        }
        default: throw std::invalid_argument("unknown tag");
      }
    } catch (const std::exception&) {
      ++bad;  // a truncated last line (the writer was killed) or a foreign line: keep the rest
    }
  }
  for (size_t i : api_like)
    if (auto it = corr_tid.find(d.ranges[i].correlation_id); it != corr_tid.end()) d.ranges[i].tid = it->second;
  if (d.windows.empty() && began >= 0) {
    if (ended < began) {  // no E line: the process ended without stopping CUPTI; end at the last record
      ended = began;
      for (const auto& r : d.ranges) ended = std::max(ended, r.end_ns);
      for (const auto& a : d.activities) ended = std::max(ended, a.end_ns);
    }
    d.windows.emplace_back(began, ended);
  }
  if (dropped > 0 || bad > 0) {
    std::string note = fmt::format("{} activity records dropped by CUPTI, {} unreadable lines in {}", dropped, bad, path);
    d.device_note = d.device_note.empty() ? note : d.device_note + "; " + note;
  }
  return d;
}

}  // namespace ampforge::profiler
