#include "server/common/quote.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gpucompute {

std::string Quote(absl::string_view text) {
  if (text.size() <= kMaxQuotedBytes) return absl::StrCat("\"", absl::CHexEscape(text), "\"");
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxQuotedBytes)), "...\" (",
                      text.size(), " bytes)");
}

}  // namespace gpucompute
