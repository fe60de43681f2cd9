// Benchmarks of the reduce ladder.
//
// Cases: all elements (2^28 fp32 SUM and MAX against CUB DeviceReduce; 2^29
// bf16 SUM), the row case [16384, 16384] fp32 SUM against CUB
// DeviceSegmentedReduce, and the column case [16384, 16384] along the first
// axis. Bytes = input read once + outputs written once; the copy ratio compares
// with a D2D copy of the same bytes. Each rung's output is spot-checked against
// the vendor's (or, without one, against single_pass).
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_segmented_reduce.cuh>

#include <string>

#include "gpucompute/kernels/reduce.h"
#include "kernels/bench/harness.h"

namespace gpucompute::bench {
namespace {

using kernels::DType;
using kernels::ReduceOp;

const char* OpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMean: return "mean";
  }
  return "?";
}

// The vendor reference of a case: CUB for all-elements SUM/MAX (fp32) and for
// the row SUM; none otherwise.
enum class Vendor { kNone, kCubReduce, kCubSegmented };

void ReduceCase(Context& ctx, int64_t outer, int64_t axis, int64_t inner, ReduceOp op, DType t,
                Vendor vendor, const std::string& shape_name) {
  const size_t n = size_t(outer * axis * inner), n_out = size_t(outer * inner);
  const size_t es = kernels::DTypeSize(t);
  const double bytes = double(n) * double(es) + double(n_out) * 4.0;
  const std::string name = shape_name + "_" + OpName(op);
  cudaStream_t s = ctx.stream();
  DeviceBuffer in(n * es), out(n_out * 4), ref(n_out * 4);
  ctx.FillRandom(in.get(), n, t);

  double vendor_ms = 0;
  bool have_ref = false;
  if (vendor == Vendor::kCubReduce && t == DType::kF32) {
    size_t temp = 0;
    const float* x = in.get<float>();
    float* y = ref.get<float>();
    if (op == ReduceOp::kSum) GC_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, temp, x, y, int64_t(n), s));
    else GC_CUDA_CHECK(cub::DeviceReduce::Max(nullptr, temp, x, y, int64_t(n), s));
    DeviceBuffer tmp(temp);
    auto run = [&](float* dst, cudaStream_t st) {
      size_t tb = temp;
      if (op == ReduceOp::kSum) cub::DeviceReduce::Sum(tmp.get(), tb, x, dst, int64_t(n), st);
      else cub::DeviceReduce::Max(tmp.get(), tb, x, dst, int64_t(n), st);
    };
    run(y, s);
    vendor_ms = ctx.Time([&](cudaStream_t st) { run(out.get<float>(), st); });
    have_ref = true;
    ctx.Record({"reduce", name, DTypeName(t), "cub", vendor_ms, bytes, 0, 1.0, 0, true, "vendor"},
               true);
  } else if (vendor == Vendor::kCubSegmented && t == DType::kF32 && op == ReduceOp::kSum &&
             inner == 1) {
    std::vector<int> h_off(size_t(outer) + 1);
    for (int64_t i = 0; i <= outer; ++i) h_off[size_t(i)] = int(i * axis);
    DeviceBuffer off(h_off.size() * sizeof(int));
    GC_CUDA_CHECK(cudaMemcpy(off.get(), h_off.data(), off.bytes(), cudaMemcpyHostToDevice));
    const float* x = in.get<float>();
    const int* o = off.get<int>();
    size_t temp = 0;
    GC_CUDA_CHECK(cub::DeviceSegmentedReduce::Sum(nullptr, temp, x, ref.get<float>(), outer, o,
                                                  o + 1, s));
    DeviceBuffer tmp(temp);
    auto run = [&](float* dst, cudaStream_t st) {
      size_t tb = temp;
      cub::DeviceSegmentedReduce::Sum(tmp.get(), tb, x, dst, outer, o, o + 1, st);
    };
    run(ref.get<float>(), s);
    vendor_ms = ctx.Time([&](cudaStream_t st) { run(out.get<float>(), st); });
    have_ref = true;
    ctx.Record({"reduce", name, DTypeName(t), "cub_segmented", vendor_ms, bytes, 0, 1.0, 0, true,
                "vendor"},
               true);
  }
  if (!have_ref) {
    kernels::ReduceArgs a{in.get(), ref.get(), outer, axis, inner, op, t, DType::kF32};
    DeviceBuffer ws(kernels::ReduceWorkspaceBytes(a, "single_pass"));
    GC_CUDA_CHECK(cudaMemsetAsync(ws.get(), 0, ws.bytes(), s));
    GC_CUDA_CHECK(kernels::LaunchReduce(a, "single_pass", ws.get(), s));
  }

  // Sums of 2^28 values in [-1, 1): fp32 accumulation orders differ by ~1e-7
  // of sum |x| (about n / 2) per level; max/min are exact in any order.
  const bool exact = op == ReduceOp::kMax || op == ReduceOp::kMin;
  const double atol = exact ? 1e-30 : (op == ReduceOp::kSum ? 1e-6 * double(axis) : 1e-6);
  const double rtol = exact ? 0 : 1e-5;
  for (const std::string& v : kernels::ReduceVariants()) {
    if (!ctx.Wants("reduce/" + v)) continue;
    kernels::ReduceArgs a{in.get(), out.get(), outer, axis, inner, op, t, DType::kF32};
    kernels::Support sup = kernels::CanImplementReduce(a, v);
    if (!sup) {
      std::printf("reduce     %-24s %-5s %-22s skipped: %s\n", name.c_str(), DTypeName(t), v.c_str(),
                  sup.reason.c_str());
      continue;
    }
    DeviceBuffer ws(kernels::ReduceWorkspaceBytes(a, v));
    GC_CUDA_CHECK(cudaMemsetAsync(ws.get(), 0, ws.bytes(), s));
    ctx.Poison(out.get(), out.bytes());
    GC_CUDA_CHECK(kernels::LaunchReduce(a, v, ws.get(), s));
    double worst = 0;
    bool ok = DeviceAllClose(out.get(), ref.get(), n_out, DType::kF32, atol, rtol, s, &worst);
    double ms = ctx.Time([&](cudaStream_t st) { kernels::LaunchReduce(a, v, ws.get(), st); });
    ctx.Record({"reduce", name, DTypeName(t), v, ms, bytes, 0, vendor_ms > 0 ? vendor_ms / ms : 0,
                0, ok, ok ? "" : "worst " + std::to_string(worst)},
               true);
  }
}

