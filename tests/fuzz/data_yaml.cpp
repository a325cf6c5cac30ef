// Fuzzes the detection data file (Ultralytics' data.yaml subset: path, train, val, nc, names). Property:
// an accepted file names at least one class and both splits.
#include "ampforge/data/yolo_dataset.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile in("data.yaml");
  try {
    const data::DetectionDataSpec s = data::read_detection_data_file(in.write(data, size));
    FUZZ_CHECK(!s.names.empty() && !s.train.empty() && !s.val.empty());
  } catch (const Error&) {
  }
  return 0;
}
