// Benchmarks of the tensor-core GEMM ladder against cuBLAS (cublasGemmEx with
// the same types, in the same run): bf16 -> bf16, fp16 -> fp16 with row-major
// A[m,k] and B[k,n]; tf32 (fp32 -> fp32, CUBLAS_COMPUTE_32F_FAST_TF32) with B
// given as [n,k] (both operands K-major, the layout the tf32 wgmma reads).
// Every rung's output is checked against cuBLAS's.
#include <cublas_v2.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpucompute/kernels/gemm.h"
#include "kernels/bench/harness.h"
#include "kernels/bench/vendor.h"

namespace gpucompute::bench {
namespace {

using kernels::DType;
using kernels::GemmArgs;

cudaDataType CudaType(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : (t == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
void CublasGemm(cublasHandle_t h, const GemmArgs& a) {
  const cublasComputeType_t compute =
      a.ab_type == DType::kF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  GC_CUBLAS_CHECK(cublasGemmEx(h, a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                               a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(a.n), int(a.m), int(a.k),
                               &a.alpha, a.b, CudaType(a.ab_type), int(a.ldb), a.a,
                               CudaType(a.ab_type), int(a.lda), &a.beta, a.c, CudaType(a.c_type),
                               int(a.ldc), compute, CUBLAS_GEMM_DEFAULT));
}

struct Shape {
  int64_t m, n, k;
};

void BenchGemmTc(Context& ctx) {
  cublasHandle_t handle;
  GC_CUBLAS_CHECK(cublasCreate(&handle));
  GC_CUBLAS_CHECK(cublasSetStream(handle, ctx.stream()));
  const std::vector<Shape> shapes = {{4096, 4096, 4096},  {8192, 8192, 8192},
                                     {16384, 16384, 16384}, {8192, 8192, 1024},
                                     {1024, 8192, 8192},  {4096, 14336, 4096}};
  struct Mode {
    const char* name;
    DType ab, c;
    bool trans_b;
  };
  const std::vector<Mode> modes = {{"bf16", DType::kBF16, DType::kBF16, false},
                                   {"f16", DType::kF16, DType::kF16, false},
                                   {"tf32", DType::kF32, DType::kF32, true}};
  for (const Mode& mode : modes) {
    for (const Shape& s : shapes) {
      if (ctx.quick() && s.m * s.n * s.k > (int64_t(1) << 36)) continue;
      const size_t es = kernels::DTypeSize(mode.ab), ec = kernels::DTypeSize(mode.c);
      DeviceBuffer a(size_t(s.m * s.k) * es), b(size_t(s.k * s.n) * es);
      DeviceBuffer c(size_t(s.m * s.n) * ec), ref(size_t(s.m * s.n) * ec);
      ctx.FillRandom(a.get(), size_t(s.m * s.k), mode.ab);
      ctx.FillRandom(b.get(), size_t(s.k * s.n), mode.ab);
      GemmArgs args;
      args.m = s.m;
      args.n = s.n;
      args.k = s.k;
      args.a = a.get();
      args.lda = s.k;
      args.b = b.get();
      args.trans_b = mode.trans_b;
      args.ldb = mode.trans_b ? s.k : s.n;
      args.ldc = s.n;
      args.ab_type = mode.ab;
      args.c_type = mode.c;
      args.allow_tf32 = mode.ab == DType::kF32;

      const std::string case_name = "M" + std::to_string(s.m) + "_N" + std::to_string(s.n) +
                                    "_K" + std::to_string(s.k);
      const double flops = 2.0 * s.m * s.n * s.k;
      const double bytes = double(s.m * s.k + s.k * s.n) * es + double(s.m * s.n) * ec;
      const bool big = flops > 4e12;
      const int warmup = big ? 2 : 5, iters = big ? 10 : 30;

      GemmArgs vendor = args;
      vendor.c = ref.get();
      const double vendor_ms =
          ctx.Time([&](cudaStream_t) { CublasGemm(handle, vendor); }, warmup, iters);
      ctx.Record({"gemm_tc", case_name, mode.name, "cublas", vendor_ms, bytes, flops, 1.0});

      for (const std::string& v : kernels::GemmTcVariants()) {
        if (!ctx.Wants("gemm_tc/" + v)) continue;
        GemmArgs ours = args;
        ours.c = c.get();
        if (!kernels::CanImplementGemmTc(ours, v)) continue;
        ctx.Poison(c.get(), c.bytes());
        GC_CUDA_CHECK(kernels::LaunchGemmTc(ours, v, nullptr, ctx.stream()));
        // 16-bit outputs: one rounding of C; tf32: input truncation grows as sqrt(K).
        const double atol = 2e-3 * std::sqrt(double(s.k)), rtol = 1e-2;
        double worst = 0;
        const bool ok = DeviceAllClose(c.get(), ref.get(), size_t(s.m * s.n), mode.c, atol, rtol,
                                       ctx.stream(), &worst);
        const double ms = ctx.Time(
            [&](cudaStream_t st) { GC_CUDA_CHECK(kernels::LaunchGemmTc(ours, v, nullptr, st)); },
            warmup, iters);
        Row row{"gemm_tc", case_name, mode.name, v, ms, bytes, flops, vendor_ms / ms};
        row.correct = ok;
        if (!ok) row.note = "worst err/tol " + std::to_string(worst);
        ctx.Record(row);
      }
    }
  }
  cublasDestroy(handle);
}

}  // namespace

GC_REGISTER_BENCH("gemm_tc", BenchGemmTc);

}  // namespace gpucompute::bench