void BenchReduce(Context& ctx) {
  const int64_t kAll = int64_t(1) << 28;
  ReduceCase(ctx, 1, kAll, 1, ReduceOp::kSum, DType::kF32, Vendor::kCubReduce, "all_2^28");
  ReduceCase(ctx, 1, kAll, 1, ReduceOp::kMax, DType::kF32, Vendor::kCubReduce, "all_2^28");
  ReduceCase(ctx, 1, 2 * kAll, 1, ReduceOp::kSum, DType::kBF16, Vendor::kNone, "all_2^29");
  ReduceCase(ctx, 16384, 16384, 1, ReduceOp::kSum, DType::kF32, Vendor::kCubSegmented,
             "rows_16384x16384");
  ReduceCase(ctx, 16384, 16384, 1, ReduceOp::kMax, DType::kBF16, Vendor::kNone,
             "rows_16384x16384");
  ReduceCase(ctx, 1, 16384, 16384, ReduceOp::kSum, DType::kF32, Vendor::kNone, "cols_16384x16384");
  ReduceCase(ctx, 64, 4096, 256, ReduceOp::kMean, DType::kF32, Vendor::kNone, "64x4096x256");
}

}  // namespace

GC_REGISTER_BENCH("reduce", BenchReduce);

}  // namespace gpucompute::bench
