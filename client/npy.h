// A small reader and writer of NumPy .npy files (format versions 1.0, 2.0 and
// 3.0; little-endian C-order arrays).
//
// The tensor convention of the CLI: float32 is '<f4', float16 is '<f2', and
// bfloat16, which has no NumPy dtype, is stored as '<u2' holding the raw bit
// patterns (the upper 16 bits of the float32). In NumPy:
//   bf16 -> f32:  (a.astype(np.uint32) << 16).view(np.float32)
//   f32 -> bf16 bits (truncating):  (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
#ifndef GPUCOMPUTE_CLIENT_NPY_H_
#define GPUCOMPUTE_CLIENT_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpucompute {

// One array: its NumPy type string, shape and raw element bytes.
struct NpyArray {
  std::string descr;  // "<f4", "<f2", "<u2", "<f8", ...
  std::vector<int64_t> shape;
  std::string data;  // product(shape) * ItemSize(descr) bytes, C order
};

// Bytes per element of a descr such as "<f4" (the digits after the kind);
// 0 when the descr is not of the form [<|=>]<letter><digits> (at most 12
// characters).
int64_t NpyItemSize(const std::string& descr);

// Parses the bytes of a .npy file. INVALID_ARGUMENT for a malformed header,
// big-endian data, Fortran order, or a data size that does not match.
absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes);

// Reads and parses `path`. NOT_FOUND when it cannot be read; errors of
// ParseNpy otherwise, prefixed with the path.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// The bytes of a version 1.0 .npy file (2.0 when the header needs it).
// REQUIRES: array.data.size() == product(shape) * NpyItemSize(descr).
std::string SerializeNpy(const NpyArray& array);

// Writes SerializeNpy(array) to `path`. INTERNAL when it cannot be written.
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_NPY_H_
