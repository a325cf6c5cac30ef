// `ampforge data make-detection OUT`: writes the detection set composed from Fashion-MNIST in the YOLO format
// (data/yolo_dataset.h), so `train --dataset detection --data OUT/data.yaml` and users read the same files.
#include <cstdio>
#include <memory>

#include "ampforge/cli/commands.h"
#include "ampforge/data/yolo_dataset.h"
#include "ampforge/util/error.h"

namespace ampforge::cli {

namespace {
struct DataArgs {
  std::string out;
  data::ComposeDetectionOptions opt;
};
}  // namespace

Command add_data_command(CLI::App& app) {
  auto args = std::make_shared<DataArgs>();
  auto* sub = app.add_subcommand("data", "Prepare data sets");
  sub->require_subcommand(1);
  auto* make = sub->add_subcommand("make-detection",
                                   "Compose a YOLO-format detection set from Fashion-MNIST (1-6 items per canvas)");
  make->add_option("out", args->out, "Output folder (images/, labels/, data.yaml)")->required();
  make->add_option("--train", args->opt.train_images, "Training images")->capture_default_str();
  make->add_option("--val", args->opt.val_images, "Validation images")->capture_default_str();
  make->add_option("--canvas", args->opt.canvas, "Canvas side in pixels")->capture_default_str();
  make->add_option("--max-items", args->opt.max_items, "Most items per canvas (fewer when it is full)")->capture_default_str();
  make->add_option("--seed", args->opt.seed, "Seed (the set is a function of it)")->capture_default_str();
  make->add_option("--fashion-mnist-dir", args->opt.fashion_mnist_dir, "Fashion-MNIST's IDX files")
      ->capture_default_str();
  return {sub, [args] {
            try {
              const std::string file = data::compose_fashion_mnist_detection(args->out, args->opt);
              std::printf("wrote %lld training and %lld validation images; data file %s\n",
                          static_cast<long long>(args->opt.train_images), static_cast<long long>(args->opt.val_images),
                          file.c_str());
              return 0;
            } catch (const Error& e) {
              std::fprintf(stderr, "ampforge data make-detection: %s\n", e.what());
              return 2;
            }
          }};
}

}  // namespace ampforge::cli
