// Image files: JPEG (libjpeg-turbo through the libjpeg API) and PNG (libpng) decoded into 8-bit RGB.
//
// What decoding promises:
//  - The result is always 8-bit RGB, (height, width, 3) interleaved, rows top to bottom.
//  - JPEG: grayscale is replicated to RGB (libjpeg's color conversion); CMYK/YCCK is converted with
//    R = (255 - C)(255 - K) / 255 (likewise G, B) from Adobe's inverted convention when the file has the
//    Adobe marker (what Photoshop writes), from plain ink values otherwise. 12-bit JPEGs are refused.
//    A file that ends before its image data does (libjpeg's "premature end of JPEG file") is an error;
//    libjpeg's other recoverable warnings (e.g. extraneous bytes before a marker) are not.
//  - PNG: palette and 1/2/4-bit grayscale are expanded, grayscale replicated to RGB, alpha (and tRNS)
//    dropped as PIL's convert("RGB") does, 16-bit samples reduced to 8 bits with rounding
//    (libpng's png_set_scale_16: v * 255 / 65535), gamma chunks ignored (as PIL does).
//  - The format comes from the first bytes, not the file name.
//  - Every failure is an Error(Io) whose message names the file and says what was wrong. libjpeg's and
//    libpng's errors are caught with their setjmp/longjmp contract (image.cpp explains how), so a corrupt
//    file never exits or aborts the process. Thread-safe: every call has its own decoder state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ampforge::data {

// An 8-bit image: (height, width, channels) interleaved, rows top to bottom. Decoders return channels = 3.
struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;  // (H, W, C)

  Image() = default;
  Image(int64_t h, int64_t w, int64_t c) : height(h), width(w), channels(c), pixels(static_cast<size_t>(h * w * c)) {}
  uint8_t* at(int64_t y, int64_t x) { return pixels.data() + (y * width + x) * channels; }
  const uint8_t* at(int64_t y, int64_t x) const { return pixels.data() + (y * width + x) * channels; }
};

enum class ImageFormat { Unknown, Jpeg, Png };

// The format from the magic bytes (JPEG: FF D8 FF; PNG: the 8-byte signature); Unknown otherwise.
ImageFormat sniff_image_format(const uint8_t* data, size_t size);

struct ImageInfo {
  ImageFormat format = ImageFormat::Unknown;
  int64_t height = 0, width = 0;  // of the full-size image
};

// Reads only the header. `name` (a file name) appears in error messages.
ImageInfo read_image_info(const uint8_t* data, size_t size, const std::string& name);

// Decodes a JPEG or PNG held in memory into 8-bit RGB. `scale_denom` (1, 2, 4 or 8) lets a JPEG be decoded
// at 1/scale_denom of its size by libjpeg's DCT scaling (each side rounded up), which is several times
// faster than decoding in full and resampling; PNGs are always decoded in full.
Image decode_image(const uint8_t* data, size_t size, const std::string& name, int scale_denom = 1);

// The whole file; Error(Io) naming it if it is missing or unreadable.
std::vector<uint8_t> read_file_bytes(const std::string& path);

// read_file_bytes + decode_image.
Image decode_image_file(const std::string& path, int scale_denom = 1);

}  // namespace ampforge::data
