// JPEG/PNG decoding and ImageFolderDataset, on real files this test writes with libjpeg's and libpng's own
// encoders: pixel values (PNG exact, JPEG close to what was encoded), every PNG color type the decoder
// converts, CMYK and scaled JPEG decoding, errors for corrupt/truncated/non-image files (always an Error
// naming the file, never a crash or exit), class discovery, labels, and loader determinism with decoding
// in the workers.
#include <gtest/gtest.h>
#include <png.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <jpeglib.h>

#include "ampforge/data/data_loader.h"
#include "ampforge/data/image.h"
#include "ampforge/data/image_folder.h"
#include "ampforge/data/transforms.h"

using namespace ampforge;
using namespace ampforge::data;
namespace fs = std::filesystem;

namespace {

fs::path test_root() { return fs::temp_directory_path() / ("ampforge_image_test_" + std::to_string(::getpid())); }

// Removes this process's fixture files when the test program ends.
class RemoveFixtures : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(test_root(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveFixtures = ::testing::AddGlobalTestEnvironment(new RemoveFixtures);

fs::path tmpdir(const std::string& sub) {
  fs::path d = test_root() / sub;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// ---- test-side encoders (the libraries' own)

void write_jpeg(const fs::path& p, int w, int h, int comps, J_COLOR_SPACE cs, const std::vector<uint8_t>& px,
                int quality = 95) {
  ASSERT_EQ(px.size(), static_cast<size_t>(w * h * comps));
  jpeg_compress_struct c;
  jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  FILE* f = std::fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  jpeg_stdio_dest(&c, f);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = comps;
  c.in_color_space = cs;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  for (int i = 0; i < c.num_components; ++i) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;  // 4:4:4
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(px.data() + static_cast<size_t>(c.next_scanline) * w * comps);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::fclose(f);
  jpeg_destroy_compress(&c);
}

struct PngSpec {
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  bool interlace = false;
  std::vector<png_color> palette;
  std::vector<uint8_t> trns;
};

// rows: packed as the PNG stores them (16-bit samples big-endian, low depths packed high bits first).
void write_png(const fs::path& p, int w, int h, const PngSpec& s, const std::vector<uint8_t>& rows) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  FILE* f = std::fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (setjmp(png_jmpbuf(png))) {
    ADD_FAILURE() << "libpng could not write " << p;
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    return;
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), s.bit_depth, s.color_type,
               s.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!s.palette.empty()) png_set_PLTE(png, info, s.palette.data(), static_cast<int>(s.palette.size()));
  if (!s.trns.empty()) png_set_tRNS(png, info, s.trns.data(), static_cast<int>(s.trns.size()), nullptr);
  png_write_info(png, info);
  const size_t row_bytes = rows.size() / static_cast<size_t>(h);
  std::vector<png_bytep> ptrs(static_cast<size_t>(h));
  for (int y = 0; y < h; ++y) ptrs[static_cast<size_t>(y)] = const_cast<uint8_t*>(rows.data() + y * row_bytes);
  png_write_image(png, ptrs.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

std::vector<uint8_t> file_bytes(const fs::path& p) { return read_file_bytes(p.string()); }
void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A smooth RGB test picture whose three channels differ (a channel swap or a BGR decode would show).
std::vector<uint8_t> smooth_rgb(int w, int h) {
  std::vector<uint8_t> px(static_cast<size_t>(w * h * 3));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = px.data() + (y * w + x) * 3;
      p[0] = static_cast<uint8_t>(40 + 160 * x / std::max(w - 1, 1));
      p[1] = static_cast<uint8_t>(200 - 150 * y / std::max(h - 1, 1));
      p[2] = static_cast<uint8_t>(90 + 60 * (x + y) / std::max(w + h - 2, 1));
    }
  return px;
}

struct Diff {
  double mean = 0;
  int max = 0;
};
Diff diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  Diff d;
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const int e = std::abs(int{a[i]} - int{b[i]});
    d.mean += e;
    d.max = std::max(d.max, e);
  }
  d.mean /= static_cast<double>(std::max<size_t>(a.size(), 1));
  return d;
}

void expect_io_error_naming(const fs::path& p, const std::string& what) {
  try {
    decode_image_file(p.string());
    ADD_FAILURE() << "no error for " << p;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
    EXPECT_NE(std::string(e.what()).find(p.filename().string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------ decoding

TEST(ImageDecode, PngEveryColorTypeExact) {
  const fs::path d = tmpdir("png");
  const int W = 7, H = 5;
  // 8-bit RGB, plain and interlaced (Adam7).
  std::vector<uint8_t> rgb(W * H * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  write_png(d / "rgb.png", W, H, {}, rgb);
  PngSpec inter;
  inter.interlace = true;
  write_png(d / "interlaced.png", W, H, inter, rgb);
  for (const char* name : {"rgb.png", "interlaced.png"}) {
    Image img = decode_image_file((d / name).string());
    EXPECT_EQ(img.height, H);
    EXPECT_EQ(img.width, W);
    EXPECT_EQ(img.channels, 3);
    EXPECT_EQ(img.pixels, rgb) << name;
  }
  // RGBA: alpha dropped.
  std::vector<uint8_t> rgba;
  for (size_t p = 0; p < W * H; ++p) {
    rgba.insert(rgba.end(), rgb.begin() + p * 3, rgb.begin() + p * 3 + 3);
    rgba.push_back(static_cast<uint8_t>(p * 9));
  }
  PngSpec rgba_spec;
  rgba_spec.color_type = PNG_COLOR_TYPE_RGB_ALPHA;
  write_png(d / "rgba.png", W, H, rgba_spec, rgba);
  EXPECT_EQ(decode_image_file((d / "rgba.png").string()).pixels, rgb);

  // 8-bit grayscale and gray + alpha: replicated to RGB.
  std::vector<uint8_t> gray(W * H), gray_alpha, gray_rgb;
  for (size_t i = 0; i < gray.size(); ++i) {
    gray[i] = static_cast<uint8_t>(i * 7);
    gray_alpha.push_back(gray[i]);
    gray_alpha.push_back(static_cast<uint8_t>(255 - i));
    gray_rgb.insert(gray_rgb.end(), 3, gray[i]);
  }
  PngSpec g8;
  g8.color_type = PNG_COLOR_TYPE_GRAY;
  write_png(d / "gray.png", W, H, g8, gray);
  EXPECT_EQ(decode_image_file((d / "gray.png").string()).pixels, gray_rgb);
  PngSpec ga;
  ga.color_type = PNG_COLOR_TYPE_GRAY_ALPHA;
  write_png(d / "gray_alpha.png", W, H, ga, gray_alpha);
  EXPECT_EQ(decode_image_file((d / "gray_alpha.png").string()).pixels, gray_rgb);

  // 4-bit grayscale: v -> v * 17 (libpng's expansion to 8 bits).
  {
    const int w4 = 6;
    std::vector<uint8_t> packed, expect;
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < w4; x += 2) {
        const int a = (x + 3 * y) % 16, b = (x + 1 + 5 * y) % 16;
        packed.push_back(static_cast<uint8_t>(a << 4 | b));
        expect.insert(expect.end(), 3, static_cast<uint8_t>(a * 17));
        expect.insert(expect.end(), 3, static_cast<uint8_t>(b * 17));
      }
    PngSpec g4;
    g4.color_type = PNG_COLOR_TYPE_GRAY;
    g4.bit_depth = 4;
    write_png(d / "gray4.png", w4, H, g4, packed);
    EXPECT_EQ(decode_image_file((d / "gray4.png").string()).pixels, expect);
  }

  // Palette, 8-bit and 2-bit, with a tRNS chunk (transparency dropped, colours kept).
  PngSpec pal;
  pal.color_type = PNG_COLOR_TYPE_PALETTE;
  pal.palette = {{255, 0, 0}, {0, 200, 10}, {1, 2, 250}, {90, 91, 92}};
  pal.trns = {0, 128};
  std::vector<uint8_t> idx(W * H), pal_rgb;
  for (size_t i = 0; i < idx.size(); ++i) {
    idx[i] = static_cast<uint8_t>((i * 3 + i / 5) % 4);
    const png_color& c = pal.palette[idx[i]];
    pal_rgb.insert(pal_rgb.end(), {c.red, c.green, c.blue});
  }
  write_png(d / "palette8.png", W, H, pal, idx);
  EXPECT_EQ(decode_image_file((d / "palette8.png").string()).pixels, pal_rgb);
  {
    const int w2 = 8;
    std::vector<uint8_t> packed, expect;
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < w2; x += 4) {
        uint8_t byte = 0;
        for (int k = 0; k < 4; ++k) {
          const int v = (x + k + y) % 4;
          byte = static_cast<uint8_t>(byte | v << (6 - 2 * k));
          const png_color& c = pal.palette[static_cast<size_t>(v)];
          expect.insert(expect.end(), {c.red, c.green, c.blue});
        }
        packed.push_back(byte);
      }
    PngSpec p2 = pal;
    p2.bit_depth = 2;
    write_png(d / "palette2.png", w2, H, p2, packed);
    EXPECT_EQ(decode_image_file((d / "palette2.png").string()).pixels, expect);
  }

  // 16-bit RGB and gray: 257 k + delta (|delta| <= 100) reduces to k, i.e. v * 255 / 65535 rounded.
  std::vector<uint8_t> rgb16, rgb16_expect, gray16, gray16_expect;
  for (int i = 0; i < W * H * 3; ++i) {
    const int k = (i * 41 + 3) % 256, delta = (i * 29) % 201 - 100;
    const int v = std::clamp(257 * k + delta, 0, 65535);
    rgb16.push_back(static_cast<uint8_t>(v >> 8));
    rgb16.push_back(static_cast<uint8_t>(v & 0xff));
    rgb16_expect.push_back(static_cast<uint8_t>(k));
    if (i < W * H) {
      gray16.push_back(static_cast<uint8_t>(v >> 8));
      gray16.push_back(static_cast<uint8_t>(v & 0xff));
      gray16_expect.insert(gray16_expect.end(), 3, static_cast<uint8_t>(k));
    }
  }
  PngSpec s16;
  s16.bit_depth = 16;
  write_png(d / "rgb16.png", W, H, s16, rgb16);
  EXPECT_EQ(decode_image_file((d / "rgb16.png").string()).pixels, rgb16_expect);
  PngSpec g16;
  g16.color_type = PNG_COLOR_TYPE_GRAY;
  g16.bit_depth = 16;
  write_png(d / "gray16.png", W, H, g16, gray16);
  EXPECT_EQ(decode_image_file((d / "gray16.png").string()).pixels, gray16_expect);

  const auto bytes = file_bytes(d / "rgb16.png");
  const ImageInfo info = read_image_info(bytes.data(), bytes.size(), "rgb16.png");
  EXPECT_EQ(info.format, ImageFormat::Png);
  EXPECT_EQ(info.width, W);
  EXPECT_EQ(info.height, H);
}

TEST(ImageDecode, JpegRgbGrayCmykCloseToWhatWasEncoded) {
  const fs::path d = tmpdir("jpeg");
  const int W = 48, H = 32;
  const auto rgb = smooth_rgb(W, H);
  write_jpeg(d / "rgb.jpg", W, H, 3, JCS_RGB, rgb, 95);
  Image img = decode_image_file((d / "rgb.jpg").string());
  ASSERT_EQ(img.height, H);
  ASSERT_EQ(img.width, W);
  ASSERT_EQ(img.channels, 3);
  // Quality 95, 4:4:4, a smooth picture: JPEG's error stays within a few levels. A swapped channel would
  // be off by up to 160.
  Diff e = diff(img.pixels, rgb);
  EXPECT_LT(e.mean, 1.0);
  EXPECT_LE(e.max, 4);

  std::vector<uint8_t> gray(W * H), gray_rgb;
  for (int i = 0; i < W * H; ++i) {
    gray[i] = static_cast<uint8_t>(30 + (i % W) * 3 + (i / W) * 2);
    gray_rgb.insert(gray_rgb.end(), 3, gray[i]);
  }
  write_jpeg(d / "gray.jpeg", W, H, 1, JCS_GRAYSCALE, gray, 95);
  img = decode_image_file((d / "gray.jpeg").string());
  e = diff(img.pixels, gray_rgb);
  EXPECT_LT(e.mean, 1.0);
  EXPECT_LE(e.max, 4);
  for (int64_t p = 0; p < W * H; ++p) {
    EXPECT_EQ(img.pixels[p * 3], img.pixels[p * 3 + 1]);
    EXPECT_EQ(img.pixels[p * 3], img.pixels[p * 3 + 2]);
  }

  // CMYK as Photoshop writes it (Adobe marker, inverted values: 255 - ink). libjpeg's encoder writes the
  // Adobe marker for CMYK input; the values we hand it are the inverted ones.
  std::vector<uint8_t> cmyk, cmyk_rgb;
  for (int p = 0; p < W * H; ++p) {
    const int c = (p % W) * 4, m = 40, yy = (p / W) * 6, k = 30;
    cmyk.insert(cmyk.end(), {static_cast<uint8_t>(255 - c), static_cast<uint8_t>(255 - m),
                             static_cast<uint8_t>(255 - yy), static_cast<uint8_t>(255 - k)});
    for (int ink : {c, m, yy}) cmyk_rgb.push_back(static_cast<uint8_t>(std::lround((255.0 - ink) * (255 - k) / 255.0)));
  }
  write_jpeg(d / "cmyk.jpg", W, H, 4, JCS_CMYK, cmyk, 98);
  img = decode_image_file((d / "cmyk.jpg").string());
  ASSERT_EQ(img.channels, 3);
  e = diff(img.pixels, cmyk_rgb);
  EXPECT_LT(e.mean, 1.5);
  EXPECT_LE(e.max, 6);
}

TEST(ImageDecode, JpegScaledDecodeIsTheDownscaledPicture) {
  const fs::path d = tmpdir("jpeg_scaled");
  const int W = 65, H = 49;  // odd sizes: libjpeg rounds the scaled sides up
  const auto rgb = smooth_rgb(W, H);
  write_jpeg(d / "big.jpg", W, H, 3, JCS_RGB, rgb, 95);
  const auto bytes = file_bytes(d / "big.jpg");
  const ImageInfo info = read_image_info(bytes.data(), bytes.size(), "big.jpg");
  EXPECT_EQ(info.format, ImageFormat::Jpeg);
  EXPECT_EQ(info.width, W);
  EXPECT_EQ(info.height, H);
  for (int denom : {2, 4, 8}) {
    Image img = decode_image(bytes.data(), bytes.size(), "big.jpg", denom);
    EXPECT_EQ(img.width, (W + denom - 1) / denom);
    EXPECT_EQ(img.height, (H + denom - 1) / denom);
    // Each output pixel is about the mean of its denom x denom source block (the picture is smooth).
    double worst = 0;
    for (int64_t y = 0; y + 1 < img.height; ++y)
      for (int64_t x = 0; x + 1 < img.width; ++x)
        for (int c = 0; c < 3; ++c) {
          double s = 0;
          for (int dy = 0; dy < denom; ++dy)
            for (int dx = 0; dx < denom; ++dx) s += rgb[((y * denom + dy) * W + x * denom + dx) * 3 + c];
          worst = std::max(worst, std::abs(s / (denom * denom) - img.at(y, x)[c]));
        }
    EXPECT_LT(worst, 5.0) << "1/" << denom;
  }
  EXPECT_THROW(decode_image(bytes.data(), bytes.size(), "big.jpg", 3), Error);
}

TEST(ImageDecode, CorruptTruncatedAndNonImageFilesGiveErrorsNamingTheFile) {
  const fs::path d = tmpdir("corrupt");
  const int W = 40, H = 30;
  write_jpeg(d / "good.jpg", W, H, 3, JCS_RGB, smooth_rgb(W, H));
  write_png(d / "good.png", W, H, {}, smooth_rgb(W, H));
  const auto jpg = file_bytes(d / "good.jpg"), png = file_bytes(d / "good.png");

  write_bytes(d / "truncated.jpg", std::vector<uint8_t>(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() * 6 / 10)));
  expect_io_error_naming(d / "truncated.jpg", "truncated");
  write_bytes(d / "header_only.jpg", std::vector<uint8_t>(jpg.begin(), jpg.begin() + 24));
  expect_io_error_naming(d / "header_only.jpg", "JPEG");

  write_bytes(d / "truncated.png", std::vector<uint8_t>(png.begin(), png.begin() + static_cast<long>(png.size() / 2)));
  expect_io_error_naming(d / "truncated.png", "truncated");
  // One flipped bit in the compressed data: the IDAT chunk's CRC no longer matches.
  auto bad = png;
  bad[bad.size() - 20] ^= 0x10;
  write_bytes(d / "corrupt.png", bad);
  expect_io_error_naming(d / "corrupt.png", "PNG");

  std::ofstream(d / "notes.jpg") << "this is not a picture\n";
  expect_io_error_naming(d / "notes.jpg", "not a JPEG or PNG");
  std::ofstream(d / "empty.png").flush();
  expect_io_error_naming(d / "empty.png", "empty");
  expect_io_error_naming(d / "missing.jpg", "does not exist");

  // Every prefix length and a sweep of single-byte corruptions: each either decodes or throws Error(Io).
  // None may crash, abort or exit (libjpeg's default handler would exit()).
  int errors = 0, decoded = 0;
  for (const auto* src : {&jpg, &png}) {
    for (size_t n = 0; n < src->size(); n += 13) {
      try {
        decode_image(src->data(), n, "prefix");
        ++decoded;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
        ++errors;
      }
    }
    for (size_t pos = 0; pos < src->size(); pos += 7) {
      auto b = *src;
      b[pos] ^= 0xa5;
      try {
        decode_image(b.data(), b.size(), "flipped");
        ++decoded;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
        ++errors;
      }
    }
  }
  EXPECT_GT(errors, 50);
  EXPECT_GT(decoded, 0);  // corruption in JPEG entropy data is recoverable (decoded with artefacts)
}

// ------------------------------------------------------------------------------------------------ ImageFolder

namespace {
// root/{ant,cat,dog}: 2 + 3 + 2 images of different sizes and formats, a skipped text file, a nested folder.
fs::path make_folder(const std::string& name) {
  const fs::path root = tmpdir(name);
  for (const char* c : {"cat", "dog", "ant", "cat/sub"}) fs::create_directories(root / c);
  auto jpg = [&](const fs::path& p, int w, int h) { write_jpeg(p, w, h, 3, JCS_RGB, smooth_rgb(w, h)); };
  jpg(root / "cat" / "b.jpg", 50, 40);
  jpg(root / "cat" / "a.JPEG", 33, 61);
  write_png(root / "cat" / "sub" / "c.png", 64, 48, {}, smooth_rgb(64, 48));
  jpg(root / "dog" / "z.jpeg", 80, 20);
  std::vector<uint8_t> gray(30 * 30, 77);
  PngSpec g;
  g.color_type = PNG_COLOR_TYPE_GRAY;
  write_png(root / "dog" / "y.png", 30, 30, g, gray);
  std::ofstream(root / "dog" / "readme.txt") << "not an image";
  jpg(root / "ant" / "1.jpg", 40, 40);
  jpg(root / "ant" / "2.jpg", 17, 23);
  std::ofstream(root / "stray.jpg") << "files directly under root belong to no class";
  return root;
}
}  // namespace

TEST(ImageFolder, ClassesLabelsAndOrderFollowTorchvision) {
  const fs::path root = make_folder("folder");
  ImageFolderDataset ds(root.string(), ImageFolderOptions::eval_defaults(24));
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"ant", "cat", "dog"}));
  ASSERT_EQ(ds.size(), 7);
  EXPECT_EQ(ds.num_classes(), 3);
  EXPECT_EQ(ds.skipped_files(), 1);  // readme.txt
  EXPECT_EQ(ds.example_shape(), (Shape{3, 24, 24}));
  // Within a class: by directory, then name ("cat" before "cat/sub"; "a.JPEG" before "b.jpg").
  const std::vector<std::string> rel{"ant/1.jpg", "ant/2.jpg", "cat/a.JPEG", "cat/b.jpg", "cat/sub/c.png",
                                     "dog/y.png", "dog/z.jpeg"};
  const std::vector<int64_t> labels{0, 0, 1, 1, 1, 2, 2};
  for (int64_t i = 0; i < ds.size(); ++i) {
    EXPECT_EQ(fs::path(ds.path(i)), root / rel[static_cast<size_t>(i)]);
    EXPECT_EQ(ds.label(i), labels[static_cast<size_t>(i)]);
  }
  const Normalization n = ds.normalization();
  EXPECT_EQ(n.mean, kImageNetMean);
  EXPECT_EQ(n.std, kImageNetStd);
  // A uniform gray PNG stays uniform through resize + center crop: every value is 77 / 255.
  std::vector<float> x(3 * 24 * 24);
  ds.get(5, x.data());
  for (float v : x) ASSERT_EQ(v, 77.0f / 255.0f);
}

