#include "coordinator/job_store.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace adjsh::coordinator {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kMaxRecordBytes = 1 << 20;  // a spec is at most 64 KiB (job_spec.h)

int64_t JobNumber(const std::string& job_id) {
  int64_t n = -1;
  if (job_id.rfind("job-", 0) != 0 || !absl::SimpleAtoi(job_id.substr(4), &n)) return -1;
  return n;
}

}  // namespace

JobStore::JobStore(const std::string& state_dir)
    : dir_(state_dir.empty() ? "" : (fs::path(state_dir) / "jobs").string()) {}

absl::Status JobStore::Save(const StoredJob& j) const {
  if (!enabled()) return absl::OkStatus();
  std::string job_json;
  const auto converted = google::protobuf::util::MessageToJsonString(j.job, &job_json);
  if (!converted.ok()) {
    return absl::InternalError(absl::StrCat("cannot encode job ", j.job.job_id()));
  }
  const nlohmann::json record = {{"job", nlohmann::json::parse(job_json)},
                                 {"checkpoint_dir", j.checkpoint_dir},
                                 {"state_message", j.state_message}};
  std::error_code ec;
  fs::create_directories(dir_, ec);
  return WriteFileAtomic((fs::path(dir_) / (j.job.job_id() + ".json")).string(), record.dump(1));
}

void JobStore::Remove(const std::string& job_id) const {
  if (!enabled()) return;
  std::error_code ec;
  fs::remove(fs::path(dir_) / (job_id + ".json"), ec);
}

std::vector<StoredJob> JobStore::Load(std::vector<std::string>* problems) const {
  std::vector<std::pair<int64_t, StoredJob>> found;
  if (!enabled()) return {};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const fs::path path = e.path();
    if (path.extension() != ".json") continue;
    const std::string id = path.stem().string();
    auto problem = [&](const std::string& why) {
      if (problems) problems->push_back(absl::StrCat(path.string(), ": ", why));
    };
    if (JobNumber(id) < 0) continue;
    RemoveStaleAtomicTemps(dir_, path.filename().string());  // of a coordinator killed mid-write
    absl::StatusOr<std::string> text =
        ReadFileToString(path.string(), {.regular_only = true, .max_bytes = kMaxRecordBytes});
    if (!text.ok()) {
      problem(std::string(text.status().message()));
      continue;
    }
    const nlohmann::json js = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!js.is_object() || !js.contains("job") || !js["job"].is_object() ||
        !js.value("checkpoint_dir", nlohmann::json()).is_string() ||
        !js.value("state_message", nlohmann::json()).is_string()) {
      problem("not a job record");
      continue;
    }
    StoredJob j;
    if (!google::protobuf::util::JsonStringToMessage(js["job"].dump(), &j.job).ok() ||
        j.job.job_id() != id) {
      problem("its job does not parse, or names another id");
      continue;
    }
    j.checkpoint_dir = js["checkpoint_dir"].get<std::string>();
    j.state_message = js["state_message"].get<std::string>();
    found.emplace_back(JobNumber(id), std::move(j));
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<StoredJob> out;
  for (auto& [n, j] : found) out.push_back(std::move(j));
  return out;
}

}  // namespace adjsh::coordinator
