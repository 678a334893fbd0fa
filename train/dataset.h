// A prepared corpus: what `adjsh prepare` (scripts/adjsh_data.py) writes for PREFIX, read
// back and checked: the manifest PREFIX.json, the train and held-out token files (mapped,
// common/token_data.h) and their document indexes (PREFIX.{train,val}.docs: little-endian
// uint64 start offsets, strictly increasing from 0, each below the split's token count).
#ifndef ADJSH_TRAIN_DATASET_H_
#define ADJSH_TRAIN_DATASET_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/token_data.h"

namespace adjsh::train {

struct PreparedSplit {
  TokenData tokens;
  int64_t documents = 0;
  std::vector<int64_t> starts;  // each document's first token, ascending from 0
};

struct PreparedData {
  std::string manifest;   // the PREFIX.json path
  std::string tokenizer;  // the tokenizer.json it was encoded with
  int64_t vocab_size = 0, eos_id = -1;
  PreparedSplit train;
  std::optional<PreparedSplit> val;  // absent when prepared with --val-fraction 0
};

// Reads a manifest and its files. INVALID_ARGUMENT (naming the file and what is wrong) for a
// manifest of another format or with missing fields, token files whose size disagrees with it,
// or a document index that is truncated (not whole uint64s, fewer or more entries than the
// manifest's documents) or out of order; NOT_FOUND for a missing file.
absl::StatusOr<PreparedData> LoadPrepared(const std::string& manifest_path);

// The files a manifest names (each split's token file and document index), as paths beside it;
// the manifest's errors as LoadPrepared's. For a caller that must vet paths before reading them.
absl::StatusOr<std::vector<std::string>> PreparedFiles(const std::string& manifest_path);

// Whether a manifest has a held-out split (false: prepared with --val-fraction 0); the
// manifest's errors as LoadPrepared's. Reads the manifest only.
absl::StatusOr<bool> HasHeldOutSplit(const std::string& manifest_path);

// OK when the data's vocabulary fits a model of vocab_size ids; else INVALID_ARGUMENT naming
// both (a tokenizer larger than the model would index past its embedding).
absl::Status CheckVocabulary(const PreparedData& data, int64_t model_vocab_size);

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_DATASET_H_
