// Traces: strict parsing (errors name the line), size parsing, and replay of the committed traces
// (tests/data/memtrace/), where the ampforge policy must keep peak reserved <= 1.05 x peak live.
#include "ampforge/memory/trace.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "ampforge/memory/synthetic.h"
#include "ampforge/util/error.h"

namespace ampforge::memory {
namespace {

Trace parse(const std::string& body) {
  std::istringstream in("# ampforge-memtrace v1\n" + body);
  return trace_parse(in, "t.txt");
}

std::string parse_error(const std::string& body) {
  try {
    parse(body);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << body;
  return "";
}

TEST(Trace, ParsesEventsCommentsAndBlankLines) {
  const Trace t = parse("# a comment\n\na 1 1024 0\na 2 0 3\ns\nf 1\n  f 2  \na 1 7 0\nf 1\n");
  ASSERT_EQ(t.events.size(), 7u);
  EXPECT_EQ(t.events[0].line, 4);
  EXPECT_EQ(t.events[1].stream, 3u);
  EXPECT_EQ(t.events[2].kind, TraceEvent::Step);
  EXPECT_EQ(t.events[5].id, 1u) << "a freed id may be used again";
}

// `e` (torch.cuda.empty_cache()): every policy gives its cached memory back there, so a later request needs new
// memory where it would have reused the cache; written back as it was read.
TEST(Trace, EmptyCacheGivesTheCachedMemoryBack) {
  const std::string body = "a 1 8388608 0\nf 1\ne\na 2 8388608 0\n";
  const Trace t = parse(body);
  ASSERT_EQ(t.events.size(), 4u);
  EXPECT_EQ(t.events[2].kind, TraceEvent::EmptyCache);
  std::vector<std::pair<int64_t, int64_t>> log;
  ReplayOptions o;
  o.segment_log = &log;
  const ReplayResult r = trace_replay(t, PolicyConfig::pytorch(), o);
  const int64_t seg = int64_t{20} << 20;  // 1-10 MiB requests take 20 MiB segments
  ASSERT_GE(log.size(), 3u);
  log.resize(3);  // then the allocator's teardown gives the last segment back
  EXPECT_EQ(log, (std::vector<std::pair<int64_t, int64_t>>{{0, seg}, {2, -seg}, {3, seg}}));
  EXPECT_EQ(r.peak_reserved, seg);
  EXPECT_EQ(r.stats.reserved.current, seg);
  std::ostringstream out;
  trace_write(t, out);
  EXPECT_EQ(out.str(), "# ampforge-memtrace v1\n" + body);
}

TEST(Trace, MalformedLinesNameTheLine) {
  EXPECT_NE(parse_error("a 1 10 0\nx 2\n").find("t.txt:3: unknown event 'x'"), std::string::npos);
  EXPECT_NE(parse_error("a 1 10 0\nf 2\n").find("t.txt:3: free of id 2, which is not live"), std::string::npos);
  EXPECT_NE(parse_error("a 1 10 0\na 1 20 0\n").find("t.txt:3: allocation id 1 is already live"), std::string::npos);
  EXPECT_NE(parse_error("a 1 -5 0\n").find("t.txt:2: size '-5' is not an unsigned decimal integer"),
            std::string::npos);
  EXPECT_NE(parse_error("a 1 1e9 0\n").find("t.txt:2: size '1e9'"), std::string::npos);
  EXPECT_NE(parse_error("a 1 99999999999999999999999 0\n").find("t.txt:2: size 99999999999999999999999 is out of range"),
            std::string::npos);
  EXPECT_NE(parse_error("a 1 17592186044417 0\n").find("out of range"), std::string::npos) << "2^44 + 1 bytes";
  EXPECT_NE(parse_error("a 1 10\n").find("t.txt:2: 'a' takes 3 fields"), std::string::npos);
  EXPECT_NE(parse_error("f 1 2\n").find("t.txt:2: 'f' takes 1 field"), std::string::npos);
  EXPECT_NE(parse_error("s 3\n").find("t.txt:2: 's' takes no fields"), std::string::npos);
  EXPECT_NE(parse_error("e 1\n").find("t.txt:2: 'e' takes no fields"), std::string::npos);
  EXPECT_NE(parse_error("a 1 10 70000\n").find("stream 70000 is out of range"), std::string::npos);
  std::istringstream no_header("a 1 10 0\n");
  try {
    trace_parse(no_header, "n.txt");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n.txt:1: expected the header line"), std::string::npos) << e.what();
  }
}

TEST(Trace, SizesWithUnitsAreParsedStrictly) {
  EXPECT_EQ(parse_size("16GiB"), uint64_t{16} << 30);
  EXPECT_EQ(parse_size("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(parse_size("4KiB"), 4096u);
  EXPECT_EQ(parse_size("1TiB"), uint64_t{1} << 40);
  EXPECT_EQ(parse_size("16GB"), uint64_t{16} * 1000 * 1000 * 1000);
  EXPECT_EQ(parse_size("1000"), 1000u);
  EXPECT_EQ(parse_size("7B"), 7u);
  for (const char* bad : {"16GB?", "-1", "1e99", "", " 16GiB", "16 GiB", "1.5GiB", "GiB", "16gib", "16G",
                          "99999999999999999999", "99999999999GiB", "+5", "0x10"}) {
    EXPECT_THROW(parse_size(bad, "--budget"), Error) << bad;
  }
  try {
    parse_size("16GB?", "--budget");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--budget: '16GB?' has an unknown unit"), std::string::npos) << e.what();
  }
}

TEST(Trace, WriteThenParseRoundTrips) {
  SyntheticOptions o;
  o.steps = 2;
  o.scale = 0.1;
  const Trace t = synthetic_cnn(o);
  std::stringstream s;
  trace_write(t, s, "round trip");
  const Trace back = trace_parse(s, "rt");
  ASSERT_EQ(back.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(back.events[i].kind, t.events[i].kind);
    EXPECT_EQ(back.events[i].id, t.events[i].id);
    EXPECT_EQ(back.events[i].bytes, t.events[i].bytes);
  }
}

std::vector<std::string> committed_traces() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(std::string(AMPFORGE_TEST_DATA_DIR) + "/memtrace"))
    if (e.path().extension() == ".txt") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Trace, CommittedTracesStayWithin5PercentOfPeakLive) {
  const auto files = committed_traces();
  ASSERT_GE(files.size(), 2u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const Trace t = trace_read(f);
    const ReplayResult naive = trace_replay(t, PolicyConfig::naive());
    const ReplayResult torch = trace_replay(t, PolicyConfig::pytorch());
    const ReplayResult ours = trace_replay(t, PolicyConfig::ampforge());
    std::cout << std::filesystem::path(f).filename().string() << ": peak live " << format_bytes(ours.peak_live)
              << "; peak reserved / peak live: pytorch " << torch.ratio << ", ampforge " << ours.ratio << ", naive "
              << naive.ratio << "\n";
    EXPECT_EQ(naive.peak_live, ours.peak_live);
    EXPECT_EQ(torch.peak_live, ours.peak_live);
    EXPECT_GE(ours.ratio, 1.0);
    EXPECT_LE(ours.ratio, 1.05);
    EXPECT_FALSE(ours.failed);
    int64_t allocs = 0, frees = 0;
    for (const TraceEvent& e : t.events) {
      allocs += e.kind == TraceEvent::Alloc;
      frees += e.kind == TraceEvent::Free;
    }
    EXPECT_EQ(ours.stats.num_allocs, allocs);
    EXPECT_EQ(ours.stats.num_frees, frees);
  }
}

// Random mixes (synthetic.h), seeds 1-8: the ampforge policy stays within 1.05x of peak live from a tenth of full
// size (peak live 142 MiB for varlen, ~0.4 GiB for many-sizes) to a quarter. At a tenth one 2 MiB granule is 1.4% of
// varlen's peak: it holds only because placement sees the free space as it is (held blocks given back first) and
// small blocks fill the unused ends of large blocks' granules; without either, varlen at a tenth needs 1.07-1.10
// (docs/MEMORY.md, "Random mixes and the 1.05 bound").
TEST(Trace, RandomMixesStayWithin5PercentOfPeakLive) {
  for (const double scale : {0.1, 0.15, 0.2, 0.25}) {
    for (const std::string name : {"many-sizes", "varlen", "cnn"}) {
      for (uint64_t seed = 1; seed <= 8; ++seed) {
        SyntheticOptions o;
        o.scale = scale;
        o.seed = seed;
        const ReplayResult r = trace_replay(synthetic_trace(name, o), PolicyConfig::ampforge());
        const std::string what = fmt::format("{} scale {} seed {}", name, scale, seed);  // shortest form: 0.1
        EXPECT_LE(r.ratio, 1.05) << what << ": peak live " << r.peak_live << ", reserved " << r.peak_reserved;
        EXPECT_GE(r.ratio, 1.0) << what;
      }
    }
  }
}

TEST(Trace, BudgetBetweenThePoliciesFailsOnlyPytorch) {
  const Trace t = trace_read(std::string(AMPFORGE_TEST_DATA_DIR) + "/memtrace/varlen.txt");
  const ReplayResult ours = trace_replay(t, PolicyConfig::ampforge());
  const ReplayResult torch = trace_replay(t, PolicyConfig::pytorch());
  ASSERT_LT(ours.peak_reserved, torch.peak_reserved);
  ReplayOptions o;
  o.budget = static_cast<uint64_t>(ours.peak_reserved + (torch.peak_reserved - ours.peak_reserved) / 4);
  const ReplayResult ours_b = trace_replay(t, PolicyConfig::ampforge(), o);
  const ReplayResult torch_b = trace_replay(t, PolicyConfig::pytorch(), o);
  EXPECT_FALSE(ours_b.failed) << ours_b.oom_report;
  ASSERT_TRUE(torch_b.failed);
  EXPECT_GT(torch_b.failed_line, 1);
  EXPECT_NE(torch_b.oom_report.find("largest free block"), std::string::npos);
  EXPECT_EQ(torch_b.stats.num_ooms, 1);
}

}  // namespace
}  // namespace ampforge::memory
