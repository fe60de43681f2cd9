// The CPU backend's kernels, one file per operation; the adapter
// (cpu_device.cc) puts them behind the Device interface. Each runs one shard
// spread over a ThreadPool (nothing here starts threads of its own) and
// writes only that shard's part of the output. They may throw std::bad_alloc
// from their working buffers; the adapter turns that into RESOURCE_EXHAUSTED.
//   gemm.cc       fp32 through CBLAS (blas.h), one single-threaded call per
//                 block of output rows; half inputs converted to fp32 per
//                 block. "naive" runs plain loops instead.
//   gemv.cc       the same per block of rows, half inputs converted in
//                 cache-sized sub-blocks so A crosses memory once; several
//                 right-hand sides as one GEMM.
//   reduce.cc     the reduced axis in chunks of kReduceChunk; inside a chunk a
//                 fixed pairwise (contiguous) or cascaded (strided) order,
//                 chunks combined by CombinePartials: the bits do not depend
//                 on the number of threads or devices.
//   transpose.cc  rank padded to 4; 64x64 tiles through a small buffer when
//                 the input's contiguous axis is not the output's, row copies
//                 otherwise.
//   attention.cc  online softmax over key blocks of 64 for blocks of 32 query
//                 rows, fp32 throughout; the two inner products are also
//                 compiled for AVX2 and AVX-512F and picked at load time.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CPU_KERNELS_H_
#define GPUCOMPUTE_SERVER_DEVICE_CPU_KERNELS_H_

#include <algorithm>
#include <cstdint>

#include "server/core/ops.h"
#include "server/core/planner.h"
#include "server/device/thread_pool.h"

namespace gpucompute::cpu {

// Work below this many scalar operations stays on the calling thread: waking
// workers costs more than it saves.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 15;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Pieces to split `work` scalar operations into on a pool of `threads`.
inline int64_t PiecesFor(int64_t work, int threads) {
  return std::clamp<int64_t>(work / kMinParallelWork, 1, threads);
}

// Rows `rows` of C, every batch entry, into `c_out` (the full output, in
// options.output_dtype). `naive`: plain loops instead of CBLAS.
void GemmRows(ThreadPool& pool, const GemmSpec& spec, Range rows, bool naive, void* c_out);

// Rows `rows` of y into `y_out` (the full output). `naive` as for GEMM.
void GemvRows(ThreadPool& pool, const GemvSpec& spec, Range rows, bool naive, void* y_out);

// What ReduceRows writes.
enum class ReduceOutput {
  kFinal,          // final values in the output dtype, into the full output
  kPartial,        // one fp32 partial [rows, inner] for the whole axis range
  kChunkPartials,  // one fp32 partial [rows, inner] per chunk, chunk-major
};

// Reduces input rows `outer` over the reduced-axis range `axis` into `out`
// as `mode` says (Device::Reduce and Device::ReduceChunks give the layouts).
void ReduceRows(ThreadPool& pool, const ReduceSpec& spec, Range outer, Range axis,
                ReduceOutput mode, void* out);

// Output elements whose flattened index over the first `prefix_axes` output
// axes lies in `prefix`, into `out` (the full output).
void TransposePrefix(ThreadPool& pool, const TransposeSpec& spec, int prefix_axes, Range prefix,
                     void* out);

// Query rows `q_rows` of the (batch, head_q) pairs `heads` into `o_out`, and
// into `lse_out` when it is not null (both full outputs).
void AttentionRows(ThreadPool& pool, const AttentionSpec& spec, Range heads, Range q_rows,
                   void* o_out, float* lse_out);

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_DEVICE_CPU_KERNELS_H_
