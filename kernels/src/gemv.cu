// GEMV ladder: y = alpha * op(A) * x + beta * y, x with 1..8 columns.
//
// What must move: A once (m*k elements), x once, y written once (and read when
// beta != 0). FLOPs: 2*m*k*ncols, at most 16 FLOP per element of A: far below
// the H200's ~14 FLOP/byte fp32 balance point, so every version is bound by
// HBM bandwidth. 16384x16384 fp32: 1.074 GB -> ~253 us at the 4244 GB/s D2D
// copy ceiling (anchors.md); bf16/fp16: 0.537 GB -> ~127 us.
//
// Versions, with what each measured on the H200 (2026-11-30, one run of
// gc_bench_gemv, 16384^2, beta = 0; x = our time vs the fastest cuBLAS call in
// the same run, "copy" = vs a D2D copy of the same traffic). Table and
// command: kernels/bench/results/gemv.md.
//   warp_row     one warp per row of A, scalar loads, __shfl_xor reduction;
//                n > 1 re-reads A once per column (the naive baseline).
//                n=1: f32 4058 GB/s 0.97x; bf16 2432 GB/s 0.56x (2-byte loads).
//   vec16        + 16-byte loads of A and x, 4 independent loads in flight per
//                lane. n = 1. f32 4459 GB/s 1.06x (copy 1.06: the default for
//                f32); bf16 4100 GB/s 0.95x.
//   smem_x       + x staged in shared memory in TILE_V segments shared by the
//                8 rows of a block. n = 1. Below vec16 in every dtype: x
//                already sits in L1 there, and the two barriers per segment
//                stop the loads in flight. TILE_V = 512 / 1024 / 2048 / 4096:
//                f32 0.96 / 1.00 / 0.99 / 1.05x, bf16 0.67 / 0.74 / 0.77 / 0.76x.
//   batched      n = 1..8 in one pass over A: R rows per warp share each x
//                vector in registers (R = 2 for n <= 2, 4 above), A streamed
//                past L1 (ld.global.nc.L1::no_allocate) so that x stays there,
//                warps take row groups in equal rounds (no ragged last wave).
//                n=1: bf16 4239 GB/s 0.98x (copy 1.02: the default for
//                fp16/bf16), f32 0.88x. n=2: copy 1.05 (f32) / 1.02 (bf16);
//                n=4: copy 0.97 / 1.03, 1.96x / 1.40x cublasGemmEx; n=8: copy
//                0.44 (f32 0.87x, bf16 0.45x GemmEx): 107 (f32) / 79 (bf16)
//                registers leave too few loads in flight. R = 2 at n = 4 was
//                tried: copy 0.82 / 0.80, reverted. R = 1 at n = 1 (an earlier
//                run): f32 0.93x, bf16 0.95x; rounds of equal size instead of
//                a grid of resident blocks took n=8 bf16 from 0.363 to 0.294 ms.
//   trans_naive  op(A) = A^T: one thread per output column walking k; loads are
//                coalesced (consecutive threads read consecutive columns) but
//                scalar and only m threads exist: 265 GB/s f32 (0.06x).
//   trans_split  op(A) = A^T: a warp reads a 512-byte row segment (16-byte
//                vectors; scalar when the pointer or lda forbid), 8 warps of a
//                block take interleaved rows and meet in shared memory; k is
//                split over blocks until the GPU is full, fp32 partials go to
//                the workspace and the last block of each column tile (atomic
//                ticket) adds them in a fixed order: one launch (after a
//                memset of the tickets), deterministic. n=1: f32 4285 GB/s
//                0.97x, bf16 3779 GB/s 0.86x; n=4: f32 1.60x, bf16 0.56x GemmEx.
//   trans_wide   trans_split with up to 4 segments side by side per warp
//                (2 KiB of a row): a regression, f32 0.90x, bf16 0.65x at n=1.
//
// Rungs added for the shapes users send (measured 2026-12-01 through the
// server's path by tests/sweep/memops_sweep.cc: device busy time, us, vendor
// and every rung in the same run; table in
// kernels/bench/results/sweep-memops.md):
//   batched_w2/_w4/_w8  2, 4 or 8 warps share a row group along k and meet in
//                shared memory: short, wide A fills the machine. bf16
//                1024x50000 n=1: batched 130.3 -> batched_w8 28.6 (cuBLAS
//                28.0, copy 27.4).
//   scalar(_wN)  batched with element loads (any alignment, any lda), every
//                column of x at once, 8 loads of A in flight per lane. bf16
//                777x12345 (odd lda) n=8: warp_row 287.3 -> scalar_w8 23.8
//                (cuBLAS 23.2); and fp32 with 8 columns, where the 16-byte
//                kernel runs short of loads in flight: fp32 16384^2 n=8:
//                batched_w2 579.5 -> scalar 373.9 (cuBLAS GemmEx 512.8).
//   mma(_wN)     fp16/bf16 on the tensor cores: a warp owns 16 rows and runs
//                mma.sync m16n8k16 against x padded to 8 columns, k permuted
//                inside each block of 32 so that a lane reads 16 contiguous
//                bytes of A. bf16 16384^2 n=8: batched_w2 293.3 -> mma_w4
//                204.4, still 0.66x of cuBLAS (133.9): x goes through
//                element loads from L1, 16 per 32 k per lane. 3001x2000 n=8:
//                7.9 against cuBLAS 7.1.
//   trans_mma    op(A) = A^T, fp16/bf16, on the tensor cores: the tile's
//                columns are the MMA's rows (mma.sync m16n8k16, x padded to 8
//                columns), k split over up to 8 CTAs of a cluster that add
//                their sums in distributed shared memory (one launch, no
//                workspace). 16-byte rows stream through cp.async into a
//                ring of 16-row steps per warp (16-18 KiB in flight each)
//                and come out by ldmatrix.trans; other rows take register
//                loads. Measured 2026-12-02 through the server's path (A^T
//                classes of the sweep, bf16; cuBLAS = GemmEx or gemv):
//                  register loads, 2 CTAs/SM: 16384^2 n=1 124.4 (cuBLAS
//                  122.1) but 1000x100000 188.0 (54.9): the compiler kept
//                  one step of loads in flight, and x's loads each step
//                  added a round trip;
//                  1-D bulk copies (one per 256-byte row) into the ring:
//                  16384^2 190.5: the copy engine's cost per small copy;
//                  cp.async ring, x read by register loads: 1000x100000
//                  93.2;
//                  cp.async ring with x's 16 rows copied into each stage:
//                  16384^2 n=1/4/8 128.7/128.2/129.0 (cuBLAS 118.8/172.8/
//                  126.9), 4096^2 n=8 9.0 (12.0), 1000x100000 n=8 53.7
//                  (58.0), 1024x50000 n=4 28.0 (37.2). Odd lda (register
//                  loads, 64-column tiles): 3001x2000 n=1 11.0 (6.4), n=8
//                  11.1 (13.4).
//                trans_split also moved to cluster splits where 8 of them
//                give every SM a CTA (no workspace, no clearing pass), with
//                8 rows in flight for 1..2 columns and a combine that adds
//                every output of the tile at once otherwise: fp32 16384^2
//                n=8 320.2 -> 254.4 (cuBLAS 438.3), 4096^2 n=1 28.0 -> 19.4.
//   mma_ring     fp16/bf16 A x on the tensor cores, A (and x, per step)
//                streamed by cp.async through a ring per warp, a persistent
//                grid of row tiles whose steps form one sequence (the next
//                tile's copies in flight while the warps meet), k split over
//                a cluster where tiles are few. Measured 2026-12-02 through
//                the server's path (sweep, bf16 n=8, us; cuBLAS GemmEx in the
//                same run):
//                  64-row tiles, 32 k per step (64 bytes of each row per
//                  copy, 8 rows per warp-wide copy), one tile per CTA:
//                  16384^2 163-200 (cuBLAS 133), 1024^2 4.3: short row
//                  pieces stream badly, and a tile's fill and drain are
//                  paid per CTA;
//                  the persistent grid, 4 KiB steps of 16 rows x 128 k,
//                  32 x 64 or 64 x 32: 16384^2 147.7 / 141.7 / 182.1, 1024^2
//                  2.85; a tile's last partial step by element loads cost
//                  100000 x 1000 330 us with 16-row tiles;
//                  the partial step copied too (zero-filled past k), the
//                  grid sized by the clusters that run at once: 100000 x
//                  1000 60.7 (32 x 64);
//                  8 KiB steps in two stages, 16 x 256 k (512 bytes of a
//                  row) or 32 x 128 k (256 bytes): 16384^2 146.8 / 142.4
//                  (cuBLAS 134.0), 4096^2 9.9 / 8.7 (13.4), 100000 x 1000
//                  78.1 / 53.4 (57.0), 1024 x 50000 32.4 / 46.9 (31.6: 4
//                  splits of 32-row tiles stream too few steps each), 1000 x
//                  16384 10.6 / 16.4 (12.6), 3001 x 2000 5.8 / 4.8 (7.1).
//                The tile is 32 rows where such tiles leave k unsplit, else
//                16. Still short of cuBLAS on large A with long rows
//                (16384^2 0.94x, 2000 x 100000 0.91x), where the default
//                keeps the vendor.
//   cublas       the vendor fallback (cublasGemmEx or its gemv, fp32
//                compute, no reduced-precision split-K) where ours still
//                lose: A^T x with one column (cuBLAS reads A faster than a
//                D2D copy), with 16-bit rows that are not 16-byte aligned,
//                and with 5..8 columns on a few short columns (see
//                heuristics/gemv_heuristics.h); and fp16/bf16 A x with 5..8
//                columns on large A with long rows.
#include <cooperative_groups.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cublas_handles.h"
#include "gpucompute/kernels/gemv.h"
#include "heuristics/gemv_heuristics.h"
#include "launch_util.h"
#include "sm90_primitives.cuh"

namespace gpucompute::kernels {
namespace {

constexpr int kWarpSize = 32;
constexpr int kThreads = 256;                       // every kernel: 8 warps per block
constexpr int kWarpsPerBlock = kThreads / kWarpSize;

// Kernel arguments, one struct for every version.
struct GemvParams {
  const void* a;
  const void* x;
  void* y;
  int64_t m, k, lda;
  int ncols;
  int y_type;  // DType of y
  float alpha, beta;
  // trans_split and trans_mma.
  int64_t rows_per_split;  // rows of the stored A ([k, m]) per split
  int splits;
  float* partial;      // [splits][m][ncols] fp32 partial sums
  unsigned* counters;  // one ticket counter per column tile, zero at launch
  bool cluster;        // splits meet in a cluster's shared memory (no workspace)
};

// ---------------------------------------------------------------------------
// Element access.

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

// Element e of a register vector of raw 32-bit words holding elements of T.
template <typename T>
__device__ __forceinline__ float ElemOf(const uint32_t* w, int e) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(w[e]);
  } else {
    const uint32_t u = w[e >> 1];
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float((e & 1) ? (u & 0xffff0000u) : (u << 16));
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>((e & 1) ? (u >> 16) : u)));
    }
  }
}

// Loads kBytes (16, 8, 4 or 2) read-only bytes into 32-bit words.
template <int kBytes>
__device__ __forceinline__ void LoadWords(const void* p, uint32_t* w) {
  if constexpr (kBytes == 16) {
    const uint4 r = __ldg(static_cast<const uint4*>(p));
    w[0] = r.x, w[1] = r.y, w[2] = r.z, w[3] = r.w;
  } else if constexpr (kBytes == 8) {
    const uint2 r = __ldg(static_cast<const uint2*>(p));
    w[0] = r.x, w[1] = r.y;
  } else if constexpr (kBytes == 4) {
    w[0] = __ldg(static_cast<const unsigned int*>(p));
  } else {
    w[0] = __ldg(static_cast<const unsigned short*>(p));
  }
}

// 16 bytes of data read exactly once: not allocated in L1, so that the
// vector x, which every warp re-reads, keeps its place there.
__device__ __forceinline__ void LoadStream16(const void* p, uint32_t* w) {
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
      : "l"(p));
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float LoadY(const void* y, int64_t i, int t) {
  if (t == static_cast<int>(DType::kF32)) return static_cast<const float*>(y)[i];
  if (t == static_cast<int>(DType::kF16)) return __half2float(static_cast<const __half*>(y)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(y)[i]);
}

