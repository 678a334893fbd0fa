// The HOST:PORT form of the address flags (listen addresses and addresses to reach), checked
// before gRPC or the metrics server reads them: gRPC took a port of '99999' as 34463, and
// '32955abc' or '+32955' as 32955.
#ifndef ADJSH_COMMON_ADDRESS_H_
#define ADJSH_COMMON_ADDRESS_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace adjsh {

// OK when `value` is HOST:PORT (a non-empty host) with a port of decimal digits only in
// [min_port, 65535]: 0 for an address to listen on (0: a free port), 1 for one to reach.
// INVALID_ARGUMENT naming --`flag` and the value otherwise.
absl::Status CheckHostPort(std::string_view flag, const std::string& value, int min_port = 0);

}  // namespace adjsh

#endif  // ADJSH_COMMON_ADDRESS_H_
