#include "common/python_json.h"

#include <array>

namespace adjsh {
namespace {

struct Word {
  std::string_view bare, marker;
};
constexpr std::array<Word, 3> kWords = {{{"-Infinity", "\"@adjsh-json:-Infinity@\""},
                                         {"Infinity", "\"@adjsh-json:Infinity@\""},
                                         {"NaN", "\"@adjsh-json:NaN@\""}}};

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

}  // namespace

std::string PythonJsonToStrict(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    bool replaced = false;
    for (const Word& w : kWords) {
      // A whole word only: not the tail of another token (e.g. a misspelt "xNaN").
      if (text.substr(i, w.bare.size()) == w.bare && (i == 0 || !IsWordChar(text[i - 1])) &&
          (i + w.bare.size() == text.size() || !IsWordChar(text[i + w.bare.size()]))) {
        out += w.marker;
        i += w.bare.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

std::string StrictJsonToPython(std::string_view text) {
  std::string out(text);
  for (const Word& w : kWords) {
    for (size_t at = out.find(w.marker); at != std::string::npos;
         at = out.find(w.marker, at + w.bare.size())) {
      out.replace(at, w.marker.size(), w.bare);
    }
  }
  return out;
}

}  // namespace adjsh
