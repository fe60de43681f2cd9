#include "server/common/quote.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gpucompute {

std::string Quote(absl::string_view text) {
  size_t n = std::min(text.size(), kMaxQuotedBytes);
  std::string escaped = absl::CHexEscape(text.substr(0, n));
  if (escaped.size() > kMaxQuotedBytes) {
    // The longest prefix whose escaped form fits: an escape takes up to four
    // characters a byte, and a prefix's escaped form never shrinks as it
    // grows, so bisect over the prefix's length.
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
      const size_t mid = (lo + hi + 1) / 2;
      if (absl::CHexEscape(text.substr(0, mid)).size() <= kMaxQuotedBytes) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    n = lo;
    escaped = absl::CHexEscape(text.substr(0, n));
  }
  if (n == text.size()) return absl::StrCat("\"", escaped, "\"");
  return absl::StrCat("\"", escaped, "...\" (", text.size(), " bytes)");
}

}  // namespace gpucompute