// y[i] = alpha * acc + beta * y[i]; y is not read when beta == 0.
__device__ __forceinline__ void WriteY(const GemvParams& p, int64_t i, float acc) {
  float v = p.alpha * acc;
  if (p.beta != 0.f) v = fmaf(p.beta, LoadY(p.y, i, p.y_type), v);
  if (p.y_type == static_cast<int>(DType::kF32)) static_cast<float*>(p.y)[i] = v;
  else if (p.y_type == static_cast<int>(DType::kF16)) static_cast<__half*>(p.y)[i] = __float2half(v);
  else static_cast<__nv_bfloat16*>(p.y)[i] = __float2bfloat16(v);
}

template <typename T>
__device__ __forceinline__ const T* RowPtr(const GemvParams& p, int64_t row) {
  return static_cast<const T*>(p.a) + row * p.lda;
}

// ---------------------------------------------------------------------------
// warp_row: one warp per row, scalar loads, one pass over A per column of x.

template <typename T>
__global__ void __launch_bounds__(kThreads) GemvWarpRowKernel(GemvParams p) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= p.m) return;
  const T* a = RowPtr<T>(p, row);
  const T* x = static_cast<const T*>(p.x);
  for (int c = 0; c < p.ncols; ++c) {
    float s = 0.f;
    for (int64_t j = lane; j < p.k; j += kWarpSize) s = fmaf(ToFloat(a[j]), ToFloat(x[j * p.ncols + c]), s);
    s = WarpSum(s);
    if (lane == 0) WriteY(p, row * p.ncols + c, s);
  }
}

// ---------------------------------------------------------------------------
// vec16: one warp per row, 16-byte loads of A and x. One column of x.
// REQUIRES: a, x 16-byte aligned, lda a multiple of the vector width.

struct Vec16Config {
  static constexpr int kUnroll = 4;  // independent 16-byte loads of A in flight per lane
};

template <typename T>
__global__ void __launch_bounds__(kThreads) GemvVec16Kernel(GemvParams p) {
  constexpr int kV = 16 / sizeof(T);  // elements per 16-byte vector
  constexpr int kU = Vec16Config::kUnroll;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= p.m) return;
  const T* a = RowPtr<T>(p, row);
  const T* x = static_cast<const T*>(p.x);
  const int64_t kvec = p.k / kV;
  float acc[kU] = {};
  int64_t i = lane;
  for (; i + kWarpSize * (kU - 1) < kvec; i += kWarpSize * kU) {
    uint32_t wa[kU][4], wx[kU][4];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      LoadWords<16>(a + (i + kWarpSize * u) * kV, wa[u]);
      LoadWords<16>(x + (i + kWarpSize * u) * kV, wx[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int e = 0; e < kV; ++e) acc[u] = fmaf(ElemOf<T>(wa[u], e), ElemOf<T>(wx[u], e), acc[u]);
  }
  for (; i < kvec; i += kWarpSize) {
    uint32_t wa[4], wx[4];
    LoadWords<16>(a + i * kV, wa);
    LoadWords<16>(x + i * kV, wx);
#pragma unroll
    for (int e = 0; e < kV; ++e) acc[0] = fmaf(ElemOf<T>(wa, e), ElemOf<T>(wx, e), acc[0]);
  }
  for (int64_t j = kvec * kV + lane; j < p.k; j += kWarpSize)
    acc[0] = fmaf(ToFloat(a[j]), ToFloat(x[j]), acc[0]);
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < kU; ++u) s += acc[u];
  s = WarpSum(s);
  if (lane == 0) WriteY(p, row, s);
}

// ---------------------------------------------------------------------------
// smem_x: vec16 with x staged through shared memory, kTileV elements at a time,
// shared by the 8 rows (warps) of a block. One column of x.
// REQUIRES: as vec16.

template <typename T, int kTileV>
__global__ void __launch_bounds__(kThreads) GemvSmemXKernel(GemvParams p) {
  constexpr int kV = 16 / sizeof(T);
  constexpr int kTileVecs = kTileV / kV;  // (TILE_V / vector width) 16-byte vectors of x
  constexpr int kU = Vec16Config::kUnroll;
  static_assert(kTileVecs % kWarpSize == 0, "a tile is whole warp passes");
  __shared__ uint4 xs[kTileVecs];
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const bool active = row < p.m;  // inactive warps still help stage x
  const T* a = RowPtr<T>(p, active ? row : 0);
  const T* x = static_cast<const T*>(p.x);
  const uint4* xv = static_cast<const uint4*>(p.x);
  const int64_t kvec = p.k / kV;
  float acc[kU] = {};
  for (int64_t t0 = 0; t0 < kvec; t0 += kTileVecs) {
    const int n = int(std::min<int64_t>(kTileVecs, kvec - t0));
    __syncthreads();  // every warp is done with the previous segment
    for (int i = threadIdx.x; i < n; i += kThreads) xs[i] = __ldg(xv + t0 + i);
    __syncthreads();
    if (!active) continue;
    int i = lane;
    for (; i + kWarpSize * (kU - 1) < n; i += kWarpSize * kU) {
      uint32_t wa[kU][4];
#pragma unroll
      for (int u = 0; u < kU; ++u) LoadWords<16>(a + (t0 + i + kWarpSize * u) * kV, wa[u]);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        uint32_t wx[4];
        *reinterpret_cast<uint4*>(wx) = xs[i + kWarpSize * u];
#pragma unroll
        for (int e = 0; e < kV; ++e) acc[u] = fmaf(ElemOf<T>(wa[u], e), ElemOf<T>(wx, e), acc[u]);
      }
    }
    for (; i < n; i += kWarpSize) {
      uint32_t wa[4];
      LoadWords<16>(a + (t0 + i) * kV, wa);
      uint32_t wx[4];
      *reinterpret_cast<uint4*>(wx) = xs[i];
#pragma unroll
      for (int e = 0; e < kV; ++e) acc[0] = fmaf(ElemOf<T>(wa, e), ElemOf<T>(wx, e), acc[0]);
    }
  }
  if (!active) return;
  for (int64_t j = kvec * kV + lane; j < p.k; j += kWarpSize)
    acc[0] = fmaf(ToFloat(a[j]), ToFloat(x[j]), acc[0]);
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < kU; ++u) s += acc[u];
  s = WarpSum(s);
  if (lane == 0) WriteY(p, row, s);
}

// The kNcols values of row j of x as floats: one or two vector loads when x
// rows are exactly kNcols wide and aligned (`vec`), else element by element
// (columns past ncols read as 0).
template <typename T, int kNcols>
__device__ __forceinline__ void LoadXRow(const GemvParams& p, int64_t j, bool vec, float* out) {
  const T* x = static_cast<const T*>(p.x);
  constexpr int kBytes = kNcols * int(sizeof(T));
  // Whole 4-, 8- or 16-byte chunks only (3, 5, 6 or 7 columns: element loads).
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes % 16 == 0) {
    if (vec) {
      constexpr int kChunk = kBytes < 16 ? kBytes : 16;
      constexpr int kPer = kChunk / int(sizeof(T));
#pragma unroll
      for (int q = 0; q < kBytes / kChunk; ++q) {
        uint32_t w[(kChunk + 3) / 4];
        LoadWords<kChunk>(x + j * kNcols + q * kPer, w);
#pragma unroll
        for (int e = 0; e < kPer; ++e) out[q * kPer + e] = ElemOf<T>(w, e);
      }
      return;
    }
  }
#pragma unroll
  for (int c = 0; c < kNcols; ++c) out[c] = c < p.ncols ? ToFloat(__ldg(x + j * p.ncols + c)) : 0.f;
}

// ---------------------------------------------------------------------------
// batched: kNcols columns of x, each row of A read once. A warp owns kRows
// consecutive rows; each lane's x vector (kV rows of x, all columns) is read
// once and used for all kRows rows. kSplit warps share one row group, each
// taking every kSplit-th run of 32 vectors along k, and meet in shared memory
// (kSplit = 1: a warp alone, no shared memory): short, wide problems (m small
// against k) still fill the machine. Blocks loop over row groups.
// REQUIRES: a, x 16-byte aligned, lda a multiple of the vector width.

template <int kNcols>
struct BatchedConfig {
  static constexpr int kRows = kNcols <= 2 ? 2 : 4;  // rows per warp
  static constexpr int kUnroll = 4 / kRows;  // 4 loads of A in flight per lane in all cases
  static_assert(kNcols >= 1 && kNcols <= 8, "1..8 columns");
  static_assert(kRows * kUnroll == 4, "loads in flight per lane");
};

// One warp's share of row group `row0`: the sums over its runs of k, in acc.
template <typename T, int kNcols, int kSplit>
__device__ __forceinline__ void BatchedAccumulate(const GemvParams& p, int64_t row0, int sub,
                                                  int lane,
                                                  float (&acc)[BatchedConfig<kNcols>::kRows][kNcols]) {
  constexpr int kV = 16 / sizeof(T);
  constexpr int kR = BatchedConfig<kNcols>::kRows;
  constexpr int kU = BatchedConfig<kNcols>::kUnroll;
  constexpr int kStep = kWarpSize * kSplit;  // vectors between a lane's consecutive loads
  const int64_t kvec = p.k / kV;
  const T* x = static_cast<const T*>(p.x);
  const T* a[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) a[r] = RowPtr<T>(p, std::min(row0 + r, p.m - 1));  // past m: re-read, discarded

  auto accumulate = [&](const uint32_t(&wa)[kR][4], const uint32_t(&wx)[kNcols][4]) {
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      float xe[kNcols];
#pragma unroll
      for (int c = 0; c < kNcols; ++c) xe[c] = ElemOf<T>(wx[(e * kNcols + c) / kV], (e * kNcols + c) % kV);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const float ae = ElemOf<T>(wa[r], e);
#pragma unroll
        for (int c = 0; c < kNcols; ++c) acc[r][c] = fmaf(ae, xe[c], acc[r][c]);
      }
    }
  };

  int64_t i = int64_t(sub) * kWarpSize + lane;
  for (; i + kStep * (kU - 1) < kvec; i += kStep * kU) {
    uint32_t wa[kU][kR][4], wx[kU][kNcols][4];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int r = 0; r < kR; ++r) LoadStream16(a[r] + (i + kStep * u) * kV, wa[u][r]);
#pragma unroll
      for (int c = 0; c < kNcols; ++c) LoadWords<16>(x + ((i + kStep * u) * kNcols + c) * kV, wx[u][c]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) accumulate(wa[u], wx[u]);
  }
  for (; i < kvec; i += kStep) {
    uint32_t wa[kR][4], wx[kNcols][4];
#pragma unroll
    for (int r = 0; r < kR; ++r) LoadStream16(a[r] + i * kV, wa[r]);
#pragma unroll
    for (int c = 0; c < kNcols; ++c) LoadWords<16>(x + (i * kNcols + c) * kV, wx[c]);
    accumulate(wa, wx);
  }
  for (int64_t j = kvec * kV + int64_t(sub) * kWarpSize + lane; j < p.k; j += kStep) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float ae = ToFloat(a[r][j]);
#pragma unroll
      for (int c = 0; c < kNcols; ++c) acc[r][c] = fmaf(ae, ToFloat(x[j * kNcols + c]), acc[r][c]);
    }
  }
}

// ---------------------------------------------------------------------------
// scalar: the batched kernel for rows that cannot be read in 16-byte vectors
// (an lda that is not a multiple of 16 bytes, a misaligned A or x): lanes
// read consecutive elements of kRows rows (coalesced, any alignment), every
// column of x at once (one vector load of an x row where it is aligned), 8
// loads of A in flight per lane. Replaces warp_row, which reads A once per
// column of x.

template <typename T, int kNcols, int kSplit>
__device__ __forceinline__ void ScalarAccumulate(const GemvParams& p, int64_t row0, int sub,
                                                 int lane,
                                                 float (&acc)[BatchedConfig<kNcols>::kRows][kNcols]) {
  constexpr int kR = BatchedConfig<kNcols>::kRows;
  constexpr int kU = 8 / kR;  // elements of each row in flight per lane
  constexpr int kStep = kWarpSize * kSplit;
  const T* a[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) a[r] = RowPtr<T>(p, std::min(row0 + r, p.m - 1));  // past m: re-read, discarded
  constexpr int kXBytes = kNcols * int(sizeof(T));
  const bool x_vec = reinterpret_cast<uintptr_t>(p.x) % (kXBytes < 16 ? kXBytes : 16) == 0;
  int64_t j = int64_t(sub) * kWarpSize + lane;
  for (; j + kStep * (kU - 1) < p.k; j += kStep * kU) {
    float av[kU][kR], xv[kU][kNcols];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int r = 0; r < kR; ++r) av[u][r] = ToFloat(__ldg(a[r] + j + kStep * u));
      LoadXRow<T, kNcols>(p, j + kStep * u, x_vec, xv[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int c = 0; c < kNcols; ++c) acc[r][c] = fmaf(av[u][r], xv[u][c], acc[r][c]);
  }
  for (; j < p.k; j += kStep) {
    float xv[kNcols];
    LoadXRow<T, kNcols>(p, j, x_vec, xv);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float av = ToFloat(__ldg(a[r] + j));
#pragma unroll
      for (int c = 0; c < kNcols; ++c) acc[r][c] = fmaf(av, xv[c], acc[r][c]);
    }
  }
}

