// Benchmarks of the gemm_simt ladder: TFLOP/s of every rung against cuBLAS
// SGEMM in exact fp32 (default math mode: no tf32), measured in the same run.
// Row-major C = A B is computed by cuBLAS as the column-major C^T = B^T A^T.
#include <cublas_v2.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gpucompute/kernels/gemm.h"
#include "kernels/bench/harness.h"
#include "kernels/bench/vendor.h"

namespace gpucompute::bench {
namespace {

struct Shape {
  int64_t m, n, k;
};

void BenchGemmSimt(Context& ctx) {
  cublasHandle_t handle;
  GC_CUBLAS_CHECK(cublasCreate(&handle));
  GC_CUBLAS_CHECK(cublasSetStream(handle, ctx.stream()));
  GC_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // exact fp32, no tf32

  const Shape shapes[] = {{4096, 4096, 4096},
                          {8192, 8192, 8192},
                          {1000, 3000, 777},
                          {8192, 8192, 1024},
                          {1024, 1024, 16384}};
  std::vector<std::string> variants = kernels::GemmSimtVariants();
  variants.push_back("");  // the dispatcher's pick
  for (const Shape& s : shapes) {
    const std::string case_name =
        "M" + std::to_string(s.m) + "_N" + std::to_string(s.n) + "_K" + std::to_string(s.k);
    const double flops = 2.0 * s.m * s.n * s.k;
    const double bytes = 4.0 * (s.m * s.k + s.k * s.n + s.m * s.n);
    DeviceBuffer a(sizeof(float) * s.m * s.k), b(sizeof(float) * s.k * s.n);
    DeviceBuffer c(sizeof(float) * s.m * s.n), ref(sizeof(float) * s.m * s.n);
    ctx.FillRandom(a.get(), s.m * s.k, kernels::DType::kF32);
    ctx.FillRandom(b.get(), s.k * s.n, kernels::DType::kF32);

    const float alpha = 1.f, beta = 0.f;
    auto run_cublas = [&](cudaStream_t) {
      GC_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k),
                                  &alpha, b.get<float>(), int(s.n), a.get<float>(), int(s.k),
                                  &beta, ref.get<float>(), int(s.n)));
    };
    const double cublas_ms = ctx.Time(run_cublas);
    Row vendor{"gemm_simt", case_name, "f32", "cublas_sgemm", cublas_ms, bytes, flops, 1.0};
    ctx.Record(vendor);

    kernels::GemmArgs args;
    args.m = s.m, args.n = s.n, args.k = s.k;
    args.a = a.get(), args.lda = s.k;
    args.b = b.get(), args.ldb = s.n;
    args.c = c.get(), args.ldc = s.n;
    for (const std::string& v : variants) {
      const std::string name = v.empty() ? "auto" : v;
      if (!ctx.Wants("gemm_simt/" + name)) continue;
      if (!kernels::CanImplementGemmSimt(args, v)) continue;
      const size_t ws_bytes = kernels::GemmSimtWorkspaceBytes(args, v);
      DeviceBuffer ws(ws_bytes);
      ctx.Poison(c.get(), c.bytes());
      GC_CUDA_CHECK(kernels::LaunchGemmSimt(args, v, ws.get(), ctx.stream()));
      double worst = 0;
      // Both sides accumulate in fp32 in different orders: |diff| ~ 1e-7 K.
      const bool ok = DeviceAllClose(c.get(), ref.get(), s.m * s.n, kernels::DType::kF32,
                                     2e-6 * double(s.k), 1e-4, ctx.stream(), &worst);
      // The first rungs run for up to a second at 8192^3: fewer repetitions.
      const bool slow = v == "naive" || v == "smem32";
      const double ms = ctx.Time(
          [&](cudaStream_t st) { GC_CUDA_CHECK(kernels::LaunchGemmSimt(args, v, ws.get(), st)); },
          slow ? 1 : 5, slow ? 3 : 30);
      Row row{"gemm_simt", case_name, "f32", name, ms, bytes, flops, cublas_ms / ms};
      row.correct = ok;
      if (!ok) row.note = "max normalised error " + std::to_string(worst);
      ctx.Record(row);
    }
  }
  cublasDestroy(handle);
}

GC_REGISTER_BENCH("gemm_simt", BenchGemmSimt);

}  // namespace
}  // namespace gpucompute::bench
