// `ampforge models` as a user runs it (the real binary): the JSON lists every registered model with the
// documented keys and torchvision's counts (issue 13, acceptance 1), the table prints them, --help and
// usage errors, an unknown name is exit 2 naming the known ones.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "ampforge/core/safetensors.h"
#include "ampforge/hw/cli_test_util.h"
#include "ampforge/models/models.h"
#include "ampforge/nn/init.h"

using ampforge::hw::testing::run_ampforge;

namespace {
const std::map<std::string, std::string> kEnv = {{"NO_COLOR", "1"}};
}

TEST(ModelsCli, JsonListsEveryModelWithTorchvisionsCounts) {
  const auto r = run_ampforge({"models", "--json"}, kEnv, 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("schema"), "ampforge.models/1");
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& m : j.at("models")) {
    for (const char* k : {"name", "task", "description", "default_input", "num_classes", "parameters",
                          "parameter_counts"})
      EXPECT_TRUE(m.contains(k)) << k << " in " << m.dump();
    by_name[m.at("name").get<std::string>()] = m;
  }
  EXPECT_EQ(by_name.size(), ampforge::models::names().size());
  for (const auto& n : ampforge::models::names()) EXPECT_TRUE(by_name.count(n)) << n;
  EXPECT_EQ(by_name.at("resnet18").at("parameters"), 11689512);
  EXPECT_EQ(by_name.at("resnet50").at("parameters"), 25557032);
  EXPECT_EQ(by_name.at("resnet50").at("parameter_counts"),
            nlohmann::json::parse(R"([{"label": "parameters", "count": 25557032}])"));
  EXPECT_EQ(by_name.at("resnet50").at("task"), "classification");
  EXPECT_EQ(by_name.at("resnet50").at("default_input"),
            nlohmann::json::parse(R"({"channels": 3, "height": 224, "width": 224})"));
  EXPECT_EQ(by_name.at("resnet50").at("num_classes"), 1000);
  EXPECT_EQ(by_name.at("cnn").at("default_input").at("channels"), 1);
  // Acceptance of the BERT issue: both counts, labelled.
  EXPECT_EQ(by_name.at("bert-base").at("task"), "masked_lm");
  EXPECT_EQ(by_name.at("bert-base").at("parameter_counts"),
            nlohmann::json::parse(R"([{"label": "BertModel with pooler", "count": 109482240},
                                      {"label": "BertForMaskedLM", "count": 109514298}])"));
}

TEST(ModelsCli, TableAndSelectedNames) {
  const auto r = run_ampforge({"models", "resnet18", "resnet50"}, kEnv, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("11,689,512"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("25,557,032"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3x224x224"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("resnet152"), std::string::npos) << r.out;
}

TEST(ModelsCli, HelpUsageErrorsAndUnknownNames) {
  const auto h = run_ampforge({"models", "--help"}, kEnv);
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.out.find("--json"), std::string::npos) << h.out;
  EXPECT_EQ(run_ampforge({"models", "--no-such-flag"}, kEnv).exit_code, 2);
  const auto u = run_ampforge({"models", "resnet49"}, kEnv);
  EXPECT_EQ(u.exit_code, 2);
  EXPECT_NE(u.err.find("unknown model 'resnet49'"), std::string::npos) << u.err;
  EXPECT_NE(u.err.find("resnet50"), std::string::npos) << u.err;
}

// --load: a safetensors file checked against a model by key (what torchvision_to_safetensors.py writes has
// torchvision's keys, as ampforge's own state_dict()).
TEST(ModelsCli, LoadReportsWhetherAFileFitsTheModel) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ampforge_models_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fits = (dir / "r18.safetensors").string(), ten = (dir / "r18_10.safetensors").string();
  size_t keys = 0;
  {
    ampforge::nn::init::SkipInitGuard skip;  // the values do not matter here
    auto m = ampforge::models::resnet18();
    keys = m->state_dict().size();
    ampforge::save_safetensors(fits, m->state_dict());
    ampforge::models::ResNetOptions o;
    o.num_classes = 10;
    ampforge::save_safetensors(ten, ampforge::models::resnet18(o)->state_dict());
  }
  const auto ok = run_ampforge({"models", "resnet18", "--load", fits}, kEnv, 60);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("loaded " + std::to_string(keys) + " of " + std::to_string(keys) + " keys"), std::string::npos)
      << ok.out;
  const auto bad = run_ampforge({"models", "resnet18", "--load", ten, "--json"}, kEnv, 60);
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  const nlohmann::json j = nlohmann::json::parse(bad.out);
  EXPECT_EQ(j.at("schema"), "ampforge.models.load/1");
  EXPECT_EQ(j.at("ok"), false);
  EXPECT_EQ(j.at("loaded"), keys - 2);
  EXPECT_EQ(j.at("mismatched_keys").at(0),
            nlohmann::json::parse(R"({"key": "fc.weight", "expected": [1000, 512], "found": [10, 512]})"));
  EXPECT_EQ(run_ampforge({"models", "resnet18", "--load", (dir / "absent").string()}, kEnv).exit_code, 2);
  EXPECT_EQ(run_ampforge({"models", "resnet18", "resnet50", "--load", fits}, kEnv).exit_code, 2);
  fs::remove_all(dir);
}

// A Hugging Face BERT checkpoint loads as downloaded: the original LayerNorm names (gamma/beta), the tied decoder
// duplicates and the position_ids buffer are mapped by the registry entry's from_reference_state.
TEST(ModelsCli, LoadMapsHuggingFaceBertNames) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ampforge_models_bert_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string hf_file = (dir / "model.safetensors").string();
  size_t keys = 0;
  {
    ampforge::nn::init::SkipInitGuard skip;
    const auto& e = ampforge::models::model_registry().at("bert-tiny");
    auto m = e.build(e.defaults);
    ampforge::nn::NamedTensors hf;
    for (auto [key, t] : m->state_dict()) {
      ++keys;
      if (key.ends_with("LayerNorm.weight")) key = key.substr(0, key.size() - 6) + "gamma";
      else if (key.ends_with("LayerNorm.bias")) key = key.substr(0, key.size() - 4) + "beta";
      hf.emplace_back(key, t);
    }
    hf.emplace_back("cls.predictions.decoder.weight", m->state_dict().front().second);
    hf.emplace_back("bert.embeddings.position_ids",
                    ampforge::Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, ampforge::Shape{1, 4}));
    ampforge::save_safetensors(hf_file, hf);
  }
  const auto r = run_ampforge({"models", "bert-tiny", "--load", hf_file, "--json"}, kEnv, 60);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("ok"), true) << r.out;
  EXPECT_EQ(j.at("loaded"), keys);
  EXPECT_TRUE(j.at("unexpected_keys").empty()) << r.out;
  fs::remove_all(dir);
}
