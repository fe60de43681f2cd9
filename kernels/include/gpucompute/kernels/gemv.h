// GEMV: y = alpha * op(A) * x + beta * y, with x holding 1..8 columns.
//
// The ladder lives in src/gemv.cu (its header comment lists every version and
// what it measured on the H200). Versions, by name:
//   "warp_row"     one warp per row of op(A), scalar loads, shuffle reduction;
//   "vec16"        + 16-byte loads of A and x (one column of x);
//   "smem_x"       + x staged in shared memory in TILE_V segments (one column);
//   "smem_x_t512", "smem_x_t1024", "smem_x_t4096": the same with other TILE_V;
//   "batched"      1..8 columns of x (the thin GEMM [M,K]x[K,N] done as GEMV):
//                  each row of A read once, several rows per warp sharing x;
//   "batched_w2", "batched_w4", "batched_w8": the same with 2, 4 or 8 warps
//                  sharing each row group along k (short, wide A);
//   "trans_naive"  A^T x, one thread per output, coalesced scalar column walk;
//   "trans_split"  A^T x, 16-byte row segments, K split across blocks, partial
//                  sums combined in a fixed order by the last block of a tile;
//   "trans_wide"   trans_split with wider row segments per warp;
//   "trans_mma"    A^T x, fp16/bf16, on the tensor cores (mma.sync m16n8k16
//                  with the tile's columns as the MMA's rows), K split over
//                  the CTAs of a thread-block cluster that add their sums in
//                  distributed shared memory: one launch, no scratch;
//   "trans_mma_64", "trans_mma_128": the same with the tile width fixed;
//   "scalar", "scalar_w2", "scalar_w4", "scalar_w8": batched with element
//                  loads (any alignment and lda), every column at once;
//   "mma", "mma_w2", "mma_w4", "mma_w8": fp16/bf16 on the tensor cores
//                  (mma.sync m16n8k16, 16 rows per warp, fp32 accumulation);
//   "mma_ring"     fp16/bf16 A x on the tensor cores with A streamed through a
//                  cp.async ring per warp: a persistent grid of tiles of 16 or
//                  32 rows, K split over a cluster where tiles are few; needs
//                  A and x 16-byte aligned and lda a multiple of 16 bytes;
//   "mma_ring_16", "mma_ring_32": the same with the tile fixed;
//   "cublas"       the vendor fallback: cublasGemmEx with fp32 compute on the
//                  same stream (y in the input dtype or fp32 only), for the
//                  classes where the kernels above still lose. It keeps one
//                  cuBLAS handle per device and stream: launches on one
//                  stream must not come from two threads at once.
// An empty variant picks the version src/heuristics/gemv_heuristics.h names
// for the arguments (derived from the server-path sweep): vec16, batched or
// scalar (split as the machine needs) for A x, mma_ring for fp16/bf16 with
// 5..8 columns on small A or short rows, trans_mma (16-bit) and trans_split
// (fp32) for A^T x with several columns, and "cublas" where the vendor is
// faster (A^T x with one column, fp16/bf16 A x with 5..8 columns on large A
// with long rows, fp32 with one column and few rows, ...).
#ifndef GPUCOMPUTE_KERNELS_GEMV_H_
#define GPUCOMPUTE_KERNELS_GEMV_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// All pointers are device pointers; all matrices are row-major.
//   op(A) is [m, k]: A is [m, k] with row stride lda >= k, or, when trans_a,
//   A is [k, m] with lda >= m.
//   x is [k, ncols] and y is [m, ncols], both dense (row stride ncols).
// A and x hold `dtype`; y holds `y_type`. Products are accumulated in fp32.
// beta == 0 never reads y (NaN in y does not leak into the result).
struct GemvArgs {
  int64_t m = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  bool trans_a = false;
  const void* x = nullptr;
  void* y = nullptr;
  int ncols = 1;  // 1..8
  DType dtype = DType::kF32;
  DType y_type = DType::kF32;
  float alpha = 1.f;
  float beta = 0.f;
};

// Every version's name, in ladder order.
const std::vector<std::string>& GemvVariants();

// Whether `variant` (empty: the default for these arguments) can run `args`;
// otherwise the reason (bad sizes, ncols outside 1..8, a vector version given
// a misaligned pointer or row stride, the wrong orientation, ...).
Support CanImplementGemv(const GemvArgs& args, std::string_view variant);

// The name of the version LaunchGemv runs for these arguments: `variant`
// itself, or the default's choice (src/heuristics/gemv_heuristics.h) when it
// is empty. Empty when CanImplementGemv refuses.
std::string GemvVariantName(const GemvArgs& args, std::string_view variant);

// Scratch bytes the chosen version needs; 0 when it needs none. Only the
// transposed split versions need scratch (fp32 partial sums and one counter
// per column tile), and only when their K split is wider than a cluster holds.
// The answer depends on the current device's SM count.
size_t GemvWorkspaceBytes(const GemvArgs& args, std::string_view variant);

// Launches on `stream`: no allocation, no synchronisation. `workspace` must
// hold GemvWorkspaceBytes(args, variant) bytes (any contents; the launch
// clears what it uses on `stream`) and must not be used by another launch that
// runs concurrently. Results are deterministic: the same inputs give bitwise
// the same y on the same device.
// Returns cudaErrorInvalidValue for refused arguments, an unknown variant, or a
// missing workspace; otherwise the launch status.
cudaError_t LaunchGemv(const GemvArgs& args, std::string_view variant, void* workspace,
                       cudaStream_t stream);

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_GEMV_H_
