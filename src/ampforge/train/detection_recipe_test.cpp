// `train --model yolov8n --dataset detection` end to end on a tiny composed set (unit: a few seconds): the recipe
// builds the detection task and data (the frozen DFL conv must be left out of the optimizer, which otherwise
// refuses it), mosaics for the first epochs, the losses are finite, evaluation reports mAP, the loss parts and the
// per-class table; mismatched model and data, and a mosaic that could never happen, are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ampforge/data/yolo_dataset.h"
#include "ampforge/train/recipe.h"

using namespace ampforge;
namespace fs = std::filesystem;

TEST(DetectionRecipe, TrainsYolov8nOnAComposedSet) {
  const fs::path dir = fs::temp_directory_path() / ("ampforge_det_recipe_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  data::ComposeDetectionOptions co;
  co.train_images = 4, co.val_images = 2, co.canvas = 64, co.max_items = 2, co.min_scale = 0.8, co.max_scale = 1.2;
  const std::string data_file = data::compose_fashion_mnist_detection(dir.string(), co);
  train::TrainConfig c;
  c.model = "yolov8n";
  c.dataset = "detection";
  c.detection_data = data_file;
  c.image_size = 64;
  c.epochs = 3;
  c.batch_size = 4;
  c.eval_batch_size = 2;
  c.lr = 1e-3;
  c.schedule = "constant";
  c.workers = 0;
  c.progress = false;
  c.verbose = false;
  c.mosaic = 1.0;
  c.close_mosaic = 1;  // mosaics in epochs 1 and 2, none in the last
  const train::TrainResult r = train::train(c);
  EXPECT_EQ(r.primary_metric, "map50");
  ASSERT_EQ(r.losses.size(), 3u);
  // Learning itself is measured by a training run (docs/ARCHITECTURE.md); in a dozen steps the loss is not
  // monotone (the class targets grow with the predicted boxes' IoU), so only finiteness is checked here.
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l) && l > 0) << l;
  const double map = tasks::metric_value(r.eval, "map50");
  EXPECT_TRUE(map >= 0 && map <= 1) << map;
  EXPECT_TRUE(std::isfinite(tasks::metric_value(r.eval, "box_loss")));
  // The final evaluation's per-class table reaches the result through the task's evaluator, named by the data file.
  const auto details = nlohmann::json::parse(r.eval_details.json);
  ASSERT_GT(details.at("per_class").size(), 0u);
  for (const auto& row : details["per_class"])
    EXPECT_EQ(row.at("name"), data::fashion_mnist_class_names().at(row.at("class").get<size_t>()));
  EXPECT_NE(r.eval_details.text.find("mAP50-95"), std::string::npos);
  c.epochs = 1;  // --close-mosaic 1 >= --epochs 1: no epoch could have a mosaic
  std::string err;
  try {
    train::train(c);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("--close-mosaic"), std::string::npos) << err;
  c.epochs = 3;
  c.model = "cnn";
  EXPECT_THROW(train::train(c), Error);  // a classifier on detection data
  c.model = "yolov8n";
  c.dataset = "fashion-mnist";
  EXPECT_THROW(train::train(c), Error);  // a detector on classification data
  fs::remove_all(dir);
}
