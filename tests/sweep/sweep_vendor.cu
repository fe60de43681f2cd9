// Vendor baselines, fills and checks for the server-path sweeps.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/cub.cuh>
#include <functional>
#include <vector>

#include "tests/sweep/device_timer.h"
#include "tests/sweep/sweep_vendor.h"

namespace gpucompute::sweep {
namespace {

#define SWEEP_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

__device__ inline uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

__device__ inline float LoadAs(const void* p, size_t i, int t) {
  if (t == 0) return static_cast<const float*>(p)[i];
  if (t == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__global__ void FillKernel(void* p, size_t n, int t, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float v =
        -1.f + 2.f * float(Mix(seed ^ (i * 0x9e3779b97f4a7c15ULL)) >> 40) * (1.f / 16777216.f);
    if (t == 0)
      static_cast<float*>(p)[i] = v;
    else if (t == 1)
      static_cast<__half*>(p)[i] = __float2half(v);
    else
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  }
}

__global__ void ErrorKernel(const void* a, int ta, const void* b, int tb, size_t n, double atol,
                            double rtol, unsigned long long* worst) {
  double local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const double x = LoadAs(a, i, ta), y = LoadAs(b, i, tb);
    double e;
    if (isnan(x) || isnan(y))
      e = (isnan(x) && isnan(y)) ? 0 : INFINITY;
    else if (x == y)
      e = 0;
    else
      e = fabs(x - y) / (atol + rtol * fabs(y));
    local = fmax(local, e);
  }
  atomicMax(worst, static_cast<unsigned long long>(__double_as_longlong(local)));
}

struct MaxF {
  __host__ __device__ float operator()(float a, float b) const { return a > b ? a : b; }
};
struct SumF {
  __host__ __device__ float operator()(float a, float b) const { return a + b; }
};
template <typename T>
struct ToF {
  __host__ __device__ float operator()(T v) const { return float(v); }
};

cudaDataType_t CudaType(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : (t == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF);
}

}  // namespace

DeviceArray::DeviceArray(size_t bytes) : bytes_(bytes) {
  SWEEP_CUDA(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256)));
}
DeviceArray::~DeviceArray() { cudaFree(ptr_); }

void Fill(void* p, int64_t n, DType t, uint64_t seed) {
  FillKernel<<<1024, 256>>>(p, size_t(n), int(t), seed);
  SWEEP_CUDA(cudaGetLastError());
  SWEEP_CUDA(cudaDeviceSynchronize());
}

void Poison(void* p, int64_t n, DType t) {
  SWEEP_CUDA(cudaMemset(p, 0xff, size_t(n) * kernels::DTypeSize(t)));
}

double MaxError(const void* a, DType ta, const void* b, DType tb, int64_t n, double atol,
                double rtol) {
  unsigned long long* worst = nullptr;
  SWEEP_CUDA(cudaMalloc(&worst, sizeof(*worst)));
  SWEEP_CUDA(cudaMemset(worst, 0, sizeof(*worst)));
  ErrorKernel<<<1024, 256>>>(a, int(ta), b, int(tb), size_t(n), atol, rtol, worst);
  SWEEP_CUDA(cudaGetLastError());
  unsigned long long bits = 0;
  SWEEP_CUDA(cudaMemcpy(&bits, worst, sizeof(bits), cudaMemcpyDeviceToHost));
  cudaFree(worst);
  double e;
  std::memcpy(&e, &bits, sizeof(e));
  return e;
}

void EvictL2() {
  static void* buffer = nullptr;
  static size_t bytes = 0;
  if (buffer == nullptr) {
    int dev = 0, l2 = 0;
    SWEEP_CUDA(cudaGetDevice(&dev));
    SWEEP_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    bytes = std::max<size_t>(size_t(2) * size_t(l2), size_t(1) << 20);
    SWEEP_CUDA(cudaMalloc(&buffer, bytes));
  }
  SWEEP_CUDA(cudaDeviceSynchronize());  // every stream's work is done (and in L2) first
  SWEEP_CUDA(cudaMemsetAsync(buffer, 0, bytes, nullptr));
  SWEEP_CUDA(cudaDeviceSynchronize());
}

struct Vendor::Impl {
  int warmup, reps;
  bool cold_l2 = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLAS workspace and CUB temporaries
  size_t workspace_bytes = size_t(256) << 20;

