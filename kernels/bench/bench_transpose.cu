// Benchmarks of the transpose ladder and of the permutation routes.
//
// Each case: every rung, cuBLAS geam (fp32, batch 1) and cuBLASLt
// MatrixTransform (every dtype) as vendor references, and a D2D copy of the
// same bytes. Bytes = input read once + output written once. Every rung's
// output is compared bit for bit with the vendor's.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <string>

#include "gpucompute/kernels/transpose.h"
#include "kernels/bench/harness.h"
#include "kernels/bench/vendor.h"

namespace gpucompute::bench {
namespace {

using kernels::DType;

// cuBLASLt transform of a row-major [b, r, c] to [b, c, r]: in column-major
// terms A is c x r (ld c), C = A^T is r x c (ld r).
class LtTranspose {
 public:
  LtTranspose(cublasLtHandle_t lt, int64_t b, int64_t r, int64_t c, DType t) : lt_(lt) {
    ok_ = cublasLtMatrixTransformDescCreate(&desc_, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    cublasOperation_t op = CUBLAS_OP_T;
    ok_ = ok_ && cublasLtMatrixTransformDescSetAttribute(desc_, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA,
                                                         &op, sizeof(op)) == CUBLAS_STATUS_SUCCESS;
    ok_ = ok_ && cublasLtMatrixLayoutCreate(&a_, CudaType(t), c, r, c) == CUBLAS_STATUS_SUCCESS;
    ok_ = ok_ && cublasLtMatrixLayoutCreate(&c_, CudaType(t), r, c, r) == CUBLAS_STATUS_SUCCESS;
    if (ok_ && b > 1) {
      int32_t count = int32_t(b);
      int64_t stride = r * c;
      for (auto l : {a_, c_}) {
        ok_ = ok_ && cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                      sizeof(count)) == CUBLAS_STATUS_SUCCESS;
        ok_ = ok_ && cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &stride, sizeof(stride)) == CUBLAS_STATUS_SUCCESS;
      }
    }
  }
  ~LtTranspose() {
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (c_) cublasLtMatrixLayoutDestroy(c_);
    if (desc_) cublasLtMatrixTransformDescDestroy(desc_);
  }
  bool ok() const { return ok_; }
  bool Run(const void* in, void* out, cudaStream_t s) const {
    const float alpha = 1.f, beta = 0.f;
    return cublasLtMatrixTransform(lt_, desc_, &alpha, in, a_, &beta, nullptr, nullptr, out, c_, s) ==
           CUBLAS_STATUS_SUCCESS;
  }

