#include "server/common/quote.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gpucompute {

std::string Quote(absl::string_view text) {
  std::string escaped = absl::CHexEscape(text.substr(0, kMaxQuotedBytes));
  if (text.size() <= kMaxQuotedBytes && escaped.size() <= kMaxQuotedBytes) {
    return absl::StrCat("\"", escaped, "\"");
  }
  // The longest prefix whose escaped form fits (an escape takes up to four
  // characters a byte, and a prefix's escaped form never shrinks as it
  // grows, so the search is a bisection over the prefix's length).
  size_t lo = 0, hi = std::min(text.size(), kMaxQuotedBytes);
  while (lo < hi) {
    const size_t mid = (lo + hi + 1) / 2;
    if (absl::CHexEscape(text.substr(0, mid)).size() <= kMaxQuotedBytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, lo)), "...\" (", text.size(),
                      " bytes)");
}

}  // namespace gpucompute
