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
//   cublas       the vendor fallback (cublasGemmEx, fp32 compute, no
//                reduced-precision split-K) where ours still lose: A^T x
//                (trans_split 0.41-0.74x of the vendor: the k split over
//                many blocks leaves a long serial combine in the last block
//                of a tile, bf16 1024x50000 63.3 against 26.6; and at 4..8
//                columns its FMAs and conversions are the limit) and
//                fp16/bf16 with 5..8 columns.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <type_traits>

#include "gpucompute/kernels/gemv.h"
#include "heuristics/gemv_heuristics.h"
#include "launch_util.h"

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
  // trans_split only.
  int64_t rows_per_split;  // rows of the stored A ([k, m]) per split
  int splits;
  float* partial;      // [splits][m][ncols] fp32 partial sums
  unsigned* counters;  // one ticket counter per column tile, zero at launch
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
// trans_split / trans_wide: op(A) = A^T, A stored [k, m]. A block owns a
// column tile of 32 * kVw * kQ columns and a range of rows (one split of k);
// lane tx reads kVw consecutive columns at kQ places 32 * kVw apart, so that a
// warp reads kQ * 32 * kVw contiguous elements of a row; warp ty takes rows
// ty, ty + 8, ...

template <typename T, int kNcols, int kVw, int kQ>
struct TransSplitConfig {
  static constexpr int kTileM = kWarpSize * kVw * kQ;  // (TILE_M) columns per block
  static constexpr int kRowStep = kWarpsPerBlock;      // warps of a block interleave rows
  static constexpr int kUnroll = kQ >= 4 ? 1 : 4 / kQ;  // rows in flight per thread
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
  // One warp per output; lanes stride over the splits, then a fixed-order
  // shuffle tree: the same order every launch.
  const int lane = tx;
  for (int o = ty; o < Cfg::kOutputs; o += kWarpsPerBlock) {
    int64_t col;
    int c;
    if (!output_index(o, &col, &c)) continue;
    float s = 0.f;
    for (int sp = lane; sp < p.splits; sp += kWarpSize)
      s += __ldcg(p.partial + (int64_t(sp) * p.m + col) * p.ncols + c);
    s = WarpSum(s);
    if (lane == 0) WriteY(p, col * p.ncols + c, s);
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// ---------------------------------------------------------------------------
// Host side.

enum class Kind {
  kWarpRow, kVec16, kSmemX, kBatched, kScalar, kMma, kTransNaive, kTransSplit, kTransWide,
  kCublas
};

struct VariantInfo {
  const char* name;
  Kind kind;
  int param;  // smem_x: TILE_V; batched, scalar, mma: warps per row group (kSplit)
};

constexpr VariantInfo kVariantTable[] = {
    {"warp_row", Kind::kWarpRow, 0},      {"vec16", Kind::kVec16, 0},
    {"smem_x", Kind::kSmemX, 2048},       {"smem_x_t512", Kind::kSmemX, 512},
    {"smem_x_t1024", Kind::kSmemX, 1024}, {"smem_x_t4096", Kind::kSmemX, 4096},
    {"batched", Kind::kBatched, 1},       {"batched_w2", Kind::kBatched, 2},
    {"batched_w4", Kind::kBatched, 4},    {"batched_w8", Kind::kBatched, 8},
    {"scalar", Kind::kScalar, 1},         {"scalar_w2", Kind::kScalar, 2},
    {"scalar_w4", Kind::kScalar, 4},      {"scalar_w8", Kind::kScalar, 8},
    {"mma", Kind::kMma, 1},               {"mma_w2", Kind::kMma, 2},
    {"mma_w4", Kind::kMma, 4},            {"mma_w8", Kind::kMma, 8},
    {"trans_naive", Kind::kTransNaive, 0}, {"trans_split", Kind::kTransSplit, 0},
    {"trans_wide", Kind::kTransWide, 0},  {"cublas", Kind::kCublas, 0},
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

using TransLauncher = void (*)(const GemvParams&, dim3, cudaStream_t);

struct TransPlan {
  TransLauncher launch = nullptr;
  int64_t tiles = 0;
  int splits = 1;
  int64_t rows_per_split = 0;
  size_t counter_bytes = 0;    // at the start of the workspace
  size_t workspace_bytes = 0;  // 0 when splits == 1
};

template <typename T, int kNcols, int kVw, int kQ>
void LaunchTransSplit(const GemvParams& p, dim3 grid, cudaStream_t stream) {
  GemvTransSplitKernel<T, kNcols, kVw, kQ><<<grid, kThreads, 0, stream>>>(p);
}

constexpr int64_t kMinRowsPerSplit = 128;

template <typename T, int kNcols, int kVw, int kQ>
TransPlan MakeTransPlan(const GemvArgs& args) {
  TransPlan plan;
  plan.launch = &LaunchTransSplit<T, kNcols, kVw, kQ>;
  plan.tiles = CeilDiv(args.m, TransSplitConfig<T, kNcols, kVw, kQ>::kTileM);
  const int64_t resident = ResidentBlocks<GemvTransSplitKernel<T, kNcols, kVw, kQ>>();
  int64_t splits = std::max<int64_t>(1, resident / plan.tiles);
  splits = std::min({splits, std::max<int64_t>(1, args.k / kMinRowsPerSplit), int64_t(65535)});
  plan.rows_per_split = CeilDiv(CeilDiv(args.k, splits), kWarpsPerBlock) * kWarpsPerBlock;
  plan.splits = int(CeilDiv(args.k, plan.rows_per_split));
  if (plan.splits > 1) {
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

// ---- the vendor fallback. ----
// cublasGemmEx (fp32 compute, no TF32, no reduced-precision split-K
// reduction, default atomics mode: deterministic) on the caller's stream,
// for the classes where our kernels still lose (see
// heuristics/gemv_heuristics.h). Row-major y^T = x^T op(A)^T is, column-major,
// Y' [ncols, m] = X' [ncols, k] * op(A)': A row-major with stride lda is
// column-major [lda, rows], used as is (A x) or transposed (A^T x).
// One handle per (device, stream), made on first use and kept for the
// process's life: the server's streams are its lanes, each leased by one
// shard at a time, so a handle is never used by two threads at once, and
// their number (and cuBLAS's workspace per handle) stays bounded by the
// lanes.
class CublasHandles {
 public:
  // The handle for `stream` on the current device; null when cuBLAS cannot
  // make one.
  cublasHandle_t Get(cudaStream_t stream) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find({device, stream});
    if (it != handles_.end()) return it->second;
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return nullptr;
    // Split-K partial sums in fp32 too: without this, cuBLAS may reduce them
    // in the 16-bit output type (errors of ~1% at k = 1000, far from our
    // kernels' fp32 accumulation).
    if (cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(h, cublasMath_t(CUBLAS_DEFAULT_MATH |
                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)) !=
            CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(h);
      return nullptr;
    }
    handles_[{device, stream}] = h;
    return h;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int, cudaStream_t>, cublasHandle_t> handles_;
};

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
    case Kind::kCublas:
      return LaunchCublas(args, stream);
    case Kind::kTransNaive:
      GemvTransNaiveKernel<T><<<unsigned(CeilDiv(args.m, kThreads)), kThreads, 0, stream>>>(p);
      break;
    case Kind::kTransSplit:
    case Kind::kTransWide: {
      const TransPlan plan = info.kind == Kind::kTransWide ? PlanTrans<T, true>(args) : PlanTrans<T, false>(args);
      p.rows_per_split = plan.rows_per_split;
      p.splits = plan.splits;
      if (plan.splits > 1) {
        if (workspace == nullptr) return cudaErrorInvalidValue;
        p.counters = static_cast<unsigned*>(workspace);
        p.partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.counter_bytes);
        const cudaError_t err = cudaMemsetAsync(p.counters, 0, plan.tiles * sizeof(unsigned), stream);
        if (err != cudaSuccess) return err;
      }
      plan.launch(p, dim3(unsigned(plan.tiles), unsigned(plan.splits)), stream);
      break;
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
  const bool trans_kind =
      info->kind == Kind::kTransNaive || info->kind == Kind::kTransSplit || info->kind == Kind::kTransWide;
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
    case Kind::kMma:
      if (args.dtype == DType::kF32)
        return Support::No(std::string(info->name) + " runs fp16 and bf16 only");
      if (!Aligned(args.a, 16) || args.lda % 8 != 0)
        return Support::No(std::string(info->name) +
                           " needs A 16-byte aligned and lda a multiple of 16 bytes");
      break;
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
