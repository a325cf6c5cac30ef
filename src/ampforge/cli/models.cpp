// `ampforge models [NAME...] [--json]`: the models `train --model` and `memory fit --model` accept, with
// their task, default input, parameter counts (each model is built in its default configuration and its
// parameters counted) and a one-line description.
// `ampforge models [NAME] --load FILE [--json]`: loads a safetensors file (e.g. from
// scripts/torchvision_to_safetensors.py) into the model's default configuration by name, or an `ampforge train`
// checkpoint into the model as it was trained (NAME optional: the checkpoint records it), and prints the
// report: loaded, missing, unexpected and mis-shaped keys.
// JSON schemas ampforge.models/1 and ampforge.models.load/1: docs/ARCHITECTURE.md ("Models").
// Exit codes: 0 listed / every key loaded; 1 the file does not fit the model (the report says how);
// 2 usage error, unknown name (the message lists the known ones) or unreadable file.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/cli/commands.h"
#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/models/registry.h"
#include "ampforge/nn/init.h"
#include "ampforge/nn/state_dict.h"

namespace ampforge::cli {

namespace {

struct ModelsArgs {
  std::vector<std::string> names;
  std::string load;
  bool json = false;
};

// 11689512 -> "11,689,512"
std::string thousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string input_str(const models::ModelOptions& o) {
  return fmt::format("{}x{}x{}", o.in_channels, o.image_size, o.image_size);
}

int run_load(const ModelsArgs& a) {
  AF_CHECK(a.names.size() <= 1, "--load: name one model to load into (got {})", a.names.size());
  const SafetensorsFile file = load_safetensors(a.load);
  // An `ampforge train` checkpoint records its model and what it was built with (core/checkpoint_format.h): the
  // name may be left out, and the model is built as trained (classes, channels, image size), from "model.*".
  const std::optional<checkpoint::ModelRecord> record = checkpoint::read_model_record(file.metadata, a.load);
  AF_CHECK(!a.names.empty() || (record && !record->model.empty()),
           "--load {}: name the model to load into (the file is not an ampforge training checkpoint that names it)",
           a.load);
  const std::string name = a.names.empty() ? record->model : a.names[0];
  if (record && !record->model.empty())
    AF_CHECK(name == record->model, "checkpoint '{}' was saved from model '{}', not '{}'", a.load, record->model,
             name);
  const models::ModelEntry& e = models::model_registry().at(name);
  models::ModelOptions mo = e.defaults;
  if (record) {
    if (record->in_channels > 0) mo.in_channels = record->in_channels;
    if (record->num_classes > 0) mo.num_classes = record->num_classes;
    if (record->image_size > 0) mo.image_size = record->image_size;  // a token-id model: its sequence length
  }
  nn::ModulePtr model;
  {
    nn::init::SkipInitGuard skip;  // every value that matters comes from the file
    model = e.build(mo);
  }
  nn::NamedTensors state;
  if (record) {
    state = checkpoint::model_weights(file.tensors);
  } else {
    state = e.reference_state(file.tensors);  // the reference's names (BERT: a Hugging Face file as downloaded)
  }
  nn::LoadOptions lo;
  lo.strict = false;
  const nn::LoadReport r = nn::load_state_dict(*model, state, lo);
  if (a.json) {
    nlohmann::json mis = nlohmann::json::array();
    for (const auto& m : r.mismatched_keys)
      mis.push_back({{"key", m.key}, {"expected", m.expected.vec()}, {"found", m.found.vec()}});
    const nlohmann::json j = {{"schema", "ampforge.models.load/1"}, {"model", e.name}, {"file", a.load},
                              {"ok", r.ok()}, {"loaded", r.loaded_keys.size()}, {"missing_keys", r.missing_keys},
                              {"unexpected_keys", r.unexpected_keys}, {"mismatched_keys", mis}};
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
  } else {
    std::printf("%s <- %s: %s\n", e.name.c_str(), a.load.c_str(), r.str().c_str());
  }
  return r.ok() ? 0 : 1;
}

int run_models(const ModelsArgs& a) {
  if (!a.load.empty()) return run_load(a);
  const models::ModelRegistry& reg = models::model_registry();
  std::vector<const models::ModelEntry*> chosen;
  if (a.names.empty()) {
    for (const auto& e : reg.entries()) chosen.push_back(&e);
  } else {
    for (const auto& n : a.names) chosen.push_back(&reg.at(n));  // unknown: InvalidArgument -> exit 2
  }
  std::vector<std::vector<models::ParameterCount>> counts;
  for (const auto* e : chosen) counts.push_back(models::parameter_counts(*e));

  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < chosen.size(); ++i) {
      const auto& e = *chosen[i];
      nlohmann::json c = nlohmann::json::array();
      for (const auto& pc : counts[i]) c.push_back({{"label", pc.label}, {"count", pc.count}});
      list.push_back({{"name", e.name},
                      {"task", e.task},
                      {"description", e.description},
                      {"default_input",
                       {{"channels", e.defaults.in_channels},
                        {"height", e.defaults.image_size},
                        {"width", e.defaults.image_size}}},
                      {"num_classes", e.defaults.num_classes},
                      {"parameters", counts[i].front().count},
                      {"parameter_counts", c}});
    }
    const nlohmann::json j = {{"schema", "ampforge.models/1"}, {"models", list}};
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
    return 0;
  }