template <typename T, int kNcols, int kSplit, bool kScalar>
__global__ void __launch_bounds__(kThreads) GemvBatchedKernel(GemvParams p) {
  constexpr int kR = BatchedConfig<kNcols>::kRows;
  constexpr int kOut = kR * kNcols;        // outputs of a row group, contiguous in y
  constexpr int kGroups = kWarpsPerBlock / kSplit;  // row groups a block holds at once
  static_assert(kWarpsPerBlock % kSplit == 0, "whole groups per block");
  __shared__ float red[kSplit > 1 ? kWarpsPerBlock : 1][kOut];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int grp = warp / kSplit, sub = warp % kSplit;
  const int64_t groups = (p.m + kR - 1) / kR;
  // Every warp of a block runs the same number of rounds (the barrier below).
  for (int64_t base = int64_t(blockIdx.x) * kGroups; base < groups;
       base += int64_t(gridDim.x) * kGroups) {
    const int64_t g = base + grp;
    const bool active = g < groups;
    const int64_t row0 = g * kR;
    float acc[kR][kNcols] = {};
    if (active) {
      if constexpr (kScalar) ScalarAccumulate<T, kNcols, kSplit>(p, row0, sub, lane, acc);
      else BatchedAccumulate<T, kNcols, kSplit>(p, row0, sub, lane, acc);
    }
    // Every lane ends with every sum; lane r*kNcols + c holds y[row0 + r, c],
    // so that the group's outputs go out in one store.
    float mine = 0.f;
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
      for (int c = 0; c < kNcols; ++c) {
        const float s = WarpSum(acc[r][c]);
        if (lane == r * kNcols + c) mine = s;
      }
    const bool writes = active && lane < kOut && row0 + lane / kNcols < p.m;
    if constexpr (kSplit == 1) {
      if (writes) WriteY(p, row0 * kNcols + lane, mine);
    } else {
      if (lane < kOut) red[warp][lane] = mine;
      __syncthreads();
      if (sub == 0 && writes) {
        float s = red[warp][lane];
#pragma unroll
        for (int w = 1; w < kSplit; ++w) s += red[warp + w][lane];  // fixed order
        WriteY(p, row0 * kNcols + lane, s);
      }
      __syncthreads();
    }
  }
}

// ---------------------------------------------------------------------------
// mma: fp16/bf16 with several columns on the tensor cores. With n columns the
// batched kernel does n FMAs (and the conversions) per element of A and runs
// out of issue slots before HBM runs out of bytes (n = 8 bf16: 0.45x cuBLAS).
// Here a warp owns 16 rows and computes them against x (padded to 8 columns)
// with mma.sync m16n8k16 (fp32 accumulation). The sum over k does not care
// about the order of k, so each lane reads 16 contiguous bytes of A (k =
// 8*tig .. 8*tig+7 of a block of 32) and gives them to two MMAs as the k
// indices the fragment layout expects there; x goes through the same
// permutation (element loads of column g, from L1). kSplit warps share each
// row group along k, as in batched.
// REQUIRES: fp16 or bf16; a 16-byte aligned, lda a multiple of 8.

template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Raw 16 bits of x[j][c] (0 where c >= ncols or j >= k).
template <typename T>
__device__ __forceinline__ uint32_t XBits(const GemvParams& p, int64_t j, int c) {
  if (c >= p.ncols || j >= p.k) return 0u;
  return __ldg(static_cast<const unsigned short*>(p.x) + j * p.ncols + c);
}

