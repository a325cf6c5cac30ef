#include "ampforge/cli/option_schema.h"

#include <nlohmann/json.hpp>

namespace ampforge::cli {
namespace {

void describe(const CLI::App& app, const std::string& path, nlohmann::json& commands) {
  nlohmann::json options = nlohmann::json::array();
  for (const CLI::Option* o : app.get_options()) {
    nlohmann::json names = nlohmann::json::array();
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
    const bool positional = !o->nonpositional();
    // A named option by its first long name (else short); a positional by its name (hidden ones included).
    const std::string name = !names.empty() ? names[0].get<std::string>() : o->get_name(true);
    if (name.empty() || name == "--help" || name == "--version") continue;
    options.push_back({{"name", name},
                       {"names", names},
                       {"type", o->get_type_name()},
                       {"takes_value", o->get_items_expected_max() > 0},
                       {"positional", positional},
                       {"required", o->get_required()},
                       {"multiple", o->get_items_expected_max() > 1}});
  }
  if (!path.empty()) commands.push_back({{"path", path}, {"options", options}});
  for (const CLI::App* sub : app.get_subcommands({}))
    describe(*sub, path.empty() ? sub->get_name() : path + " " + sub->get_name(), commands);
}

}  // namespace

std::string option_schema_json(const CLI::App& app) {
  nlohmann::json commands = nlohmann::json::array();
  describe(app, "", commands);
  return nlohmann::json{{"commands", commands}}.dump(1);
}

}  // namespace ampforge::cli
