#include "proto/dtype.h"

#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace gpucompute {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in binary32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return BitsToFloat(FloatBits(magnitude) | sign);
  }
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float f) {
  // After F. Giesen's float_to_half_fast3_rtne: exact round to nearest even.
  constexpr uint32_t kInfBits = 255u << 23;
  constexpr uint32_t kHalfOverflow = (127u + 16u) << 23;  // 2^16: Inf after rounding
  constexpr uint32_t kMinNormal = 113u << 23;             // 2^-14
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t x = FloatBits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t out;
  if (x >= kHalfOverflow) {
    // Inf stays Inf, overflow goes to Inf, NaN stays a quiet NaN with the top
    // payload bits.
    out = x > kInfBits ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (x < kMinNormal) {
    // Subnormal or zero: let the FPU round by adding a magic number whose ulp
    // is the half subnormal step.
    const float sum = BitsToFloat(x) + BitsToFloat(kDenormMagic);
    out = FloatBits(sum) - kDenormMagic;
  } else {
    const uint32_t mantissa_odd = (x >> 13) & 1u;
    x += (uint32_t(15 - 127) << 23) + 0xfffu;
    x += mantissa_odd;
    out = x >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float BFloat16ToFloat(uint16_t b) { return BitsToFloat(uint32_t(b) << 16); }

uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN, sign kept
  }
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

namespace {

// Bulk loops. bfloat16 is a shift (the compiler vectorises these); binary16
// uses the F16C instructions when the CPU has them (exact, round to nearest
// even, like the scalar code), the scalar code otherwise.
void BFloat16ToFloatN(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(src[i]) << 16;
    std::memcpy(dst + i, &u, sizeof(u));
  }
}

void FloatToBFloat16N(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof(u));
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    dst[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define GC_HAVE_F16C_PATH 1
__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const uint16_t* src, float* dst,
                                                         int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

__attribute__((target("avx,f16c"))) void FloatToHalfF16c(const float* src, uint16_t* dst,
                                                         int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

bool HasF16c() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for
  // __builtin_cpu_supports.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
           (ecx & bit_F16C) != 0;
  }();
  return has;
}
#endif

}  // namespace

void ToFloat(DType from, const void* src, float* dst, int64_t n) {
  if (n <= 0) return;
  switch (from) {
    case DType::kFloat32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::kFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
#ifdef GC_HAVE_F16C_PATH
      if (HasF16c()) return HalfToFloatF16c(s, dst, n);
#endif
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(s[i]);
      return;
    }
    case DType::kBFloat16:
      BFloat16ToFloatN(static_cast<const uint16_t*>(src), dst, n);
      return;
  }
}

void FromFloat(DType to, const float* src, void* dst, int64_t n) {
  if (n <= 0) return;
  switch (to) {
    case DType::kFloat32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::kFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
#ifdef GC_HAVE_F16C_PATH
      if (HasF16c()) return FloatToHalfF16c(src, d, n);
#endif
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToHalf(src[i]);
      return;
    }
    case DType::kBFloat16:
      FloatToBFloat16N(src, static_cast<uint16_t*>(dst), n);
      return;
  }
}

double LoadAsDouble(DType t, const void* data, int64_t i) {
  switch (t) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
  }
  return 0;
}

}  // namespace gpucompute
