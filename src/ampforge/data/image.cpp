// JPEG and PNG decoding (contract in image.h).
//
// Both libraries report fatal errors by longjmp: libpng always (png_error jumps to png_jmpbuf), libjpeg
// through the error_exit hook we install (its default prints and calls exit()). The C++ rule for
// setjmp/longjmp is that a jump is defined only if replacing it by throw/catch would run no non-trivial
// destructor. So every call into a library goes through a small "guarded" function that sets the jump point
// and holds only trivially destructible locals; it returns false after a jump. The objects with destructors
// (the decoder state, which frees the library's structs, and the output buffers) live in the callers, which
// turn a false into an Error naming the file.
#include "ampforge/data/image.h"

#include <png.h>  // first: it includes <setjmp.h> itself

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <jerror.h>
#include <jpeglib.h>

#include "ampforge/util/error.h"

namespace ampforge::data {

namespace {

// Refuse images whose decoded size would be absurd (a corrupt or hostile header): 2^28 pixels is 768 MiB
// of RGB, far beyond any training image.
constexpr int64_t kMaxPixels = int64_t{1} << 28;

void check_dimensions(int64_t h, int64_t w, const std::string& name) {
  if (h <= 0 || w <= 0) AF_THROW(Io, "image '{}' declares an empty size ({} x {})", name, w, h);
  if (h * w > kMaxPixels)
    AF_THROW(Io, "image '{}' declares {} x {} pixels, over the limit of {} pixels (corrupt header?)", name, w, h,
             kMaxPixels);
}

// ---------------------------------------------------------------------------------------------- JPEG

struct JpegErrors {
  jpeg_error_mgr mgr;  // first member: libjpeg hands back &mgr, which we cast to JpegErrors*
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool image_complete;  // every scanline has been read: a missing end marker no longer matters
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  cinfo->err->format_message(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  // libjpeg treats running out of data as a warning and fills the rest of the image with gray. A truncated
  // file is an error for us (a training set should not silently hold half-gray images).
  if (cinfo->err->msg_code == JWRN_JPEG_EOF && !e->image_complete) {
    std::snprintf(e->message, sizeof e->message, "the file is truncated (libjpeg: premature end of JPEG file)");
    std::longjmp(e->jump, 1);
  }
  ++cinfo->err->num_warnings;  // recoverable corruption (e.g. extraneous bytes before a marker): decoded as is
}

struct JpegDecoder {
  jpeg_decompress_struct cinfo{};
  JpegErrors err{};
  bool created = false;
  JpegDecoder() = default;
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  // Safe after any error, and after a failed create: the struct starts zeroed, and jpeg_destroy frees
  // nothing when the memory manager was never set up.
  ~JpegDecoder() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// Guarded: creates the decompressor over the bytes and reads the header; with scale_denom > 0 also picks the
// output color space and scaling and computes the output size.
bool jpeg_start_guarded(JpegDecoder* d, const uint8_t* data, size_t size, int scale_denom) {
  d->cinfo.err = jpeg_std_error(&d->err.mgr);
  d->err.mgr.error_exit = jpeg_on_error;
  d->err.mgr.emit_message = jpeg_on_message;
  if (setjmp(d->err.jump)) return false;
  d->created = true;
  jpeg_create_decompress(&d->cinfo);
  jpeg_mem_src(&d->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d->cinfo, TRUE);
  if (scale_denom <= 0) return true;
  d->cinfo.scale_num = 1;
  d->cinfo.scale_denom = static_cast<unsigned int>(scale_denom);
  // CMYK/YCCK cannot be converted to RGB by libjpeg: decode as CMYK and convert afterwards.
  d->cinfo.out_color_space =
      (d->cinfo.jpeg_color_space == JCS_CMYK || d->cinfo.jpeg_color_space == JCS_YCCK) ? JCS_CMYK : JCS_RGB;
  jpeg_calc_output_dimensions(&d->cinfo);
  return true;
}

// Guarded: decodes every scanline into out (output_height rows of row_bytes).
bool jpeg_decompress_guarded(JpegDecoder* d, uint8_t* out, size_t row_bytes) {
  if (setjmp(d->err.jump)) return false;
  jpeg_start_decompress(&d->cinfo);
  while (d->cinfo.output_scanline < d->cinfo.output_height) {
    JSAMPROW rows[8];
    const JDIMENSION first = d->cinfo.output_scanline;
    const JDIMENSION n = std::min<JDIMENSION>(8, d->cinfo.output_height - first);
    for (JDIMENSION k = 0; k < n; ++k) rows[k] = out + (first + k) * row_bytes;
    jpeg_read_scanlines(&d->cinfo, rows, n);
  }
  d->err.image_complete = true;
  jpeg_finish_decompress(&d->cinfo);
  return true;
}

[[noreturn]] void jpeg_fail(const JpegDecoder& d, const std::string& name) {
  AF_THROW(Io, "cannot decode JPEG '{}': {}", name, d.err.message);
}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name, int scale_denom) {
  JpegDecoder d;
  if (!jpeg_start_guarded(&d, data, size, scale_denom)) jpeg_fail(d, name);
  const int64_t h = d.cinfo.output_height, w = d.cinfo.output_width, c = d.cinfo.output_components;
  check_dimensions(d.cinfo.image_height, d.cinfo.image_width, name);
  AF_ASSERT(c == 3 || c == 4, "JPEG '{}': libjpeg gives {} output components", name, c);
  Image img(h, w, 3);
  std::vector<uint8_t> cmyk;
  if (c == 4) cmyk.resize(static_cast<size_t>(h * w * 4));
  uint8_t* out = c == 4 ? cmyk.data() : img.pixels.data();
  if (!jpeg_decompress_guarded(&d, out, static_cast<size_t>(w * c))) jpeg_fail(d, name);
  if (c == 4) {
    // Adobe (Photoshop) CMYK JPEGs store 255 - ink; then the value itself is the "paper left" factor.
    const bool inverted = d.cinfo.saw_Adobe_marker;
    for (int64_t p = 0; p < h * w; ++p) {
      const uint8_t* s = cmyk.data() + p * 4;
      const int k = inverted ? s[3] : 255 - s[3];
      for (int ch = 0; ch < 3; ++ch) {
        const int v = inverted ? s[ch] : 255 - s[ch];
        img.pixels[static_cast<size_t>(p * 3 + ch)] = static_cast<uint8_t>((v * k + 127) / 255);
      }
    }
  }
  return img;
}

// ----------------------------------------------------------------------------------------------- PNG

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  char message[256] = "unknown libpng error";
  PngReader() = default;
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;
  ~PngReader() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

void png_on_error(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", msg);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // recoverable (e.g. a known-incorrect sRGB profile)

void png_read_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->size - r->pos) png_error(png, "the file is truncated (it ends inside a chunk)");
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}

// Guarded: reads the signature and the chunks before the image data.
bool png_read_header_guarded(PngReader* r) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_set_read_fn(r->png, r, png_read_memory);
  png_read_info(r->png, r->info);
  return true;
}

// Guarded: asks libpng for 8-bit RGB rows whatever the file holds (image.h lists the conversions).
bool png_setup_rgb8_guarded(PngReader* r) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  const int color = png_get_color_type(r->png, r->info), depth = png_get_bit_depth(r->png, r->info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r->png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(r->png);
  if (depth == 16) png_set_scale_16(r->png);
  png_set_strip_alpha(r->png);  // also drops the alpha that palette expansion makes from tRNS
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(r->png);
  png_set_interlace_handling(r->png);
  png_read_update_info(r->png, r->info);
  return true;
}

// Guarded: decodes every row (all passes when interlaced).
bool png_read_rows_guarded(PngReader* r, png_bytep* rows) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_read_image(r->png, rows);
  return true;
}

