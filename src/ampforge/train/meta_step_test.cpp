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
