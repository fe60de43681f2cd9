// Typed element access for the CPU kernels: addresses of elements of any
// dtype, storage types, per-element conversion for loops that convert on the
// fly, and a dispatch from a runtime dtype to a compile-time one.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CPU_ELEMENTS_H_
#define GPUCOMPUTE_SERVER_DEVICE_CPU_ELEMENTS_H_

#include <cstdint>
#include <type_traits>

#include "proto/dtype.h"

namespace gpucompute::cpu {

// Address of element i of a `dtype` array.
inline const char* ElementAt(const void* base, DType dtype, int64_t i) {
  return static_cast<const char*>(base) + i * static_cast<int64_t>(DTypeSize(dtype));
}
inline char* ElementAt(void* base, DType dtype, int64_t i) {
  return static_cast<char*>(base) + i * static_cast<int64_t>(DTypeSize(dtype));
}

// The storage type of one element: float, or the 16 bits of a half type.
template <DType T>
using Storage = std::conditional_t<T == DType::kFloat32, float, uint16_t>;

template <DType T>
inline float LoadF(Storage<T> v) {
  if constexpr (T == DType::kFloat32) {
    return v;
  } else if constexpr (T == DType::kFloat16) {
    return HalfToFloat(v);
  } else {
    return BFloat16ToFloat(v);
  }
}

template <DType T>
inline Storage<T> StoreF(float f) {
  if constexpr (T == DType::kFloat32) {
    return f;
  } else if constexpr (T == DType::kFloat16) {
    return FloatToHalf(f);
  } else {
    return FloatToBFloat16(f);
  }
}

// Calls fn(std::integral_constant<DType, t>{}).
template <typename Fn>
inline decltype(auto) DispatchDType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kFloat16:
      return fn(std::integral_constant<DType, DType::kFloat16>{});
    case DType::kBFloat16:
      return fn(std::integral_constant<DType, DType::kBFloat16>{});
    case DType::kFloat32:
      break;
  }
  return fn(std::integral_constant<DType, DType::kFloat32>{});
}

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_DEVICE_CPU_ELEMENTS_H_
