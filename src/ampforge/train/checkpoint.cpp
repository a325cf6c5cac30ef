#include "ampforge/train/checkpoint.h"

#include <optional>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/core/safetensors.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/build_info.h"

namespace ampforge::train {

void check_checkpoint_path(const std::string& path) {
  namespace fs = std::filesystem;
  // The messages name the path, not the option: the CLI's --save and the Python package's save= both get here.
  AF_CHECK(!path.empty(), "cannot save checkpoints to an empty path: give a file name (e.g. ckpt.safetensors)");
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::string dir = path;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    AF_THROW(InvalidArgument, "cannot save checkpoints to '{}': it is a directory; give a file name (e.g. {}/ckpt.safetensors)",
             path, dir);
  }
  // Probe the way a save writes: a new file beside the target (the save renames its temporary file there).
  const std::string probe = fmt::format("{}.probe.{}.{}", path, static_cast<long>(::getpid()), static_cast<long>(::gettid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    AF_THROW(Io, "cannot save checkpoints to '{}': {} (checked before training, so no run is lost)", path,
             std::strerror(err));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt,
                     const CheckpointInfo& info) {
  save_checkpoint(path, model, opt, opt.state_dict(), info);
}

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt,
                     const std::vector<std::pair<std::string, Tensor>>& optimizer_state, const CheckpointInfo& info) {
  // The file holds host bytes: device tensors are copied to the CPU (the one synchronisation of a save).
  auto host = [](const Tensor& t) { return t.device().is_cpu() ? t : ops::to_device(t, kCPU); };
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [n, t] : model.state_dict()) tensors.emplace_back(checkpoint::kModelPrefix + n, host(t));
  for (auto& [n, t] : optimizer_state) tensors.emplace_back(checkpoint::kOptimizerPrefix + n, host(t));
  for (auto& [n, t] : info.ema) tensors.emplace_back(checkpoint::kEmaPrefix + n, host(t));
  nlohmann::json pos = {{"epoch", info.pos.epoch}, {"batch_in_epoch", info.pos.batch_in_epoch},
                        {"global_step", info.pos.global_step}};
  nlohmann::json rng = {{"seed", std::to_string(info.rng.seed)}, {"offset", std::to_string(info.rng.offset)}};
  std::map<std::string, std::string> meta{{"format", kCheckpointFormat},
                                          {"ampforge_version", AMPFORGE_VERSION_STRING},
                                          {"model", info.model},
                                          {"optimizer", opt.name()},
                                          {"position", pos.dump()},
                                          {"rng", rng.dump()},
                                          {"scaler", nlohmann::json(info.scaler).dump()},
                                          {"config", info.config_json}};
  if (!info.ema.empty()) meta["ema_updates"] = std::to_string(info.ema_updates);
  if (!info.record.model.empty()) meta["model_record"] = checkpoint::model_record_json(info.record);
  save_safetensors(path, tensors, meta);
}

CheckpointInfo load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                               const std::string& expected_model) {
  auto file = load_safetensors(path);
  auto& meta = file.metadata;
  auto get = [&](const char* k) -> const std::string& {
    auto it = meta.find(k);
    if (it == meta.end()) AF_THROW(Io, "'{}' is not an ampforge checkpoint (metadata key '{}' is missing)", path, k);
    return it->second;
  };
  if (get("format") != kCheckpointFormat)
    AF_THROW(Io, "'{}' has checkpoint format '{}'; this build reads '{}'", path, get("format"), kCheckpointFormat);
  CheckpointInfo info;
  info.model = get("model");
  AF_CHECK(info.model == expected_model, "checkpoint '{}' was saved from model '{}', not '{}' (pass --model {} or "
           "another checkpoint)", path, info.model, expected_model, info.model);
  AF_CHECK(get("optimizer") == opt.name(), "checkpoint '{}' holds {} optimizer state, but this run uses {}", path,
           get("optimizer"), opt.name());
  try {
    auto pos = nlohmann::json::parse(get("position"));
    info.pos = {pos.at("epoch").get<int64_t>(), pos.at("batch_in_epoch").get<int64_t>(), pos.at("global_step").get<int64_t>()};
    auto rng = nlohmann::json::parse(get("rng"));
    info.rng = {std::stoull(rng.at("seed").get<std::string>()), std::stoull(rng.at("offset").get<std::string>())};
    info.scaler = nlohmann::json::parse(get("scaler")).get<std::map<std::string, double>>();
  } catch (const nlohmann::json::exception& e) {
    AF_THROW(Io, "checkpoint '{}' has malformed metadata: {}", path, e.what());
  }
  info.config_json = meta.count("config") ? meta.at("config") : "";
  info.record = *checkpoint::read_model_record(meta, path);
  if (auto it = meta.find("ema_updates"); it != meta.end()) {
    try {
      info.ema_updates = std::stoll(it->second);
    } catch (const std::exception&) {
      AF_THROW(Io, "checkpoint '{}' has a malformed ema_updates '{}'", path, it->second);
    }
  }
  std::vector<std::pair<std::string, Tensor>> model_state, opt_state;
  for (auto& [n, t] : file.tensors) {
    const auto strip = [&n = n](std::string_view prefix) -> std::optional<std::string> {
      if (n.rfind(prefix, 0) != 0) return std::nullopt;
      return n.substr(prefix.size());
    };
    if (auto m = strip(checkpoint::kModelPrefix)) model_state.emplace_back(*m, t);
    else if (auto o = strip(checkpoint::kOptimizerPrefix)) opt_state.emplace_back(*o, t);
    else if (auto e = strip(checkpoint::kEmaPrefix)) info.ema.emplace_back(*e, t);
    else AF_THROW(Io, "checkpoint '{}' has an unexpected tensor '{}'", path, n);
  }
  try {
    model.load_state_dict(model_state, true);
    opt.load_state_dict(opt_state);
  } catch (const Error& e) {
    AF_THROW(InvalidArgument, "checkpoint '{}' does not fit this model: {}", path, e.what());
  }
  return info;
}

}  // namespace ampforge::train
