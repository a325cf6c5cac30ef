// Subcommand registry of the CLI: each cli/<name>.cpp adds its subcommand and returns how to run it.
#pragma once

#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace ampforge::cli {

struct Command {
  CLI::App* sub;
  std::function<int()> run;  // returns the process exit code
};
using CommandList = std::vector<Command>;

CommandList register_commands(CLI::App& app);

// One registration function per subcommand file.
Command add_info_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_doctor_command(CLI::App& app);
Command add_monitor_command(CLI::App& app);
Command add_memory_command(CLI::App& app);
Command add_profile_command(CLI::App& app);
Command add_models_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_predict_command(CLI::App& app);
Command add_data_command(CLI::App& app);
Command add_detect_command(CLI::App& app);
Command add_launch_command(CLI::App& app);

}  // namespace ampforge::cli
