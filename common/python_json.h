// JSON as Python's json module writes it. transformers saves config.json with json.dumps, which
// writes the floats inf, -inf and nan as the bare words Infinity, -Infinity and NaN (a Mamba-2
// config's default time_step_limit is [0.0, Infinity]); strict JSON has no such values, so a
// strict parser refuses the whole file. These two functions carry such values through a strict
// parser and back: each word outside a string becomes a marker string, and the markers become
// the words again when the JSON is written.
#ifndef ADJSH_COMMON_PYTHON_JSON_H_
#define ADJSH_COMMON_PYTHON_JSON_H_

#include <string>
#include <string_view>

namespace adjsh {

// Strict JSON: Infinity, -Infinity and NaN outside strings become the strings
// "@adjsh-json:Infinity@", "@adjsh-json:-Infinity@" and "@adjsh-json:NaN@". Everything else
// (strings, escapes, other tokens, malformed text) is copied as it is.
std::string PythonJsonToStrict(std::string_view text);

// The inverse for text a strict writer made from PythonJsonToStrict's output: each marker
// string, quotes included, becomes its bare word again.
std::string StrictJsonToPython(std::string_view text);

}  // namespace adjsh

#endif  // ADJSH_COMMON_PYTHON_JSON_H_
