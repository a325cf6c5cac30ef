// Fuzzes image decoding (JPEG through libjpeg-turbo, PNG through libpng, as the image-folder data sets
// read users' files), at full size and with libjpeg's reduced-size decoding. Properties: the header's size
// is the decoded size (scaled), pixels are 8-bit RGB of exactly width x height x 3 bytes.
#include "ampforge/data/image.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int scale = 1 << (data[0] % 4);  // 1, 2, 4, 8
  ++data;
  --size;
  try {
    const data::ImageInfo info = data::read_image_info(data, size, "fuzz");
    // Refuse what would take long to decode (a 1 KiB file may claim 65535 x 65535): the decoder's own
    // limits are what is fuzzed, not the machine's memory.
    if (static_cast<uint64_t>(info.width) * static_cast<uint64_t>(info.height) > (uint64_t{1} << 22)) return 0;
    const data::Image img = data::decode_image(data, size, "fuzz", scale);
    FUZZ_CHECK(img.width > 0 && img.height > 0);
    FUZZ_CHECK(img.pixels.size() == static_cast<size_t>(img.width) * static_cast<size_t>(img.height) * 3);
    if (scale == 1) FUZZ_CHECK(img.width == info.width && img.height == info.height);
  } catch (const Error&) {
  }
  return 0;
}
