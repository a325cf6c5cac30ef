// Fuzzes PyTorch memory snapshot pickles (`ampforge memory replay|explain snap.pickle`): the data-only pickle
// reader, the snapshot reader, the trace reconstruction of every device, and on what is accepted a replay under
// each snapshot policy on a 1 GiB simulated device plus the oom explanation.
// Property beyond "no crash": a rebuilt trace allocates each id once and frees only what is live.
#include <unordered_set>

#include "ampforge/memory/pickle.h"
#include "ampforge/memory/torch_report.h"
#include "ampforge/memory/torch_snapshot.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  memory::TorchSnapshot snap;
  try {
    snap = memory::torch_snapshot_parse(bytes, "fuzz.pickle");
  } catch (const Error&) {
    return 0;
  }
  for (size_t dev = 0; dev < snap.device_traces.size() && dev < 4; ++dev) {
    memory::TorchReplayInput in;
    try {
      in = memory::torch_trace_build(snap, static_cast<int>(dev));
    } catch (const Error&) {
      continue;
    }
    std::unordered_set<uint64_t> live;
    for (const memory::TraceEvent& e : in.trace.events) {
      if (e.kind == memory::TraceEvent::Alloc && (e.flags & memory::TraceEvent::kProbe) == 0) {
        FUZZ_CHECK(live.insert(e.id).second, "id %llu allocated twice", static_cast<unsigned long long>(e.id));
      } else if (e.kind == memory::TraceEvent::Free) {
        FUZZ_CHECK(live.erase(e.id) == 1, "free of id %llu that is not live", static_cast<unsigned long long>(e.id));
      }
    }
    if (in.trace.events.size() > 2000) continue;  // keep each input fast
    for (const std::string& p : memory::torch_policy_names()) {
      memory::ReplayOptions o;
      o.budget = uint64_t{1} << 30;
      (void)memory::trace_replay(in.trace, memory::torch_policy_by_name(p, snap.settings), o);
    }
    if (in.ooms.size() <= 2) (void)memory::torch_explain(snap, in);
  }
  return 0;
}
