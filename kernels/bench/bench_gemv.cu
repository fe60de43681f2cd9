// Benchmarks of the GEMV ladder against cuBLAS, in the same run.
//
// Cases: 16384 x 16384 (A larger than L2 in every dtype), n = 1 in fp32, bf16
// and fp16, A x and A^T x; then n = 2, 4, 8 columns of x. Vendor rows:
//   fp32, n = 1: cublasSgemv and cublasGemmEx (n = 1, fp32 compute);
//   fp16/bf16, n = 1: cublasGemmEx (n = 1, fp32 compute) and the
//                     mixed-precision cuBLAS gemv (cublasHSHgemvStridedBatched /
//                     cublasTSTgemvStridedBatched, one batch);
//   n > 1: cublasGemmEx (fp32 compute, no TF32).
// Our rows carry vendor_ratio = fastest vendor ms / our ms, and copy_ratio =
// D2D copy of the same traffic / our ms. Traffic counts A and x read once and y
// written once (beta = 0).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "gpucompute/kernels/gemv.h"
#include "kernels/bench/harness.h"
#include "kernels/bench/vendor.h"

namespace gpucompute::bench {
namespace {

using kernels::DType;
using kernels::GemvArgs;

struct Vendor {
  std::string name;
  std::function<void(cudaStream_t)> run;
};

// cuBLAS is column-major: row-major Y[m, n] = op(A) X is Y^T = X^T op(A)^T, a
// column-major GEMM of shape (n, m, k) with X^T ([n, k], ld n) first.
std::vector<Vendor> VendorRuns(cublasHandle_t h, const GemvArgs& g) {
  std::vector<Vendor> v;
  const int m = int(g.m), k = int(g.k), n = g.ncols, lda = int(g.lda);
  static const float kOne = 1.f, kZero = 0.f;
  const float* alpha = &kOne;
  const float* beta = &kZero;
  v.push_back({"cublas_gemmex", [=](cudaStream_t) {
                 GC_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                                              alpha, g.x, CudaType(g.dtype), n, g.a, CudaType(g.dtype), lda,
                                              beta, g.y, CudaType(g.y_type), n, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
               }});
  if (n != 1) return v;
  // gemv: row-major A x is the column-major A'^T x with A' = [k, m], lda.
  const cublasOperation_t op = g.trans_a ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int rows = g.trans_a ? m : k, cols = g.trans_a ? k : m;  // of the column-major matrix
  if (g.dtype == DType::kF32) {
    v.push_back({"cublas_sgemv", [=](cudaStream_t) {
                   GC_CUBLAS_CHECK(cublasSgemv(h, op, rows, cols, alpha, static_cast<const float*>(g.a), lda,
                                               static_cast<const float*>(g.x), 1, beta, static_cast<float*>(g.y), 1));
                 }});
  } else if (g.dtype == DType::kF16) {
    v.push_back({"cublas_hshgemv", [=](cudaStream_t) {
                   GC_CUBLAS_CHECK(cublasHSHgemvStridedBatched(
                       h, op, rows, cols, alpha, static_cast<const __half*>(g.a), lda, 0,
                       static_cast<const __half*>(g.x), 1, 0, beta, static_cast<__half*>(g.y), 1, 0, 1));
                 }});
  } else {
    v.push_back({"cublas_tstgemv", [=](cudaStream_t) {
                   GC_CUBLAS_CHECK(cublasTSTgemvStridedBatched(
                       h, op, rows, cols, alpha, static_cast<const __nv_bfloat16*>(g.a), lda, 0,
                       static_cast<const __nv_bfloat16*>(g.x), 1, 0, beta, static_cast<__nv_bfloat16*>(g.y), 1,
                       0, 1));
                 }});
  }
  return v;
}

std::string CaseName(const GemvArgs& g) {
  return std::to_string(g.m) + "x" + std::to_string(g.k) + "_n" + std::to_string(g.ncols) +
         (g.trans_a ? "_T" : "");
}

void BenchGemv(Context& ctx) {
  constexpr int64_t kM = 16384, kK = 16384;
  DeviceBuffer a(size_t(kM) * kK * 4);  // the largest A: fp32
  DeviceBuffer x(size_t(kK) * 8 * 4), y(size_t(kM) * 8 * 4), y_ref(size_t(kM) * 8 * 4);
  cublasHandle_t handle;
  GC_CUBLAS_CHECK(cublasCreate(&handle));
  GC_CUBLAS_CHECK(cublasSetStream(handle, ctx.stream()));

  struct Shape {
    int ncols;
    bool trans;
  };
  const std::vector<Shape> shapes = {{1, false}, {1, true}, {2, false}, {4, false}, {8, false}, {4, true}};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    ctx.FillRandom(a.get(), size_t(kM) * kK, dt);
    ctx.FillRandom(x.get(), size_t(kK) * 8, dt);
    for (const Shape& s : shapes) {
      GemvArgs g;
      g.m = kM;
      g.k = kK;
      g.a = a.get();
      g.lda = s.trans ? kM : kK;
      g.trans_a = s.trans;
      g.x = x.get();
      g.ncols = s.ncols;
      g.dtype = dt;
      g.y_type = dt;
      const std::string cname = CaseName(g);
      const size_t es = kernels::DTypeSize(dt);
      const double bytes = double(kM) * kK * es + double(kK) * s.ncols * es + double(kM) * s.ncols * es;
      const double flops = 2.0 * kM * kK * s.ncols;
      const double tol_a = dt == DType::kF32 ? 1e-3 : 2e-2, tol_r = dt == DType::kF32 ? 1e-4 : 1.6e-2;

      // Vendor rows first; the fastest is the reference for the ratios and the check.
      double best_vendor = 0;
      std::string best_name;
      for (auto& v : VendorRuns(handle, [&] { GemvArgs r = g; r.y = y.get(); return r; }())) {
        if (!ctx.Wants("gemv/" + v.name)) continue;
        const double ms = ctx.Time(v.run);
        Row row{"gemv", cname, kernels::DTypeName(dt), v.name, ms, bytes, flops};
        ctx.Record(row, true);
        if (best_vendor == 0 || ms < best_vendor) best_vendor = ms, best_name = v.name;
      }
      // Reference output for the spot check (the gemm path, any n).
      // Reductions in fp32 even where y is fp16/bf16 (cuBLAS may otherwise add
      // split-k partials in the output type, which the check would flag).
      GemvArgs ref = g;
      ref.y = y_ref.get();
      GC_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
      VendorRuns(handle, ref)[0].run(ctx.stream());
      GC_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
      GC_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));

