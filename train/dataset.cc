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

// One split: {"file", "docs", "tokens", "documents"} beside the manifest.
absl::StatusOr<PreparedSplit> LoadSplit(const std::string& manifest, const fs::path& dir,
                                        const nlohmann::json& js, const char* name) {
  const bool ok = js.is_object() && js.contains("file") && js["file"].is_string() &&
                  js.contains("docs") && js["docs"].is_string() && js.contains("tokens") &&
                  js["tokens"].is_number_integer() && js.contains("documents") &&
                  js["documents"].is_number_integer();
  if (!ok) return Bad(manifest, absl::StrCat("the ", name, " split's entry is malformed"));
  for (const char* key : {"file", "docs"}) {  // names beside the manifest, never paths
    const std::string v = js[key].get<std::string>();
    if (v.empty() || v.find('/') != std::string::npos || v == "." || v == "..") {
      return Bad(manifest, absl::StrCat("the ", name, " split's ", key,
                                        " must be a file name beside the manifest"));
    }
  }
  PreparedSplit split;
  const std::string file = (dir / js["file"].get<std::string>()).string();
  absl::StatusOr<TokenData> tokens = TokenData::Map(file);
  if (!tokens.ok()) return tokens.status();
  const int64_t want_tokens = js["tokens"].get<int64_t>();
  if (tokens->size() != want_tokens) {
    return Bad(file, absl::StrCat("holds ", tokens->size(), " tokens, the manifest says ",
                                  want_tokens, " (truncated or replaced?)"));
  }
  split.tokens = *std::move(tokens);
  split.documents = js["documents"].get<int64_t>();
  const std::string docs_path = (dir / js["docs"].get<std::string>()).string();
  absl::StatusOr<std::string> docs = ReadFileToString(docs_path);
  if (!docs.ok()) return docs.status();
  if (docs->size() % 8 != 0) {
    return Bad(docs_path, absl::StrCat("size ", docs->size(),
                                       " bytes is not a whole number of uint64 offsets "
                                       "(truncated?)"));
  }
  const int64_t n = static_cast<int64_t>(docs->size() / 8);
  if (n != split.documents) {
    return Bad(docs_path, absl::StrCat("holds ", n, " document offsets, the manifest says ",
                                       split.documents, " (truncated?)"));
  }
  uint64_t prev = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t off;
    std::memcpy(&off, docs->data() + 8 * i, 8);  // little-endian host (tensor.cc)
    if ((i == 0 && off != 0) || (i > 0 && off <= prev) ||
        off >= static_cast<uint64_t>(split.tokens.size())) {
      return Bad(docs_path, absl::StrCat("offset ", i, " (", off,
                                         ") is out of order or past the split's ",
                                         split.tokens.size(), " tokens"));
    }
    prev = off;
    split.starts.push_back(static_cast<int64_t>(off));
  }
  return split;
}

}  // namespace

absl::StatusOr<PreparedData> LoadPrepared(const std::string& manifest_path) {
  absl::StatusOr<std::string> text = ReadFileToString(manifest_path, {.max_bytes = 1 << 24});
  if (!text.ok()) return text.status();
  const nlohmann::json js = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!js.is_object() || js.value("format", "") != "adjsh-tokens-1") {
    return Bad(manifest_path, "not a manifest of adjsh prepare (format adjsh-tokens-1)");
  }
  if (!js.contains("vocab_size") || !js["vocab_size"].is_number_integer() ||
      !js.contains("eos_id") || !js["eos_id"].is_number_integer() || !js.contains("train")) {
    return Bad(manifest_path, "vocab_size, eos_id or train is missing");
  }
  PreparedData data;
  data.manifest = manifest_path;
  data.tokenizer = js.value("tokenizer", "");
  data.vocab_size = js["vocab_size"].get<int64_t>();
  data.eos_id = js["eos_id"].get<int64_t>();
  const fs::path dir = fs::path(manifest_path).parent_path();
  absl::StatusOr<PreparedSplit> train = LoadSplit(manifest_path, dir, js["train"], "train");
  if (!train.ok()) return train.status();
  data.train = *std::move(train);
  if (js.contains("val") && !js["val"].is_null()) {
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
