// Data-pipeline throughput (never pass/fail):
//  1. SyntheticDataset at ImageNet size (3, 224, 224): examples per second of get(), against the Box-Muller
//     generator it used before (the peer, re-implemented here), one thread each.
//  2. DataLoader batches of --batch synthetic (3, 224, 224) examples with 0 .. --workers workers.
//  3. With --image-folder DIR: ImageFolderDataset decode + transform throughput (train and eval variants,
//     224, full and reduced JPEG decoding) through the DataLoader with --workers workers.
// Usage: data_bench [--examples N] [--batch N] [--workers N] [--image-folder DIR] [--batches N]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ampforge/core/generator.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/data/image_folder.h"
#include "ampforge/util/timer.h"

namespace af = ampforge;
namespace data = ampforge::data;

namespace {

// The previous SyntheticDataset::get: Box-Muller on pairs of Philox words.
void box_muller_example(uint64_t seed, int64_t i, float* dst, int64_t n) {
  for (int64_t k = 0; k < n; k += 2) {
    auto w = af::philox4x32(seed, (static_cast<uint64_t>(i) << 32) + static_cast<uint64_t>(k / 2));
    const double u1 = (static_cast<double>(w[0] >> 8) + 1.0) / 16777216.0, u2 = static_cast<double>(w[1] >> 8) / 16777216.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    dst[k] = static_cast<float>(r * std::cos(6.283185307179586 * u2));
    if (k + 1 < n) dst[k + 1] = static_cast<float>(r * std::sin(6.283185307179586 * u2));
  }
}

double loader_rate(std::shared_ptr<const data::Dataset> ds, int64_t batch, int workers, int batches,
                   std::vector<float> mean, std::vector<float> stdv) {
  data::LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.prefetch = std::max(2, workers);
  o.mean = std::move(mean);
  o.std = std::move(stdv);
  data::DataLoader dl(ds, o);
  dl.start_epoch(0);
  af::Stopwatch sw;
  int got = 0;
  int64_t examples = 0;
  while (got < batches) {
    auto b = dl.next();
    if (!b) break;
    examples += b->x.shape()[0];
    ++got;
  }
  return static_cast<double>(examples) / sw.seconds();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t examples = 64, batch = 256;
  int workers = 2, batches = 4;
  std::string folder;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--examples")) examples = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--workers")) workers = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batches")) batches = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--image-folder")) folder = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: data_bench [--examples N] [--batch N] [--workers N] [--batches N] [--image-folder DIR]\n"
                           "(the CPU side of data loading; batches stay on the host)\n");
      return 2;
    }
  }
  const af::Shape shape{3, 224, 224};
  const int64_t n = af::shape_numel(shape);
  std::vector<float> buf(static_cast<size_t>(n));
  auto ds = std::make_shared<data::SyntheticDataset>(std::max<int64_t>(examples, batch * batches), shape, 1000, 1);
  af::Stopwatch sw;
  for (int64_t i = 0; i < examples; ++i) ds->get(i, buf.data());
  const double ours = static_cast<double>(examples) / sw.seconds();
  sw.reset();
  for (int64_t i = 0; i < examples; ++i) box_muller_example(1, i, buf.data(), n);
  const double peer = static_cast<double>(examples) / sw.seconds();
  std::printf("synthetic (3, 224, 224) get, 1 thread: %.0f examples/s (Box-Muller peer %.0f/s, ratio %.1fx)\n", ours,
              peer, ours / peer);
  for (int w = 0; w <= workers; ++w)
    std::printf("DataLoader synthetic batch %lld, %d workers: %.0f examples/s\n", static_cast<long long>(batch), w,
                loader_rate(ds, batch, w, batches, {0.0f}, {1.0f}));
  if (!folder.empty()) {
    for (bool train : {true, false})
      for (bool reduced : {false, true}) {
        data::ImageFolderOptions o = train ? data::ImageFolderOptions::train_defaults(224)
                                           : data::ImageFolderOptions::eval_defaults(224);
        o.reduced_jpeg_decode = reduced;
        auto f = std::make_shared<data::ImageFolderDataset>(folder, o);
        std::printf("image folder %s (%lld files), %s%s, %d workers: %.0f examples/s\n", folder.c_str(),
                    static_cast<long long>(f->size()), train ? "train" : "eval", reduced ? ", reduced JPEG decode" : "",
                    workers, loader_rate(f, std::min<int64_t>(batch, f->size()), workers, batches, o.mean, o.std));
      }
  }
  return 0;
}
