#include "train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/safetensors.h"
#include "nlohmann/json.hpp"

namespace adjsh::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kAvg = "exp_avg.";
constexpr const char* kAvgSq = "exp_avg_sq.";

std::string StepName(int64_t step) { return absl::StrFormat("step-%08d", step); }

absl::Status FromErrorCode(const std::error_code& ec, const std::string& what) {
  return ec ? absl::InternalError(absl::StrCat(what, ": ", ec.message())) : absl::OkStatus();
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& root, const ModelParams<float>& params,
                            const AdamWState& optimizer, const TrainerState& state, int keep) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (absl::Status s = FromErrorCode(ec, "cannot create checkpoint directory " + root); !s.ok())
    return s;
  const std::string name = StepName(state.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp_dir = fs::path(root) / (name + ".tmp");
  fs::remove_all(tmp_dir, ec);
  if (absl::Status s = SaveModelDir(tmp_dir.string(), params, DType::kF32); !s.ok()) return s;

  TensorMap moments;
  for (auto& [name, t] : ParamsToTensors(optimizer.m, DType::kF32))
    moments.emplace(kAvg + name, std::move(t));
  for (auto& [name, t] : ParamsToTensors(optimizer.v, DType::kF32))
    moments.emplace(kAvgSq + name, std::move(t));
  if (absl::Status s = WriteSafetensors((tmp_dir / "optimizer.safetensors").string(), moments);
      !s.ok())
    return s;
  const nlohmann::json js = {{"step", state.step},
                             {"data_position", state.data_position},
                             {"last_loss", state.last_loss},
                             {"adamw_step", optimizer.step}};
  if (absl::Status s = WriteFileAtomic((tmp_dir / "trainer_state.json").string(), js.dump(2));
      !s.ok())
    return s;
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (absl::Status s = FromErrorCode(ec, "cannot rename " + tmp_dir.string()); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomic((fs::path(root) / "latest").string(), name); !s.ok())
    return s;

  // Keep the newest `keep` step folders.
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find('.') == std::string::npos)
      steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t k = 0; k + std::max(1, keep) < steps.size(); ++k)
    fs::remove_all(fs::path(root) / steps[k], ec);
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> LoadLatestCheckpoint(const std::string& root) {
  absl::StatusOr<std::string> latest = ReadFileToString((fs::path(root) / "latest").string());
  if (!latest.ok()) {
    if (absl::IsNotFound(latest.status()))
      return absl::NotFoundError(absl::StrCat("no checkpoint in ", root));
    return latest.status();
  }
  Checkpoint ck;
  ck.path = (fs::path(root) / *latest).string();
  absl::StatusOr<ModelParams<float>> params = LoadModelDir<float>(ck.path);
  if (!params.ok()) return params.status();
  ck.params = std::move(*params);
  absl::StatusOr<TensorMap> moments =
      ReadSafetensors((fs::path(ck.path) / "optimizer.safetensors").string());
  if (!moments.ok()) return moments.status();
  ck.optimizer = NewAdamWState(ck.params.config);
  for (auto [prefix, model] : {std::pair{kAvg, &ck.optimizer.m}, std::pair{kAvgSq, &ck.optimizer.v}}) {
    for (const ParamRef<float>& p : ListParams(*model)) {
      auto it = moments->find(prefix + p.name);
      if (it == moments->end() || it->second.shape != p.shape) {
        return absl::InvalidArgumentError(absl::StrCat(ck.path, ": optimizer state for ", p.name,
                                                       " is missing or has the wrong shape"));
      }
      absl::StatusOr<std::vector<float>> values = it->second.To<float>();
      if (!values.ok()) return values.status();
      *p.values = std::move(*values);
    }
  }
  absl::StatusOr<std::string> text =
      ReadFileToString((fs::path(ck.path) / "trainer_state.json").string());
  if (!text.ok()) return text.status();
  const nlohmann::json js = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto integer = [&](const char* key) {
    return js.is_object() && js.contains(key) && js[key].is_number_integer() &&
           js[key].get<int64_t>() >= 0;
  };
  if (!integer("step") || !integer("data_position") || !integer("adamw_step") ||
      !js.contains("last_loss") || !js["last_loss"].is_number()) {
    return absl::InvalidArgumentError(ck.path + "/trainer_state.json is malformed");
  }
  ck.state.step = js["step"].get<int64_t>();
  ck.state.data_position = js["data_position"].get<int64_t>();
  ck.state.last_loss = js["last_loss"].get<double>();
  ck.optimizer.step = js["adamw_step"].get<int64_t>();
  return ck;
}

}  // namespace adjsh::train
