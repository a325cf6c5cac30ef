// Fuzzes YOLO label files (`class cx cy w h` per line, from users' data sets). Property: every box
// accepted is a valid class with coordinates in [0, 1] and a positive size.
#include <cmath>

#include "ampforge/data/yolo_dataset.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile in("labels");
  try {
    for (const data::DetectionBox& b : data::read_yolo_labels(in.write(data, size), 80)) {
      FUZZ_CHECK(b.cls >= 0 && b.cls < 80);
      for (float v : {b.cx, b.cy, b.w, b.h}) FUZZ_CHECK(std::isfinite(v) && v >= 0 && v <= 1);
      FUZZ_CHECK(b.w > 0 && b.h > 0);
    }
  } catch (const Error&) {
  }
  return 0;
}
