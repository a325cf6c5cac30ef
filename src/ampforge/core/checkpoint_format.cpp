#include "ampforge/core/checkpoint_format.h"

#include <nlohmann/json.hpp>

#include "ampforge/util/error.h"

namespace ampforge::checkpoint {

bool is_checkpoint(const std::map<std::string, std::string>& metadata) {
  const auto it = metadata.find("format");
  return it != metadata.end() && it->second == kFormat;
}

std::optional<ModelRecord> read_model_record(const std::map<std::string, std::string>& metadata,
                                             const std::string& path) {
  if (!is_checkpoint(metadata)) return std::nullopt;
  ModelRecord r;
  if (const auto it = metadata.find("model"); it != metadata.end()) r.model = it->second;
  const auto it = metadata.find("model_record");
  if (it == metadata.end()) return r;
  try {
    const nlohmann::json j = nlohmann::json::parse(it->second);
    r.task = j.value("task", std::string());
    r.in_channels = j.value("in_channels", int64_t{0});
    r.num_classes = j.value("num_classes", int64_t{0});
    r.image_size = j.value("image_size", int64_t{0});
    if (j.contains("model")) r.model = j.at("model").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    AF_THROW(Io, "checkpoint '{}' has a malformed model_record ({}): {}", path, e.what(), it->second);
  }
  if (r.in_channels < 0 || r.num_classes < 0 || r.image_size < 0 || r.in_channels > 4096 ||
      r.num_classes > (int64_t{1} << 24) || r.image_size > (int64_t{1} << 16))
    AF_THROW(Io, "checkpoint '{}' has a model_record out of range: {}", path, it->second);
  return r;
}

std::string model_record_json(const ModelRecord& r) {
  return nlohmann::json{{"model", r.model},
                        {"task", r.task},
                        {"in_channels", r.in_channels},
                        {"num_classes", r.num_classes},
                        {"image_size", r.image_size}}
      .dump();
}

std::vector<std::pair<std::string, Tensor>> model_weights(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                          std::string* which) {
  bool has_ema = false;
  for (const auto& [n, t] : tensors) has_ema = has_ema || n.rfind(kEmaPrefix, 0) == 0;
  const std::string prefix = has_ema ? kEmaPrefix : kModelPrefix;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [n, t] : tensors)
    if (n.rfind(prefix, 0) == 0) out.emplace_back(n.substr(prefix.size()), t);
  if (which != nullptr) *which = has_ema ? "ema" : "model";
  return out;
}

}  // namespace ampforge::checkpoint
