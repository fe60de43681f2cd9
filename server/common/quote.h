// Quoting client-supplied strings in error messages.
#ifndef GPUCOMPUTE_SERVER_COMMON_QUOTE_H_
#define GPUCOMPUTE_SERVER_COMMON_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace gpucompute {

// Most characters of a client's string, as escaped, that an error message
// quotes.
inline constexpr size_t kMaxQuotedBytes = 256;

// `text` in double quotes, C-escaped, for an error message: "abc". A string
// whose escaped form is longer than kMaxQuotedBytes (an escape such as \x07
// takes four) is cut to the longest prefix whose escaped form fits, followed
// by "..." and its length in bytes: "abcd..." (8200 bytes). A message
// quoting what a client sent thus stays small whatever the client sent: an
// unbounded echo could make the reply fail on gRPC's metadata limit, or cost
// as much as the request.
std::string Quote(absl::string_view text);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_COMMON_QUOTE_H_
