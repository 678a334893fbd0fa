#include "train/dataset.h"

#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "nlohmann/json.hpp"

namespace adjsh::train {
namespace {

namespace fs = std::filesystem;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// The path of a split's `key` ("file" or "docs"): a plain name beside the manifest, never a
// path (so that the manifest names nothing outside its folder).
absl::StatusOr<std::string> SplitPath(const std::string& manifest, const fs::path& dir,
                                      const nlohmann::json& js, const char* name,
                                      const char* key) {
  if (!js.is_object() || !js.contains(key) || !js[key].is_string()) {
    return Bad(manifest, absl::StrCat("the ", name, " split's entry is malformed"));
  }
  const std::string v = js[key].get<std::string>();
  if (v.empty() || v.find('/') != std::string::npos || v == "." || v == "..") {
    return Bad(manifest, absl::StrCat("the ", name, " split's ", key,
                                      " must be a file name beside the manifest"));
  }
  return (dir / v).string();
}

// The manifest's JSON, its format checked.
absl::StatusOr<nlohmann::json> ReadManifest(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path, {.max_bytes = 1 << 24});
  if (!text.ok()) return text.status();
  nlohmann::json js = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  // (is_string first: nlohmann's value() throws on a key of another type.)
  if (!js.is_object() || !js.contains("format") || !js["format"].is_string() ||
      js["format"].get<std::string>() != "adjsh-tokens-1") {
    return Bad(path, "not a manifest of adjsh prepare (format adjsh-tokens-1)");
  }
  return js;
}

// Whether the manifest has a held-out split (prepared with --val-fraction 0 it has none).
bool HasVal(const nlohmann::json& js) { return js.contains("val") && !js["val"].is_null(); }

// One split: {"file", "docs", "tokens", "documents"} beside the manifest.
absl::StatusOr<PreparedSplit> LoadSplit(const std::string& manifest, const fs::path& dir,
                                        const nlohmann::json& js, const char* name) {
  absl::StatusOr<std::string> file = SplitPath(manifest, dir, js, name, "file");
  if (!file.ok()) return file.status();
  absl::StatusOr<std::string> docs_path = SplitPath(manifest, dir, js, name, "docs");
  if (!docs_path.ok()) return docs_path.status();
  if (!js.contains("tokens") || !js["tokens"].is_number_integer() ||
      !js.contains("documents") || !js["documents"].is_number_integer()) {
    return Bad(manifest, absl::StrCat("the ", name, " split's entry is malformed"));
  }
  PreparedSplit split;
  absl::StatusOr<TokenData> tokens = TokenData::Map(*file);
  if (!tokens.ok()) return tokens.status();
  const int64_t want_tokens = js["tokens"].get<int64_t>();
  if (tokens->size() != want_tokens) {
    return Bad(*file, absl::StrCat("holds ", tokens->size(), " tokens, the manifest says ",
                                   want_tokens, " (truncated or replaced?)"));
  }
  split.tokens = *std::move(tokens);
  split.documents = js["documents"].get<int64_t>();
  absl::StatusOr<std::vector<int64_t>> starts = ReadTokenOffsets(*docs_path, split.tokens.size());
  if (!starts.ok()) return starts.status();
  if (static_cast<int64_t>(starts->size()) != split.documents) {
    return Bad(*docs_path, absl::StrCat("holds ", starts->size(),
                                        " document offsets, the manifest says ",
                                        split.documents, " (truncated?)"));
  }
  if (!starts->empty() && starts->front() != 0) {
    return Bad(*docs_path, absl::StrCat("the first document starts at ", starts->front(),
                                        ", not 0"));
  }
  split.starts = *std::move(starts);
  return split;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> PreparedFiles(const std::string& manifest_path) {
  absl::StatusOr<nlohmann::json> js = ReadManifest(manifest_path);
  if (!js.ok()) return js.status();
  const fs::path dir = fs::path(manifest_path).parent_path();
  std::vector<std::string> files;
  for (const char* split : {"train", "val"}) {
    if (split == std::string("val") && !HasVal(*js)) continue;
    for (const char* key : {"file", "docs"}) {
      absl::StatusOr<std::string> p =
          SplitPath(manifest_path, dir, js->value(split, nlohmann::json()), split, key);
      if (!p.ok()) return p.status();
      files.push_back(*std::move(p));
    }
  }
  return files;
}

absl::StatusOr<bool> HasHeldOutSplit(const std::string& manifest_path) {
  absl::StatusOr<nlohmann::json> js = ReadManifest(manifest_path);
  if (!js.ok()) return js.status();
  return HasVal(*js);
}

absl::StatusOr<PreparedData> LoadPrepared(const std::string& manifest_path) {
  absl::StatusOr<nlohmann::json> manifest = ReadManifest(manifest_path);
  if (!manifest.ok()) return manifest.status();
  const nlohmann::json& js = *manifest;
  if (!js.contains("vocab_size") || !js["vocab_size"].is_number_integer() ||
      !js.contains("eos_id") || !js["eos_id"].is_number_integer() || !js.contains("train")) {
    return Bad(manifest_path, "vocab_size, eos_id or train is missing");
  }
  if (js.contains("tokenizer") && !js["tokenizer"].is_string()) {
    return Bad(manifest_path, "tokenizer must be a string (the tokenizer's folder)");
  }
  PreparedData data;
  data.manifest = manifest_path;
  data.tokenizer = js.contains("tokenizer") ? js["tokenizer"].get<std::string>() : "";
  data.vocab_size = js["vocab_size"].get<int64_t>();
  data.eos_id = js["eos_id"].get<int64_t>();
  if (data.vocab_size < 1 || data.eos_id < 0 || data.eos_id >= data.vocab_size) {
    return Bad(manifest_path, absl::StrCat("vocab_size ", data.vocab_size, " and eos_id ",
                                           data.eos_id, " do not make a vocabulary holding its "
                                           "EOS id"));
  }
  // The ids' width is the files' extension's; a dtype that names another says the manifest is
  // not what it describes.
  if (js.contains("dtype") && js["dtype"] != "u16" && js["dtype"] != "u32") {
    return Bad(manifest_path, absl::StrCat("dtype ", js["dtype"].dump(), " is not u16 or u32"));
  }
  const fs::path dir = fs::path(manifest_path).parent_path();
  absl::StatusOr<PreparedSplit> train = LoadSplit(manifest_path, dir, js["train"], "train");
  if (!train.ok()) return train.status();
  data.train = *std::move(train);
  if (HasVal(js)) {
    absl::StatusOr<PreparedSplit> val = LoadSplit(manifest_path, dir, js["val"], "val");
    if (!val.ok()) return val.status();
    data.val = *std::move(val);
  }
  return data;
}

absl::Status CheckVocabulary(const PreparedData& data, int64_t model_vocab_size) {
  if (data.vocab_size <= model_vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      data.manifest, " was encoded with a tokenizer of ", data.vocab_size,
      " ids, more than the model's vocab_size of ", model_vocab_size,
      " (prepare it with the model's tokenizer, or make a model with --vocab-size >= ",
      data.vocab_size, ")"));
}

}  // namespace adjsh::train
