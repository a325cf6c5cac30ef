#include <memory>

#include "ampforge/models/models.h"

namespace ampforge::models {

using namespace ampforge::nn;

nn::ModulePtr small_cnn(const ModelOptions& o) {
  AF_CHECK(o.image_size % 4 == 0 && o.image_size >= 4, "small_cnn: image size must be a multiple of 4, got {}",
           o.image_size);
  const int64_t s = o.image_size / 4;
  Conv2dOptions c;
  c.padding = 1;
  c.bias = false;
  auto net = std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
      std::make_shared<Conv2d>(o.in_channels, 32, 3, c), std::make_shared<BatchNorm2d>(32), std::make_shared<ReLU>(),
      std::make_shared<MaxPool2d>(2),
      std::make_shared<Conv2d>(32, 64, 3, c), std::make_shared<BatchNorm2d>(64), std::make_shared<ReLU>(),
      std::make_shared<MaxPool2d>(2),
      std::make_shared<Flatten>(), std::make_shared<Linear>(64 * s * s, 128), std::make_shared<ReLU>(),
      std::make_shared<Linear>(128, o.num_classes)});
  return net;
}

namespace {

// Not models::BasicBlock (resnet.h): the same tree, but Conv2d's default init and its own draw order, which
// resnet-small's results were measured with.
class SmallBasicBlock : public Module {
 public:
  SmallBasicBlock(int64_t in, int64_t out, int64_t stride) : Module("BasicBlock") {
    Conv2dOptions c3;
    c3.stride = stride;
    c3.padding = 1;
    c3.bias = false;
    conv1 = register_module("conv1", std::make_shared<Conv2d>(in, out, 3, c3));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(out));
    c3.stride = 1;
    conv2 = register_module("conv2", std::make_shared<Conv2d>(out, out, 3, c3));
    bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(out));
    if (stride != 1 || in != out) {
      Conv2dOptions c1;
      c1.stride = stride;
      c1.bias = false;
      downsample = register_module("downsample", std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
                                                     std::make_shared<Conv2d>(in, out, 1, c1),
                                                     std::make_shared<BatchNorm2d>(out)}));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = bn1->forward_act((*conv1)(x), NormAct::ReLU);
    y = (*bn2)((*conv2)(y));
    Tensor id = downsample ? (*downsample)(x) : x;
    return relu(add(y, id));
  }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Sequential> downsample;
};

class SmallResNet : public Module {
 public:
  explicit SmallResNet(const ModelOptions& o) : Module("SmallResNet") {
    Conv2dOptions c;
    c.padding = 1;
    c.bias = false;
    stem = register_module("stem", std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
                                       std::make_shared<Conv2d>(o.in_channels, 16, 3, c),
                                       std::make_shared<BatchNorm2d>(16), std::make_shared<ReLU>()}));
    using Block = SmallBasicBlock;
    layers = register_module("layers", std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
                                           std::make_shared<Block>(16, 16, 1), std::make_shared<Block>(16, 16, 1),
                                           std::make_shared<Block>(16, 32, 2), std::make_shared<Block>(32, 32, 1),
                                           std::make_shared<Block>(32, 64, 2), std::make_shared<Block>(64, 64, 1)}));
    pool = register_module("pool", std::make_shared<AdaptiveAvgPool2d>(1, 1));
    fc = register_module("fc", std::make_shared<Linear>(64, o.num_classes));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = (*layers)((*stem)(x));
    return (*fc)(flatten((*pool)(y), 1));
  }
  std::shared_ptr<Sequential> stem, layers;
  std::shared_ptr<AdaptiveAvgPool2d> pool;
  std::shared_ptr<Linear> fc;
};

}  // namespace

nn::ModulePtr small_resnet(const ModelOptions& o) { return std::make_shared<SmallResNet>(o); }

}  // namespace ampforge::models
