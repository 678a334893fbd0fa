#include "coordinator/job_paths.h"

#include <filesystem>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "train/dataset.h"

namespace adjsh::coordinator {
namespace fs = std::filesystem;
namespace {

bool Within(const fs::path& p, const fs::path& root) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q) {
    if (r->empty()) continue;  // a trailing separator
    if (q == p.end() || *q != *r) return false;
  }
  return true;
}

absl::Status Denied(const std::string& field, const std::string& path) {
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": ", Echo(path, 512),
      " is outside the coordinator's data roots (--data-root) and its state dir"));
}

// The resolved absolute form of `path`, if it lies under one of `roots`.
absl::StatusOr<std::string> Resolve(const std::string& field, const std::string& path,
                                    const std::vector<fs::path>& roots, const fs::path& base) {
  const fs::path given(path);
  for (const fs::path& part : given) {
    if (part == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": \"..\" is not allowed in a job's paths"));
    }
  }
  if (given.is_relative() && base.empty()) return Denied(field, path);
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(given.is_absolute() ? given : base / given, ec);
  if (ec) return Denied(field, path);
  for (const fs::path& root : roots) {
    if (Within(resolved, root)) return resolved.string();
  }
  return Denied(field, path);
}

}  // namespace

absl::Status ConfineJobPaths(v1::JobSpec& spec, const PathRoots& roots) {
  std::vector<fs::path> allowed;
  std::error_code ec;
  for (const std::string& r : roots.data_roots) allowed.push_back(fs::weakly_canonical(r, ec));
  if (!roots.state_dir.empty()) allowed.push_back(fs::weakly_canonical(roots.state_dir, ec));
  const fs::path base = roots.state_dir.empty() ? fs::path() : fs::path(roots.state_dir);

  auto confine = [&](const std::string& field, const std::string& path,
                     auto set) -> absl::Status {
    if (path.empty()) return absl::OkStatus();  // "is empty" is ValidateJobSpec's to say
    absl::StatusOr<std::string> r = Resolve(field, path, allowed, base);
    if (!r.ok()) return r.status();
    set(*r);
    return absl::OkStatus();
  };
  if (spec.has_model_dir()) {
    if (absl::Status s = confine("model_dir", spec.model_dir(),
                                 [&](const std::string& p) { spec.set_model_dir(p); });
        !s.ok())
      return s;
    // The files read from it, which could be links out of the root.
    for (const char* file : {"config.json", "model.safetensors"}) {
      const std::string p = (fs::path(spec.model_dir()) / file).string();
      if (absl::Status s = confine("model_dir", p, [](const std::string&) {}); !s.ok()) return s;
    }
  }
  if (spec.has_token_file()) {
    if (absl::Status s = confine("token_file", spec.token_file(),
                                 [&](const std::string& p) { spec.set_token_file(p); });
        !s.ok())
      return s;
  }
  if (spec.has_prepared_data()) {
    if (absl::Status s = confine("prepared_data", spec.prepared_data(),
                                 [&](const std::string& p) { spec.set_prepared_data(p); });
        !s.ok())
      return s;
    // The files it names lie beside it (train/dataset.h), and could be links out of the root.
    // A manifest that cannot be read here is ValidateJobSpec's to refuse.
    absl::StatusOr<std::vector<std::string>> files = train::PreparedFiles(spec.prepared_data());
    for (const std::string& p : files.ok() ? *files : std::vector<std::string>{}) {
      if (absl::Status s = confine("prepared_data", p, [](const std::string&) {}); !s.ok())
        return s;
    }
  }
  if (!spec.val_token_file().empty()) {
    if (absl::Status s = confine("val_token_file", spec.val_token_file(),
                                 [&](const std::string& p) { spec.set_val_token_file(p); });
        !s.ok())
      return s;
  }
  if (spec.has_text_files()) {
    for (int i = 0; i < spec.text_files().paths_size(); ++i) {
      if (absl::Status s = confine(absl::StrCat("text_files.paths[", i, "]"),
                                   spec.text_files().paths(i),
                                   [&](const std::string& p) {
                                     spec.mutable_text_files()->set_paths(i, p);
                                   });
          !s.ok())
        return s;
    }
  }
  return confine("checkpoint_dir", spec.checkpoint_dir(),
                 [&](const std::string& p) { spec.set_checkpoint_dir(p); });
}

}  // namespace adjsh::coordinator
