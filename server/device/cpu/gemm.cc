// GEMM on the CPU: B converted to fp32 once per shard, then one
// single-threaded CBLAS call per (batch entry, block of output rows) over the
// pool, each block of half A converted to fp32 on its own.
#include <vector>

#include "server/device/cpu/blas.h"
#include "server/device/cpu/elements.h"
#include "server/device/cpu/kernels.h"

namespace gpucompute::cpu {
namespace {

// Converts n elements of a `dtype` buffer into floats, in parallel pieces.
void ToFloatParallel(ThreadPool& pool, DType dtype, const void* src, float* dst, int64_t n) {
  pool.ParallelRange(0, n, kMinParallelWork, pool.size(), [&](int64_t b, int64_t e) {
    ToFloat(dtype, ElementAt(src, dtype, b), dst + b, e - b);
  });
}

}  // namespace

void GemmRows(ThreadPool& pool, const GemmSpec& spec, Range rows, bool naive, void* c_out) {
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
  pool.ParallelFor(batch * blocks, [&](int64_t task) {
    const int64_t e = task / blocks;
    const int64_t i0 = rows.begin + (task % blocks) * block_rows;
    const int64_t i1 = std::min(rows.end, i0 + block_rows);
    const int64_t block = i1 - i0;
    const void* a_entry = ElementAt(spec.a.data, dt, (spec.a_batched ? e : 0) * m * k);
    std::vector<float> a_scratch, c_scratch;
    const FloatBlock a = RowsOfOpA(dt, a_entry, spec.trans_a, m, k, i0, i1, a_scratch);
    const float* b = bf + (spec.b_batched ? e : 0) * k * n;
    const int64_t out_offset = e * m * n + i0 * n;
    float* c = out_dtype == DType::kFloat32 ? static_cast<float*>(c_out) + out_offset : nullptr;
    if (c == nullptr) {
      c_scratch.resize(size_t(block * n));
      c = c_scratch.data();
    }
    if (read_c) {
      const int64_t c_offset = (spec.c_batched ? e : 0) * m * n + i0 * n;
      ToFloat(dt, ElementAt(spec.c->data, dt, c_offset), c, block * n);
    }
    Sgemm(naive, spec.trans_a, spec.trans_b, block, n, k, alpha, a.data, a.ld, b, ldb,
          read_c ? beta : 0.0f, c, n);
    if (!c_scratch.empty())
      FromFloat(out_dtype, c, ElementAt(c_out, out_dtype, out_offset), block * n);
  });
}

}  // namespace gpucompute::cpu
