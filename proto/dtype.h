// Element types and conversions between them on the host.
#ifndef GPUCOMPUTE_PROTO_DTYPE_H_
#define GPUCOMPUTE_PROTO_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gpucompute {

// Element types the service computes with. Matches proto DType minus the
// unspecified value.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Bytes per element: 4 for kFloat32, 2 for the half types.
constexpr size_t DTypeSize(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// "float32", "float16" or "bfloat16" (metric labels and messages).
std::string_view DTypeName(DType t);

// IEEE binary16 and bfloat16 <-> binary32, round to nearest even; NaN and Inf
// are preserved, overflow goes to Inf.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

// Converts n elements of type `from` at src into float at dst.
void ToFloat(DType from, const void* src, float* dst, int64_t n);

// Converts n floats at src into elements of type `to` at dst.
void FromFloat(DType to, const float* src, void* dst, int64_t n);

// Reads element i of a `t` array as a double (for references and checks).
double LoadAsDouble(DType t, const void* data, int64_t i);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_PROTO_DTYPE_H_
