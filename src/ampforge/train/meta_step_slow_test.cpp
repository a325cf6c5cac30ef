// The meta device's check for the largest registered models (label `slow`: their real CPU step takes tens of
// seconds to minutes on a 2-core machine; meta_step_testutil.h says what it checks).
#include "ampforge/train/meta_step_testutil.h"

namespace ampforge::train {
namespace {

using testing::expect_meta_peak_equals_cpu;

class MetaStepLarge : public ::testing::TestWithParam<std::string> {};

TEST_P(MetaStepLarge, PeakAllocatedEqualsTheCpuStepsWithinOneGranule) { expect_meta_peak_equals_cpu(GetParam()); }

INSTANTIATE_TEST_SUITE_P(RegisteredModels, MetaStepLarge, ::testing::ValuesIn(testing::kMetaSlowModels),
                         testing::test_name);

}  // namespace
}  // namespace ampforge::train
