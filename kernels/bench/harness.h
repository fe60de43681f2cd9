// One benchmark harness for every operation and version of the kernels library.
//
// Each operation's bench_<op>.cu registers a function with GC_REGISTER_BENCH;
// that function allocates inputs larger than L2, fills them with fresh random
// data, and for each case and version calls Context::Time (median of timed
// runs after warm-up, CUDA events) and Context::Record. Vendor baselines
// (cuBLAS, CUB) are timed in the same process, right beside our versions, and
// recorded as rows too; ratios are computed against them.
#ifndef GPUCOMPUTE_KERNELS_BENCH_HARNESS_H_
#define GPUCOMPUTE_KERNELS_BENCH_HARNESS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gpucompute/kernels/common.h"

namespace gpucompute::bench {

#define GC_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    cudaError_t gc_err_ = (expr);                                                        \
    if (gc_err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                 \
                   cudaGetErrorString(gc_err_));                                         \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

// One row of the results table.
struct Row {
  std::string op;        // "transpose", "reduce", ...
  std::string case_name; // e.g. "16384x16384" or "M4096_N4096_K4096"
  std::string dtype;     // "f32", "f16", "bf16"
  std::string variant;   // our rung name, or the vendor's ("cublas_geam", "cub", "memcpy")
  double ms = 0;         // median time of one launch
  double bytes = 0;      // bytes that must move (inputs read once, outputs written once)
  double flops = 0;      // FLOPs that must be done (0 for memory-bound ops)
  double vendor_ratio = 0;  // vendor ms / our ms (> 1: faster than the vendor); 0 if none
  double copy_ratio = 0;    // D2D copy ms of the same bytes / our ms; 0 if not relevant
  bool correct = true;      // the harness's spot check against the vendor output passed
  std::string note;
};

class Context {
 public:
  Context(bool quick, std::string filter);
  ~Context();

  // Median milliseconds of `fn(stream)` over `iters` timed runs after `warmup`
  // runs, each timed with its own pair of CUDA events. In quick mode the counts
  // shrink. Aborts on a CUDA error.
  double Time(const std::function<void(cudaStream_t)>& fn, int warmup = 5, int iters = 30);

  // Median milliseconds of a device-to-device cudaMemcpyAsync moving `bytes`
  // (read + write counted as 2 * bytes / 2: i.e. a copy of bytes/2 bytes, so
  // that a kernel that reads N bytes and writes N bytes compares with a copy
  // of N bytes). Cached per size.
  double CopyMsForTraffic(double bytes);

  // Records a row; computes copy_ratio from row.bytes when `with_copy_ratio`.
  void Record(Row row, bool with_copy_ratio = false);

  // True when `name` (op or "op/variant") passes the --filter substring.
  bool Wants(const std::string& name) const;

  bool quick() const { return quick_; }
  cudaStream_t stream() const { return stream_; }
  const cudaDeviceProp& props() const { return props_; }
  uint64_t seed() const { return seed_; }
  const std::vector<Row>& rows() const { return rows_; }

  // Fills n elements of `dtype` at p with uniform values in [lo, hi), from a
  // fresh seed each call. Poison fills with NaN (0xFF bytes).
  void FillRandom(void* p, size_t n, kernels::DType dtype, float lo = -1.f, float hi = 1.f);
  void Poison(void* p, size_t bytes);

 private:
  bool quick_;
  std::string filter_;
  cudaStream_t stream_ = nullptr;
  cudaDeviceProp props_{};
  uint64_t seed_;
  std::vector<Row> rows_;
  std::vector<std::pair<double, double>> copy_cache_;
};

using BenchFn = void (*)(Context&);

struct Registrar {
  Registrar(const char* op, BenchFn fn);
};

struct Registered {
  const char* op;
  BenchFn fn;
};
std::vector<Registered>& Registry();

#define GC_REGISTER_BENCH(op, fn) \
  static ::gpucompute::bench::Registrar gc_registrar_##fn(op, fn)

// Device buffer owned for the duration of a bench function.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    GC_CUDA_CHECK(cudaMalloc(&ptr_, bytes ? bytes : 1));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Spot check: max |a - b| / (atol + rtol |b|) over n elements of two device
// arrays of `dtype`; returns true when every element is within tolerance.
bool DeviceAllClose(const void* a, const void* b, size_t n, kernels::DType dtype, double atol,
                    double rtol, cudaStream_t stream, double* worst = nullptr);

}  // namespace gpucompute::bench

#endif  // GPUCOMPUTE_KERNELS_BENCH_HARNESS_H_
