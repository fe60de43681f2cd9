#include "client/npy.h"

#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace gpucompute {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

// The value text after `key`: in the header dict, past the colon and spaces.
absl::StatusOr<absl::string_view> ValueOf(absl::string_view header, absl::string_view key) {
  for (char quote : {'\'', '"'}) {
    std::string quoted = absl::StrCat(std::string(1, quote), key, std::string(1, quote));
    size_t at = header.find(quoted);
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = header.substr(at + quoted.size());
    rest = absl::StripLeadingAsciiWhitespace(rest);
    if (!absl::ConsumePrefix(&rest, ":")) break;
    return absl::StripLeadingAsciiWhitespace(rest);
  }
  return absl::InvalidArgumentError(absl::StrCat("npy header: no '", key, "'"));
}

}  // namespace

int64_t NpyItemSize(const std::string& descr) {
  if (descr.size() < 3 || descr.size() > 12) return 0;
  if (descr[0] != '<' && descr[0] != '|' && descr[0] != '=' && descr[0] != '>') return 0;
  // The kind is a letter ('f', 'u', ...), the size digits: anything else
  // (a quote, a sign, spaces) is no type string SerializeNpy could write back.
  if (!absl::ascii_isalpha(static_cast<unsigned char>(descr[1]))) return 0;
  for (size_t i = 2; i < descr.size(); ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(descr[i]))) return 0;
  }
  int64_t size = 0;
  if (!absl::SimpleAtoi(descr.substr(2), &size) || size <= 0) return 0;
  return size;
}

absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes) {
  if (bytes.size() < kMagicSize + 4 || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0) {
    return absl::InvalidArgumentError("npy: not a .npy file (bad magic)");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  int major = u[6];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = u[8] | (size_t{u[9]} << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return absl::InvalidArgumentError("npy: truncated header");
    header_len = u[8] | (size_t{u[9]} << 8) | (size_t{u[10]} << 16) | (size_t{u[11]} << 24);
    header_start = 12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("npy: unsupported format version ", major));
  }
  if (bytes.size() < header_start + header_len) {
    return absl::InvalidArgumentError("npy: truncated header");
  }
  absl::string_view header(bytes.data() + header_start, header_len);

  NpyArray array;
  auto descr = ValueOf(header, "descr");
  if (!descr.ok()) return descr.status();
  if (descr->empty() || ((*descr)[0] != '\'' && (*descr)[0] != '"')) {
    return absl::InvalidArgumentError("npy header: 'descr' is not a simple type string");
  }
  size_t close = descr->find((*descr)[0], 1);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("npy header: unterminated 'descr'");
  }
  array.descr = std::string(descr->substr(1, close - 1));
  int64_t item = NpyItemSize(array.descr);
  if (item == 0) {
    return absl::InvalidArgumentError(absl::StrCat("npy: unsupported dtype '", array.descr, "'"));
  }
  if (array.descr[0] == '>' && item > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: big-endian dtype '", array.descr, "' is not supported"));
  }
  if (array.descr[0] == '=' || array.descr[0] == '>') array.descr[0] = item == 1 ? '|' : '<';

  auto fortran = ValueOf(header, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (absl::StartsWith(*fortran, "True")) {
    return absl::InvalidArgumentError("npy: Fortran-order arrays are not supported");
  }
  if (!absl::StartsWith(*fortran, "False")) {
    return absl::InvalidArgumentError("npy header: 'fortran_order' is not True or False");
  }

  auto shape = ValueOf(header, "shape");
  if (!shape.ok()) return shape.status();
  if (shape->empty() || (*shape)[0] != '(') {
    return absl::InvalidArgumentError("npy header: 'shape' is not a tuple");
  }
  size_t end = shape->find(')');
  if (end == absl::string_view::npos) {
    return absl::InvalidArgumentError("npy header: unterminated 'shape'");
  }
  int64_t count = 1;
  for (absl::string_view dim : absl::StrSplit(shape->substr(1, end - 1), ',')) {
    dim = absl::StripAsciiWhitespace(dim);
    if (dim.empty()) continue;
    int64_t d = 0;
    if (!absl::SimpleAtoi(dim, &d) || d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("npy header: bad dimension '", dim, "'"));
    }
    if (d != 0 && count > INT64_MAX / d) {
      return absl::InvalidArgumentError("npy header: shape overflows int64");
    }
    count *= d;
    array.shape.push_back(d);
  }

  size_t data_start = header_start + header_len;
  size_t available = bytes.size() - data_start;
  if (count > static_cast<int64_t>(available) / item ||
      static_cast<int64_t>(available) != count * item) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: ", available, " data bytes, expected ", count, " x ", item));
  }
  array.data = bytes.substr(data_start);
  return array;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  std::ostringstream contents;
  contents << in.rdbuf();
  auto array = ParseNpy(contents.str());
  if (!array.ok()) {
    return absl::Status(array.status().code(), absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

std::string SerializeNpy(const NpyArray& array) {
  // Python tuple syntax: "()", "(3,)", "(3, 4)".
  std::string shape = absl::StrJoin(array.shape, ", ");
  if (array.shape.size() == 1) shape += ",";
  std::string header = absl::StrCat("{'descr': '", array.descr,
                                    "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Pad with spaces and a final newline so that the data starts 64-aligned.
  bool v2 = header.size() + 1 + 10 > 65535;
  size_t prefix = v2 ? 12 : 10;
  size_t total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');

  std::string out(kMagic, kMagicSize);
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back(0);
  size_t len = header.size();
  out.push_back(static_cast<char>(len & 0xff));
  out.push_back(static_cast<char>((len >> 8) & 0xff));
  if (v2) {
    out.push_back(static_cast<char>((len >> 16) & 0xff));
    out.push_back(static_cast<char>((len >> 24) & 0xff));
  }
  out += header;
  out += array.data;
  return out;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::string bytes = SerializeNpy(array);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

}  // namespace gpucompute