template <typename T, int kSplit>
__global__ void __launch_bounds__(kThreads) GemvMmaKernel(GemvParams p) {
  constexpr int kRows = 16;
  constexpr int kBlockK = 32;  // k per pair of MMAs
  constexpr int kGroups = kWarpsPerBlock / kSplit;
  static_assert(kWarpsPerBlock % kSplit == 0, "whole groups per block");
  __shared__ float red[kSplit > 1 ? kWarpsPerBlock : 1][kWarpSize * 4];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int grp = warp / kSplit, sub = warp % kSplit;
  const int g = lane >> 2, tig = lane & 3;
  const int64_t groups = (p.m + kRows - 1) / kRows;
  const int64_t kblocks = (p.k + kBlockK - 1) / kBlockK;
  const int64_t full_blocks = p.k / kBlockK;
  for (int64_t base = int64_t(blockIdx.x) * kGroups; base < groups;
       base += int64_t(gridDim.x) * kGroups) {
    const int64_t grp_index = base + grp;
    const bool active = grp_index < groups;
    const int64_t row0 = grp_index * kRows;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    if (active) {
      const T* a_lo = RowPtr<T>(p, std::min(row0 + g, p.m - 1));
      const T* a_hi = RowPtr<T>(p, std::min(row0 + g + 8, p.m - 1));
      auto block = [&](int64_t kb, bool full) {
        const int64_t k0 = kb * kBlockK + 8 * tig;
        uint32_t lo[4], hi[4], xb[4];
        if (full) {
          LoadStream16(a_lo + k0, lo);
          LoadStream16(a_hi + k0, hi);
        } else {
          const unsigned short* rl = reinterpret_cast<const unsigned short*>(a_lo);
          const unsigned short* rh = reinterpret_cast<const unsigned short*>(a_hi);
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const int64_t e = k0 + 2 * w;
            lo[w] = (e < p.k ? uint32_t(__ldg(rl + e)) : 0u) |
                    (e + 1 < p.k ? uint32_t(__ldg(rl + e + 1)) << 16 : 0u);
            hi[w] = (e < p.k ? uint32_t(__ldg(rh + e)) : 0u) |
                    (e + 1 < p.k ? uint32_t(__ldg(rh + e + 1)) << 16 : 0u);
          }
        }
#pragma unroll
        for (int w = 0; w < 4; ++w)
          xb[w] = XBits<T>(p, k0 + 2 * w, g) | (XBits<T>(p, k0 + 2 * w + 1, g) << 16);
        const uint32_t a1[4] = {lo[0], hi[0], lo[1], hi[1]};
        Mma16816<T>(d, a1, xb[0], xb[1]);
        const uint32_t a2[4] = {lo[2], hi[2], lo[3], hi[3]};
        Mma16816<T>(d, a2, xb[2], xb[3]);
      };
      int64_t kb = sub;
      for (; kb + kSplit < full_blocks; kb += 2 * kSplit) {  // two blocks in flight
        block(kb, true);
        block(kb + kSplit, true);
      }
      for (; kb < kblocks; kb += kSplit) block(kb, kb < full_blocks);
    }
    // d[0..1]: row g, columns 2*tig, 2*tig+1; d[2..3]: row g + 8.
    if constexpr (kSplit > 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][lane * 4 + i] = d[i];
      __syncthreads();
      if (sub == 0) {
#pragma unroll
        for (int w = 1; w < kSplit; ++w)
#pragma unroll
          for (int i = 0; i < 4; ++i) d[i] += red[warp + w][lane * 4 + i];  // fixed order
      }
      __syncthreads();
    }
    if (active && sub == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = row0 + g + (i >= 2 ? 8 : 0);
        const int col = 2 * tig + (i & 1);
        if (row < p.m && col < p.ncols) WriteY(p, row * p.ncols + col, d[i]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// trans_naive: op(A) = A^T, A stored [k, m]. One thread per output column.

template <typename T>
__global__ void __launch_bounds__(kThreads) GemvTransNaiveKernel(GemvParams p) {
  const int64_t col = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= p.m) return;
  const T* a = static_cast<const T*>(p.a) + col;
  const T* x = static_cast<const T*>(p.x);
  float acc[8] = {};
  for (int64_t j = 0; j < p.k; ++j) {
    const float av = ToFloat(a[j * p.lda]);
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (c < p.ncols) acc[c] = fmaf(av, ToFloat(x[j * p.ncols + c]), acc[c]);
  }
#pragma unroll
  for (int c = 0; c < 8; ++c)
    if (c < p.ncols) WriteY(p, col * p.ncols + c, acc[c]);
}

// ---------------------------------------------------------------------------
// Splits of k over the CTAs of a thread-block cluster (trans_mma, mma_ring and
// the cluster mode of trans_split): each CTA leaves its sums for the tile's
// outputs (rows of y from tile0) in shared memory, `sums[row_local * 8 + c]`, and after a cluster
// barrier CTA `rank` adds the splits of every (p.splits)th output from the
// CTAs' shared memory (distributed shared memory), rank 0 first: a fixed
// order, no workspace, no second pass. With one split the CTA writes its own
// sums. Every thread of the cluster's CTAs must call it (it holds barriers).
__device__ __forceinline__ void ClusterCombine(const GemvParams& p, const float* sums,
                                               int64_t tile0, int tile_rows) {
  namespace cg = cooperative_groups;
  const int splits = p.splits;
  const int64_t rows = std::min<int64_t>(tile_rows, p.m - tile0);
  const int outputs = int(rows) * p.ncols;
  if (splits == 1) {
    __syncthreads();
    for (int o = threadIdx.x; o < outputs; o += blockDim.x)
      WriteY(p, tile0 * p.ncols + o, sums[(o / p.ncols) * 8 + o % p.ncols]);
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every CTA's sums are in place
  const int rank = int(cluster.block_rank());
  for (int o = rank * int(blockDim.x) + int(threadIdx.x); o < outputs;
       o += splits * int(blockDim.x)) {
    const int at = (o / p.ncols) * 8 + o % p.ncols;
    float s = 0.f;
    for (int r = 0; r < splits; ++r) s += cluster.map_shared_rank(sums, r)[at];
    WriteY(p, tile0 * p.ncols + o, s);
  }
  cluster.sync();  // no CTA leaves while others still read its shared memory
}

// ---------------------------------------------------------------------------
// trans_split / trans_wide: op(A) = A^T, A stored [k, m]. A block owns a
// column tile of 32 * kVw * kQ columns and a range of rows (one split of k);
// lane tx reads kVw consecutive columns at kQ places 32 * kVw apart, so that a
// warp reads kQ * 32 * kVw contiguous elements of a row; warp ty takes rows
// ty, ty + 8, ...

template <typename T, int kNcols, int kVw, int kQ>
struct TransSplitConfig {
  static constexpr int kTileM = kWarpSize * kVw * kQ;  // (TILE_M) columns per block
  static constexpr int kRowStep = kWarpsPerBlock;      // warps of a block interleave rows
  // Rows in flight per thread: 8 for one segment and 1..2 columns (few
  // accumulators; the cluster mode may run one CTA per SM), else 4 / kQ.
  static constexpr int kUnroll = kQ >= 4 ? 1 : (kQ == 1 && kNcols <= 2 ? 8 : 4 / kQ);
  static constexpr int kLoadBytes = kVw * int(sizeof(T));
  static constexpr int kWords = (kLoadBytes + 3) / 4;
  static constexpr int kOutputs = kTileM * kNcols;  // (TILE_M, NCOLS) results per block
  static_assert(kLoadBytes == 16 || kLoadBytes == 8 || kVw == 1, "16-, 8-byte or scalar loads");
  static_assert(kVw * kQ * kNcols <= 32, "accumulators per thread");
};

template <typename T, int kNcols, int kVw, int kQ>
__global__ void __launch_bounds__(kThreads) GemvTransSplitKernel(GemvParams p) {
  using Cfg = TransSplitConfig<T, kNcols, kVw, kQ>;
  constexpr int kU = Cfg::kUnroll;
  constexpr int kStep = Cfg::kRowStep;
  constexpr int kQStride = kWarpSize * kVw;  // columns between a lane's kQ segments
  __shared__ float red[kWarpsPerBlock][Cfg::kOutputs];  // (warp, ((q * VW + v) * NCOLS + c) * 32 + lane)
  __shared__ bool is_last;
  __shared__ float cluster_sums[kQ == 1 ? Cfg::kTileM * 8 : 1];  // (col, c): cluster mode

  const int tx = threadIdx.x % kWarpSize;
  const int ty = threadIdx.x / kWarpSize;
  const int64_t tile_col0 = int64_t(blockIdx.x) * Cfg::kTileM;
  const int64_t col0 = tile_col0 + tx * kVw;
  const int64_t j_begin = int64_t(blockIdx.y) * p.rows_per_split;
  const int64_t j_end = std::min(p.k, j_begin + p.rows_per_split);
  const T* a = static_cast<const T*>(p.a) + col0;
  constexpr int kXBytes = kNcols * int(sizeof(T));
  const bool x_vec = p.ncols == kNcols &&
                     reinterpret_cast<uintptr_t>(p.x) % uintptr_t(kXBytes < 16 ? kXBytes : 16) == 0;

  float acc[kQ][kVw][kNcols] = {};
  if (col0 + (kQ - 1) * kQStride + kVw <= p.m) {
    int64_t j = j_begin + ty;
    for (; j + kStep * (kU - 1) < j_end; j += kStep * kU) {
      uint32_t w[kU][kQ][Cfg::kWords];
      float xv[kU][kNcols];
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int q = 0; q < kQ; ++q) LoadWords<Cfg::kLoadBytes>(a + (j + kStep * u) * p.lda + q * kQStride, w[u][q]);
#pragma unroll
      for (int u = 0; u < kU; ++u) LoadXRow<T, kNcols>(p, j + kStep * u, x_vec, xv[u]);
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int q = 0; q < kQ; ++q)
#pragma unroll
          for (int v = 0; v < kVw; ++v) {
            const float av = ElemOf<T>(w[u][q], v);
#pragma unroll
            for (int c = 0; c < kNcols; ++c) acc[q][v][c] = fmaf(av, xv[u][c], acc[q][v][c]);
          }
    }
    for (; j < j_end; j += kStep) {
      uint32_t w[kQ][Cfg::kWords];
      float xv[kNcols];
#pragma unroll
      for (int q = 0; q < kQ; ++q) LoadWords<Cfg::kLoadBytes>(a + j * p.lda + q * kQStride, w[q]);
      LoadXRow<T, kNcols>(p, j, x_vec, xv);
#pragma unroll
      for (int q = 0; q < kQ; ++q)
#pragma unroll
        for (int v = 0; v < kVw; ++v) {
          const float av = ElemOf<T>(w[q], v);
#pragma unroll
          for (int c = 0; c < kNcols; ++c) acc[q][v][c] = fmaf(av, xv[c], acc[q][v][c]);
        }
    }
  } else if (col0 < p.m) {  // the right edge of the last tile: element by element
    for (int64_t j = j_begin + ty; j < j_end; j += kStep) {
      float xv[kNcols];
      LoadXRow<T, kNcols>(p, j, x_vec, xv);
#pragma unroll
      for (int q = 0; q < kQ; ++q)
#pragma unroll
        for (int v = 0; v < kVw; ++v) {
          if (col0 + q * kQStride + v >= p.m) continue;
          const float av = ToFloat(__ldg(a + j * p.lda + q * kQStride + v));
#pragma unroll
          for (int c = 0; c < kNcols; ++c) acc[q][v][c] = fmaf(av, xv[c], acc[q][v][c]);
        }
    }
  }

#pragma unroll
  for (int q = 0; q < kQ; ++q)
#pragma unroll
    for (int v = 0; v < kVw; ++v)
#pragma unroll
      for (int c = 0; c < kNcols; ++c)
        red[ty][((q * kVw + v) * kNcols + c) * kWarpSize + tx] = acc[q][v][c];
  __syncthreads();

  // Output o of the tile: lane o % 32, and o / 32 = (q * kVw + v) * kNcols + c.
  auto output_index = [&](int o, int64_t* col, int* c) {
    const int qvc = o / kWarpSize;
    const int qv = qvc / kNcols;
    *col = tile_col0 + (qv / kVw) * kQStride + (o % kWarpSize) * kVw + qv % kVw;
    *c = qvc % kNcols;
    return *col < p.m && *c < p.ncols;
  };
  if constexpr (kQ == 1) {
    if (p.cluster) {  // the splits meet in the cluster's shared memory
      for (int o = threadIdx.x; o < Cfg::kOutputs; o += kThreads) {
        int64_t col;
        int c;
        if (!output_index(o, &col, &c)) continue;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kWarpsPerBlock; ++w) s += red[w][o];
        cluster_sums[(col - tile_col0) * 8 + c] = s;
      }
      ClusterCombine(p, cluster_sums, tile_col0, Cfg::kTileM);
      return;
    }
  }
  for (int o = threadIdx.x; o < Cfg::kOutputs; o += kThreads) {
    int64_t col;
    int c;
    if (!output_index(o, &col, &c)) continue;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) s += red[w][o];
    if (p.splits == 1) WriteY(p, col * p.ncols + c, s);
    else __stcg(p.partial + (int64_t(blockIdx.y) * p.m + col) * p.ncols + c, s);
  }
  if (p.splits == 1) return;

  // Ticket: the last block of this column tile to finish adds the partials.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&p.counters[blockIdx.x], 1u) == unsigned(p.splits - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // Groups of `lanes` lanes (1, 8 or 32, more for more splits) each add one
  // output's splits: lane i of a group the splits i, i + lanes, ... in
  // order, then a fixed shuffle tree over the group: the same order every
  // launch, and every output of the tile in flight at once when the splits
  // are few.
  const int lanes = p.splits > 128 ? 32 : (p.splits > 16 ? 8 : 1);
  const int per_block = kThreads / lanes;
  const int sub = threadIdx.x % lanes;
  const int64_t stride = p.m * p.ncols;
  for (int base = 0; base < Cfg::kOutputs; base += per_block) {  // the same trips in every warp
    const int o = base + int(threadIdx.x) / lanes;
    int64_t col = 0;
    int c = 0;
    const bool valid = o < Cfg::kOutputs && output_index(o, &col, &c);
    float s = 0.f;
    if (valid) {
      const float* part = p.partial + col * p.ncols + c;
      for (int sp = sub; sp < p.splits; sp += lanes) s += __ldcg(part + int64_t(sp) * stride);
    }
    for (int off = 1; off < lanes; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (valid && sub == 0) WriteY(p, col * p.ncols + c, s);
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// ---------------------------------------------------------------------------
// trans_mma: op(A) = A^T (A stored [k, m]), fp16/bf16, 1..8 columns, on the
// tensor cores: y^T's tile is computed as D = op(A)^T-tile [cols x k] times
// x [k x 8] with mma.sync m16n8k16 (fp32 accumulation), the tile's columns of
// A being the MMA's M rows and x (padded to 8 columns) its N. A block of 8
// warps owns kChunks * 64 columns; every warp covers all of them and the
// warps take the 16-row steps of the block's k range in turn (warp w: steps
// w, w + 8, ...). This kernel takes rows at any 2-byte alignment (odd lda;
// 16-byte rows take the cp.async kernel below). Lane (g, tig) =
// (lane / 4, lane % 4) reads 16 bytes (8 columns g*8..g*8+7 of each 64-column
// chunk, as aligned 4-byte words funnel-shifted where the row is 2 bytes
// off) of the rows 2tig, 2tig+1,
// 2tig+8, 2tig+9 of a step: exactly the k indices its A fragments hold, so a
// byte permute of two rows' words gives a fragment register (one column, two
// consecutive k), and the 8 columns of its vector feed 4 MMAs, column 2jj as
// the fragment's row g and 2jj+1 as row g+8. x's fragment holds x[k][g] for
// the same k. kSteps steps are loaded before any MMA: 256 (one chunk) or
// 128 (two) bytes of A in flight per lane.
// k is split over the CTAs of a cluster (p.splits of them, up to 8), which
// meet in ClusterCombine; within a CTA the 8 warps meet in shared memory.
// REQUIRES: fp16 or bf16; launched with p.splits CTAs per cluster along x
// (blockIdx.x = tile * p.splits + rank), p.rows_per_split a multiple of 16.

// The part of a clustered tensor-core launch (trans_mma, mma_ring) that CTA
// blockIdx.x owns: output tile blockIdx.x / p.splits (tile0: its first output
// row of y, i.e. a column of the stored A for A^T x, a row of A for A x),
// split blockIdx.x % p.splits (k indices j_begin..j_end), and that range's
// steps of kStep k indices, whole or not.
struct TileSlice {
  int64_t tile0, j_begin, j_end, steps, full_steps;
};
template <int kStep>
__device__ __forceinline__ TileSlice SliceOf(const GemvParams& p, int tile_outputs) {
  TileSlice t;
  t.tile0 = int64_t(blockIdx.x / unsigned(p.splits)) * tile_outputs;
  t.j_begin = int64_t(blockIdx.x % unsigned(p.splits)) * p.rows_per_split;
  t.j_end = std::min(p.k, t.j_begin + p.rows_per_split);
  t.steps = t.j_end > t.j_begin ? (t.j_end - t.j_begin + kStep - 1) / kStep : 0;
  t.full_steps = t.j_end > t.j_begin ? (t.j_end - t.j_begin) / kStep : 0;
  return t;
}

// The 8 warps of a tensor-core CTA (trans_mma, mma_ring) meet: each leaves
// its accumulators in `red` ([warp][register][lane]), and their sums in a
// fixed order go to sums[row * 8 + c], where row = row_of(f, g, upper) is the
// output row of the tile (a column of the stored A for A^T x) that MMA f gives
// lane group g in its fragment row g (upper 0) or g + 8 (upper 1), and c =
// 2 * (lane % 4) + (register % 2) the column of x. Every thread of the CTA
// calls it; `red` is free again after its next __syncthreads().
template <int kFrags, typename RowOf>
__device__ __forceinline__ void MeetWarps(float (*red)[kFrags * 4][kWarpSize], float* sums,
                                          const float (&d)[kFrags][4], RowOf row_of) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][f * 4 + i][lane] = d[f][i];
  __syncthreads();
  for (int e = threadIdx.x; e < kFrags * 4 * kWarpSize; e += kThreads) {
    const int ri = e / kWarpSize, l = e % kWarpSize;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) v += red[w][ri][l];  // fixed order
    const int i = ri % 4;
    sums[row_of(ri / 4, l >> 2, i >> 1) * 8 + 2 * (l & 3) + (i & 1)] = v;
  }
}

template <int kChunks>
struct TransMmaConfig {
  static constexpr int kTileCols = 64 * kChunks;
  // 16-row steps loaded at once: 4 with one chunk, 1 with two (two would
  // spill at the 128 registers that keep 2 CTAs per SM resident).
  static constexpr int kSteps = kChunks == 1 ? 4 : 1;
};

// 8 elements (4 words) of a row starting at `ptr`, at any 2-byte alignment:
// aligned 4-byte words, funnel-shifted when the row is 2 bytes off.
__device__ __forceinline__ void LoadRowChunk(const void* ptr, uint32_t* w) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(ptr);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t(3));
  const uint32_t shift = (addr & 2u) ? 16u : 0u;
  uint32_t u[5];
#pragma unroll
  for (int i = 0; i < 4; ++i) u[i] = __ldg(base + i);
  // The fifth word holds the last element only when the row is 2 bytes off
  // 4-byte alignment; it is then the aligned word that holds the chunk's last
  // byte, so it never reaches past the page that holds it.
  u[4] = shift ? __ldg(base + 4) : 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = __funnelshift_r(u[i], u[i + 1], shift);
}

// The same, element by element: columns at or past p.m and rows at or past
// `j_end` read as 0.
__device__ __forceinline__ void LoadRowChunkGuarded(const GemvParams& p, int64_t j, int64_t j_end,
                                                    int64_t col, uint32_t* w) {
  const unsigned short* a = static_cast<const unsigned short*>(p.a);
  const bool row_ok = j < j_end;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = col + 2 * i;
    const uint32_t lo = row_ok && c < p.m ? __ldg(a + j * p.lda + c) : 0u;
    const uint32_t hi = row_ok && c + 1 < p.m ? __ldg(a + j * p.lda + c + 1) : 0u;
    w[i] = lo | (hi << 16);
  }
}

// Raw bits of x[j][c] and x[j + 1][c] (0 where c >= ncols or a row is at or
// past j_end).
__device__ __forceinline__ uint32_t XPairBits(const GemvParams& p, int64_t j, int c,
                                              int64_t j_end) {
  if (c >= p.ncols) return 0u;
  const unsigned short* x = static_cast<const unsigned short*>(p.x);
  const uint32_t lo = j < j_end ? __ldg(x + j * p.ncols + c) : 0u;
  const uint32_t hi = j + 1 < j_end ? __ldg(x + (j + 1) * p.ncols + c) : 0u;
  return lo | (hi << 16);
}

