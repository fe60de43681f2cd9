// GEMM on the CPU: B converted to fp32 once per shard, then tasks of
// (batch entry, block of output rows) over the pool, each cut into
// single-threaded CBLAS calls of about kBlockFlops (whole rows first, then
// columns), with a stop check before each; each block of half A converted
// to fp32 on its own.
#include <vector>

#include "server/device/cpu/blas.h"
#include "server/device/cpu/elements.h"
#include "server/device/cpu/kernels.h"

namespace gpucompute::cpu {
namespace {

// Work of one CBLAS call at most, where the shape allows: a cancelled shard
// stops within one call (about 25 ms at the 40 GFLOP/s of one core of the
// 2-core dev VM).
constexpr int64_t kBlockFlops = int64_t{1} << 30;
// But calls of at least this many rows and columns (fewer only where C has
// fewer): OpenBLAS packs the panels of B (and A) afresh on each call. Against
// one call per task (1024 x 2048 of C), calls of 64-128 rows cost 8-14% and
// calls of 256 x 512 or 128 x 1024 25-28%; from 256 x 1024 the difference
// was within the noise of the 2-core dev VM (a few %, k = 1024 to 4096).
// Calls that cut the rows or columns of a task elsewhere than before can
// change the last bits of their results (OpenBLAS's micro-tiles start
// elsewhere), as a different number of threads already does.
constexpr int64_t kMinBlasRows = 256;
constexpr int64_t kMinBlasCols = 1024;
// The naive loops compute row by row: blocks of any size cost the same.
constexpr int64_t kNaiveBlockFlops = int64_t{1} << 26;

// Converts n elements of a `dtype` buffer into floats, in parallel pieces.
void ToFloatParallel(ThreadPool& pool, DType dtype, const void* src, float* dst, int64_t n) {
  pool.ParallelRange(0, n, kMinParallelWork, pool.size(), [&](int64_t b, int64_t e) {
    ToFloat(dtype, ElementAt(src, dtype, b), dst + b, e - b);
  });
}

}  // namespace

void GemmRows(ThreadPool& pool, const GemmSpec& spec, Range rows, bool naive, void* c_out,
              ShardStop& stop) {
  const int64_t m = spec.m, n = spec.n, k = spec.k, batch = spec.batch;
  const int64_t shard_rows = rows.size();
  const DType dt = spec.dtype, out_dtype = spec.options.output_dtype;
  const float alpha = static_cast<float>(spec.alpha), beta = static_cast<float>(spec.beta);
  const bool read_c = spec.beta != 0 && spec.c.has_value();
  if (shard_rows <= 0 || n <= 0) return;

  // B as fp32, every batch entry it has.
  const int64_t b_entries = spec.b_batched ? batch : 1;
  std::vector<float> b_converted;
  const float* bf = static_cast<const float*>(spec.b.data);
  if (dt != DType::kFloat32) {
    b_converted.resize(size_t(b_entries * k * n));
    ToFloatParallel(pool, dt, spec.b.data, b_converted.data(), b_entries * k * n);
    bf = b_converted.data();
  }
  const int64_t ldb = spec.trans_b ? k : n;

  // Tasks: (batch entry, block of rows).
  const int64_t work = 2 * batch * shard_rows * n * std::max<int64_t>(k, 1);
  const int64_t pieces = PiecesFor(work, pool.size());
  const int64_t blocks_per_entry = std::min(shard_rows, CeilDiv(pieces, batch));
  const int64_t block_rows = CeilDiv(shard_rows, blocks_per_entry);
  const int64_t blocks = CeilDiv(shard_rows, block_rows);
  const int64_t row_work = 2 * n * std::max<int64_t>(k, 1);
  const int64_t call_flops = naive ? kNaiveBlockFlops : kBlockFlops;
  pool.ParallelFor(batch * blocks, [&](int64_t task) {
    if (stop.Stop()) return;
    const int64_t e = task / blocks;
    const int64_t t0 = rows.begin + (task % blocks) * block_rows;
    const int64_t t1 = std::min(rows.end, t0 + block_rows);
    const int64_t task_rows = t1 - t0;
    const void* a_entry = ElementAt(spec.a.data, dt, (spec.a_batched ? e : 0) * m * k);
    const float* b = bf + (spec.b_batched ? e : 0) * k * n;
    const int64_t task_offset = e * m * n + t0 * n;
    std::vector<float> a_scratch, c_scratch;
    float* c_task =
        out_dtype == DType::kFloat32 ? static_cast<float*>(c_out) + task_offset : nullptr;
    if (c_task == nullptr) {
      c_scratch.resize(size_t(task_rows * n));
      c_task = c_scratch.data();
    }
    if (read_c) {
      const int64_t c_offset = (spec.c_batched ? e : 0) * m * n + t0 * n;
      ToFloat(dt, ElementAt(spec.c->data, dt, c_offset), c_task, task_rows * n);
    }
    const int64_t row_calls = BlocksFor(task_rows, row_work, call_flops, naive ? 1 : kMinBlasRows);
    for (int64_t r = 0; r < row_calls; ++r) {
      const int64_t i0 = t0 + r * task_rows / row_calls;
      const int64_t i1 = t0 + (r + 1) * task_rows / row_calls;
      const FloatBlock a = RowsOfOpA(dt, a_entry, spec.trans_a, m, k, i0, i1, a_scratch);
      const int64_t col_calls =
          naive ? 1
                : BlocksFor(n, 2 * (i1 - i0) * std::max<int64_t>(k, 1), call_flops, kMinBlasCols);
      for (int64_t c = 0; c < col_calls; ++c) {
        if (stop.Stop()) return;
        const int64_t j0 = c * n / col_calls, j1 = (c + 1) * n / col_calls;
        Sgemm(naive, spec.trans_a, spec.trans_b, i1 - i0, j1 - j0, k, alpha, a.data, a.ld,
              spec.trans_b ? b + j0 * ldb : b + j0, ldb, read_c ? beta : 0.0f,
              c_task + (i0 - t0) * n + j0, n);
      }
    }
    if (!c_scratch.empty()) {
      FromFloat(out_dtype, c_task, ElementAt(c_out, out_dtype, task_offset), task_rows * n);
    }
  });
}

}  // namespace gpucompute::cpu