// The reader with its header read; Error(Io) naming the file otherwise.
void png_open(PngReader& r, const uint8_t* data, size_t size, const std::string& name) {
  r.data = data;
  r.size = size;
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, png_on_error, png_on_warning);
  if (r.png != nullptr) r.info = png_create_info_struct(r.png);
  if (r.png == nullptr || r.info == nullptr) AF_THROW(Io, "cannot decode PNG '{}': libpng could not start (out of memory?)", name);
  if (!png_read_header_guarded(&r)) AF_THROW(Io, "cannot decode PNG '{}': {}", name, r.message);
}

Image decode_png(const uint8_t* data, size_t size, const std::string& name) {
  PngReader r;
  png_open(r, data, size, name);
  const int64_t h = png_get_image_height(r.png, r.info), w = png_get_image_width(r.png, r.info);
  check_dimensions(h, w, name);
  if (!png_setup_rgb8_guarded(&r)) AF_THROW(Io, "cannot decode PNG '{}': {}", name, r.message);
  const int channels = png_get_channels(r.png, r.info), depth = png_get_bit_depth(r.png, r.info);
  AF_ASSERT(channels == 3 && depth == 8 && png_get_rowbytes(r.png, r.info) == static_cast<size_t>(w * 3),
            "PNG '{}': libpng's conversion gave {} channels of {} bits", name, channels, depth);
  Image img(h, w, 3);
  std::vector<png_bytep> rows(static_cast<size_t>(h));
  for (int64_t y = 0; y < h; ++y) rows[static_cast<size_t>(y)] = img.at(y, 0);
  if (!png_read_rows_guarded(&r, rows.data())) AF_THROW(Io, "cannot decode PNG '{}': {}", name, r.message);
  // The chunks after the image data (png_read_end) are not read: the pixels are complete and zlib has
  // checked their stream; PIL does not look further either.
  return img;
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::Jpeg;
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::Png;
  return ImageFormat::Unknown;
}