template <typename T, int kChunks>
__global__ void __launch_bounds__(kThreads, 2) GemvTransMmaKernel(GemvParams p) {
  using Cfg = TransMmaConfig<kChunks>;
  constexpr int kSteps = Cfg::kSteps;
  constexpr int kRegs = kChunks * 16;  // accumulators per lane
  __shared__ float red[kWarpsPerBlock][kRegs][kWarpSize];
  __shared__ float sums[Cfg::kTileCols * 8];

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane >> 2, tig = lane & 3;
  const TileSlice slice = SliceOf<16>(p, Cfg::kTileCols);
  const int64_t tile_col0 = slice.tile0, j_begin = slice.j_begin, j_end = slice.j_end;
  const int64_t steps = slice.steps, full_steps = slice.full_steps;
  const bool cols_inside = tile_col0 + Cfg::kTileCols <= p.m;
  const T* a_lane = static_cast<const T*>(p.a) + tile_col0 + g * 8;
  // Rows of a step this lane reads: 2tig, 2tig+1 (fragment k 2tig..) and
  // 2tig+8, 2tig+9 (k 2tig+8..).
  const int row_off[4] = {2 * tig, 2 * tig + 1, 2 * tig + 8, 2 * tig + 9};

  float d[kChunks][4][4] = {};
  auto mma_step = [&](const uint32_t(&w)[kChunks][4][4], uint32_t b0, uint32_t b1) {
#pragma unroll
    for (int h = 0; h < kChunks; ++h)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const uint32_t a[4] = {__byte_perm(w[h][0][jj], w[h][1][jj], 0x5410),
                               __byte_perm(w[h][0][jj], w[h][1][jj], 0x7632),
                               __byte_perm(w[h][2][jj], w[h][3][jj], 0x5410),
                               __byte_perm(w[h][2][jj], w[h][3][jj], 0x7632)};
        Mma16816<T>(d[h][jj], a, b0, b1);
      }
  };

  int64_t s = warp;
  if (cols_inside) {
    // kSteps whole steps at once while they last.
    for (; s + int64_t(kWarpsPerBlock) * (kSteps - 1) < full_steps;
         s += int64_t(kWarpsPerBlock) * kSteps) {
      uint32_t w[kSteps][kChunks][4][4];
      uint32_t b[kSteps][2];
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        const int64_t j0 = j_begin + (s + int64_t(kWarpsPerBlock) * u) * 16;
#pragma unroll
        for (int h = 0; h < kChunks; ++h)
#pragma unroll
          for (int r = 0; r < 4; ++r)
            LoadRowChunk(a_lane + (j0 + row_off[r]) * p.lda + h * 64, w[u][h][r]);
        b[u][0] = XPairBits(p, j0 + 2 * tig, g, j_end);
        b[u][1] = XPairBits(p, j0 + 2 * tig + 8, g, j_end);
      }
#pragma unroll
      for (int u = 0; u < kSteps; ++u) mma_step(w[u], b[u][0], b[u][1]);
    }
    for (; s < full_steps; s += kWarpsPerBlock) {  // whole steps left over
      const int64_t j0 = j_begin + s * 16;
      uint32_t w[kChunks][4][4];
#pragma unroll
      for (int h = 0; h < kChunks; ++h)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          LoadRowChunk(a_lane + (j0 + row_off[r]) * p.lda + h * 64, w[h][r]);
      mma_step(w, XPairBits(p, j0 + 2 * tig, g, j_end), XPairBits(p, j0 + 2 * tig + 8, g, j_end));
    }
  }
  // Steps that cross p.m or j_end: element by element.
  for (; s < steps; s += kWarpsPerBlock) {
    const int64_t j0 = j_begin + s * 16;
    uint32_t w[kChunks][4][4];
#pragma unroll
    for (int h = 0; h < kChunks; ++h)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        LoadRowChunkGuarded(p, j0 + row_off[r], j_end, tile_col0 + h * 64 + g * 8, w[h][r]);
    mma_step(w, XPairBits(p, j0 + 2 * tig, g, j_end), XPairBits(p, j0 + 2 * tig + 8, g, j_end));
  }

  // The 8 warps meet: MMA jj of chunk h holds columns h*64 + g*8 + 2jj (row
  // g) and the next one (row g + 8).
  MeetWarps<kChunks * 4>(red, sums, reinterpret_cast<const float(&)[kChunks * 4][4]>(d),
                         [](int f, int grp, int upper) {  // f = 4h + jj
                           return (f / 4) * 64 + grp * 8 + 2 * (f % 4) + upper;
                         });
  ClusterCombine(p, sums, tile_col0, Cfg::kTileCols);
}

// trans_mma on rows that allow 16-byte copies (A 16-byte aligned, lda a
// multiple of 8): the same MMAs, with A's rows streamed into shared memory by
// cp.async (16 bytes a lane, every lane of the warp, 2 or 4 rows per
// instruction) through a ring of kStages 16-row steps per warp, one commit
// group per step, so that a warp keeps kStages steps (16 or 18 KiB) in flight
// whatever its registers hold; the fragments come out of shared memory with
// ldmatrix.trans (rows padded by 16 bytes: the 8 rows of a matrix fall in 8
// different bank groups). Each warp streams its own steps (w, w + 8, ...), so
// no warp waits for another until the sums meet. Here MMA jj of chunk h holds
// columns h*64 + jj*16 + g (fragment row g) and + 8 (row g + 8). Steps that
// cross j_end take element loads in the same mapping. One CTA per SM (the
// ring is ~140 KiB). (1-D bulk copies, one per 256-byte row, were tried in
// its place: 16384^2 bf16 n=1 took 190-290 us, against 124 for the register
// kernel above: the copy engine's cost per small copy was the limit.)
template <int kChunks>
struct TransRingConfig {
  static constexpr int kTileCols = 64 * kChunks;
  static constexpr int kRowBytes = kTileCols * 2;
  static constexpr int kPitch = kRowBytes + 16;  // bytes between rows in shared memory
  static constexpr int kXBytes = 16 * 8 * 2;     // the step's 16 rows of x, up to 8 columns
  static constexpr int kStepBytes = 16 * kPitch + kXBytes;
  static constexpr int kStages = kChunks == 2 ? 4 : 8;
  static constexpr int kVectorsPerRow = kRowBytes / 16;
  static constexpr int kRowsPerCopy = kWarpSize / kVectorsPerRow;  // rows one warp-wide copy covers
  static constexpr int kRingBytes = kWarpsPerBlock * kStages * kStepBytes;
  static constexpr int kRedBytes = kWarpsPerBlock * kChunks * 16 * kWarpSize * 4;
  static constexpr int kSmemBytes = kRingBytes > kRedBytes ? kRingBytes : kRedBytes;
};

template <typename T, int kChunks>
__global__ void __launch_bounds__(kThreads, 1) GemvTransRingKernel(GemvParams p) {
  using Cfg = TransRingConfig<kChunks>;
  constexpr int kStages = Cfg::kStages;
  constexpr int kRegs = kChunks * 16;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float sums[Cfg::kTileCols * 8];

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane >> 2, tig = lane & 3;
  const TileSlice slice = SliceOf<16>(p, Cfg::kTileCols);
  const int64_t tile_col0 = slice.tile0, j_begin = slice.j_begin, j_end = slice.j_end;
  const int64_t steps = slice.steps, full_steps = slice.full_steps;
  // This warp's whole steps: w, w + 8, ... below full_steps.
  const int64_t my_full =
      full_steps > warp ? (full_steps - warp + kWarpsPerBlock - 1) / kWarpsPerBlock : 0;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                        uint32_t(warp * kStages * Cfg::kStepBytes);

  // This lane's copies: vector `vec` of rows copy_row, copy_row +
  // kRowsPerCopy, ...; past p.m (the last tile) the vector is zero-filled.
  const int vec = lane % Cfg::kVectorsPerRow, copy_row = lane / Cfg::kVectorsPerRow;
  const int64_t left = (p.m - tile_col0) * int64_t(sizeof(T)) - vec * 16;
  const uint32_t src_bytes = left >= 16 ? 16u : (left > 0 ? uint32_t(left) : 0u);
  const int64_t row_bytes = p.lda * int64_t(sizeof(T));
  const unsigned char* a_lane = static_cast<const unsigned char*>(p.a) +
                                tile_col0 * int64_t(sizeof(T)) + (src_bytes > 0 ? vec * 16 : 0);
  const uint32_t dst_lane = ring + copy_row * Cfg::kPitch + vec * 16;
  const unsigned char* x_bytes = static_cast<const unsigned char*>(p.x);
  const int x_step_bytes = 16 * p.ncols * int(sizeof(T));  // 32..256, contiguous
  // Step i of this warp into stage i % kStages: its 16 rows of A, then its 16
  // rows of x (lanes 0..2*ncols-1); one commit group (empty past the warp's
  // last step, so that the group count stays one per step).
  auto issue = [&](int64_t i) {
    if (i < my_full) {
      const int st = int(i % kStages);
      const int64_t j0 = j_begin + (warp + i * kWarpsPerBlock) * 16;
#pragma unroll
      for (int r = 0; r < 16; r += Cfg::kRowsPerCopy)
        sm90::CpAsync16(dst_lane + st * Cfg::kStepBytes + r * Cfg::kPitch,
                        a_lane + (j0 + copy_row + r) * row_bytes, src_bytes);
      if (lane * 16 < x_step_bytes)
        sm90::CpAsync16(ring + st * Cfg::kStepBytes + 16 * Cfg::kPitch + lane * 16,
                        x_bytes + j0 * p.ncols * int64_t(sizeof(T)) + lane * 16, 16);
    }
    sm90::CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < kStages; ++i) issue(i);

  float d[kChunks][4][4] = {};
  // ldmatrix row addresses: lanes 8q..8q+7 give rows k = (q >= 2 ? 8 : 0) +
  // lane % 8 of columns (q & 1) * 8 + (the MMA's 16).
  const int q = lane >> 3;
  const uint32_t lm_off = uint32_t(((q >> 1) * 8 + (lane & 7)) * Cfg::kPitch + (q & 1) * 16);
  // x's fragment from the stage: x[k][g] and x[k + 1][g] (0 past ncols).
  const bool x_col = g < p.ncols;
  const uint32_t x_lane = uint32_t((2 * tig * p.ncols + g) * int(sizeof(T)));
  const uint32_t x_row = uint32_t(p.ncols * int(sizeof(T)));
  auto x_pair = [&](uint32_t at) -> uint32_t {
    if (!x_col) return 0u;
    uint16_t lo, hi;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(lo) : "r"(at));
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(hi) : "r"(at + x_row));
    return uint32_t(lo) | (uint32_t(hi) << 16);
  };
  for (int64_t i = 0; i < my_full; ++i) {
    const int st = int(i % kStages);
    sm90::CpAsyncWait<kStages - 1>();  // this lane's copies of step i have landed
    __syncwarp();                // and every other lane's
    const uint32_t xs = ring + st * Cfg::kStepBytes + 16 * Cfg::kPitch + x_lane;
    const uint32_t b0 = x_pair(xs), b1 = x_pair(xs + 8 * x_row);
    const uint32_t base = ring + st * Cfg::kStepBytes + lm_off;
#pragma unroll
    for (int h = 0; h < kChunks; ++h)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t a[4];
        sm90::LdMatrixX4Trans(a, base + (h * 64 + jj * 16) * 2);
        Mma16816<T>(d[h][jj], a, b0, b1);
      }
    __syncwarp();  // every lane has read the stage before it is refilled
    issue(i + kStages);
  }
  // A last step that crosses j_end: element loads, the same mapping.
  for (int64_t s =
           full_steps + ((warp - full_steps) % kWarpsPerBlock + kWarpsPerBlock) % kWarpsPerBlock;
       s < steps; s += kWarpsPerBlock) {
    const int64_t j0 = j_begin + s * 16;
    const unsigned short* a = static_cast<const unsigned short*>(p.a);
    auto elem = [&](int64_t j, int64_t col) -> uint32_t {
      return j < j_end && col < p.m ? __ldg(a + j * p.lda + col) : 0u;
    };
    const int64_t r0 = j0 + 2 * tig, r8 = r0 + 8;
#pragma unroll
    for (int h = 0; h < kChunks; ++h)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int64_t lo = tile_col0 + h * 64 + jj * 16 + g, hi = lo + 8;
        const uint32_t a[4] = {
            elem(r0, lo) | elem(r0 + 1, lo) << 16, elem(r0, hi) | elem(r0 + 1, hi) << 16,
            elem(r8, lo) | elem(r8 + 1, lo) << 16, elem(r8, hi) | elem(r8 + 1, hi) << 16};
        Mma16816<T>(d[h][jj], a, XPairBits(p, r0, g, j_end), XPairBits(p, r8, g, j_end));
      }
  }

  // The warps meet in shared memory (the ring is free once every warp is
  // past its last step and no copy is in flight).
  sm90::CpAsyncWait<0>();
  __syncthreads();
  MeetWarps<kChunks * 4>(reinterpret_cast<float(*)[kRegs][kWarpSize]>(smem), sums,
                         reinterpret_cast<const float(&)[kChunks * 4][4]>(d),
                         [](int f, int grp, int upper) { return f * 16 + grp + 8 * upper; });
  ClusterCombine(p, sums, tile_col0, Cfg::kTileCols);
}

