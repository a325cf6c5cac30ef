// ImageFolderDataset (contract in image_folder.h): the folder scan at construction, decode + transforms in get().
#include "ampforge/data/image_folder.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "ampforge/util/error.h"

namespace ampforge::data {

namespace fs = std::filesystem;

namespace {

bool has_image_extension(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return e == ".jpg" || e == ".jpeg" || e == ".png";
}

ImageFolderOptions checked(ImageFolderOptions o) {
  AF_CHECK(o.image_size > 0, "ImageFolderDataset: image_size must be positive, got {}", o.image_size);
  AF_CHECK(o.resize_size >= 0, "ImageFolderDataset: resize_size must be >= 0 (0: round(S * 256 / 224)), got {}",
           o.resize_size);
  Normalize(o.mean, o.std).check_channels(3, "ImageFolderDataset");
  return o;
}

// The largest JPEG scale denominator d in {1, 2, 4, 8} that keeps an (h, w) region at least (min_h, min_w).
int reduced_denominator(double h, double w, double min_h, double min_w) {
  for (int d : {8, 4, 2})
    if (h / d >= min_h && w / d >= min_w) return d;
  return 1;
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(const std::string& root, ImageFolderOptions opt)
    : root_(root),
      opt_(checked(std::move(opt))),
      rrc_(opt_.image_size, opt_.scale, opt_.ratio),
      flip_(opt_.hflip_p),
      resize_(opt_.resize_size > 0 ? opt_.resize_size : eval_resize_size(opt_.image_size)),
      center_(opt_.image_size) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    AF_THROW(Io, "image folder '{}' does not exist or is not a directory (expected root/<class>/<image>.jpg|.jpeg|.png, "
             "torchvision's ImageFolder layout)", root);
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec)) classes_.push_back(e.path().filename().string());
  if (ec) AF_THROW(Io, "cannot list image folder '{}': {}", root, ec.message());
  std::sort(classes_.begin(), classes_.end());
  if (classes_.empty())
    AF_THROW(Io, "image folder '{}' has no class sub-folders: expected root/<class>/<image>.jpg|.jpeg|.png "
             "(torchvision's ImageFolder layout)", root);
  AF_CHECK(classes_.size() <= static_cast<size_t>(INT32_MAX), "image folder '{}': too many classes", root);

  std::vector<std::string> empty_classes;
  path_offsets_.push_back(0);
  const fs::path base(root);
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::pair<std::string, std::string>> files;  // (directory, file name): torchvision's order
    const auto opts = fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
    for (auto it = fs::recursive_directory_iterator(base / classes_[c], opts, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      if (!has_image_extension(it->path())) {
        ++skipped_;
        continue;
      }
      files.emplace_back(it->path().parent_path().string(), it->path().filename().string());
    }
    if (ec) AF_THROW(Io, "cannot list class folder '{}': {}", (base / classes_[c]).string(), ec.message());
    if (files.empty()) empty_classes.push_back(classes_[c]);
    std::sort(files.begin(), files.end());
    for (const auto& [dir, name] : files) {
      rel_paths_ += (fs::path(dir) / name).lexically_relative(base).string();
      path_offsets_.push_back(rel_paths_.size());
      labels_.push_back(static_cast<int32_t>(c));
    }
  }
  if (!empty_classes.empty()) {
    std::string list;
    for (size_t k = 0; k < std::min<size_t>(empty_classes.size(), 5); ++k) list += (k ? ", '" : "'") + empty_classes[k] + "'";
    if (empty_classes.size() > 5) list += fmt::format(" and {} more", empty_classes.size() - 5);
    AF_THROW(Io, "image folder '{}': {} class folder(s) hold no .jpg, .jpeg or .png file: {}", root,
             empty_classes.size(), list);
  }
}

std::string ImageFolderDataset::path(int64_t i) const {
  AF_CHECK(i >= 0 && i < size(), "ImageFolderDataset: example {} out of range [0, {})", i, size());
  const size_t a = path_offsets_[static_cast<size_t>(i)], b = path_offsets_[static_cast<size_t>(i) + 1];
  return (fs::path(root_) / rel_paths_.substr(a, b - a)).string();
}

Image ImageFolderDataset::transformed(int64_t i, const ExampleContext& ctx) const {
  const std::string file = path(i);
  const std::vector<uint8_t> bytes = read_file_bytes(file);
  const int64_t S = opt_.image_size;
  const bool reduced = opt_.reduced_jpeg_decode && sniff_image_format(bytes.data(), bytes.size()) == ImageFormat::Jpeg;
  ExampleRng rng(ctx.key);
  if (opt_.train) {
    Image out;
    if (reduced) {
      const ImageInfo info = read_image_info(bytes.data(), bytes.size(), file);
      const CropBox box = rrc_.get_params(info.height, info.width, rng);
      const int d = reduced_denominator(static_cast<double>(box.height), static_cast<double>(box.width),
                                        static_cast<double>(S), static_cast<double>(S));
      const Image img = decode_image(bytes.data(), bytes.size(), file, d);
      const double sy = static_cast<double>(img.height) / static_cast<double>(info.height);
      const double sx = static_cast<double>(img.width) / static_cast<double>(info.width);
      out = d == 1 ? resized_crop(img, box, S, S)
                   : resized_crop(img, CropBoxF{box.top * sy, box.left * sx, box.height * sy, box.width * sx}, S, S);
    } else {
      const Image img = decode_image(bytes.data(), bytes.size(), file);
      out = rrc_(img, rng);
    }
    flip_(out, rng);
    return out;
  }
  int64_t H = 0, W = 0;
  int d = 1;
  if (reduced) {
    const ImageInfo info = read_image_info(bytes.data(), bytes.size(), file);
    H = info.height;
    W = info.width;
    const auto [h2, w2] = resize_.output_size(H, W);
    d = reduced_denominator(static_cast<double>(H), static_cast<double>(W), static_cast<double>(h2), static_cast<double>(w2));
  }
  const Image img = decode_image(bytes.data(), bytes.size(), file, d);
  if (!reduced) {
    H = img.height;
    W = img.width;
  }
  const auto [h2, w2] = resize_.output_size(H, W);  // from the full-size image, however it was decoded
  const CropBox box = center_.box(h2, w2);
  if (box.top >= 0 && box.left >= 0 && box.top + box.height <= h2 && box.left + box.width <= w2)
    return resize_window(img, h2, w2, box);  // the same pixels as CenterCrop(Resize(img)), only the crop computed
  return center_(resize(img, h2, w2));
}

void ImageFolderDataset::get(int64_t i, float* dst, const ExampleContext& ctx) const { to_tensor(transformed(i, ctx), dst); }

void ImageFolderDataset::get(int64_t i, float* dst) const { get(i, dst, ExampleContext{}); }

}  // namespace ampforge::data