namespace {
[[noreturn]] void unknown_format(const uint8_t* data, size_t size, const std::string& name) {
  if (size == 0) AF_THROW(Io, "image file '{}' is empty", name);
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(size, 8); ++i) head += fmt::format("{}{:02x}", i ? " " : "", data[i]);
  AF_THROW(Io, "'{}' is not a JPEG or PNG image: it starts with bytes {} (expected ff d8 ff for JPEG or "
           "89 50 4e 47 0d 0a 1a 0a for PNG)", name, head);
}
}  // namespace

ImageInfo read_image_info(const uint8_t* data, size_t size, const std::string& name) {
  ImageInfo info;
  info.format = sniff_image_format(data, size);
  if (info.format == ImageFormat::Jpeg) {
    JpegDecoder d;
    if (!jpeg_start_guarded(&d, data, size, 0)) jpeg_fail(d, name);
    info.height = d.cinfo.image_height;
    info.width = d.cinfo.image_width;
  } else if (info.format == ImageFormat::Png) {
    PngReader r;
    png_open(r, data, size, name);
    info.height = png_get_image_height(r.png, r.info);
    info.width = png_get_image_width(r.png, r.info);
  } else {
    unknown_format(data, size, name);
  }
  check_dimensions(info.height, info.width, name);
  return info;
}

Image decode_image(const uint8_t* data, size_t size, const std::string& name, int scale_denom) {
  AF_CHECK(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
           "decode_image('{}'): scale_denom must be 1, 2, 4 or 8, got {}", name, scale_denom);
  switch (sniff_image_format(data, size)) {
    case ImageFormat::Jpeg: return decode_jpeg(data, size, name, scale_denom);
    case ImageFormat::Png: return decode_png(data, size, name);
    case ImageFormat::Unknown: break;
  }
  unknown_format(data, size, name);
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) AF_THROW(Io, "file '{}' does not exist", path);
  if (std::filesystem::is_directory(path, ec)) AF_THROW(Io, "'{}' is a directory, expected a file", path);
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) AF_THROW(Io, "cannot open '{}' for reading", path);
  const std::streamoff n = f.tellg();
  if (n < 0) AF_THROW(Io, "cannot tell the size of '{}'", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  f.seekg(0);
  if (n > 0 && !f.read(reinterpret_cast<char*>(bytes.data()), n)) AF_THROW(Io, "read error in '{}'", path);
  return bytes;
}

Image decode_image_file(const std::string& path, int scale_denom) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return decode_image(bytes.data(), bytes.size(), path, scale_denom);
}

}  // namespace ampforge::data
