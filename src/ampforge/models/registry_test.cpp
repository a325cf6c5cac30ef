// Model registry (unit): every built-in name builds, counts are honest (build and count), unknown names are
// errors listing the known ones, a name cannot be registered twice, counting leaves the generator alone.
#include <gtest/gtest.h>

#include "ampforge/core/generator.h"
#include "ampforge/models/models.h"
#include "ampforge/nn/init.h"

using namespace ampforge;
using namespace ampforge::models;

TEST(ModelRegistry, BuiltinsInOrderWithTasksAndDefaults) {
  const std::vector<std::string> want = {"cnn", "resnet-small", "resnet18", "resnet34", "resnet50", "resnet101",
                                         "resnet152", "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d",
                                         "wide_resnet50_2", "wide_resnet101_2", "yolov8n", "yolov8s", "yolov8m",
                                         "yolov8l", "yolov8x", "bert-base", "bert-mini", "bert-tiny"};
  EXPECT_EQ(names(), want);
  for (const auto& e : model_registry().entries()) {
    EXPECT_EQ(e.task, e.name.rfind("yolov8", 0) == 0  ? "detection"
                      : e.name.rfind("bert-", 0) == 0 ? "masked_lm"
                                                      : "classification")
        << e.name;
    EXPECT_FALSE(e.description.empty()) << e.name;
    EXPECT_EQ(e.description.find('\n'), std::string::npos) << e.name;
  }
  const ModelEntry& r50 = model_registry().at("resnet50");
  EXPECT_EQ(r50.defaults.in_channels, 3);
  EXPECT_EQ(r50.defaults.image_size, 224);
  EXPECT_EQ(r50.defaults.num_classes, 1000);
  EXPECT_EQ(model_registry().at("cnn").defaults.in_channels, 1);
}

TEST(ModelRegistry, CountsAreTheBuiltModelsAndLeaveTheGeneratorAlone) {
  manual_seed(11);
  const PhiloxState before = default_generator().state();
  const auto c18 = parameter_counts(model_registry().at("resnet18"));
  ASSERT_EQ(c18.size(), 1u);
  EXPECT_EQ(c18[0].label, "parameters");
  EXPECT_EQ(c18[0].count, 11689512);
  EXPECT_EQ(parameter_counts(model_registry().at("resnet50"))[0].count, 25557032);
  const PhiloxState after = default_generator().state();
  EXPECT_EQ(before.seed, after.seed);
  EXPECT_EQ(before.offset, after.offset);
  // The small models' counts are what their builders make for the default (1x28x28, 10 classes).
  EXPECT_EQ(parameter_counts(model_registry().at("cnn"))[0].count, small_cnn({})->num_parameters());
  EXPECT_EQ(parameter_counts(model_registry().at("resnet-small"))[0].count, small_resnet({})->num_parameters());
}

TEST(ModelRegistry, BertCountsBothVariantsLabelled) {
  const std::vector<ParameterCount> c = parameter_counts(model_registry().at("bert-base"));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].label, "BertModel with pooler");
  EXPECT_EQ(c[0].count, 109482240);  // MODELS.md §B.4
  EXPECT_EQ(c[1].label, "BertForMaskedLM");
  EXPECT_EQ(c[1].count, 109514298);
  EXPECT_EQ(model_registry().at("bert-base").defaults.num_classes, 30522);  // the vocabulary
}

TEST(ModelRegistry, CreatePassesTheDataShapeThrough) {
  ModelOptions o;
  o.in_channels = 1;
  o.num_classes = 10;
  o.image_size = 32;
  nn::init::SkipInitGuard skip;
  nn::ModulePtr m = create("resnet18", o);
  const nn::NamedTensors sd = m->state_dict();
  EXPECT_EQ(sd.front().first, "conv1.weight");
  EXPECT_EQ(sd.front().second.shape().vec(), (std::vector<int64_t>{64, 1, 7, 7}));
  EXPECT_EQ(sd.back().first, "fc.bias");
  EXPECT_EQ(sd.back().second.shape().vec(), (std::vector<int64_t>{10}));
}

TEST(ModelRegistry, UnknownNamesListTheKnownOnes) {
  try {
    create("resnet49");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("resnet49"), std::string::npos) << m;
    EXPECT_NE(m.find("cnn, resnet-small, resnet18"), std::string::npos) << m;
  }
  EXPECT_EQ(model_registry().find("resnet49"), nullptr);
}

TEST(ModelRegistry, NamesAreUniqueAndEntriesComplete) {
  ModelRegistry r;
  register_builtin_models(r);
  EXPECT_THROW(register_builtin_models(r), Error);  // every name again
  ModelEntry e;
  e.name = "x";
  EXPECT_THROW(r.add(e), Error);  // no build function
  e.build = [](const ModelOptions& o) { return small_cnn(o); };
  e.name = "";
  EXPECT_THROW(r.add(e), Error);
  e.name = "x";
  e.counts = [] { return std::vector<ParameterCount>{{"with head", 3}, {"without head", 2}}; };
  r.add(e);
  const auto c = parameter_counts(r.at("x"));  // a labelled list (BERT: "BertModel with pooler", ...)
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].label, "without head");
}