TEST(ImageFolder, MissingEmptyOrImagelessFoldersAreClearErrors) {
  auto expect = [](const fs::path& root, const std::string& what) {
    try {
      ImageFolderDataset ds(root.string());
      ADD_FAILURE() << "no error for " << root;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
      EXPECT_NE(std::string(e.what()).find(root.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const fs::path empty = tmpdir("empty_root");
  expect(empty, "no class sub-folders");
  expect(empty / "nope", "does not exist");
  const fs::path imageless = tmpdir("imageless");
  fs::create_directories(imageless / "a");
  fs::create_directories(imageless / "b");
  write_png(imageless / "a" / "x.png", 4, 4, {}, smooth_rgb(4, 4));
  std::ofstream(imageless / "b" / "x.gif") << "GIF89a";
  expect(imageless, "'b'");
  EXPECT_THROW(ImageFolderDataset(make_folder("bad_opts").string(), ImageFolderOptions::train_defaults(0)), Error);
  ImageFolderOptions two_means;
  two_means.mean = {0.5f, 0.5f};
  EXPECT_THROW(ImageFolderDataset(make_folder("bad_mean").string(), two_means), Error);
}

TEST(ImageFolder, TrainAugmentationDependsOnlyOnTheKeyAndWorkersChangeNothing) {
  const fs::path root = make_folder("train");
  auto ds = std::make_shared<ImageFolderDataset>(root.string(), ImageFolderOptions::train_defaults(16));
  const int64_t per = 3 * 16 * 16;
  std::vector<float> a(per), b(per), c(per);
  ds->get(2, a.data(), ExampleContext{example_key(1, 0, 2), 0, 2});
  ds->get(2, b.data(), ExampleContext{example_key(1, 0, 2), 0, 2});
  ds->get(2, c.data(), ExampleContext{example_key(1, 1, 2), 1, 2});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);

  auto collect = [&](int workers, int64_t epoch) {
    LoaderOptions o;
    o.batch_size = 3;
    o.workers = workers;
    o.seed = 5;
    auto n = ds->normalization();
    o.mean = n.mean;
    o.std = n.std;
    DataLoader dl(ds, o);
    dl.start_epoch(epoch);
    std::vector<float> all;
    while (auto bt = dl.next()) {
      EXPECT_EQ(bt->x.shape(), (Shape{bt->x.shape()[0], 3, 16, 16}));
      auto v = bt->x.contiguous().tolist<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    EXPECT_EQ(all.size(), static_cast<size_t>(7 * per));
    return all;
  };
  const auto w0 = collect(0, 3), w2 = collect(2, 3), w3 = collect(3, 3), other = collect(2, 4);
  EXPECT_EQ(w0, w2);
  EXPECT_EQ(w0, w3);
  EXPECT_NE(w0, other);
}

TEST(ImageFolder, EvalIsResizeThenCenterCropAndTheLoaderNormalisesPerChannel) {
  const fs::path root = make_folder("eval");
  auto ds = std::make_shared<ImageFolderDataset>(root.string(), ImageFolderOptions::eval_defaults(32));
  // The eval transform by hand: decode, Resize(round(32 * 256 / 224) = 37), CenterCrop(32).
  EXPECT_EQ(eval_resize_size(32), 37);
  EXPECT_EQ(eval_resize_size(224), 256);
  const Image decoded = decode_image_file(ds->path(3));  // cat/b.jpg, 50 x 40
  const Image expect = CenterCrop(32)(Resize(37)(decoded));
  const Image got = ds->transformed(3, ExampleContext{12345, 0, 3});
  EXPECT_EQ(got.pixels, expect.pixels);
  EXPECT_EQ(ds->transformed(3, ExampleContext{999, 7, 3}).pixels, expect.pixels);  // eval draws nothing

  LoaderOptions o;
  o.batch_size = 7;
  o.shuffle = false;
  o.workers = 2;
  o.mean = kImageNetMean;
  o.std = kImageNetStd;
  DataLoader dl(ds, o);
  dl.start_epoch(0);
  auto batch = dl.next();
  ASSERT_TRUE(batch.has_value());
  auto x = batch->x.contiguous().tolist<float>();
  const int64_t plane = 32 * 32;
  for (int c = 0; c < 3; ++c)
    for (int64_t q : {int64_t{0}, int64_t{100}, plane - 1}) {
      const float v = static_cast<float>(expect.pixels[static_cast<size_t>(q * 3 + c)]) / 255.0f;
      EXPECT_EQ(x[static_cast<size_t>(3 * 3 * plane + c * plane + q)], (v - kImageNetMean[c]) * (1.0f / kImageNetStd[c]));
    }
  EXPECT_EQ(batch->y.tolist<int64_t>(), (std::vector<int64_t>{0, 0, 1, 1, 1, 2, 2}));
}

TEST(ImageFolder, ReducedJpegDecodeKeepsTheBoxAndIsClose) {
  const fs::path root = tmpdir("reduced");
  fs::create_directories(root / "only");
  write_jpeg(root / "only" / "large.jpg", 640, 480, 3, JCS_RGB, smooth_rgb(640, 480));
  for (bool train : {true, false}) {
    ImageFolderOptions full = train ? ImageFolderOptions::train_defaults(64) : ImageFolderOptions::eval_defaults(64);
    ImageFolderOptions fast = full;
    fast.reduced_jpeg_decode = true;
    ImageFolderDataset a(root.string(), full), b(root.string(), fast);
    for (uint64_t key = 1; key < 6; ++key) {
      const Image x = a.transformed(0, ExampleContext{key, 0, 0}), y = b.transformed(0, ExampleContext{key, 0, 0});
      const Diff e = diff(x.pixels, y.pixels);
      EXPECT_LT(e.mean, 1.5) << (train ? "train" : "eval") << " key " << key;
      EXPECT_LE(e.max, 8) << (train ? "train" : "eval") << " key " << key;
    }
  }
}

TEST(ImageFolder, ACorruptFileStopsTheLoaderWithItsName) {
  const fs::path root = make_folder("corrupt_member");
  std::ofstream(root / "dog" / "broken.jpg") << "\xff\xd8\xff garbage";
  auto ds = std::make_shared<ImageFolderDataset>(root.string(), ImageFolderOptions::train_defaults(8));
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  o.shuffle = false;
  DataLoader dl(ds, o);
  dl.start_epoch(0);
  try {
    while (dl.next()) {
    }
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find("broken.jpg"), std::string::npos) << e.what();
  }
}