  size_t wname = 4, wtask = 4;
  for (const auto* e : chosen) wname = std::max(wname, e->name.size()), wtask = std::max(wtask, e->task.size());
  std::printf("%-*s  %-*s  %-9s  %7s  %13s  %s\n", static_cast<int>(wname), "name", static_cast<int>(wtask), "task",
              "input", "classes", "parameters", "description");
  for (size_t i = 0; i < chosen.size(); ++i) {
    const auto& e = *chosen[i];
    const auto& c = counts[i];
    const bool one = c.size() == 1 && c.front().label == "parameters";
    std::printf("%-*s  %-*s  %-9s  %7lld  %13s  %s\n", static_cast<int>(wname), e.name.c_str(),
                static_cast<int>(wtask), e.task.c_str(), input_str(e.defaults).c_str(),
                static_cast<long long>(e.defaults.num_classes), thousands(c.front().count).c_str(),
                one ? e.description.c_str() : (e.description + " [" + c.front().label + "]").c_str());
    for (size_t k = 1; k < c.size(); ++k)
      std::printf("%-*s  %-*s  %-9s  %7s  %13s  [%s]\n", static_cast<int>(wname), "", static_cast<int>(wtask), "", "",
                  "", thousands(c[k].count).c_str(), c[k].label.c_str());
  }
  return 0;
}

}  // namespace

Command add_models_command(CLI::App& app) {
  auto args = std::make_shared<ModelsArgs>();
  auto* sub = app.add_subcommand("models", "List the models `train --model` accepts, with their parameter counts");
  sub->add_option("names", args->names, "Only these models (default: all)");
  sub->add_option("--load", args->load,
                  "Load this safetensors file into the (one) named model by key and report missing, unexpected "
                  "and mis-shaped keys");
  sub->add_flag("--json", args->json,
                "Print JSON (schemas ampforge.models/1, ampforge.models.load/1; see docs/ARCHITECTURE.md)");
  sub->footer(
      "Counts are of each model's default configuration (input and classes as listed), built and counted.\n"
      "Example: ampforge models resnet50 --load resnet50.safetensors  (scripts/torchvision_to_safetensors.py)\n"
      "Exit codes: 0 listed / all keys loaded; 1 the file does not fit the model; 2 usage error, unknown model\n"
      "name or unreadable file.");
  return {sub, [args] { return run_models(*args); }};
}

}  // namespace ampforge::cli
