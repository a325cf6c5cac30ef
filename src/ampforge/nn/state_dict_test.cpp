// Loading weights by name with a report (nn/state_dict.h): missing / unexpected / mis-shaped keys, strict
// errors listing all of them with the model unchanged, prefixes, safetensors files, and Module's own
// load_state_dict keeping its behaviour.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "ampforge/core/generator.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/models/resnet.h"
#include "ampforge/nn/state_dict.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
namespace fs = std::filesystem;

namespace {

// A two-layer model: "0.weight" (4, 3), "0.bias" (4), "1.weight", "1.running_mean", ... (BatchNorm2d(4)).
nn::ModulePtr tiny() {
  return std::make_shared<nn::Sequential>(
      std::initializer_list<nn::ModulePtr>{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::BatchNorm2d>(4)});
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         ops::to_dtype(a, DType::F64).tolist<double>() == ops::to_dtype(b, DType::F64).tolist<double>();
}

nn::NamedTensors clone_state(const nn::Module& m) {
  nn::NamedTensors out;
  for (const auto& [n, t] : m.state_dict()) out.emplace_back(n, ops::clone(t));
  return out;
}

std::string temp_file(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ampforge_state_dict_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

}  // namespace

TEST(LoadStateDict, ReportsMissingUnexpectedAndMisShapedKeysByName) {
  manual_seed(1);
  nn::ModulePtr m = tiny();
  const nn::NamedTensors before = clone_state(*m);
  nn::NamedTensors state = {{"0.weight", ops::ones({4, 3})},
                            {"0.bias", ops::ones({5})},                 // mis-shaped
                            {"1.weight", ops::full({4}, 2.0)},
                            {"1.bias", ops::full({4}, 3.0)},
                            {"1.running_mean", ops::full({4}, 4.0)},
                            {"1.running_var", ops::full({4}, 5.0)},
                            {"head.weight", ops::ones({2})}};           // unexpected; 1.num_batches_tracked missing
  nn::LoadOptions lo;
  lo.strict = false;
  const nn::LoadReport r = nn::load_state_dict(*m, state, lo);
  EXPECT_EQ(r.loaded_keys,
            (std::vector<std::string>{"0.weight", "1.weight", "1.bias", "1.running_mean", "1.running_var"}));
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"1.num_batches_tracked"}));
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"head.weight"}));
  ASSERT_EQ(r.mismatched_keys.size(), 1u);
  EXPECT_EQ(r.mismatched_keys[0].key, "0.bias");
  EXPECT_EQ(r.mismatched_keys[0].expected.vec(), (std::vector<int64_t>{4}));
  EXPECT_EQ(r.mismatched_keys[0].found.vec(), (std::vector<int64_t>{5}));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.str(),
            "loaded 5 of 7 keys; 1 missing key: 1.num_batches_tracked; 1 unexpected key: head.weight; "
            "1 shape mismatch: 0.bias (model [4], state [5])");
  const nn::NamedTensors after = m->state_dict();
  EXPECT_TRUE(same_values(after[0].second, ops::ones({4, 3})));   // loaded
  EXPECT_TRUE(same_values(after[1].second, before[1].second));    // mis-shaped: left alone
  EXPECT_TRUE(same_values(after[5].second, ops::full({4}, 5.0)));  // running_var
}

TEST(LoadStateDict, StrictListsEverythingInOneErrorAndLoadsNothing) {
  manual_seed(2);
  nn::ModulePtr m = tiny();
  const nn::NamedTensors before = clone_state(*m);
  nn::NamedTensors state = clone_state(*m);
  state[0].second = ops::zeros({4, 3});                // would load
  state[1].second = ops::zeros({4, 1});                // mis-shaped
  state.erase(state.begin() + 2);                      // 1.weight missing
  state.emplace_back("extra", ops::zeros({1}));        // unexpected
  try {
    nn::load_state_dict(*m, state);
    FAIL() << "strict load accepted a state that does not fit";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* s : {"1 missing key: 1.weight", "1 unexpected key: extra", "0.bias (model [4], state [4, 1])",
                          "Sequential", "nothing was loaded", "strict = false"})
      EXPECT_NE(msg.find(s), std::string::npos) << s << " not in: " << msg;
  }
  const nn::NamedTensors after = m->state_dict();
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_TRUE(same_values(after[i].second, before[i].second)) << after[i].first;
  // A fitting state loads fully and reports it.
  nn::ModulePtr other = tiny();
  const nn::LoadReport ok = nn::load_state_dict(*other, before);
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.loaded_keys.size(), 7u);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(same_values(other->state_dict()[i].second, before[i].second));
}