// ---------------------------------------------------------------------------
// mma_ring: fp16/bf16 A x, 1..8 columns, on the tensor cores with A streamed
// through a cp.async ring. The mma kernel above reads A with register loads
// and x element by element from L1 (16 loads of x per 32 k per lane), and at
// 8 columns it runs out of issue slots before HBM runs out of bytes (16384^2
// bf16 n=8: 204 us against cuBLAS's 130).
// A CTA owns tiles of kTileRows rows of A (16 or 32) and one split of k, the
// same for each of its tiles; it walks its tiles in turn (tile blockIdx.x /
// p.splits, then every gridDim.x / p.splits-th: a persistent grid of one CTA
// per SM). The tiles' steps (kTileRows rows by kStepK k: 16 x 256 or 32 x
// 128, 8 KiB of A) form one sequence, tile after tile, and warp w takes items
// w, w + 8, ... of it, streaming each into a ring of kStages (2) stages by
// cp.async, one commit group per step: the tile's rows (one or two of them
// per warp-wide copy) and the step's rows of x (contiguous, 16 bytes a
// lane). The ring runs across tile boundaries, so the next tile's copies are
// in flight while the warps meet. A's fragments come out of shared memory by
// ldmatrix (rows padded by 16 bytes: the 8 rows of a matrix fall in 8
// different bank groups), x's by 16-bit shared loads (x[k][g] and
// x[k + 1][g], 0 past ncols); MMA f holds rows f*16 + g (fragment row g) and
// + 8. At the end of each tile the warps meet in shared memory (MeetWarps)
// and the splits of k in the cluster's (ClusterCombine). A step that crosses
// j_end (or p.m) copies what is in A and x and zero-fills the rest.
// REQUIRES: fp16 or bf16; A and x 16-byte aligned, lda a multiple of 8;
// launched with p.splits CTAs per cluster along x, gridDim.x a multiple of
// p.splits, p.rows_per_split a multiple of kStepK, kSmemBytes of dynamic
// shared memory.
template <int kTileRows, int kK>
struct RingConfig {
  static constexpr int kFrags = kTileRows / 16;   // MMAs (16 rows each) per 16 k
  static constexpr int kStepK = kK;               // k per step
  static constexpr int kRowBytes = kStepK * 2;    // bytes of a row per step
  static constexpr int kPitch = kRowBytes + 16;   // bytes between rows in shared memory
  static constexpr int kXBytes = kStepK * 8 * 2;  // the step's rows of x, up to 8 columns
  static constexpr int kStepBytes = kTileRows * kPitch + kXBytes;
  // Stages per warp: 4, or as many as 210 KiB of the SM's shared memory hold.
  static constexpr int kStages = 210 * 1024 / (kWarpsPerBlock * kStepBytes) < 4
                                     ? 210 * 1024 / (kWarpsPerBlock * kStepBytes)
                                     : 4;
  static_assert(kStages >= 2, "a ring of at least two stages");
  static constexpr int kVectorsPerRow = kRowBytes / 16;
  static constexpr int kRowsPerCopy = kWarpSize / kVectorsPerRow;  // rows one warp-wide copy covers
  static constexpr int kSmemBytes = kWarpsPerBlock * kStages * kStepBytes;
};

template <typename T, int kTileRows, int kStepK>
__global__ void __launch_bounds__(kThreads, 1) GemvRingKernel(GemvParams p) {
  using Cfg = RingConfig<kTileRows, kStepK>;
  constexpr int kStep = Cfg::kStepK, kStages = Cfg::kStages, kFrags = Cfg::kFrags;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float red[kWarpsPerBlock][kFrags * 4][kWarpSize];
  __shared__ float sums[kTileRows * 8];

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane >> 2, tig = lane & 3;
  // This CTA's split of k, the same in each of its tiles: `steps` steps, the
  // last one partial where the split's end is not a step's.
  const int64_t j_begin = int64_t(blockIdx.x % unsigned(p.splits)) * p.rows_per_split;
  const int64_t j_end = std::min(p.k, j_begin + p.rows_per_split);
  const int64_t steps = j_end > j_begin ? (j_end - j_begin + kStep - 1) / kStep : 0;
  // Its tiles: first_tile, + clusters, ...
  const int64_t clusters = gridDim.x / unsigned(p.splits);
  const int64_t first_tile = blockIdx.x / unsigned(p.splits);
  const int64_t tiles = (p.m + kTileRows - 1) / kTileRows;
  const int64_t my_tiles = first_tile < tiles ? (tiles - first_tile + clusters - 1) / clusters : 0;
  // This warp's items (steps w, w + 8, ... of the CTA's sequence).
  const int64_t items = my_tiles * steps;
  const int64_t my_items = items > warp ? (items - warp + kWarpsPerBlock - 1) / kWarpsPerBlock : 0;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                        uint32_t(warp * kStages * Cfg::kStepBytes);

  // This lane's copies: vector `vec` of rows copy_row + kRowsPerCopy * r of
  // the tile. Rows at or past p.m, and elements at or past j_end, are
  // zero-filled and read nothing (x's too: past j_end both factors are 0).
  const int vec = lane % Cfg::kVectorsPerRow, copy_row = lane / Cfg::kVectorsPerRow;
  const int64_t row_bytes = p.lda * int64_t(sizeof(T));
  const unsigned char* a_bytes = static_cast<const unsigned char*>(p.a);
  const uint32_t dst_lane = ring + copy_row * Cfg::kPitch + vec * 16;
  const unsigned char* x_bytes = static_cast<const unsigned char*>(p.x);
  const int x_step_bytes = kStep * p.ncols * int(sizeof(T));  // contiguous, a multiple of 64
  // Item i of this warp into stage i % kStages; one commit group (empty past
  // the warp's last item, so that the group count stays one per item).
  auto issue = [&](int64_t i) {
    if (i < my_items) {
      const uint32_t stage = uint32_t(i % kStages) * Cfg::kStepBytes;
      const int64_t item = warp + i * kWarpsPerBlock;
      const int64_t t = item / steps, s = item - t * steps;
      const int64_t row0 = (first_tile + t * clusters) * kTileRows + copy_row;
      const int64_t j0 = j_begin + s * kStep;
      const int64_t rows_left = p.m - row0;  // copy r is in A while r < rows_left
      const int64_t k_left = (j_end - j0) * int64_t(sizeof(T)) - vec * 16;  // bytes of the row
      const uint32_t a_len = k_left >= 16 ? 16u : (k_left > 0 ? uint32_t(k_left) : 0u);
      const int64_t at = row0 * row_bytes + j0 * int64_t(sizeof(T)) + vec * 16;
#pragma unroll
      for (int r = 0; r < kTileRows; r += Cfg::kRowsPerCopy) {
        const bool in = r < rows_left && a_len > 0;
        sm90::CpAsync16(dst_lane + stage + r * Cfg::kPitch, in ? a_bytes + at + r * row_bytes : p.a,
                        in ? a_len : 0u);
      }
      const int64_t x_left = std::min<int64_t>(j_end - j0, kStep) * p.ncols * int64_t(sizeof(T));
      for (int off = lane * 16; off < x_step_bytes; off += kWarpSize * 16) {
        const int64_t left = x_left - off;
        const uint32_t len = left >= 16 ? 16u : (left > 0 ? uint32_t(left) : 0u);
        sm90::CpAsync16(ring + stage + kTileRows * Cfg::kPitch + off,
                        len > 0 ? x_bytes + j0 * p.ncols * int64_t(sizeof(T)) + off : p.x, len);
      }
    }
    sm90::CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < kStages; ++i) issue(i);

  // ldmatrix row addresses: lanes 8q..8q+7 give row (q & 1) * 8 + lane % 8 of
  // the MMA's 16, at k (q >> 1) * 8 of its 16.
  const int q = lane >> 3;
  const uint32_t lm_off = uint32_t(((q & 1) * 8 + (lane & 7)) * Cfg::kPitch + (q >> 1) * 16);
  // x's fragment from the stage: x[k][g] and x[k + 1][g] (0 past ncols).
  // (The same reads through a helper struct shared with GemvTransRingKernel
  // took 90 registers instead of 78 and cost 5-28% on the sweep's A x rows
  // with 8 columns in the next run, cuBLAS within 2% of its times: both
  // kernels keep this lambda.)
  const bool x_col = g < p.ncols;
  const uint32_t x_lane = uint32_t((2 * tig * p.ncols + g) * int(sizeof(T)));
  const uint32_t x_row = uint32_t(p.ncols * int(sizeof(T)));
  auto x_pair = [&](uint32_t at) -> uint32_t {
    if (!x_col) return 0u;
    uint16_t lo, hi;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(lo) : "r"(at));
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(hi) : "r"(at + x_row));
    return uint32_t(lo) | (uint32_t(hi) << 16);
  };

  int64_t i = 0;  // this warp's next item
  for (int64_t t = 0; t < my_tiles; ++t) {
    const int64_t tile_row0 = (first_tile + t * clusters) * kTileRows;
    float d[kFrags][4] = {};
    // This warp's items of tile t: those below item (t + 1) * steps.
    const int64_t ahead = (t + 1) * steps - warp;
    const int64_t i_end = ahead > 0 ? (ahead + kWarpsPerBlock - 1) / kWarpsPerBlock : 0;
    for (; i < i_end; ++i) {
      const uint32_t stage = ring + uint32_t(i % kStages) * Cfg::kStepBytes;
      sm90::CpAsyncWait<kStages - 1>();  // this lane's copies of item i have landed
      __syncwarp();                      // and every other lane's
      const uint32_t xs = stage + kTileRows * Cfg::kPitch + x_lane;
#pragma unroll
      for (int s16 = 0; s16 < kStep / 16; ++s16) {
        const uint32_t b0 = x_pair(xs + 16 * s16 * x_row), b1 = x_pair(xs + (16 * s16 + 8) * x_row);
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          uint32_t a[4];
          sm90::LdMatrixX4(a, stage + lm_off + f * 16 * Cfg::kPitch + s16 * 32);
          Mma16816<T>(d[f], a, b0, b1);
        }
      }
      __syncwarp();  // every lane has read the stage before it is refilled
      issue(i + kStages);
    }
    MeetWarps<kFrags>(red, sums, d,
                      [](int f, int grp, int upper) { return f * 16 + grp + 8 * upper; });
    ClusterCombine(p, sums, tile_row0, kTileRows);
    __syncthreads();  // `red` and `sums` are free for the next tile
  }
}

// ---------------------------------------------------------------------------
// Host side.

enum class Kind {
  kWarpRow,
  kVec16,
  kSmemX,
  kBatched,
  kScalar,
  kMma,
  kMmaRing,
  kTransNaive,
  kTransSplit,
  kTransWide,
  kTransMma,
  kCublas
};

struct VariantInfo {
  const char* name;
  Kind kind;
  int param;  // smem_x: TILE_V; batched, scalar, mma: warps per row group (kSplit);
              // trans_mma, mma_ring: tile rows of y (0: the plan's choice)
};

constexpr VariantInfo kVariantTable[] = {
    {"warp_row", Kind::kWarpRow, 0},
    {"vec16", Kind::kVec16, 0},
    {"smem_x", Kind::kSmemX, 2048},
    {"smem_x_t512", Kind::kSmemX, 512},
    {"smem_x_t1024", Kind::kSmemX, 1024},
    {"smem_x_t4096", Kind::kSmemX, 4096},
    {"batched", Kind::kBatched, 1},
    {"batched_w2", Kind::kBatched, 2},
    {"batched_w4", Kind::kBatched, 4},
    {"batched_w8", Kind::kBatched, 8},
    {"scalar", Kind::kScalar, 1},
    {"scalar_w2", Kind::kScalar, 2},
    {"scalar_w4", Kind::kScalar, 4},
    {"scalar_w8", Kind::kScalar, 8},
    {"mma", Kind::kMma, 1},
    {"mma_w2", Kind::kMma, 2},
    {"mma_w4", Kind::kMma, 4},
    {"mma_w8", Kind::kMma, 8},
    {"mma_ring", Kind::kMmaRing, 0},
    {"mma_ring_16", Kind::kMmaRing, 16},
    {"mma_ring_32", Kind::kMmaRing, 32},
    {"trans_naive", Kind::kTransNaive, 0},
    {"trans_split", Kind::kTransSplit, 0},
    {"trans_wide", Kind::kTransWide, 0},
    {"trans_mma", Kind::kTransMma, 0},
    {"trans_mma_64", Kind::kTransMma, 64},
    {"trans_mma_128", Kind::kTransMma, 128},
    {"cublas", Kind::kCublas, 0},
};

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The 16-byte-vector versions read whole vectors of every row of A and of x.
bool VectorFriendly(const GemvArgs& args) {
  const int64_t v = 16 / int64_t(DTypeSize(args.dtype));
  return Aligned(args.a, 16) && Aligned(args.x, 16) && args.lda % v == 0;
}

