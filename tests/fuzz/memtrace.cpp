// Fuzzes memory traces (`ampforge memory replay TRACE`): the strict parser, then what a parsed trace is
// used for, a replay under each policy on a simulated 1 GiB device (arbitrary allocation and free orders
// through the caching allocator), and the snapshot summary of the result. Property: a parsed trace writes
// and parses back to the same events.
#include <sstream>

#include "ampforge/memory/report.h"
#include "ampforge/memory/trace.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;
using namespace ampforge::memory;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Trace t;
  try {
    std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
    t = trace_parse(in, "fuzz");
  } catch (const Error&) {
    return 0;
  }
  std::ostringstream out;
  trace_write(t, out);
  std::istringstream back(out.str());
  const Trace u = trace_parse(back, "rewritten");
  FUZZ_CHECK(u.events.size() == t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    const TraceEvent &a = t.events[i], &b = u.events[i];
    FUZZ_CHECK(a.kind == b.kind && a.id == b.id && a.bytes == b.bytes && a.stream == b.stream, "event %zu", i);
  }
  ReplayOptions opt;
  opt.budget = uint64_t{1} << 30;
  opt.keep_snapshot = true;
  for (const char* policy : {"ampforge", "pytorch", "naive"}) {
    const ReplayResult r = trace_replay(t, PolicyConfig::by_name(policy), opt);
    FUZZ_CHECK(r.failed || r.events == static_cast<int64_t>(t.events.size()), "%s replayed %lld of %zu events",
               policy, static_cast<long long>(r.events), t.events.size());
    (void)snapshot_summary(r.snapshot);
    (void)replay_result_to_json(r).dump();
  }
  return 0;
}