TEST(LoadStateDict, PrefixSelectsAndStripsConvertsDtypesAndRejectsDuplicates) {
  nn::ModulePtr m = tiny();
  nn::NamedTensors state;
  for (const auto& [n, t] : clone_state(*m)) state.emplace_back("model." + n, t);
  state.emplace_back("optim.step", ops::zeros({1}));  // outside the prefix: ignored, not unexpected
  state[0].second = ops::full({4, 3}, 0.5, DType::F64);  // converted to the model's F32
  nn::LoadOptions lo;
  lo.prefix = "model.";
  const nn::LoadReport r = nn::load_state_dict(*m, state, lo);
  EXPECT_TRUE(r.ok()) << r.str();
  EXPECT_EQ(m->state_dict()[0].second.dtype(), DType::F32);
  EXPECT_TRUE(same_values(m->state_dict()[0].second, ops::full({4, 3}, 0.5)));
  state.push_back(state[0]);
  EXPECT_THROW(nn::load_state_dict(*m, state, lo), Error);
}

// The torchvision path: a safetensors file (as scripts/torchvision_to_safetensors.py writes) into a ResNet;
// into a 10-class ResNet the fc keys are reported, everything else loads (the fine-tuning case).
TEST(LoadStateDict, ResNetFromSafetensorsFileWithADifferentHead) {
  manual_seed(3);
  auto src = models::resnet18();
  const std::string path = temp_file("resnet18.safetensors");
  save_safetensors(path, src->state_dict());
  manual_seed(4);
  auto same = models::resnet18();
  const nn::LoadReport full = nn::load_safetensors(*same, path);
  EXPECT_TRUE(full.ok()) << full.str();
  EXPECT_EQ(full.loaded_keys.size(), src->state_dict().size());
  EXPECT_TRUE(same_values(same->layer4->state_dict().back().second, src->layer4->state_dict().back().second));

  models::ResNetOptions o;
  o.num_classes = 10;
  auto ten = models::resnet18(o);
  EXPECT_THROW(nn::load_safetensors(*ten, path), Error);  // strict
  nn::LoadOptions lo;
  lo.strict = false;
  const nn::LoadReport r = nn::load_safetensors(*ten, path, lo);
  ASSERT_EQ(r.mismatched_keys.size(), 2u);
  EXPECT_EQ(r.mismatched_keys[0].key, "fc.weight");
  EXPECT_EQ(r.mismatched_keys[0].expected.vec(), (std::vector<int64_t>{10, 512}));
  EXPECT_EQ(r.mismatched_keys[0].found.vec(), (std::vector<int64_t>{1000, 512}));
  EXPECT_EQ(r.mismatched_keys[1].key, "fc.bias");
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  EXPECT_TRUE(same_values(ten->conv1->weight, src->conv1->weight));
  // Errors name the file.
  try {
    nn::load_safetensors(*ten, path);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(nn::load_safetensors(*ten, temp_file("absent.safetensors")), Error);
  fs::remove_all(fs::path(path).parent_path());
}

// Module::load_state_dict as before: strict rejects any difference (now naming all at once), non-strict
// ignores missing / unexpected keys but still rejects a mis-shaped one.
TEST(LoadStateDict, ModuleMethodKeepsItsBehaviour) {
  nn::ModulePtr m = tiny();
  nn::NamedTensors state = clone_state(*m);
  state.pop_back();
  EXPECT_THROW(m->load_state_dict(state, true), Error);
  EXPECT_NO_THROW(m->load_state_dict(state, false));
  state[1].second = ops::zeros({3});
  try {
    m->load_state_dict(state, false);
    FAIL() << "a mis-shaped key was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape mismatch for '0.bias': the model has [4], the state has [3]"),
              std::string::npos)
        << e.what();
  }
}
