#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "common/file_io.h"
#include "common/safetensors.h"
#include "nlohmann/json.hpp"
#include "engine/families/families.h"

namespace adjsh::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kAvg = "exp_avg.";
constexpr const char* kAvgSq = "exp_avg_sq.";

std::string StepName(int64_t step) { return absl::StrFormat("step-%08d", step); }

absl::Status FromErrorCode(const std::error_code& ec, const std::string& what) {
  return ec ? absl::InternalError(absl::StrCat(what, ": ", ec.message())) : absl::OkStatus();
}

// A moment's tensors (f32), each named prefix + the parameter's name.
template <typename P>
void AddMoments(const char* prefix, const P& moment, TensorMap& out) {
  for (const ParamRef<float>& p : ListParams(const_cast<P&>(moment)))
    out.emplace(prefix + p.name, HostTensor::From<float>(*p.values, p.shape, DType::kF32));
}

// Writes the step folder under its temporary name and renames it into place.
template <typename P>
absl::Status WriteStepDir(const fs::path& tmp_dir, const fs::path& final_dir, const P& params,
                          const AdamWState<P>& optimizer,
                          const TrainerState& state, DType model_dtype,
                          const std::vector<std::string>& side_files) {
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  if (absl::Status s = FamilyOf<P>::Save(tmp_dir.string(), params, model_dtype); !s.ok())
    return s;
  for (const std::string& file : side_files) {
    fs::copy_file(file, tmp_dir / fs::path(file).filename(), fs::copy_options::overwrite_existing,
                  ec);
    if (ec) return FromErrorCode(ec, "cannot copy " + file);
  }
  TensorMap moments;
  AddMoments(kAvg, optimizer.m, moments);
  AddMoments(kAvgSq, optimizer.v, moments);
  if (absl::Status s = WriteSafetensors((tmp_dir / "optimizer.safetensors").string(), moments);
      !s.ok())
    return s;
  nlohmann::ordered_json js = {{"step", state.step},
                               {"sequence", state.sequence},
                               {"data_position", state.data_position},
                               {"last_loss", state.last_loss},
                               {"adamw_step", optimizer.step}};
  if (!state.definition.empty()) js["options"] = nlohmann::ordered_json::parse(state.definition);
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

template <typename P>
absl::Status SaveCheckpoint(const std::string& root, const P& params,
                            const AdamWState<P>& optimizer, const TrainerState& state,
                            std::vector<int64_t>& written, int keep, DType model_dtype,
                            const std::vector<std::string>& side_files) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (absl::Status s = FromErrorCode(ec, "cannot create checkpoint directory " + root); !s.ok())
    return s;
  const std::string name = StepName(state.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp_dir = fs::path(root) / (name + ".tmp");
  absl::Status s = WriteStepDir(tmp_dir, final_dir, params, optimizer, state, model_dtype,
                                side_files);
  RemoveStaleAtomicTemps(root, "latest");  // of earlier runs killed while replacing `latest`
  if (s.ok()) s = WriteFileAtomic((fs::path(root) / "latest").string(), name);
  if (!s.ok()) {
    // A failed save (disk full, quota) frees what it wrote: `latest` still names the previous
    // checkpoint, which is left untouched, and a folder `latest` does not name is never kept.
    fs::remove_all(tmp_dir, ec);
    fs::remove_all(final_dir, ec);
    return absl::Status(s.code(),
                        absl::StrCat("cannot save the checkpoint of step ", state.step, " in ",
                                     root, " (the previous one is kept, if there is one): ",
                                     s.message()));
  }
  // Keep the newest `keep` of the folders this run wrote; any other folder is not ours to
  // delete (an earlier run's, or the one this run resumed from).
  std::erase(written, state.step);
  written.push_back(state.step);
  const size_t keep_n = static_cast<size_t>(std::max(1, keep));
  while (written.size() > keep_n) {
    fs::remove_all(fs::path(root) / StepName(written.front()), ec);
    written.erase(written.begin());
  }
  return absl::OkStatus();
}

absl::Status CheckCheckpointDirWritable(const std::string& root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create checkpoint directory ", root, ": ", ec.message()));
  }
  const std::string probe = (fs::path(root) / absl::StrCat(".write-check.", ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", root, " is not writable: ", std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

std::vector<std::string> ModelSideFiles(const std::string& model_dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                           "generation_config.json"}) {
    const fs::path p = fs::path(model_dir) / name;
    if (fs::is_regular_file(p, ec)) files.push_back(p.string());
  }
  return files;
}

namespace {

// One step folder: the model, the optimizer state and the trainer state, each checked.
template <typename P>
absl::StatusOr<Checkpoint<P>> LoadStepDir(const std::string& path) {
  Checkpoint<P> ck;
  ck.path = path;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return absl::NotFoundError(path + " is not there");
  for (const char* file : {"config.json", "model.safetensors", "optimizer.safetensors",
                           "trainer_state.json"}) {
    if (!fs::is_regular_file(fs::path(path) / file, ec))
      return absl::NotFoundError(absl::StrCat(path, " has no ", file));
  }
  absl::StatusOr<P> params = FamilyOf<P>::template Load<float>(ck.path);
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
      absl::StatusOr<std::vector<float>> values = it->second.template To<float>();
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
  ck.state.sequence = integer("sequence") ? js["sequence"].get<int64_t>() : -1;
  if (js.contains("options")) {
    if (!js["options"].is_object())
      return absl::InvalidArgumentError(ck.path + "/trainer_state.json: options is not an object");
    ck.state.definition = js["options"].dump();
  }
  ck.state.data_position = js["data_position"].get<int64_t>();
  ck.state.last_loss = js["last_loss"].get<double>();
  ck.optimizer.step = js["adamw_step"].get<int64_t>();
  return ck;
}

}  // namespace

template <typename P>
absl::StatusOr<Checkpoint<P>> LoadLatestCheckpoint(const std::string& root,
                                                   ResumeFallback fallback, std::string* note) {
  std::error_code ec;
  std::vector<int64_t> steps;  // the step folders there, newest first
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = e.is_directory(ec) ? StepOf(e.path().filename().string()) : -1;
    if (step >= 0) steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  const fs::path latest_path = fs::path(root) / "latest";
  const bool has_latest = fs::exists(fs::symlink_status(latest_path, ec));
  if (!has_latest && steps.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", root));
  }
  // Why `latest` gives no checkpoint, or the one it gives.
  std::string why;
  if (!has_latest) {
    why = absl::StrCat(root, " holds step folders but no `latest`");
  } else {
    absl::StatusOr<std::string> text = ReadFileToString(latest_path.string());
    const std::string name = text.ok() ? std::string(absl::StripAsciiWhitespace(*text)) : "";
    if (!text.ok()) {
      why = absl::StrCat("cannot read ", latest_path.string(), ": ", text.status().message());
    } else if (name.empty()) {
      why = absl::StrCat(latest_path.string(), " is empty");
    } else if (StepOf(name) < 0) {
      why = absl::StrCat(latest_path.string(), " names \"", name,
                         "\", not a step folder (step-NNNNNNNN)");
    } else {
      absl::StatusOr<Checkpoint<P>> ck = LoadStepDir<P>((fs::path(root) / name).string());
      if (ck.ok()) return ck;
      why = absl::StrCat(latest_path.string(), " names ", name, ", which does not load: ",
                         ck.status().message());
    }
  }
  if (fallback == ResumeFallback::kRefuse) {
    return absl::FailedPreconditionError(absl::StrCat(
        why, ". Nothing was started or deleted; repair `latest`, or resume from the newest "
             "complete step folder with the fallback option"));
  }
  for (int64_t step : steps) {
    absl::StatusOr<Checkpoint<P>> ck =
        LoadStepDir<P>((fs::path(root) / StepName(step)).string());
    if (!ck.ok()) continue;
    if (note) *note = absl::StrCat(why, "; resuming from ", StepName(step), " instead");
    return ck;
  }
  return absl::FailedPreconditionError(
      absl::StrCat(why, ", and no step folder in ", root, " loads. Nothing was started or deleted"));
}

#define ADJSH_INSTANTIATE(P)                                                                  \
  template absl::Status SaveCheckpoint<P>(const std::string&, const P&, const AdamWState<P>&,  \
                                          const TrainerState&, std::vector<int64_t>&, int,    \
                                          DType, const std::vector<std::string>&);            \
  template absl::StatusOr<Checkpoint<P>> LoadLatestCheckpoint<P>(const std::string&,          \
                                                                 ResumeFallback, std::string*);
ADJSH_INSTANTIATE(ModelParams<float>)
ADJSH_INSTANTIATE(Mamba2Params<float>)
#undef ADJSH_INSTANTIATE

}  // namespace adjsh::train
