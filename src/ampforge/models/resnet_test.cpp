// ResNet family (unit): torchvision's parameter counts, state-dict keys / order / shapes / dtypes (against
// tests/data/models/torchvision_state_dicts.json, written by scripts/gen_resnet_golden.py from torchvision
// 0.14), v1.5's stride placement, initialisation, zero_init_residual, forward shapes, option checks.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ampforge/core/generator.h"
#include "ampforge/models/resnet.h"
#include "ampforge/nn/init.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
using namespace ampforge::models;

namespace {

std::shared_ptr<ResNet> by_name(const std::string& n, const ResNetOptions& o = {}) {
  if (n == "resnet18") return resnet18(o);
  if (n == "resnet34") return resnet34(o);
  if (n == "resnet50") return resnet50(o);
  if (n == "resnet101") return resnet101(o);
  if (n == "resnet152") return resnet152(o);
  if (n == "resnext50_32x4d") return resnext50_32x4d(o);
  if (n == "resnext101_32x8d") return resnext101_32x8d(o);
  if (n == "resnext101_64x4d") return resnext101_64x4d(o);
  if (n == "wide_resnet50_2") return wide_resnet50_2(o);
  if (n == "wide_resnet101_2") return wide_resnet101_2(o);
  return nullptr;
}

const char* dtype_torch_name(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::I64: return "int64";
    default: return "other";
  }
}

}  // namespace

// torchvision 0.14's sum(p.numel() for p in m.parameters()), 1000 classes (MODELS.md §C: ResNet-50).
TEST(ResNetFamily, ParameterCountsAreTorchvisions) {
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"resnet18", 11689512},         {"resnet34", 21797672},          {"resnet50", 25557032},
      {"resnet101", 44549160},        {"resnet152", 60192808},         {"resnext50_32x4d", 25028904},
      {"resnext101_32x8d", 88791336}, {"resnext101_64x4d", 83455272},  {"wide_resnet50_2", 68883240},
      {"wide_resnet101_2", 126886696}};
  nn::init::SkipInitGuard skip;  // structure only: no random fill of 500 MB of weights
  for (const auto& [name, count] : expected) EXPECT_EQ(by_name(name)->num_parameters(), count) << name;
}

TEST(ResNetFamily, StateDictIsTorchvisionsKeyForKey) {
  std::ifstream in(std::string(AMPFORGE_TEST_DATA_DIR) + "/models/torchvision_state_dicts.json");
  ASSERT_TRUE(in) << "tests/data/models/torchvision_state_dicts.json (regenerate with scripts/gen_golden.sh)";
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j.at("models").size(), 3u);
  nn::init::SkipInitGuard skip;
  for (const auto& [name, entries] : j.at("models").items()) {
    std::shared_ptr<ResNet> m = by_name(name);
    ASSERT_TRUE(m) << name;
    const nn::NamedTensors sd = m->state_dict();
    ASSERT_EQ(sd.size(), entries.size()) << name;
    for (size_t i = 0; i < sd.size(); ++i) {
      const auto& e = entries[i];
      ASSERT_EQ(sd[i].first, e.at("key").get<std::string>()) << name << " entry " << i;
      EXPECT_EQ(sd[i].second.shape().vec(), e.at("shape").get<std::vector<int64_t>>()) << name << " " << sd[i].first;
      EXPECT_EQ(dtype_torch_name(sd[i].second.dtype()), e.at("dtype").get<std::string>()) << name << " " << sd[i].first;
    }
  }
}

// v1.5: the stride of a downsampling Bottleneck is on the 3x3 conv2, and its shortcut strides too.
TEST(ResNetFamily, BottleneckStridesItsThreeByThreeConv) {
  nn::init::SkipInitGuard skip;
  auto m = resnet50();
  auto* b = dynamic_cast<Bottleneck*>(m->layer2->children().at(0).second.get());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->conv1->options.stride, 1);
  EXPECT_EQ(b->conv2->options.stride, 2);
  EXPECT_EQ(b->conv3->options.stride, 1);
  ASSERT_TRUE(b->downsample);
  auto* ds = dynamic_cast<nn::Conv2d*>(b->downsample->children().at(0).second.get());
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->options.stride, 2);
  EXPECT_EQ(ds->kernel_size, 1);
  // layer1's first block projects 64 -> 256 with stride 1; the others use the identity.
  auto* first = dynamic_cast<Bottleneck*>(m->layer1->children().at(0).second.get());
  auto* second = dynamic_cast<Bottleneck*>(m->layer1->children().at(1).second.get());
  EXPECT_TRUE(first->downsample);
  EXPECT_FALSE(second->downsample);
  // ResNet-18's layer1 keeps 64 channels: no projection.
  auto r18 = resnet18();
  EXPECT_FALSE(dynamic_cast<BasicBlock*>(r18->layer1->children().at(0).second.get())->downsample);
  EXPECT_TRUE(dynamic_cast<BasicBlock*>(r18->layer2->children().at(0).second.get())->downsample);
}

