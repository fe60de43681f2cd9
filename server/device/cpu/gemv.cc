// GEMV on the CPU: one task per block of output rows, worked through in
// sub-blocks with a stop check before each: half A converted to fp32 in
// sub-blocks that stay in cache (so A crosses memory once, at its own size),
// fp32 A in sub-blocks of about kStopFloats multiply-adds; several
// right-hand sides as one GEMM that reads A once.
#include <vector>

#include "server/device/cpu/blas.h"
#include "server/device/cpu/elements.h"
#include "server/device/cpu/kernels.h"

namespace gpucompute::cpu {
namespace {

// Floats of converted A a GEMV task keeps at once (fits in L2).
constexpr int64_t kGemvScratchFloats = int64_t{1} << 16;
// Multiply-adds of fp32 A between two stop checks (over every column of
// x): for one column, 16 MiB of A, a few milliseconds of one core's memory
// bandwidth.
constexpr int64_t kStopFloats = int64_t{1} << 22;

}  // namespace

void GemvRows(ThreadPool& pool, const GemvSpec& spec, Range rows, bool naive, void* y_out,
              ShardStop& stop) {
  const int64_t m = spec.m, k = spec.k, ncols = spec.ncols;
  const int64_t shard_rows = rows.size();
  const DType dt = spec.dtype, out_dtype = spec.options.output_dtype;
  const float alpha = static_cast<float>(spec.alpha), beta = static_cast<float>(spec.beta);
  const bool read_y = spec.beta != 0 && spec.y.has_value();
  if (shard_rows <= 0) return;

  std::vector<float> x_converted;
  const float* x = static_cast<const float*>(spec.x.data);
  if (dt != DType::kFloat32) {
    x_converted.resize(size_t(k * ncols));
    ToFloat(dt, spec.x.data, x_converted.data(), k * ncols);
    x = x_converted.data();
  }
  const int64_t work = 2 * shard_rows * std::max<int64_t>(k, 1) * ncols;
  const int64_t blocks = std::min(shard_rows, PiecesFor(work, pool.size()));
  const int64_t block_rows = CeilDiv(shard_rows, blocks);
  const int64_t sub_rows =
      dt == DType::kFloat32 ? std::max<int64_t>(32, kStopFloats / std::max<int64_t>(k * ncols, 1))
                            : std::max<int64_t>(32, kGemvScratchFloats / std::max<int64_t>(k, 1));
  pool.ParallelFor(CeilDiv(shard_rows, block_rows), [&](int64_t task) {
    const int64_t task_begin = rows.begin + task * block_rows;
    const int64_t task_end = std::min(rows.end, task_begin + block_rows);
    std::vector<float> a_scratch, y_scratch;
    for (int64_t i0 = task_begin; i0 < task_end; i0 += sub_rows) {
      if (stop.Stop()) return;
      const int64_t i1 = std::min(task_end, i0 + sub_rows);
      const int64_t block = i1 - i0;
      const FloatBlock a = RowsOfOpA(dt, spec.a.data, spec.trans_a, m, k, i0, i1, a_scratch);
      const int64_t out_offset = i0 * ncols;
      float* y = out_dtype == DType::kFloat32 ? static_cast<float*>(y_out) + out_offset : nullptr;
      if (y == nullptr) {
        y_scratch.resize(static_cast<size_t>(block * ncols));
        y = y_scratch.data();
      }
      if (read_y) ToFloat(dt, ElementAt(spec.y->data, dt, out_offset), y, block * ncols);
      const float b = read_y ? beta : 0.0f;
      if (ncols == 1) {
        Sgemv(naive, spec.trans_a, block, k, alpha, a.data, a.ld, x, 1, b, y, 1);
      } else if (naive) {
        for (int64_t c = 0; c < ncols; ++c) {
          Sgemv(true, spec.trans_a, block, k, alpha, a.data, a.ld, x + c, ncols, b, y + c, ncols);
        }
      } else {
        Sgemm(false, spec.trans_a, false, block, ncols, k, alpha, a.data, a.ld, x, ncols, b, y,
              ncols);
      }
      if (out_dtype != DType::kFloat32) {
        FromFloat(out_dtype, y, ElementAt(y_out, out_dtype, out_offset), block * ncols);
      }
    }
  });
}

}  // namespace gpucompute::cpu
