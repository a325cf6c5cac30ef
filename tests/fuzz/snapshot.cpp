// Fuzzes memory snapshot files (`ampforge memory snapshot FILE`): the reader's checks, then the summary,
// SVG and HTML renderers on what it accepts.
#include "ampforge/memory/report.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile in("snapshot");
  nlohmann::json s;
  try {
    s = memory::snapshot_read(in.write(data, size));
  } catch (const Error&) {
    return 0;
  }
  (void)memory::snapshot_summary(s);
  (void)memory::snapshot_svg(s);
  (void)memory::snapshot_html(s);
  return 0;
}
