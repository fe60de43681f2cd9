// Fuzz target: the .npy reader of the client and CLI (client/npy.h). The
// bytes are a .npy file's.
//
// Besides no crash, leak or undefined behaviour:
// - an array read holds product(shape) elements of NpyItemSize(descr) bytes,
//   in a little-endian or byte-order-free descr;
// - written again by SerializeNpy, it reads back the same.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/npy.h"
#include "tests/fuzz/fuzz_check.h"

namespace gpucompute {
namespace {

void FuzzOne(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<NpyArray> array = ParseNpy(bytes);
  if (!array.ok()) {
    FUZZ_CHECK(array.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  const int64_t item = NpyItemSize(array->descr);
  FUZZ_CHECK(item > 0);
  FUZZ_CHECK(array->descr[0] == '<' || array->descr[0] == '|');
  __int128 count = 1;
  for (int64_t d : array->shape) {
    FUZZ_CHECK(d >= 0);
    count *= d;  // the reader's own running count fits in int64
    FUZZ_CHECK(count <= INT64_MAX);
  }
  FUZZ_CHECK(count * item == static_cast<__int128>(array->data.size()));

  const absl::StatusOr<NpyArray> again = ParseNpy(SerializeNpy(*array));
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->descr == array->descr);
  FUZZ_CHECK(again->shape == array->shape);
  FUZZ_CHECK(again->data == array->data);
}

}  // namespace
}  // namespace gpucompute

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpucompute::FuzzOne(data, size);
  return 0;
}