cudaDataType_t CublasType(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : (t == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF);
}

// y may be the input dtype, or fp32 for fp16/bf16 inputs (what GemmEx takes
// with fp32 compute).
bool CublasTakes(const GemvArgs& args) {
  return args.y_type == args.dtype || args.y_type == DType::kF32;
}

const VariantInfo* FindByName(std::string_view name) {
  for (const auto& v : kVariantTable)
    if (name == v.name) return &v;
  return nullptr;
}

// The default: the version heuristics/gemv_heuristics.h picks for the
// arguments.
const VariantInfo* Find(const GemvArgs& args, std::string_view variant) {
  if (!variant.empty()) return FindByName(variant);
  GemvShape shape;
  shape.m = args.m;
  shape.k = args.k;
  shape.ncols = args.ncols;
  shape.dtype = args.dtype;
  shape.trans_a = args.trans_a;
  shape.vector_friendly = VectorFriendly(args);
  shape.vendor_ok = CublasTakes(args) && args.m <= 0x7fffffff && args.k <= 0x7fffffff &&
                    args.lda <= 0x7fffffff;
  return FindByName(ChooseGemv(shape, SmCount()));
}

// Blocks of `kernel` resident on the whole current device at once. The
// per-SM figure depends only on the kernel and the architecture: asked once
// per kernel.
template <auto kKernel>
int64_t ResidentBlocks() {
  static const int per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreads, 0) != cudaSuccess) {
      (void)cudaGetLastError();  // no device here: plan for 4 blocks per SM
      n = 4;
    }
    return std::max(n, 1);
  }();
  return int64_t(SmCount()) * per_sm;
}

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// ---- trans_split planning: which instantiation, how many splits. ----

using TransLauncher = cudaError_t (*)(const GemvParams&, dim3, cudaStream_t);

struct TransPlan {
  TransLauncher launch = nullptr;
  int64_t tiles = 0;
  int splits = 1;
  int64_t rows_per_split = 0;
  bool cluster = false;        // the splits meet in a cluster (no workspace)
  size_t counter_bytes = 0;    // at the start of the workspace
  size_t workspace_bytes = 0;  // 0 when splits == 1 or cluster
};

// Launches `kernel` on `grid` with clusters of `cluster_x` x `cluster_y`
// CTAs (none when both are 1) and `smem_bytes` of dynamic shared memory.
template <typename Kernel>
cudaError_t LaunchClustered(Kernel kernel, const GemvParams& p, dim3 grid, unsigned cluster_x,
                            unsigned cluster_y, cudaStream_t stream, size_t smem_bytes = 0) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = cluster_y;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = cluster_x * cluster_y > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, p);
}

template <typename T, int kNcols, int kVw, int kQ>
cudaError_t LaunchTransSplit(const GemvParams& p, dim3 grid, cudaStream_t stream) {
  if (p.cluster)
    return LaunchClustered(GemvTransSplitKernel<T, kNcols, kVw, kQ>, p, grid, 1, grid.y, stream);
  GemvTransSplitKernel<T, kNcols, kVw, kQ><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

constexpr int64_t kMinRowsPerSplit = 128;

template <typename T, int kNcols, int kVw, int kQ>
TransPlan MakeTransPlan(const GemvArgs& args) {
  TransPlan plan;
  plan.launch = &LaunchTransSplit<T, kNcols, kVw, kQ>;
  plan.tiles = CeilDiv(args.m, TransSplitConfig<T, kNcols, kVw, kQ>::kTileM);
  const int64_t resident = ResidentBlocks<GemvTransSplitKernel<T, kNcols, kVw, kQ>>();
  int64_t splits = std::max<int64_t>(1, resident / plan.tiles);
  // Splits that clusters can hold (up to 8) when that gives every SM a CTA:
  // no workspace, no clearing pass, no last-block combine.
  plan.cluster = kQ == 1 && plan.tiles * kGemvMaxClusterSplits >= SmCount();
  if (plan.cluster) splits = std::min<int64_t>(splits, kGemvMaxClusterSplits);
  splits = std::min({splits, std::max<int64_t>(1, args.k / kMinRowsPerSplit), int64_t(65535)});
  plan.rows_per_split = CeilDiv(CeilDiv(args.k, splits), kWarpsPerBlock) * kWarpsPerBlock;
  plan.splits = int(CeilDiv(args.k, plan.rows_per_split));
  if (plan.splits == 1) plan.cluster = false;
  if (plan.splits > 1 && !plan.cluster) {
    plan.counter_bytes = AlignUp(size_t(plan.tiles) * sizeof(unsigned), 256);
    plan.workspace_bytes =
        plan.counter_bytes + size_t(plan.splits) * size_t(args.m) * size_t(args.ncols) * sizeof(float);
  }
  return plan;
}

// kQ = 1: a warp reads 32 vectors (512 bytes) of a row; wide: up to 4 such
// segments side by side (2 KiB), as the accumulator budget allows.
template <typename T, int kNcols, int kVw, bool kWide>
constexpr int TransQ() {
  if (!kWide) return 1;
  constexpr int q = 32 / (kVw * kNcols);
  return q >= 4 ? 4 : (q < 1 ? 1 : q);
}

template <typename T, int kNcols, bool kWide>
TransPlan PickTransWidth(const GemvArgs& args) {
  // 16-byte loads, or 8-byte ones where 16 would need more than 32 accumulators.
  constexpr int kVec = (16 / int(sizeof(T))) * kNcols <= 32 ? 16 / int(sizeof(T)) : 8 / int(sizeof(T));
  if (Aligned(args.a, kVec * sizeof(T)) && args.lda % kVec == 0)
    return MakeTransPlan<T, kNcols, kVec, TransQ<T, kNcols, kVec, kWide>()>(args);
  return MakeTransPlan<T, kNcols, 1, TransQ<T, kNcols, 1, kWide>()>(args);
}

template <typename T, bool kWide>
TransPlan PlanTrans(const GemvArgs& args) {
  if (args.ncols <= 1) return PickTransWidth<T, 1, kWide>(args);
  if (args.ncols <= 2) return PickTransWidth<T, 2, kWide>(args);
  if (args.ncols <= 4) return PickTransWidth<T, 4, kWide>(args);
  return PickTransWidth<T, 8, kWide>(args);
}

template <bool kWide>
TransPlan PlanTransTyped(const GemvArgs& args) {
  switch (args.dtype) {
    case DType::kF32: return PlanTrans<float, kWide>(args);
    case DType::kF16: return PlanTrans<__half, kWide>(args);
    default: return PlanTrans<__nv_bfloat16, kWide>(args);
  }
}

TransPlan PlanTransAny(const GemvArgs& args, bool wide) {
  return wide ? PlanTransTyped<true>(args) : PlanTransTyped<false>(args);
}

// ---- launching. ----

// Blocks for `groups` row groups at `groups_per_block` a block, given
// `resident` blocks at once: rounds of equal size (to within one), so that no
// last round runs with a few warps only.
int64_t RoundBlocks(int64_t groups, int64_t groups_per_block, int64_t resident) {
  const int64_t rounds = CeilDiv(groups, resident * groups_per_block);
  return CeilDiv(CeilDiv(groups, rounds), groups_per_block);
}

template <typename T, int kNcols, int kSplit, bool kScalar>
cudaError_t LaunchBatchedSplit(const GemvParams& p, cudaStream_t stream) {
  constexpr int kGroupsPerBlock = kWarpsPerBlock / kSplit;
  const int64_t groups = CeilDiv(p.m, BatchedConfig<kNcols>::kRows);
  const int64_t blocks = RoundBlocks(
      groups, kGroupsPerBlock, ResidentBlocks<GemvBatchedKernel<T, kNcols, kSplit, kScalar>>());
  GemvBatchedKernel<T, kNcols, kSplit, kScalar><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int kNcols, bool kScalar>
cudaError_t LaunchBatched(const GemvParams& p, int split, cudaStream_t stream) {
  switch (split) {
    case 1: return LaunchBatchedSplit<T, kNcols, 1, kScalar>(p, stream);
    case 2: return LaunchBatchedSplit<T, kNcols, 2, kScalar>(p, stream);
    case 4: return LaunchBatchedSplit<T, kNcols, 4, kScalar>(p, stream);
    default: return LaunchBatchedSplit<T, kNcols, 8, kScalar>(p, stream);
  }
}

template <typename T, bool kScalar>
cudaError_t LaunchBatchedAny(const GemvParams& p, int split, cudaStream_t stream) {
  switch (p.ncols) {
    case 1: return LaunchBatched<T, 1, kScalar>(p, split, stream);
    case 2: return LaunchBatched<T, 2, kScalar>(p, split, stream);
    case 3: return LaunchBatched<T, 3, kScalar>(p, split, stream);
    case 4: return LaunchBatched<T, 4, kScalar>(p, split, stream);
    case 5: return LaunchBatched<T, 5, kScalar>(p, split, stream);
    case 6: return LaunchBatched<T, 6, kScalar>(p, split, stream);
    case 7: return LaunchBatched<T, 7, kScalar>(p, split, stream);
    default: return LaunchBatched<T, 8, kScalar>(p, split, stream);
  }
}

template <typename T, int kSplit>
cudaError_t LaunchMmaSplit(const GemvParams& p, cudaStream_t stream) {
  constexpr int kGroupsPerBlock = kWarpsPerBlock / kSplit;
  const int64_t blocks =
      RoundBlocks(CeilDiv(p.m, 16), kGroupsPerBlock, ResidentBlocks<GemvMmaKernel<T, kSplit>>());
  GemvMmaKernel<T, kSplit><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMma(const GemvParams& p, int split, cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return cudaErrorInvalidValue;
  } else {
    switch (split) {
      case 1: return LaunchMmaSplit<T, 1>(p, stream);
      case 2: return LaunchMmaSplit<T, 2>(p, stream);
      case 4: return LaunchMmaSplit<T, 4>(p, stream);
      default: return LaunchMmaSplit<T, 8>(p, stream);
    }
  }
}

// ---- trans_mma. ----

template <typename T, int kChunks>
cudaError_t LaunchTransMmaWith(GemvParams p, const GemvTilePlan& plan, cudaStream_t stream) {
  p.splits = plan.splits;
  p.rows_per_split = plan.rows_per_split;
  const dim3 grid(unsigned(plan.tiles * plan.splits));
  return LaunchClustered(GemvTransMmaKernel<T, kChunks>, p, grid, unsigned(plan.splits), 1, stream);
}

// A cp.async ring kernel (its ring in dynamic shared memory) on `plan`.
template <typename Kernel>
cudaError_t LaunchRingWith(Kernel kernel, int smem_bytes, GemvParams p, const GemvTilePlan& plan,
                           cudaStream_t stream) {
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
      e != cudaSuccess)
    return e;
  p.splits = plan.splits;
  p.rows_per_split = plan.rows_per_split;
  return LaunchClustered(kernel, p, dim3(unsigned(plan.tiles * plan.splits)), unsigned(plan.splits),
                         1, stream, smem_bytes);
}

template <typename T, int kChunks>
cudaError_t LaunchTransRingWith(const GemvParams& p, const GemvTilePlan& plan,
                                cudaStream_t stream) {
  return LaunchRingWith(GemvTransRingKernel<T, kChunks>, TransRingConfig<kChunks>::kSmemBytes, p,
                        plan, stream);
}

// Whether A's rows and x allow the 16-byte copies of the cp.async kernel.
bool TransRingRows(const GemvArgs& args) {
  return Aligned(args.a, 16) && args.lda % 8 == 0 && Aligned(args.x, 16);
}

// CTAs resident on the device at once: the cp.async kernel one per SM, the
// register kernel as its 128 registers allow.
template <typename T>
int64_t TransMmaResident(bool ring) {
  return ring ? int64_t(SmCount()) : ResidentBlocks<GemvTransMmaKernel<T, 2>>();
}

template <typename T>
cudaError_t LaunchTransMma(const GemvArgs& args, const GemvParams& p, int only_cols,
                           cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return cudaErrorInvalidValue;
  } else {
    const bool ring = TransRingRows(args);
    const GemvTilePlan plan =
        ChooseGemvTilePlan(args.m, args.k, TransMmaResident<T>(ring), only_cols);
    if (ring)
      return plan.tile == 128 ? LaunchTransRingWith<T, 2>(p, plan, stream)
                              : LaunchTransRingWith<T, 1>(p, plan, stream);
    return plan.tile == 128 ? LaunchTransMmaWith<T, 2>(p, plan, stream)
                            : LaunchTransMmaWith<T, 1>(p, plan, stream);
  }
}

