// The meta device's check for the models whose real CPU step is quick (meta_step_testutil.h says what it checks
// and why the largest models run under the `slow` label).
#include <algorithm>

#include "ampforge/train/meta_step_testutil.h"

namespace ampforge::train {
namespace {

using testing::expect_meta_peak_equals_cpu;

class MetaStep : public ::testing::TestWithParam<std::string> {};

TEST_P(MetaStep, PeakAllocatedEqualsTheCpuStepsWithinOneGranule) { expect_meta_peak_equals_cpu(GetParam()); }

INSTANTIATE_TEST_SUITE_P(RegisteredModels, MetaStep, ::testing::ValuesIn(testing::kMetaUnitModels), testing::test_name);

// 16-bit steps: the CPU's convolutions then run on F32 copies and YOLOv8's batch norm + SiLU backward keeps an F32
// buffer, both from the caching allocator (meta/cpu_scratch.h); the small CNN and YOLOv8n cover both.
class MetaStep16Bit : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(MetaStep16Bit, PeakAllocatedEqualsTheCpuStepsWithinOneGranule) {
  expect_meta_peak_equals_cpu(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Models, MetaStep16Bit,
                         ::testing::Combine(::testing::Values(std::string("cnn"), std::string("yolov8n")),
                                            ::testing::Values(DType::F16, DType::BF16)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, DType>>& i) {
                           return std::get<0>(i.param) + "_" + std::string(dtype_name(std::get<1>(i.param)));
                         });

// No registered model escapes the check: the unit and slow lists together are the registry.
TEST(MetaStepCoverage, EveryRegisteredModelIsChecked) {
  for (const std::string& name : models::names()) {
    const bool unit = std::count(testing::kMetaUnitModels.begin(), testing::kMetaUnitModels.end(), name) > 0;
    const bool slow = std::count(testing::kMetaSlowModels.begin(), testing::kMetaSlowModels.end(), name) > 0;
    EXPECT_TRUE(unit != slow) << name << " must be in exactly one of kMetaUnitModels and kMetaSlowModels";
  }
  EXPECT_EQ(testing::kMetaUnitModels.size() + testing::kMetaSlowModels.size(), models::names().size());
}

}  // namespace
}  // namespace ampforge::train
