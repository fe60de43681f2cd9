// Helpers shared by the kernel tests: GPU presence, device buffers, host-side
// dtype conversion, fresh random inputs, NaN poisoning and tolerance checks.
#ifndef GPUCOMPUTE_TESTS_KERNELS_GPU_TEST_UTIL_H_
#define GPUCOMPUTE_TESTS_KERNELS_GPU_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpucompute/kernels/common.h"

namespace gpucompute::testing {

using kernels::DType;

// True when a CUDA device is usable. Tests call GC_REQUIRE_GPU() first.
inline bool HaveGpu() {
  static const bool have = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return have;
}

#define GC_REQUIRE_GPU()                                                 \
  do {                                                                   \
    if (!::gpucompute::testing::HaveGpu())                               \
      GTEST_SKIP() << "no CUDA device present: GPU kernel test skipped"; \
  } while (0)

// Fails the test (returning from the enclosing void function) unless `expr`,
// evaluated once, is cudaSuccess; the message names the call and the error.
#define GC_ASSERT_CUDA(expr)                                                         \
  do {                                                                               \
    const cudaError_t gc_err_ = (expr);                                              \
    ASSERT_EQ(gc_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(gc_err_); \
  } while (0)

// Host value <-> storage of each dtype.
inline void StoreHost(void* p, size_t i, DType t, double v) {
  if (t == DType::kF32)
    static_cast<float*>(p)[i] = float(v);
  else if (t == DType::kF16)
    static_cast<__half*>(p)[i] = __float2half(float(v));
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(float(v));
}
inline double LoadHost(const void* p, size_t i, DType t) {
  if (t == DType::kF32) return static_cast<const float*>(p)[i];
  if (t == DType::kF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// A host tensor in storage form plus its values as doubles (exactly the values
// stored, after rounding to the dtype), for the float64 reference.
struct HostData {
  DType dtype;
  std::vector<uint8_t> bytes;
  std::vector<double> values;
};

// Fresh random values in [lo, hi) each call (seeded from std::random_device).
inline HostData RandomHost(size_t n, DType t, double lo = -1, double hi = 1) {
  static std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> dist(lo, hi);
  HostData h{t, std::vector<uint8_t>(n * kernels::DTypeSize(t)), std::vector<double>(n)};
  for (size_t i = 0; i < n; ++i) {
    StoreHost(h.bytes.data(), i, t, dist(rng));
    h.values[i] = LoadHost(h.bytes.data(), i, t);
  }
  return h;
}

// Device memory owned by a test. `offset_elems` shifts the returned pointer so
// that vector paths meet a misaligned base.
class DeviceArray {
 public:
  DeviceArray(size_t bytes, size_t offset_bytes = 0) : offset_(offset_bytes) {
    if (cudaMalloc(&base_, bytes + offset_bytes + 16) != cudaSuccess) base_ = nullptr;
    bytes_ = bytes;
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void* get() const { return static_cast<uint8_t*>(base_) + offset_; }
  // Whether the allocation succeeded.
  bool ok() const { return base_ != nullptr; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(get());
  }
  size_t bytes() const { return bytes_; }
  void Upload(const void* src) { cudaMemcpy(get(), src, bytes_, cudaMemcpyHostToDevice); }
  void Download(void* dst) const { cudaMemcpy(dst, get(), bytes_, cudaMemcpyDeviceToHost); }
  // Fills with `byte` (by default 0xFF: NaN in every float dtype).
  void Poison(uint8_t byte = 0xFF) { cudaMemset(get(), byte, bytes_); }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  size_t offset_ = 0;
};

// Relative tolerance of one rounding to each dtype (fp32 accumulation).
inline double DefaultRtol(DType t) {
  return t == DType::kF32 ? 1e-5 : (t == DType::kF16 ? 2e-3 : 1.6e-2);
}

// Checks |got - ref| <= atol + rtol |ref| elementwise; reports the first few
// failures and the count. NaN in `got` fails unless `ref` is NaN too.
inline ::testing::AssertionResult AllClose(const void* got, DType t, const std::vector<double>& ref,
                                           double atol, double rtol) {
  size_t bad = 0;
  std::string msg;
  for (size_t i = 0; i < ref.size(); ++i) {
    double g = LoadHost(got, i, t);
    bool ok = (std::isnan(ref[i]) && std::isnan(g)) || (std::isinf(ref[i]) && g == ref[i]) ||
              std::fabs(g - ref[i]) <= atol + rtol * std::fabs(ref[i]);
    if (!ok && bad++ < 5)
      msg += " [" + std::to_string(i) + "] got " + std::to_string(g) + " want " +
             std::to_string(ref[i]) + ";";
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << ref.size() << " out of tolerance:" << msg;
}

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_KERNELS_GPU_TEST_UTIL_H_
