// Every subcommand's options as JSON, read from the CLI's own definitions (CLI11's App tree): what
// `ampforge --cli-schema` prints. Used by the option sweep (cli/option_sweep_test.cpp), which runs each option
// with boundary values, and usable by shell-completion generators. Hidden from --help: it describes the CLI,
// not the engine.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace ampforge::cli {

// {"commands": [{"path": "memory replay", "options": [{"name": "--policy", "names": ["--policy"], "type": "TEXT",
//   "takes_value": true, "positional": false, "required": false, "multiple": false}, ...]}, ...]}
// One entry per subcommand at any depth (a subcommand that only groups others is listed too, with its own
// options); the help and version flags are left out.
std::string option_schema_json(const CLI::App& app);

}  // namespace ampforge::cli
