#include "common/address.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace adjsh {

absl::Status CheckHostPort(std::string_view flag, const std::string& value, int min_port) {
  const size_t colon = value.rfind(':');
  const std::string port = colon == std::string::npos ? std::string() : value.substr(colon + 1);
  int number = -1;
  // Digits only: SimpleAtoi also takes a sign or spaces.
  if (colon == std::string::npos || colon == 0 || port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port, &number) || number < min_port || number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--", std::string(flag),
                                                   " must be HOST:PORT (port ", min_port,
                                                   "-65535), got '", value, "'"));
  }
  return absl::OkStatus();
}

}  // namespace adjsh