 private:
  cublasLtHandle_t lt_;
  cublasLtMatrixTransformDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, c_ = nullptr;
  bool ok_ = false;
};

std::string ShapeName(int64_t b, int64_t r, int64_t c) {
  std::string s = std::to_string(r) + "x" + std::to_string(c);
  return b > 1 ? std::to_string(b) + "x" + s : s;
}

void TransposeCase(Context& ctx, cublasHandle_t blas, cublasLtHandle_t lt, int64_t b, int64_t r,
                   int64_t c, DType t) {
  const size_t n = size_t(b * r * c), es = kernels::DTypeSize(t);
  const double bytes = 2.0 * double(n) * double(es);
  const std::string name = ShapeName(b, r, c);
  DeviceBuffer in(n * es), out(n * es), ref(n * es);
  ctx.FillRandom(in.get(), n, t);
  cudaStream_t s = ctx.stream();

  // Vendor references; the first that works provides the reference output.
  double vendor_ms = 0;
  bool have_ref = false;
  LtTranspose lt_op(lt, b, r, c, t);
  if (lt_op.ok() && lt_op.Run(in.get(), ref.get(), s)) {
    have_ref = true;
    double ms = ctx.Time([&](cudaStream_t st) { lt_op.Run(in.get(), out.get(), st); });
    vendor_ms = ms;
    ctx.Record({"transpose", name, DTypeName(t), "cublaslt_transform", ms, bytes, 0, 1.0, 0, true,
                "vendor"},
               true);
  }
  if (t == DType::kF32 && b == 1) {
    const float alpha = 1.f, beta = 0.f;
    auto geam = [&](void* dst) {
      return cublasSgeam(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(r), int(c), &alpha,
                         in.get<float>(), int(c), &beta, static_cast<float*>(dst), int(r),
                         static_cast<float*>(dst), int(r));
    };
    if (geam(have_ref ? out.get() : ref.get()) == CUBLAS_STATUS_SUCCESS) {
      have_ref = true;
      double ms = ctx.Time([&](cudaStream_t) { geam(out.get()); });
      vendor_ms = ms;  // geam is the named reference for fp32
      ctx.Record({"transpose", name, DTypeName(t), "cublas_geam", ms, bytes, 0, 1.0, 0, true,
                  "vendor"},
                 true);
    }
  }
  if (!have_ref) {
    GC_CUDA_CHECK(kernels::LaunchTranspose({in.get(), ref.get(), b, r, c, t}, "naive", s));
  }

  for (const std::string& v : kernels::TransposeVariants()) {
    if (!ctx.Wants("transpose/" + v)) continue;
    kernels::TransposeArgs args{in.get(), out.get(), b, r, c, t};
    kernels::Support sup = kernels::CanImplementTranspose(args, v);
    if (!sup) {
      std::printf("transpose  %-24s %-5s %-22s skipped: %s\n", name.c_str(), DTypeName(t),
                  v.c_str(), sup.reason.c_str());
      continue;
    }
    ctx.Poison(out.get(), out.bytes());
    GC_CUDA_CHECK(kernels::LaunchTranspose(args, v, s));
    bool ok = DeviceAllClose(out.get(), ref.get(), n, t, 1e-30, 0, s);
    double ms = ctx.Time([&](cudaStream_t st) { kernels::LaunchTranspose(args, v, st); });
    ctx.Record({"transpose", name, DTypeName(t), v, ms, bytes, 0,
                vendor_ms > 0 ? vendor_ms / ms : 0, 0, ok, ""},
               true);
  }
}

// A permutation through LaunchPermute (default variant), against a copy of the
// same bytes, recorded under the name of the route that ran; the tests check
// the results.
void PermuteCase(Context& ctx, std::initializer_list<int64_t> shape,
                 std::initializer_list<int> perm, DType t) {
  kernels::PermuteArgs a;
  a.rank = int(shape.size());
  int i = 0;
  for (int64_t d : shape) a.shape[i++] = d;
  i = 0;
  for (int p : perm) a.perm[i++] = p;
  a.dtype = t;
  size_t n = 1;
  std::string name;
  for (int d = 0; d < a.rank; ++d) {
    n *= size_t(a.shape[d]);
    name += (d ? "x" : "") + std::to_string(a.shape[d]);
  }
  name += "_p";
  for (int d = 0; d < a.rank; ++d) name += std::to_string(a.perm[d]);
  const size_t es = kernels::DTypeSize(t);
  DeviceBuffer in(n * es), out(n * es);
  ctx.FillRandom(in.get(), n, t);
  a.in = in.get();
  a.out = out.get();
  const double bytes = 2.0 * double(n) * double(es);
  GC_CUDA_CHECK(kernels::LaunchPermute(a, "", ctx.stream()));
  double ms = ctx.Time([&](cudaStream_t st) { kernels::LaunchPermute(a, "", st); });
  ctx.Record({"permute", name, DTypeName(t), "default/" + kernels::PermuteVariantName(a, ""), ms,
              bytes, 0, 0, 0, true, ""},
             true);
}

void BenchTranspose(Context& ctx) {
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "transpose: cuBLAS unavailable\n");
    return;
  }
  cublasSetStream(blas, ctx.stream());
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
    TransposeCase(ctx, blas, lt, 1, 16384, 16384, t);
  TransposeCase(ctx, blas, lt, 1, 4097, 4099, DType::kF32);
  TransposeCase(ctx, blas, lt, 64, 1024, 1024, DType::kF32);
  TransposeCase(ctx, blas, lt, 64, 1024, 1024, DType::kBF16);
  if (ctx.Wants("permute")) {
    PermuteCase(ctx, {64, 512, 2048}, {1, 0, 2}, DType::kF32);
    PermuteCase(ctx, {64, 64, 64, 256}, {2, 0, 1, 3}, DType::kBF16);
    PermuteCase(ctx, {256, 512, 512}, {2, 1, 0}, DType::kF32);
    PermuteCase(ctx, {8192, 4, 8192}, {2, 1, 0}, DType::kF32);
  }
  cublasLtDestroy(lt);
  cublasDestroy(blas);
}

}  // namespace

GC_REGISTER_BENCH("transpose", BenchTranspose);

}  // namespace gpucompute::bench