      for (const std::string& variant : kernels::GemvVariants()) {
        if (!ctx.Wants("gemv/" + variant)) continue;
        GemvArgs ours = g;
        ours.y = y.get();
        if (!kernels::CanImplementGemv(ours, variant)) continue;
        // The naive versions would take seconds on the batched cases: time them on n = 1 only.
        if ((variant == "warp_row" || variant == "trans_naive") && s.ncols > 1) continue;
        DeviceBuffer ws(std::max<size_t>(kernels::GemvWorkspaceBytes(ours, variant), 1));
        auto run = [&](cudaStream_t st) { GC_CUDA_CHECK(kernels::LaunchGemv(ours, variant, ws.get(), st)); };
        ctx.Poison(y.get(), size_t(kM) * s.ncols * es);
        run(ctx.stream());
        double worst = 0;
        const bool ok = DeviceAllClose(y.get(), y_ref.get(), size_t(kM) * s.ncols, dt, tol_a, tol_r,
                                       ctx.stream(), &worst);
        const int iters = (variant == "trans_naive" || variant == "warp_row") ? 10 : 40;
        const double ms = ctx.Time(run, 3, iters);
        Row row{"gemv", cname, kernels::DTypeName(dt), variant, ms, bytes, flops};
        row.vendor_ratio = best_vendor > 0 ? best_vendor / ms : 0;
        row.correct = ok;
        row.note = "vs " + best_name;
        if (!ok) row.note += " worst=" + std::to_string(worst);
        ctx.Record(row, true);
      }
    }
  }
  cublasDestroy(handle);
}

GC_REGISTER_BENCH("gemv", BenchGemv);

}  // namespace
}  // namespace gpucompute::bench
