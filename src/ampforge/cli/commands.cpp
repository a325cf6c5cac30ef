#include "ampforge/cli/commands.h"

namespace ampforge::cli {

CommandList register_commands(CLI::App& app) {
  CommandList list;
  list.push_back(add_info_command(app));
  list.push_back(add_train_command(app));
  list.push_back(add_doctor_command(app));
  list.push_back(add_monitor_command(app));
  list.push_back(add_memory_command(app));
  list.push_back(add_profile_command(app));
  list.push_back(add_models_command(app));
  list.push_back(add_bench_command(app));
  list.push_back(add_export_command(app));
  list.push_back(add_predict_command(app));
  list.push_back(add_data_command(app));
  list.push_back(add_detect_command(app));
  list.push_back(add_launch_command(app));
  return list;
}

}  // namespace ampforge::cli