// ---- mma_ring. ----

// Clusters of `cluster_x` CTAs of `kernel` (kThreads threads, `smem_bytes` of
// dynamic shared memory each) that the current device runs at once: a
// cluster's CTAs must share a GPC, so this can be fewer than the SMs divided
// by the cluster size. Asked once per device, kernel and size.
template <typename Kernel>
int64_t ActiveClusters(Kernel kernel, unsigned cluster_x, int smem_bytes) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, unsigned>, int64_t> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::max<int64_t>(1, SmCount() / cluster_x);
  }
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel), cluster_x);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(cluster_x);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = size_t(smem_bytes);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess || clusters < 1) {
    (void)cudaGetLastError();
    clusters = std::max(1, SmCount() / int(cluster_x));
  }
  std::lock_guard<std::mutex> lock(mu);
  known[key] = clusters;
  return clusters;
}

// The persistent grid: as many clusters as run at once, tiles at most.
template <typename T, int kTileRows, int kStepK>
cudaError_t LaunchMmaRingWith(GemvParams p, cudaStream_t stream) {
  using Cfg = RingConfig<kTileRows, kStepK>;
  const GemvTilePlan plan = ChooseGemvTilePlan(p.m, p.k, SmCount(), kTileRows, Cfg::kStepK);
  auto kernel = GemvRingKernel<T, kTileRows, kStepK>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           Cfg::kSmemBytes);
      e != cudaSuccess)
    return e;
  const int64_t clusters =
      std::min<int64_t>(plan.tiles, ActiveClusters(kernel, unsigned(plan.splits), Cfg::kSmemBytes));
  p.splits = plan.splits;
  p.rows_per_split = plan.rows_per_split;
  return LaunchClustered(kernel, p, dim3(unsigned(clusters * plan.splits)), unsigned(plan.splits),
                         1, stream, Cfg::kSmemBytes);
}

// Tiles of 16 rows read 512 bytes of each row per step, tiles of 32 rows
// 256: two stages of 8 KiB of A per warp either way.
template <typename T>
cudaError_t LaunchMmaRing(const GemvParams& p, int only_tile, cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return cudaErrorInvalidValue;
  } else {
    const int tile = only_tile != 0 ? only_tile : ChooseGemvRingTile(p.m, SmCount());
    if (tile == 16) return LaunchMmaRingWith<T, 16, 256>(p, stream);
    return LaunchMmaRingWith<T, 32, 128>(p, stream);
  }
}

// ---- the vendor fallback. ----
// cublasGemmEx (fp32 compute, no TF32, no reduced-precision split-K
// reduction, default atomics mode: deterministic) on the caller's stream,
// for the classes where our kernels still lose (see
// heuristics/gemv_heuristics.h). Row-major y^T = x^T op(A)^T is, column-major,
// Y' [ncols, m] = X' [ncols, k] * op(A)': A row-major with stride lda is
// column-major [lda, rows], used as is (A x) or transposed (A^T x).
// Handles: cublas_handles.h (this file's own pool).
cudaError_t LaunchCublas(const GemvArgs& args, cudaStream_t stream) {
  static CublasHandles* const handles = new CublasHandles();  // lives as long as the process
  cublasHandle_t h = handles->Get(stream);
  if (h == nullptr) return cudaErrorNotReady;
  const float alpha = args.alpha, beta = args.beta;
  const cudaDataType_t t = CublasType(args.dtype);
  const cublasStatus_t st = cublasGemmEx(
      h, CUBLAS_OP_N, args.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, args.ncols, int(args.m),
      int(args.k), &alpha, args.x, t, args.ncols, args.a, t, int(args.lda), &beta, args.y,
      CublasType(args.y_type), args.ncols, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st == CUBLAS_STATUS_SUCCESS) return cudaGetLastError();
  return st == CUBLAS_STATUS_INVALID_VALUE || st == CUBLAS_STATUS_NOT_SUPPORTED
             ? cudaErrorInvalidValue
             : cudaErrorLaunchFailure;
}

template <typename T>
cudaError_t LaunchTyped(const GemvArgs& args, const VariantInfo& info, void* workspace,
                        cudaStream_t stream) {
  GemvParams p{};
  p.a = args.a;
  p.x = args.x;
  p.y = args.y;
  p.m = args.m;
  p.k = args.k;
  p.lda = args.lda;
  p.ncols = args.ncols;
  p.y_type = static_cast<int>(args.y_type);
  p.alpha = args.alpha;
  p.beta = args.beta;
  const unsigned row_blocks = unsigned(CeilDiv(args.m, kWarpsPerBlock));
  switch (info.kind) {
    case Kind::kWarpRow:
      GemvWarpRowKernel<T><<<row_blocks, kThreads, 0, stream>>>(p);
      break;
    case Kind::kVec16:
      GemvVec16Kernel<T><<<row_blocks, kThreads, 0, stream>>>(p);
      break;
    case Kind::kSmemX:
      switch (info.param) {
        case 512: GemvSmemXKernel<T, 512><<<row_blocks, kThreads, 0, stream>>>(p); break;
        case 1024: GemvSmemXKernel<T, 1024><<<row_blocks, kThreads, 0, stream>>>(p); break;
        case 2048: GemvSmemXKernel<T, 2048><<<row_blocks, kThreads, 0, stream>>>(p); break;
        default: GemvSmemXKernel<T, 4096><<<row_blocks, kThreads, 0, stream>>>(p); break;
      }
      break;
    case Kind::kBatched:
      return LaunchBatchedAny<T, false>(p, info.param, stream);
    case Kind::kScalar:
      return LaunchBatchedAny<T, true>(p, info.param, stream);
    case Kind::kMma:
      return LaunchMma<T>(p, info.param, stream);
    case Kind::kMmaRing:
      return LaunchMmaRing<T>(p, info.param, stream);
    case Kind::kCublas:
      return LaunchCublas(args, stream);
    case Kind::kTransMma:
      return LaunchTransMma<T>(args, p, info.param, stream);
    case Kind::kTransNaive:
      GemvTransNaiveKernel<T><<<unsigned(CeilDiv(args.m, kThreads)), kThreads, 0, stream>>>(p);
      break;
    case Kind::kTransSplit:
    case Kind::kTransWide: {
      const TransPlan plan = info.kind == Kind::kTransWide ? PlanTrans<T, true>(args) : PlanTrans<T, false>(args);
      p.rows_per_split = plan.rows_per_split;
      p.splits = plan.splits;
      p.cluster = plan.cluster;
      if (plan.splits > 1 && !plan.cluster) {
        if (workspace == nullptr) return cudaErrorInvalidValue;
        p.counters = static_cast<unsigned*>(workspace);
        p.partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.counter_bytes);
        const cudaError_t err = cudaMemsetAsync(p.counters, 0, plan.tiles * sizeof(unsigned), stream);
        if (err != cudaSuccess) return err;
      }
      return plan.launch(p, dim3(unsigned(plan.tiles), unsigned(plan.splits)), stream);
    }
  }
  return cudaGetLastError();
}

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

}  // namespace

const std::vector<std::string>& GemvVariants() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& info : kVariantTable) v.emplace_back(info.name);
    return v;
  }();
  return names;
}

Support CanImplementGemv(const GemvArgs& args, std::string_view variant) {
  const VariantInfo* info = Find(args, variant);
  if (info == nullptr) return Support::No("unknown GEMV variant '" + std::string(variant) + "'");
  if (!ValidDType(args.dtype) || !ValidDType(args.y_type)) return Support::No("unknown dtype");
  if (args.m < 1 || args.k < 1) return Support::No("m and k must be at least 1");
  if (args.ncols < 1 || args.ncols > 8) return Support::No("ncols must be in 1..8");
  if (args.a == nullptr || args.x == nullptr || args.y == nullptr) return Support::No("null pointer");
  if (args.lda < (args.trans_a ? args.m : args.k))
    return Support::No(args.trans_a ? "lda must be >= m for a transposed A ([k, m])" : "lda must be >= k");
  if (args.m * args.ncols >= (int64_t(1) << 40) || args.k * args.ncols >= (int64_t(1) << 40))
    return Support::No("too large");
  if (info->kind == Kind::kCublas) {
    if (!CublasTakes(args))
      return Support::No("cublas writes y in the input dtype or fp32 only");
    if (args.m > 0x7fffffff || args.k > 0x7fffffff || args.lda > 0x7fffffff)
      return Support::No("cublas takes 32-bit sizes only");
    return Support::Yes();
  }
  const bool trans_kind = info->kind == Kind::kTransNaive || info->kind == Kind::kTransSplit ||
                          info->kind == Kind::kTransWide || info->kind == Kind::kTransMma;
  if (trans_kind != args.trans_a)
    return Support::No(std::string(info->name) + (trans_kind ? " computes A^T x only (trans_a = true)"
                                                             : " computes A x only (trans_a = false)"));
  switch (info->kind) {
    case Kind::kVec16:
    case Kind::kSmemX:
      if (args.ncols != 1) return Support::No(std::string(info->name) + " takes one column of x; use batched");
      [[fallthrough]];
    case Kind::kBatched:
      if (!VectorFriendly(args))
        return Support::No(std::string(info->name) +
                           " needs A and x 16-byte aligned and lda a multiple of 16 bytes");
      break;
    case Kind::kTransMma:
      if (args.dtype == DType::kF32)
        return Support::No(std::string(info->name) + " runs fp16 and bf16 only");
      if (!Aligned(args.a, 2) || !Aligned(args.x, 2))
        return Support::No(std::string(info->name) + " needs A and x aligned to their elements");
      if (CeilDiv(args.m, 64) * kGemvMaxClusterSplits > 0x7fffffff)
        return Support::No("m too large for one grid");
      break;
    case Kind::kMma:
      if (args.dtype == DType::kF32)
        return Support::No(std::string(info->name) + " runs fp16 and bf16 only");
      if (!Aligned(args.a, 16) || args.lda % 8 != 0)
        return Support::No(std::string(info->name) +
                           " needs A 16-byte aligned and lda a multiple of 16 bytes");
      break;
    case Kind::kMmaRing:
      if (args.dtype == DType::kF32)
        return Support::No(std::string(info->name) + " runs fp16 and bf16 only");
      if (!VectorFriendly(args))
        return Support::No(std::string(info->name) +
                           " needs A and x 16-byte aligned and lda a multiple of 16 bytes");
      break;  // a persistent grid: any m
    default:
      break;
  }
  if (info->kind == Kind::kWarpRow || info->kind == Kind::kVec16 || info->kind == Kind::kSmemX) {
    if (CeilDiv(args.m, kWarpsPerBlock) > 0x7fffffff) return Support::No("m too large for one grid");
  }
  if (info->kind == Kind::kTransNaive && CeilDiv(args.m, kThreads) > 0x7fffffff)
    return Support::No("m too large for one grid");
  return Support::Yes();
}

std::string GemvVariantName(const GemvArgs& args, std::string_view variant) {
  if (!CanImplementGemv(args, variant)) return {};
  return Find(args, variant)->name;
}

size_t GemvWorkspaceBytes(const GemvArgs& args, std::string_view variant) {
  const VariantInfo* info = Find(args, variant);
  if (info == nullptr || !CanImplementGemv(args, variant)) return 0;
  if (info->kind != Kind::kTransSplit && info->kind != Kind::kTransWide) return 0;
  return PlanTransAny(args, info->kind == Kind::kTransWide).workspace_bytes;
}

cudaError_t LaunchGemv(const GemvArgs& args, std::string_view variant, void* workspace,
                       cudaStream_t stream) {
  if (!CanImplementGemv(args, variant)) return cudaErrorInvalidValue;
  const VariantInfo& info = *Find(args, variant);
  switch (args.dtype) {
    case DType::kF32: return LaunchTyped<float>(args, info, workspace, stream);
    case DType::kF16: return LaunchTyped<__half>(args, info, workspace, stream);
    default: return LaunchTyped<__nv_bfloat16>(args, info, workspace, stream);
  }
}

}  // namespace gpucompute::kernels
