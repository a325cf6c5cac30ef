// The brief's mixed-precision training loop, in C++ (README "A C++ example"): autocast(float16) +
// GradScaler + AdamW. Built and run by the tests (ctest -R example), so it cannot rot.
// Trains the small CNN on synthetic 28x28 images for a few steps and checks that the loss went down.
#include <cstdio>

#include "ampforge/ampforge.h"

namespace af = ampforge;

int main() {
  af::manual_seed(0);
  af::Device dev = af::kCPU;  // or af::Device::parse("cuda") on a machine with an NVIDIA GPU
  auto model = af::models::small_cnn({.in_channels = 1, .num_classes = 10});
  model->to(dev);
  af::optim::AdamW opt(model->parameters(), {.lr = 1e-3});
  af::amp::GradScaler scaler;  // PyTorch's defaults: init scale 65536, growth interval 2000

  auto data = std::make_shared<af::data::SyntheticDataset>(512, af::Shape{1, 28, 28}, 10, /*seed=*/1);
  af::data::DataLoader loader(data, {.batch_size = 64, .format = af::MemoryFormat::ChannelsLast});

  double first = 0, last = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    loader.start_epoch(epoch);
    while (auto batch = loader.next()) {
      af::Tensor loss;
      {
        af::amp::Autocast ac(dev, af::DType::F16);
        loss = af::cross_entropy((*model)(batch->x), batch->y);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      opt.zero_grad();
      last = loss.item();
      if (first == 0) first = last;
    }
  }
  std::printf("loss %.4f -> %.4f, loss scale %.0f\n", first, last, scaler.get_scale());
  return last < first ? 0 : 1;
}
