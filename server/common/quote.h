// Quoting client-supplied strings in error messages.
#ifndef GPUCOMPUTE_SERVER_COMMON_QUOTE_H_
#define GPUCOMPUTE_SERVER_COMMON_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace gpucompute {

// Most bytes of a client's string that an error message quotes.
inline constexpr size_t kMaxQuotedBytes = 256;

// `text` in double quotes, C-escaped, for an error message: "abc". A string
// longer than kMaxQuotedBytes is cut to that many bytes, followed by "..."
// and its length: "abcd..." (8200 bytes). A message quoting what a client
// sent thus stays small whatever the client sent: an unbounded echo could
// make the reply fail on gRPC's metadata limit, or cost as much as the request.
std::string Quote(absl::string_view text);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_COMMON_QUOTE_H_
