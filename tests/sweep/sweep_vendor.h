// The device side of the server-path sweeps: random fills, output checks and
// the vendor baselines (cuBLAS, cuBLASLt, CUB, a D2D copy), each timed with
// CUDA events as the median of many calls after a warm-up. Host-only header
// over sweep_vendor.cu.
#ifndef GPUCOMPUTE_TESTS_SWEEP_SWEEP_VENDOR_H_
#define GPUCOMPUTE_TESTS_SWEEP_SWEEP_VENDOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "gpucompute/kernels/common.h"

namespace gpucompute::sweep {

using kernels::DType;

// Device memory that frees itself. Aborts when cudaMalloc fails.
class DeviceArray {
 public:
  explicit DeviceArray(size_t bytes);
  ~DeviceArray();
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Uniform values in [-1, 1) from `seed`, n elements of `t` at device `p`.
void Fill(void* p, int64_t n, DType t, uint64_t seed);
// n elements of 0xff bytes (NaN in every dtype) at device `p`.
void Poison(void* p, int64_t n, DType t);

// max over i of |a[i] - b[i]| / (atol + rtol * |b[i]|), 0 where both are
// equal (NaN == NaN), +inf where only one is NaN.
double MaxError(const void* a, DType ta, const void* b, DType tb, int64_t n, double atol,
                double rtol);

// Flushes L2: writes a device buffer of twice the L2's size (allocated on
// first use) and waits, so that no line of earlier work is left there for
// the next call (as nvbench and Triton's do_bench flush it between runs).
void EvictL2();

// Vendor calls. Every Time* function runs its call `warmup` times, then `reps`
// times, and returns the median device busy time (DeviceTimer); the
// result of the last call is in `out` (fp32 for the reductions). A negative
// result: the vendor has no call for these arguments.
class Vendor {
 public:
  Vendor(int warmup, int reps);
  ~Vendor();
  Vendor(const Vendor&) = delete;
  Vendor& operator=(const Vendor&) = delete;

  // y = op(A) x with x of ncols columns (row-major [k, ncols]), y [m, ncols]
  // in `dtype`; A is [m, k] or, when trans_a, [k, m]. The fastest of cublas
  // gemv (fp32; bf16/fp16 through the strided-batched gemv, ncols = 1) and
  // cublasGemmEx (fp32 compute); `*which` names it.
  double TimeGemv(const void* a, const void* x, void* y, int64_t m, int64_t k, int ncols,
                  bool trans_a, DType dtype, std::string* which);
  // C = alpha op(A) op(B) + beta C, row-major, strided batch (stride 0: one
  // matrix for the batch), with cublasGemmStridedBatchedEx (fp32 compute;
  // tf32 tensor cores when `tf32`): the call torch.matmul makes. C holds
  // beta's addend before the first call (kept for every later one: beta != 0
  // runs read a copy restored before each call, outside the timing).
  double TimeGemm(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k,
                  int64_t batch, int64_t stride_a, int64_t stride_b, bool trans_a, bool trans_b,
                  DType ab, DType c_type, bool tf32, float alpha, float beta, std::string* which);
  // Sum or max of [outer, axis] rows (outer = 1: all elements) into fp32 `out`
  // with CUB (DeviceReduce or DeviceSegmentedReduce). inner must be 1.
  double TimeReduce(const void* in, float* out, int64_t outer, int64_t axis, bool max, DType dtype,
                    std::string* which);
  // [batch, rows, cols] -> [batch, cols, rows] with cuBLASLt's
  // MatrixTransform, or cublasSgeam for fp32 with batch 1, the faster.
  double TimeTranspose(const void* in, void* out, int64_t batch, int64_t rows, int64_t cols,
                       DType dtype, std::string* which);
  // Changes the counts of later Time* calls (long cases take fewer).
  void SetReps(int warmup, int reps);
  // With `cold`, later Time* calls flush L2 (EvictL2) before each run,
  // after beta's addend is restored.
  void SetColdL2(bool cold);
  // A D2D copy of `bytes` (the floor of any pass that reads and writes them).
  double TimeCopy(void* dst, const void* src, size_t bytes);

  struct Impl;  // defined in sweep_vendor.cu

 private:
  std::unique_ptr<Impl> impl_;
};

// The GPU's name and the versions of the driver, runtime and cuBLAS.
std::string DescribeGpu();

}  // namespace gpucompute::sweep

#endif  // GPUCOMPUTE_TESTS_SWEEP_SWEEP_VENDOR_H_
