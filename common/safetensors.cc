// Safetensors reader and writer. Layout: u64 little-endian header length H, H bytes of JSON
// header, then the data region; each tensor's data_offsets [begin, end) are relative to the
// start of the data region.
#include "common/safetensors.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/file_io.h"
#include "common/strings.h"

namespace adjsh {
namespace {

using Json = nlohmann::json;
constexpr std::string_view kMetadataKey = "__metadata__";

absl::Status Bad(absl::string_view what, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", detail));
}

absl::Status BadTensor(absl::string_view what, absl::string_view name,
                       absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": tensor \"", name, "\": ", detail));
}

// A JSON value as a non-negative integer that fits in int64, or nothing.
bool GetCount(const Json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

struct Entry {
  std::string name;
  HostTensor tensor;  // data not yet filled
  int64_t begin = 0, end = 0;
};

absl::StatusOr<Entry> ParseEntry(absl::string_view what, const std::string& name, const Json& j,
                                 int64_t data_size) {
  Entry e;
  e.name = name;
  if (!j.is_object()) return BadTensor(what, name, "header entry is not a JSON object");
  auto dtype_it = j.find("dtype");
  if (dtype_it == j.end()) return BadTensor(what, name, "missing \"dtype\"");
  if (!dtype_it->is_string()) return BadTensor(what, name, "\"dtype\" is not a string");
  absl::StatusOr<DType> dtype = ParseDType(dtype_it->get<std::string>());
  if (!dtype.ok()) return BadTensor(what, name, dtype.status().message());
  e.tensor.dtype = *dtype;

  auto shape_it = j.find("shape");
  if (shape_it == j.end()) return BadTensor(what, name, "missing \"shape\"");
  if (!shape_it->is_array()) return BadTensor(what, name, "\"shape\" is not an array");
  // numel * size must not overflow; any tensor that fits in the file is far below 2^62 bytes.
  int64_t bytes = DTypeSize(e.tensor.dtype);
  for (const Json& d : *shape_it) {
    int64_t dim;
    if (!GetCount(d, &dim)) {
      return BadTensor(what, name,
                       absl::StrCat("shape ", shape_it->dump(), " has a negative or "
                                    "non-integer dimension"));
    }
    e.tensor.shape.push_back(dim);
    if (bytes != 0 && dim > (int64_t{1} << 62) / bytes) {
      return BadTensor(what, name, absl::StrCat("shape ", shape_it->dump(), " is too large"));
    }
    bytes *= dim;
  }

  auto off_it = j.find("data_offsets");
  if (off_it == j.end()) return BadTensor(what, name, "missing \"data_offsets\"");
  if (!off_it->is_array() || off_it->size() != 2 || !GetCount((*off_it)[0], &e.begin) ||
      !GetCount((*off_it)[1], &e.end)) {
    return BadTensor(what, name, absl::StrCat("\"data_offsets\" ", off_it->dump(),
                                              " is not a pair of non-negative integers"));
  }
  if (e.begin > e.end || e.end > data_size) {
    return BadTensor(what, name,
                     absl::StrCat("data_offsets [", e.begin, ", ", e.end,
                                  "] outside the data region of ", data_size, " bytes"));
  }
  if (e.end - e.begin != bytes) {
    return BadTensor(what, name,
                     absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] span ",
                                  e.end - e.begin, " bytes but dtype ",
                                  ToAbsl(DTypeName(e.tensor.dtype)), " and shape ",
                                  ShapeString(e.tensor.shape), " need ", bytes));
  }
  return e;
}

}  // namespace

absl::StatusOr<TensorMap> ParseSafetensors(std::string_view bytes, std::string_view what_std) {
  const absl::string_view what = ToAbsl(what_std);
  if (bytes.size() < 8) {
    return Bad(what, absl::StrCat("file is ", bytes.size(),
                                  " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);  // little-endian host (see tensor.cc)
  if (header_len > bytes.size() - 8) {
    return Bad(what, absl::StrCat("header length ", header_len, " runs past the end of the file (",
                                  bytes.size(), " bytes): truncated or not safetensors"));
  }
  const std::string_view header = bytes.substr(8, header_len);
  const std::string_view data = bytes.substr(8 + header_len);
  Json j = Json::parse(header, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(what, "header is not valid JSON");
  if (!j.is_object()) return Bad(what, "header is not a JSON object");

  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it->is_object()) return Bad(what, "\"__metadata__\" is not a JSON object");
      continue;
    }
    absl::StatusOr<Entry> e =
        ParseEntry(what, it.key(), it.value(), static_cast<int64_t>(data.size()));
    if (!e.ok()) return e.status();
    entries.push_back(*std::move(e));
  }

  // Tensors must not share bytes (the format forbids it; sharing would alias on write-back).
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& prev = *by_offset[i - 1];
    const Entry& cur = *by_offset[i];
    if (cur.begin < prev.end) {
      return BadTensor(what, cur.name,
                       absl::StrCat("data_offsets [", cur.begin, ", ", cur.end,
                                    "] overlap tensor \"", prev.name, "\" [", prev.begin, ", ",
                                    prev.end, "]"));
    }
  }

  TensorMap out;
  for (Entry& e : entries) {
    const auto* p = reinterpret_cast<const uint8_t*>(data.data()) + e.begin;
    e.tensor.data.assign(p, p + (e.end - e.begin));
    out.emplace(std::move(e.name), std::move(e.tensor));
  }
  return out;
}

absl::StatusOr<TensorMap> ReadSafetensors(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  return ParseSafetensors(*bytes, path);
}

std::string SerializeSafetensors(const TensorMap& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps insertion order: metadata first, then tensors in name order (std::map),
  // with data laid out in that same order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    ADJSH_CHECK(ValidateTensor(t).ok(), "SerializeSafetensors: tensor bytes do not match shape");
    ADJSH_CHECK(name != kMetadataKey, "SerializeSafetensors: reserved tensor name");
    const int64_t end = offset + static_cast<int64_t>(t.data.size());
    header[name] = {{"dtype", std::string(DTypeName(t.dtype))},
                    {"shape", t.shape},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  // Invalid UTF-8 in a name is replaced rather than thrown on.
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Pad with spaces so the data region starts 8-byte aligned (8 + header length % 8 == 0).
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + static_cast<size_t>(offset));
  const uint64_t header_len = text.size();
  out.append(reinterpret_cast<const char*>(&header_len), 8);
  out += text;
  for (const auto& [name, t] : tensors) {
    out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"__metadata__\" is reserved, not a tensor name"));
    }
    if (absl::Status s = ValidateTensor(t); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor \"", name, "\": ", s.message()));
    }
  }
  return WriteFileAtomic(path, SerializeSafetensors(tensors, metadata));
}

}  // namespace adjsh