// Convs kaiming_normal(fan_out, relu): std sqrt(2 / fan_out); BN (1, 0); fc Linear's U(-1/sqrt(in), 1/sqrt(in)).
TEST(ResNetFamily, InitialisationIsTorchvisions) {
  manual_seed(7);
  auto m = resnet18();
  for (const auto& [name, t] : m->named_parameters()) {
    const std::vector<float> v = t.tolist<float>();
    if (t.dim() == 4) {
      const double fan_out = static_cast<double>(t.size(0) * t.size(2) * t.size(3));
      double sq = 0, mean = 0;
      for (float x : v) mean += x, sq += double(x) * x;
      mean /= static_cast<double>(v.size());
      const double sd = std::sqrt(sq / static_cast<double>(v.size()) - mean * mean);
      const double want = std::sqrt(2.0 / fan_out);
      // Standard error of a sample std is sd / sqrt(2n); n >= 9408 gives <= 0.8%: 5% is > 6 sigma.
      EXPECT_NEAR(sd / want, 1.0, 0.05) << name;
      EXPECT_NEAR(mean / want, 0.0, 0.05) << name;
    } else if (name == "fc.weight" || name == "fc.bias") {
      const double bound = 1.0 / std::sqrt(512.0);
      float lo = 1, hi = -1;
      for (float x : v) lo = std::min(lo, x), hi = std::max(hi, x);
      EXPECT_GE(lo, -bound) << name;
      EXPECT_LE(hi, bound) << name;
      if (name == "fc.weight") {
        EXPECT_GT(hi - lo, 1.9 * bound) << name;  // uniform over the whole range
      }
    } else {
      const float want = name.ends_with(".weight") ? 1.0f : 0.0f;
      for (float x : v) ASSERT_EQ(x, want) << name;
    }
  }
}

TEST(ResNetFamily, ZeroInitResidualZeroesTheLastBnOfEveryBlock) {
  ResNetOptions o;
  o.zero_init_residual = true;
  for (const std::string name : {"resnet18", "resnet50"}) {
    manual_seed(1);
    auto m = by_name(name, o);
    int zeroed = 0;
    for (const auto& [n, t] : m->named_parameters()) {
      const bool last_bn = name == "resnet18" ? n.ends_with(".bn2.weight") : n.ends_with(".bn3.weight");
      if (!n.ends_with(".weight") || t.dim() != 1) continue;
      const std::vector<float> v = t.tolist<float>();
      const float want = last_bn ? 0.0f : 1.0f;
      for (float x : v) ASSERT_EQ(x, want) << name << " " << n;
      zeroed += last_bn;
    }
    EXPECT_EQ(zeroed, name == "resnet18" ? 8 : 16) << name;
  }
  // Off by default (torchvision and DLE's default).
  auto m = resnet50();
  EXPECT_EQ(dynamic_cast<Bottleneck*>(m->layer1->children().at(0).second.get())->bn3->weight.tolist<float>()[0], 1.0f);
}

TEST(ResNetFamily, ForwardShapesForAnyInputSizeChannelsAndClasses) {
  manual_seed(3);
  ResNetOptions o;
  o.in_channels = 1;
  o.num_classes = 10;
  auto m = resnet18(o);
  EXPECT_EQ(m->fc->weight.shape().vec(), (std::vector<int64_t>{10, 512}));
  EXPECT_EQ(m->conv1->weight.shape().vec(), (std::vector<int64_t>{64, 1, 7, 7}));
  const Tensor y = (*m)(ops::randn({2, 1, 32, 32}));
  EXPECT_EQ(y.shape().vec(), (std::vector<int64_t>{2, 10}));
  auto r50 = resnet50();
  const Tensor z = (*r50)(ops::randn({1, 3, 40, 40}));  // 40 -> 20 -> 10 -> 10 -> 5 -> 3 -> 2
  EXPECT_EQ(z.shape().vec(), (std::vector<int64_t>{1, 1000}));
  for (double v : ops::to_dtype(z, DType::F64).tolist<double>()) ASSERT_TRUE(std::isfinite(v));
}

TEST(ResNetFamily, BadOptionsAreUserErrors) {
  ResNetOptions o;
  o.groups = 32;
  EXPECT_THROW(resnet18(o), Error);  // BasicBlock: groups 1, width 64 only (as torchvision)
  o = {};
  o.num_classes = 0;
  EXPECT_THROW(resnet50(o), Error);
  EXPECT_THROW(ResNet(ResNetBlock::Basic, {2, 2, 2}), Error);
  EXPECT_THROW(ResNet(ResNetBlock::Basic, {2, 0, 2, 2}), Error);
}

// The repr reads like torchvision's print(model): the same children in the same order.
TEST(ResNetFamily, DescribeListsTorchvisionsChildren) {
  nn::init::SkipInitGuard skip;
  auto m = resnet18();
  std::vector<std::string> names;
  for (const auto& [n, c] : m->children()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4",
                                             "avgpool", "fc"}));
  const std::string d = m->describe();
  EXPECT_NE(d.find("(downsample): Sequential("), std::string::npos) << d;
  EXPECT_NE(d.find("Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)"), std::string::npos) << d;
}