  // Median device busy seconds of `call` (which enqueues on `stream`; see
  // DeviceTimer); negative when the first call reports failure.
  double Time(const std::function<bool()>& call) {
    for (int i = 0; i < warmup; ++i)
      if (!call()) return -1;
    std::vector<double> s(static_cast<size_t>(reps > 0 ? reps : 1));
    DeviceTimer& timer = DeviceTimer::Get();
    for (int i = 0; i < reps; ++i) {
      if (cold_l2) EvictL2();
      timer.Begin();
      if (!call()) return -1;
      s[size_t(i)] = timer.End();
    }
    std::nth_element(s.begin(), s.begin() + reps / 2, s.end());
    return s[size_t(reps / 2)];
  }
};

Vendor::Vendor(int warmup, int reps) : impl_(new Impl) {
  impl_->warmup = warmup;
  impl_->reps = reps;
  SWEEP_CUDA(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  SWEEP_CUDA(cudaMalloc(&impl_->workspace, impl_->workspace_bytes));
  if (cublasCreate(&impl_->blas) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  cublasSetStream(impl_->blas, impl_->stream);
  cublasSetWorkspace(impl_->blas, impl_->workspace, impl_->workspace_bytes);
  if (cublasLtCreate(&impl_->lt) != CUBLAS_STATUS_SUCCESS) std::exit(1);
}

Vendor::~Vendor() {
  cublasLtDestroy(impl_->lt);
  cublasDestroy(impl_->blas);
  cudaFree(impl_->workspace);
  cudaStreamDestroy(impl_->stream);
}

double Vendor::TimeGemv(const void* a, const void* x, void* y, int64_t m, int64_t k, int ncols,
                        bool trans_a, DType dtype, std::string* which) {
  cublasHandle_t h = impl_->blas;
  const float one = 1.f, zero = 0.f;
  double best = -1;
  auto consider = [&](const char* name, const std::function<bool()>& call) {
    const double t = impl_->Time(call);
    if (t > 0 && (best < 0 || t < best)) {
      best = t;
      *which = name;
    }
  };
  if (ncols == 1) {
    // Row-major A [m, k] is column-major [k, m]: y = A x is op T there.
    const cublasOperation_t op = trans_a ? CUBLAS_OP_N : CUBLAS_OP_T;
    const int rows = int(trans_a ? m : k), cols = int(trans_a ? k : m);
    if (dtype == DType::kF32) {
      consider("cublasSgemv", [&] {
        return cublasSgemv(h, op, rows, cols, &one, static_cast<const float*>(a), rows,
                           static_cast<const float*>(x), 1, &zero, static_cast<float*>(y),
                           1) == CUBLAS_STATUS_SUCCESS;
      });
    } else if (dtype == DType::kBF16) {
      consider("cublasTSTgemvStridedBatched", [&] {
        return cublasTSTgemvStridedBatched(
                   h, op, rows, cols, &one, static_cast<const __nv_bfloat16*>(a), rows, 0,
                   static_cast<const __nv_bfloat16*>(x), 1, 0, &zero,
                   static_cast<__nv_bfloat16*>(y), 1, 0, 1) == CUBLAS_STATUS_SUCCESS;
      });
    } else {
      consider("cublasHSHgemvStridedBatched", [&] {
        return cublasHSHgemvStridedBatched(h, op, rows, cols, &one, static_cast<const __half*>(a),
                                           rows, 0, static_cast<const __half*>(x), 1, 0, &zero,
                                           static_cast<__half*>(y), 1, 0,
                                           1) == CUBLAS_STATUS_SUCCESS;
      });
    }
  }
  // Column-major: Y^T [ncols, m] = X^T [ncols, k] * op(A)^T.
  const cudaDataType_t ct = CudaType(dtype);
  consider("cublasGemmEx", [&] {
    return cublasGemmEx(h, CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, ncols, int(m), int(k),
                        &one, x, ct, ncols, a, ct, int(trans_a ? m : k), &zero, y, ct, ncols,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  });
  return best;
}

double Vendor::TimeGemm(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k,
                        int64_t batch, int64_t stride_a, int64_t stride_b, bool trans_a,
                        bool trans_b, DType ab, DType c_type, bool tf32, float alpha, float beta,
                        std::string* which) {
  // Row-major C [m, n] is column-major C^T = op(B)^T op(A)^T: B first.
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const int lda = int(trans_a ? m : k), ldb = int(trans_b ? k : n);
  const size_t c_bytes = size_t(batch * m * n) * DTypeSize(c_type);
  *which = "cublasGemmStridedBatchedEx";
  auto call = [&] {
    return cublasGemmStridedBatchedEx(
               impl_->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
               trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, CudaType(ab),
               ldb, stride_b, a, CudaType(ab), lda, stride_a, &beta, c, CudaType(c_type), int(n),
               m * n, int(batch), compute, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  };
  // Split-K partial sums in fp32 (as the server's cuBLASLt fallback asks):
  // by default cuBLAS may round them to a 16-bit output type first, and the
  // reference would then be the less accurate of the two.
  struct MathMode {
    cublasHandle_t h;
    cublasMath_t saved = CUBLAS_DEFAULT_MATH;
    explicit MathMode(cublasHandle_t handle) : h(handle) {
      cublasGetMathMode(h, &saved);
      cublasSetMathMode(h, cublasMath_t(saved | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    }
    ~MathMode() { cublasSetMathMode(h, saved); }
  } mode(impl_->blas);
  if (beta == 0) return impl_->Time(call);
  // beta's addend, restored before every call outside the timing. Every copy
  // goes on impl_->stream: it does not wait for the legacy default stream
  // (cudaStreamNonBlocking), and a device-to-device cudaMemcpy returns before
  // the copy is done. The final call once read an addend half restored
  // (12772x13111x32 f32 with beta: a reference off by 2.5e4, H100).
  void* c0 = nullptr;
  SWEEP_CUDA(cudaDeviceSynchronize());  // whatever wrote C is done
  SWEEP_CUDA(cudaMalloc(&c0, c_bytes));
  SWEEP_CUDA(cudaMemcpyAsync(c0, c, c_bytes, cudaMemcpyDeviceToDevice, impl_->stream));
  DeviceTimer& timer = DeviceTimer::Get();
  std::vector<double> s;
  bool ok = true;
  for (int i = 0; ok && i < impl_->warmup + impl_->reps; ++i) {
    SWEEP_CUDA(cudaMemcpyAsync(c, c0, c_bytes, cudaMemcpyDeviceToDevice, impl_->stream));
    if (impl_->cold_l2) EvictL2();  // after the copy: C is not read from L2
    timer.Begin();
    ok = call();
    const double t = timer.End();
    if (ok && i >= impl_->warmup) s.push_back(t);
  }
  // The result left in C is that of one call on the addend.
  SWEEP_CUDA(cudaMemcpyAsync(c, c0, c_bytes, cudaMemcpyDeviceToDevice, impl_->stream));
  if (ok) ok = call();
  SWEEP_CUDA(cudaStreamSynchronize(impl_->stream));
  cudaFree(c0);
  if (!ok || s.empty()) return -1;
  std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
  return s[s.size() / 2];
}

void Vendor::SetReps(int warmup, int reps) {
  impl_->warmup = warmup;
  impl_->reps = reps;
}

void Vendor::SetColdL2(bool cold) { impl_->cold_l2 = cold; }

namespace {
template <typename T>
double ReduceTyped(Vendor::Impl* v, const T* in, float* out, int64_t outer, int64_t axis, bool max,
                   int64_t* offsets) {
  auto it = thrust::make_transform_iterator(in, ToF<T>{});
  const float init = max ? -INFINITY : 0.f;
  return v->Time([&] {
    size_t bytes = v->workspace_bytes;
    cudaError_t e;
    if (outer == 1) {
      e = max ? cub::DeviceReduce::Reduce(v->workspace, bytes, it, out, axis, MaxF{}, init,
                                          v->stream)
              : cub::DeviceReduce::Reduce(v->workspace, bytes, it, out, axis, SumF{}, init,
                                          v->stream);
    } else {
      e = max ? cub::DeviceSegmentedReduce::Reduce(v->workspace, bytes, it, out, outer, offsets,
                                                   offsets + 1, MaxF{}, init, v->stream)
              : cub::DeviceSegmentedReduce::Reduce(v->workspace, bytes, it, out, outer, offsets,
                                                   offsets + 1, SumF{}, init, v->stream);
    }
    return e == cudaSuccess;
  });
}
}  // namespace

double Vendor::TimeReduce(const void* in, float* out, int64_t outer, int64_t axis, bool max,
                          DType dtype, std::string* which) {
  int64_t* offsets = nullptr;
  if (outer > 1) {
    std::vector<int64_t> host(size_t(outer + 1));
    for (int64_t i = 0; i <= outer; ++i) host[size_t(i)] = i * axis;
    SWEEP_CUDA(cudaMalloc(&offsets, host.size() * sizeof(int64_t)));
    SWEEP_CUDA(
        cudaMemcpy(offsets, host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  }
  double t;
  if (dtype == DType::kF32)
    t = ReduceTyped(impl_.get(), static_cast<const float*>(in), out, outer, axis, max, offsets);
  else if (dtype == DType::kF16)
    t = ReduceTyped(impl_.get(), static_cast<const __half*>(in), out, outer, axis, max, offsets);
  else
    t = ReduceTyped(impl_.get(), static_cast<const __nv_bfloat16*>(in), out, outer, axis, max,
                    offsets);
  if (offsets) cudaFree(offsets);
  *which = outer == 1 ? "cub::DeviceReduce" : "cub::DeviceSegmentedReduce";
  return t;
}

double Vendor::TimeTranspose(const void* in, void* out, int64_t batch, int64_t rows, int64_t cols,
                             DType dtype, std::string* which) {
  double best = -1;
  // cuBLASLt: column-major A [cols, rows] (ld cols) -> C [rows, cols] (ld rows), A transposed.
  cublasLtMatrixTransformDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lc = nullptr;
  bool ok = cublasLtMatrixTransformDescCreate(&desc, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  const cublasOperation_t trans = CUBLAS_OP_T;
  ok =
      ok && cublasLtMatrixTransformDescSetAttribute(desc, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA,
                                                    &trans, sizeof(trans)) == CUBLAS_STATUS_SUCCESS;
  ok = ok &&
       cublasLtMatrixLayoutCreate(&la, CudaType(dtype), cols, rows, cols) == CUBLAS_STATUS_SUCCESS;
  ok = ok &&
       cublasLtMatrixLayoutCreate(&lc, CudaType(dtype), rows, cols, rows) == CUBLAS_STATUS_SUCCESS;
  if (ok && batch > 1) {
    const int count = int(batch);
    const int64_t stride = rows * cols;
    for (cublasLtMatrixLayout_t l : {la, lc}) {
      ok = ok && cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof(count)) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof(stride)) == CUBLAS_STATUS_SUCCESS;
    }
  }
  if (ok) {
    const float one = 1.f, zero = 0.f;
    best = impl_->Time([&] {
      return cublasLtMatrixTransform(impl_->lt, desc, &one, in, la, &zero, nullptr, nullptr, out,
                                     lc, impl_->stream) == CUBLAS_STATUS_SUCCESS;
    });
    if (best > 0) *which = "cublasLtMatrixTransform";
  }
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (desc) cublasLtMatrixTransformDescDestroy(desc);
  if (dtype == DType::kF32 && batch == 1) {
    const float one = 1.f, zero = 0.f;
    const double t = impl_->Time([&] {
      return cublasSgeam(impl_->blas, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(cols), &one,
                         static_cast<const float*>(in), int(cols), &zero, nullptr, int(rows),
                         static_cast<float*>(out), int(rows)) == CUBLAS_STATUS_SUCCESS;
    });
    if (t > 0 && (best < 0 || t < best)) {
      best = t;
      *which = "cublasSgeam";
    }
  }
  return best;
}

double Vendor::TimeCopy(void* dst, const void* src, size_t bytes) {
  return impl_->Time([&] {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream) == cudaSuccess;
  });
}

std::string DescribeGpu() {
  int dev = 0, driver = 0, runtime = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  int blas = 0;
  cublasGetProperty(MAJOR_VERSION, &blas);
  int minor = 0;
  cublasGetProperty(MINOR_VERSION, &minor);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (%d SMs), driver %d, runtime %d, cuBLAS %d.%d", prop.name,
                prop.multiProcessorCount, driver, runtime, blas, minor);
  return buf;
}

}  // namespace gpucompute::sweep
