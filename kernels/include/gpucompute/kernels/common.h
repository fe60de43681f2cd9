// Shared vocabulary of the kernels library. Host-only: compiles with g++.
//
// Every operation's public header follows one convention:
//   struct XxxArgs { device pointers, sizes, strides, dtype };
//   Support CanImplement(const XxxArgs&, std::string_view variant);
//   size_t XxxWorkspaceBytes(const XxxArgs&, std::string_view variant);   // where needed
//   cudaError_t LaunchXxx(const XxxArgs&, std::string_view variant,
//                         void* workspace, cudaStream_t stream);
//   const std::vector<std::string>& XxxVariants();   // every rung, by name
// An empty variant means "the fastest for these arguments". Launch functions
// never allocate and never synchronise; they return cudaErrorInvalidValue for
// arguments that CanImplement refuses, and for an unknown variant name.
#ifndef GPUCOMPUTE_KERNELS_COMMON_H_
#define GPUCOMPUTE_KERNELS_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace gpucompute::kernels {

// Element types. Storage is IEEE binary32, binary16, or bfloat16.
enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

constexpr size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
constexpr const char* DTypeName(DType t) {
  return t == DType::kF32 ? "f32" : (t == DType::kF16 ? "f16" : "bf16");
}

// Outcome of a CanImplement check: ok, or the reason the arguments are refused.
struct Support {
  bool ok = true;
  std::string reason;

  static Support Yes() { return {}; }
  static Support No(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_COMMON_H_
