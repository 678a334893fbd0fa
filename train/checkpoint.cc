#include "train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/numbers.h"
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

// Writes the step folder under its temporary name and renames it into place.
absl::Status WriteStepDir(const fs::path& tmp_dir, const fs::path& final_dir,
                          const ModelParams<float>& params, const AdamWState& optimizer,
                          const TrainerState& state) {
  std::error_code ec;
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
  return FromErrorCode(ec, "cannot rename " + tmp_dir.string());
}

// The step of a folder name "step-NNNNNNNN", or -1 for anything else (temporary folders too).
int64_t StepOf(const std::string& name) {
  int64_t step = -1;
  if (name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos ||
      !absl::SimpleAtoi(name.substr(5), &step)) {
    return -1;
  }
  return step;
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
  absl::Status s = WriteStepDir(tmp_dir, final_dir, params, optimizer, state);
  if (s.ok()) s = WriteFileAtomic((fs::path(root) / "latest").string(), name);
  if (!s.ok()) {
    // A failed save (disk full, quota) frees what it wrote: `latest` still names the previous
    // checkpoint, which is left untouched, and a folder `latest` does not name is never kept.
    fs::remove_all(tmp_dir, ec);
    fs::remove_all(final_dir, ec);
    return absl::Status(s.code(), absl::StrCat("cannot save the checkpoint of step ", state.step,
                                                " in ", root, " (the previous one is kept): ",
                                                s.message()));
  }

  // Keep the newest `keep` step folders up to this one; later ones are left over from a run
  // that went further before it was resumed from an earlier checkpoint: stale, removed.
  std::vector<int64_t> older, stale;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = e.is_directory() ? StepOf(e.path().filename().string()) : -1;
    if (step > state.step) stale.push_back(step);
    if (step >= 0 && step < state.step) older.push_back(step);
  }
  std::sort(older.begin(), older.end());
  if (older.size() >= static_cast<size_t>(std::max(1, keep))) {
    stale.insert(stale.end(), older.begin(), older.end() - (std::max(1, keep) - 1));
  }
  for (int64_t step : stale) fs::remove_all(fs::path(root) / StepName(step), ec);
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
