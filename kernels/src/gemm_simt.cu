// GEMM in exact fp32 on the CUDA cores (FFMA): C = alpha * op(A) * op(B) + beta * C,
// row-major, strided batch, any M, N, K >= 1 (edges are handled here, never padded).
//
// The two numbers, for M = N = K = 4096 (one batch, beta = 0):
//   FLOPs that must be done: 2 * M * N * K = 137.4 GFLOP (8192^3: 1.10 TFLOP);
//   bytes that must move:    4 * (M*K + K*N + M*N) = 201 MB (8192^3: 805 MB).
//   Floor on the H200: FFMA peak 132 SMs * 128 lanes * 2 FLOP * 1.98 GHz ~ 67 TFLOP/s
//   -> 2.05 ms (8192^3: 16.4 ms); the bytes take 0.05 ms at 4.2 TB/s, so every
//   shape benchmarked here is compute-bound (arithmetic intensity >= 270 FLOP/B).
//   cuBLAS SGEMM reaches ~51 TFLOP/s (0.76 of the FFMA peak) on these sizes.
//
// The ladder (every rung selectable by name; "" picks the fastest for the shape).
// MEASURED on the H200, NN, TFLOP/s at 4096^3 / 8192^3 and the ratio to cuBLAS
// SGEMM (tf32 off, 51.3 / 51.1 TFLOP/s) in the same run; the full table, odd
// shapes included, is in kernels/bench/results/gemm_simt.md.
//   naive     one thread per C element, K loop straight from global memory.
//             5.5 / 5.5 TFLOP/s (0.11x).
//   smem32    32x32 tiles of A and B in shared memory (coalesced loads, padded to
//             33 columns), each element reused 32 times; 1024 threads per block.
//             6.0 / 6.0 (0.12x): still two shared loads per FFMA.
//   reg8x8    128x128 block tile, tile_k 8, 256 threads, each keeps an 8x8 block
//             of C in registers (64 FFMA per 16 shared loads); scalar loads, A kept
//             [m][k] in shared memory, 4-way bank conflicts on the B reads.
//             14.0 / 14.0 (0.27x).
//   vec4      16-byte global loads (scalar fallback for unaligned operands and
//             edges), A stored transposed [k][m] with 4 floats of padding so the
//             transposing stores are conflict free, 16-byte shared loads of 4x4
//             sub-blocks spaced half a tile apart. 34.8 / 34.7 (0.68x).
//   dbuf      two shared-memory stages (global loads for tile t+1 in flight while
//             tile t is computed) and ping-pong register fragments; one barrier per
//             k-tile. 42.8 / 43.5 (0.83x / 0.85x); 128 registers, FMA pipe 66%.
//   swizzle   dbuf with grouped block rasterisation (8 tile-rows per group).
//             42.4 / 42.6 (0.83x): no gain (groups of 4 and 16 neither), so the
//             later rungs keep the plain raster.
//   warptile  warps own 64x64 sub-tiles, lanes 4x8, each lane 16x8 of C (128 FFMA
//             per 6 conflict-free 16-byte shared loads, ~245 registers, 8 warps
//             per SM); block tile per problem: 256x128 for large C, 128x128, or
//             64x128 with 8x8 per lane (4 blocks per SM) when larger tiles leave
//             SMs idle. 47.0 / 47.3 (0.92x / 0.93x); FMA pipe 73%, 0 shared-load
//             bank conflicts. The warp layout alone (128x128, 8x8 per lane) measured
//             42.3 / 42.5, no better than dbuf: the gain is the larger lane tile.
//   splitk    warptile with K cut into slices (partials in the caller's
//             workspace, then one reduction that applies alpha and beta), for
//             small M*N and large K; slices run on 128x128 tiles or 64x128 tiles
//             with 8x16 per lane. 1024x1024x16384: 45.2 TFLOP/s (0.87x) against
//             27.6 (0.53x) for one slice.
//   small tiles and padded rows (warptile and splitk; sweep-gemm.md run 18,
//             H100, server path): small problems take 64x64 or 32x32 tiles with
//             4x4 per lane (8 or 2 warps a block), so that they spread over
//             more SMs: 128^3 8.5 -> 4.4 us, 256^3 10.9 -> 5.5, 512^3 21.0 ->
//             14.4 (cuBLAS 4.4, 6.5, 12.7); operands whose rows are not on
//             16 bytes are copied with padded rows first (PadBytes):
//             4097x4095x4099 0.86x -> 0.91x, 6001x3001x5003 0.76x -> 0.85x.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <iterator>

#include "gemm_addend.h"
#include "gpucompute/kernels/gemm.h"
#include "launch_util.h"

namespace gpucompute::kernels {
namespace {

// ---------------------------------------------------------------------------
// Parameters shared by every kernel of the ladder.
// ---------------------------------------------------------------------------
struct SimtParams {
  int m = 0, n = 0, k = 0;
  int64_t batch = 1;
  int splits = 1;       // K slices; output slice s of batch b goes to c + b*stride_c + s*stride_split
  int k_per_split = 0;  // multiple of the tile's BK when splits > 1
  const float* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const float* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  float* c = nullptr;
  int64_t ldc = 0, stride_c = 0, stride_split = 0;
  // Where beta * C is read (only with beta != 0, hence one K slice): c, or
  // another array of C's layout (ldc; batch stride stride_c_src, 0 for one C
  // for the whole batch).
  const float* c_src = nullptr;
  int64_t stride_c_src = 0;
  float alpha = 1.f, beta = 0.f;
  bool trans_a = false, trans_b = false;
  bool vec_a = false, vec_b = false, vec_c = false;  // 16-byte accesses allowed
  int tiles_m = 0, tiles_n = 0;
  int swizzle_group = 1;  // tile-rows per raster group (1: plain row-major raster)
};

// Batch/split iteration count and the grid's z extent (<= 65535, kernels loop).
__host__ __device__ inline int64_t ZCount(const SimtParams& p) { return p.batch * p.splits; }
inline unsigned GridZ(const SimtParams& p) {
  return static_cast<unsigned>(std::min<int64_t>(ZCount(p), 65535));
}

// Maps a linear block index to a (tile row, tile column); `group` tile-rows are
// walked column by column so that concurrently running blocks share B tiles
// across the group and A tiles along it.
__device__ __forceinline__ void TileCoords(int bid, int tiles_m, int tiles_n, int group, int* tm,
                                           int* tn) {
  const int per_group = group * tiles_n;
  const int g = bid / per_group;
  const int first = g * group;
  const int rows = min(tiles_m - first, group);
  const int r = bid - g * per_group;
  *tm = first + r % rows;
  *tn = r / rows;
}

// alpha * acc + beta * *c, with c read only when beta != 0.
__device__ __forceinline__ float Blend(float acc, const float* c, float alpha, float beta) {
  return beta == 0.f ? alpha * acc : fmaf(beta, *c, alpha * acc);
}

// Batch entry z's addend at element offset `at` of its C.
__device__ __forceinline__ const float* CSrc(const SimtParams& p, int64_t z, int64_t at) {
  return p.c_src + z * p.stride_c_src + at;
}

// ---------------------------------------------------------------------------
// Rung 1: naive. Block 32x8 threads covers an 8x32 tile of C.
// ---------------------------------------------------------------------------
constexpr int kNaiveRows = 8, kNaiveCols = 32;

__global__ void __launch_bounds__(256) NaiveKernel(const SimtParams p) {
  int tm, tn;
  TileCoords(blockIdx.x, p.tiles_m, p.tiles_n, 1, &tm, &tn);
  const int i = tm * kNaiveRows + threadIdx.y;
  const int j = tn * kNaiveCols + threadIdx.x;
  if (i >= p.m || j >= p.n) return;
  const int64_t sam = p.trans_a ? 1 : p.lda, sak = p.trans_a ? p.lda : 1;
  const int64_t sbk = p.trans_b ? 1 : p.ldb, sbn = p.trans_b ? p.ldb : 1;
  for (int64_t z = blockIdx.z; z < ZCount(p); z += gridDim.z) {
    const float* a = p.a + z * p.stride_a + i * sam;
    const float* b = p.b + z * p.stride_b + j * sbn;
    float acc = 0.f;
    for (int kk = 0; kk < p.k; ++kk) acc = fmaf(a[kk * sak], b[kk * sbk], acc);
    const int64_t at = int64_t(i) * p.ldc + j;
    p.c[z * p.stride_c + at] = Blend(acc, CSrc(p, z, at), p.alpha, p.beta);
  }
}

// ---------------------------------------------------------------------------
// Rung 2: 32x32 shared-memory tiles, one C element per thread.
// ---------------------------------------------------------------------------
constexpr int kSmemTile = 32;

__global__ void __launch_bounds__(1024) Smem32Kernel(const SimtParams p) {
  __shared__ float as[kSmemTile][kSmemTile + 1];  // (BLOCK_M, BLOCK_K)
  __shared__ float bs[kSmemTile][kSmemTile + 1];  // (BLOCK_K, BLOCK_N)
  int tm, tn;
  TileCoords(blockIdx.x, p.tiles_m, p.tiles_n, 1, &tm, &tn);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m0 = tm * kSmemTile, n0 = tn * kSmemTile;
  // Consecutive threads walk the operand's contiguous dimension.
  const int ar = p.trans_a ? tx : ty, ac = p.trans_a ? ty : tx;  // (m, k) in the tile
  const int bk = p.trans_b ? tx : ty, bn = p.trans_b ? ty : tx;  // (k, n) in the tile
  const int64_t sam = p.trans_a ? 1 : p.lda, sak = p.trans_a ? p.lda : 1;
  const int64_t sbk = p.trans_b ? 1 : p.ldb, sbn = p.trans_b ? p.ldb : 1;
  for (int64_t z = blockIdx.z; z < ZCount(p); z += gridDim.z) {
    const float* a = p.a + z * p.stride_a;
    const float* b = p.b + z * p.stride_b;
    float acc = 0.f;
    for (int k0 = 0; k0 < p.k; k0 += kSmemTile) {
      const int am = m0 + ar, ak = k0 + ac;
      as[ar][ac] = (am < p.m && ak < p.k) ? a[am * sam + ak * sak] : 0.f;
      const int bkk = k0 + bk, bnn = n0 + bn;
      bs[bk][bn] = (bkk < p.k && bnn < p.n) ? b[bkk * sbk + bnn * sbn] : 0.f;
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kSmemTile; ++kk) acc = fmaf(as[ty][kk], bs[kk][tx], acc);
      __syncthreads();
    }
    const int i = m0 + ty, j = n0 + tx;
    if (i < p.m && j < p.n) {
      const int64_t at = int64_t(i) * p.ldc + j;
      p.c[z * p.stride_c + at] = Blend(acc, CSrc(p, z, at), p.alpha, p.beta);
    }
  }
}

// ---------------------------------------------------------------------------
// Rung 3: register tiling, scalar loads. 16x16 threads, each an 8x8 block of C.
// ---------------------------------------------------------------------------
struct Reg8x8Config {
  static constexpr int kBM = 128, kBN = 128, kBK = 8;  // (BLOCK_M, BLOCK_N, BLOCK_K)
  static constexpr int kTM = 8, kTN = 8;                // (THREAD_M, THREAD_N)
  static constexpr int kThreads = (kBM / kTM) * (kBN / kTN);
  static constexpr int kLoadsA = kBM * kBK / kThreads;  // scalars per thread per tile
  static constexpr int kLoadsB = kBN * kBK / kThreads;
  static_assert(kThreads == 256, "one thread per 8x8 block of the 128x128 tile");
  static_assert(kBM * kBK % kThreads == 0 && kBN * kBK % kThreads == 0, "even tile loads");
};

__global__ void __launch_bounds__(Reg8x8Config::kThreads, 2) Reg8x8Kernel(const SimtParams p) {
  using Cfg = Reg8x8Config;
  __shared__ float as[Cfg::kBM][Cfg::kBK];  // (BLOCK_M, BLOCK_K): A as it lies for NN
  __shared__ float bs[Cfg::kBK][Cfg::kBN];  // (BLOCK_K, BLOCK_N)
  int tm, tn;
  TileCoords(blockIdx.x, p.tiles_m, p.tiles_n, 1, &tm, &tn);
  const int tid = threadIdx.x;
  const int ty = tid / (Cfg::kBN / Cfg::kTN), tx = tid % (Cfg::kBN / Cfg::kTN);
  const int m0 = tm * Cfg::kBM, n0 = tn * Cfg::kBN;
  const int64_t sam = p.trans_a ? 1 : p.lda, sak = p.trans_a ? p.lda : 1;
  const int64_t sbk = p.trans_b ? 1 : p.ldb, sbn = p.trans_b ? p.ldb : 1;
  for (int64_t z = blockIdx.z; z < ZCount(p); z += gridDim.z) {
    const float* a = p.a + z * p.stride_a;
    const float* b = p.b + z * p.stride_b;
    float acc[Cfg::kTM][Cfg::kTN] = {};
    for (int k0 = 0; k0 < p.k; k0 += Cfg::kBK) {
#pragma unroll
      for (int l = 0; l < Cfg::kLoadsA; ++l) {
        const int e = tid + l * Cfg::kThreads;
        // Consecutive threads follow A's contiguous dimension.
        const int r = p.trans_a ? e % Cfg::kBM : e / Cfg::kBK;
        const int c = p.trans_a ? e / Cfg::kBM : e % Cfg::kBK;
        const int gm = m0 + r, gk = k0 + c;
        as[r][c] = (gm < p.m && gk < p.k) ? a[gm * sam + gk * sak] : 0.f;
      }
#pragma unroll
      for (int l = 0; l < Cfg::kLoadsB; ++l) {
        const int e = tid + l * Cfg::kThreads;
        const int r = p.trans_b ? e % Cfg::kBK : e / Cfg::kBN;
        const int c = p.trans_b ? e / Cfg::kBK : e % Cfg::kBN;
        const int gk = k0 + r, gn = n0 + c;
        bs[r][c] = (gk < p.k && gn < p.n) ? b[gk * sbk + gn * sbn] : 0.f;
      }
      __syncthreads();
      // Not unrolled: unrolled, the compiler hoists the shared loads of every
      // k-step and spills the accumulators.
#pragma unroll 1
      for (int kk = 0; kk < Cfg::kBK; ++kk) {
        float ra[Cfg::kTM], rb[Cfg::kTN];
#pragma unroll
        for (int i = 0; i < Cfg::kTM; ++i) ra[i] = as[ty * Cfg::kTM + i][kk];
#pragma unroll
        for (int j = 0; j < Cfg::kTN; ++j) rb[j] = bs[kk][tx * Cfg::kTN + j];
#pragma unroll
        for (int i = 0; i < Cfg::kTM; ++i)
#pragma unroll
          for (int j = 0; j < Cfg::kTN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
      }
      __syncthreads();
    }
    float* c = p.c + z * p.stride_c;
#pragma unroll
    for (int i = 0; i < Cfg::kTM; ++i) {
      const int gm = m0 + ty * Cfg::kTM + i;
      if (gm >= p.m) continue;
#pragma unroll
      for (int j = 0; j < Cfg::kTN; ++j) {
        const int gn = n0 + tx * Cfg::kTN + j;
        if (gn < p.n) {
          const int64_t at = int64_t(gm) * p.ldc + gn;
          c[at] = Blend(acc[i][j], CSrc(p, z, at), p.alpha, p.beta);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Rungs 4-8: vectorised register-tiled kernels, one template.
// ---------------------------------------------------------------------------
// Each thread owns kTM x kTN of C as sub-blocks of 4x4: rows row0 + c*kRowStep +
// {0..3} (c < kTM/4), columns col0 + c*kColStep + {0..3} (c < kTN/4), so that
// its shared reads are kTM/4 + kTN/4 16-byte loads per k.
//   kWarpLayout false: threads form a (BM/kTM) x (BN/kTN) grid over the tile,
//     the sub-blocks a tile fraction apart.
//   kWarpLayout true: warps form kWarpsM x kWarpsN; lanes form kLanesM x
//     (32/kLanesM) inside the warp, so a warp owns (kLanesM kTM) x
//     (32/kLanesM kTN) of C; a 16-byte shared load then touches kLanesM (A) or
//     32/kLanesM (B) distinct vectors of one k-row: one wavefront.
template <int kBM_, int kBN_, int kBK_, int kTM_, int kTN_, bool kWarpLayout_, int kLanesM_,
          int kWarpsM_, int kWarpsN_, bool kDoubleBuffer_, int kMinBlocks_, bool kInterior_>
struct TiledConfig {
  static constexpr int kBM = kBM_, kBN = kBN_, kBK = kBK_;  // (BLOCK_M, BLOCK_N, BLOCK_K)
  static constexpr int kTM = kTM_, kTN = kTN_;              // (THREAD_M, THREAD_N)
  static constexpr bool kWarpLayout = kWarpLayout_;
  static constexpr int kLanesM = kLanesM_, kLanesN = kWarpLayout ? 32 / kLanesM_ : 0;
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;
  static constexpr bool kDoubleBuffer = kDoubleBuffer_;
  static constexpr int kMinBlocks = kMinBlocks_;  // blocks per SM the registers must allow
  // Whole tiles of aligned operands take a load path without predicates. In the
  // 128x128 configurations with 8x8 per thread (at the 128-register cap) it
  // cost 5% (42.5 -> 40.3 TFLOP/s at 4096^3) and is off; the other
  // configurations were measured and tuned with it on.
  static constexpr bool kInterior = kInterior_;
  static constexpr int kStages = kDoubleBuffer ? 2 : 1;
  static constexpr int kThreads =
      kWarpLayout ? 32 * kWarpsM * kWarpsN : (kBM / kTM) * (kBN / kTN);
  static constexpr int kRowStep = (kWarpLayout ? kLanesM : kBM / kTM) * 4;
  static constexpr int kColStep = (kWarpLayout ? kLanesN : kBN / kTN) * 4;
  // 4 floats of padding per k-row: the transposing stores of a k-contiguous
  // operand hit 32 distinct banks, 16-byte alignment of the rows is kept.
  static constexpr int kLdA = kBM + 4, kLdB = kBN + 4;
  static constexpr int kLoadsA = kBM * kBK / 4 / kThreads;  // float4 per thread per tile
  static constexpr int kLoadsB = kBN * kBK / 4 / kThreads;
  static_assert(kBK % 4 == 0 && kTM % 4 == 0 && kTN % 4 == 0, "4x4 sub-blocks, 4-k vectors");
  static_assert(kBM * kBK % (4 * kThreads) == 0 && kBN * kBK % (4 * kThreads) == 0,
                "every thread loads the same number of float4 per tile");
  static_assert(kLoadsA >= 1 && kLoadsB >= 1, "every thread takes part in the loads");
  static_assert(!kWarpLayout || (32 % kLanesM == 0 && kBM == kWarpsM * kLanesM * kTM &&
                                 kBN == kWarpsN * kLanesN * kTN),
                "warps x lanes x thread tile cover the block tile");
  static_assert(kWarpLayout || (kBM % kTM == 0 && kBN % kTN == 0), "");
  static_assert(kThreads % 32 == 0, "");
};

// Configurations of the ladder. 8x8 per thread fits in 128 registers (2 blocks
// of 256 or 4 of 128 threads per SM); 16x8 per thread takes ~250 registers
// (8 warps per SM) for 128 FFMA per 6 shared loads instead of 64 per 4.
//                                 BM   BN  BK TM  TN  warp  lanesM wM wN dbuf  blk/SM interior
using Vec4Config = TiledConfig<128, 128, 8, 8, 8, false, 0, 0, 0, false, 2, false>;
using DbufConfig = TiledConfig<128, 128, 8, 8, 8, false, 0, 0, 0, true, 2, false>;
using Warp64Config = TiledConfig<64, 128, 8, 8, 8, true, 4, 2, 2, true, 4, true>;
using Warp128Config = TiledConfig<128, 128, 8, 16, 8, true, 4, 2, 2, true, 2, true>;
using Warp256Config = TiledConfig<256, 128, 8, 16, 8, true, 4, 4, 2, true, 1, true>;
using Warp64WideConfig = TiledConfig<64, 128, 8, 8, 16, true, 8, 1, 2, true, 4, true>;
// Small problems: 4x4 per thread, so that a tile of few outputs still has
// several warps (a 128^3 problem is 2 tiles of 64 x 128: 2 SMs busy).
using Warp64SmallConfig = TiledConfig<64, 64, 16, 4, 4, true, 4, 4, 2, true, 4, true>;
using Warp32SmallConfig = TiledConfig<32, 32, 16, 4, 4, true, 4, 2, 1, true, 8, true>;

// Global -> register -> shared movement of one operand tile, kBO x kBK, stored
// k-major [kBK][kBO + 4] in shared memory. kKContig: the operand's k index is
// contiguous in memory (A not transposed, B transposed), so each vector holds
// 4 consecutive k of one row and is stored transposed; otherwise each vector
// holds 4 consecutive m (or n) of one k and is stored as is.
template <int kBO, int kBK, int kThreads, bool kKContig>
struct TileLoader {
  static constexpr int kLoads = kBO * kBK / 4 / kThreads;
  static constexpr int kLd = kBO + 4;
  const float* ptr[kLoads];  // this thread's vector in the next k-tile
  int64_t step;              // pointer advance per k-tile
  int o[kLoads];             // m (or n) index within the tile of the vector's first element
  int kq[kLoads];            // k index within the tile of the vector's first element
  int o_limit;               // rows (or columns) left in the matrix from the tile start
  int k_end;
  bool vec;

  static __device__ __forceinline__ int O(int tid, int l) {
    const int v = tid + l * kThreads;
    return kKContig ? v / (kBK / 4) : (v % (kBO / 4)) * 4;
  }
  static __device__ __forceinline__ int Kq(int tid, int l) {
    const int v = tid + l * kThreads;
    return kKContig ? (v % (kBK / 4)) * 4 : v / (kBO / 4);
  }

  // `base` points at the batch's matrix, `ld` its row stride; the tile starts at
  // (o0, k_begin).
  __device__ __forceinline__ TileLoader(const float* base, int64_t ld, int o0, int o_total,
                                        int k_begin, int k_end_, bool vec_, int tid) {
    o_limit = o_total - o0;
    k_end = k_end_;
    vec = vec_;
    step = kKContig ? kBK : kBK * ld;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      o[l] = O(tid, l);
      kq[l] = Kq(tid, l);
      ptr[l] = kKContig ? base + int64_t(o0 + min(o[l], o_limit - 1)) * ld + k_begin + kq[l]
                        : base + int64_t(k_begin + kq[l]) * ld + o0 + o[l];
    }
  }

  // Next k-tile, starting at absolute k `k0`, into registers; zeros outside
  // the matrix, scalar loads where a vector is unaligned or crosses an edge.
  __device__ __forceinline__ void Load(int k0, float4 (&r)[kLoads]) {
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const float* q = ptr[l];
      const int k = k0 + kq[l];
      if (kKContig) {
        const bool o_ok = o[l] < o_limit;
        if (vec && o_ok && k + 3 < k_end) {
          r[l] = *reinterpret_cast<const float4*>(q);
        } else {
          r[l].x = (o_ok && k < k_end) ? q[0] : 0.f;
          r[l].y = (o_ok && k + 1 < k_end) ? q[1] : 0.f;
          r[l].z = (o_ok && k + 2 < k_end) ? q[2] : 0.f;
          r[l].w = (o_ok && k + 3 < k_end) ? q[3] : 0.f;
        }
      } else {
        const bool k_ok = k < k_end;
        const int left = o_limit - o[l];
        if (vec && k_ok && left >= 4) {
          r[l] = *reinterpret_cast<const float4*>(q);
        } else {
          r[l].x = (k_ok && left > 0) ? q[0] : 0.f;
          r[l].y = (k_ok && left > 1) ? q[1] : 0.f;
          r[l].z = (k_ok && left > 2) ? q[2] : 0.f;
          r[l].w = (k_ok && left > 3) ? q[3] : 0.f;
        }
      }
      ptr[l] += step;
    }
  }

  // Next k-tile when it lies wholly inside the matrix and vectors are aligned.
  __device__ __forceinline__ void LoadInterior(float4 (&r)[kLoads]) {
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      r[l] = *reinterpret_cast<const float4*>(ptr[l]);
      ptr[l] += step;
    }
  }

  __device__ __forceinline__ void Store(const float4 (&r)[kLoads], float* s) const {
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      if (kKContig) {
        s[(kq[l] + 0) * kLd + o[l]] = r[l].x;
        s[(kq[l] + 1) * kLd + o[l]] = r[l].y;
        s[(kq[l] + 2) * kLd + o[l]] = r[l].z;
        s[(kq[l] + 3) * kLd + o[l]] = r[l].w;
      } else {
        *reinterpret_cast<float4*>(&s[kq[l] * kLd + o[l]]) = r[l];
      }
    }
  }
};

template <class Cfg>
__device__ __forceinline__ void LoadFragments(const float* as, const float* bs, int kk, int row0,
                                              int col0, float (&fa)[Cfg::kTM],
                                              float (&fb)[Cfg::kTN]) {
#pragma unroll
  for (int c = 0; c < Cfg::kTM / 4; ++c) {
    const float4 v =
        *reinterpret_cast<const float4*>(&as[kk * Cfg::kLdA + row0 + c * Cfg::kRowStep]);
    fa[4 * c + 0] = v.x, fa[4 * c + 1] = v.y, fa[4 * c + 2] = v.z, fa[4 * c + 3] = v.w;
  }
#pragma unroll
  for (int c = 0; c < Cfg::kTN / 4; ++c) {
    const float4 v =
        *reinterpret_cast<const float4*>(&bs[kk * Cfg::kLdB + col0 + c * Cfg::kColStep]);
    fb[4 * c + 0] = v.x, fb[4 * c + 1] = v.y, fb[4 * c + 2] = v.z, fb[4 * c + 3] = v.w;
  }
}

template <int kTM, int kTN>
__device__ __forceinline__ void OuterProduct(const float (&fa)[kTM], const float (&fb)[kTN],
                                             float (&acc)[kTM][kTN]) {
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(fa[i], fb[j], acc[i][j]);
}

template <class Cfg, bool kAKContig, bool kBKContig>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) TiledKernel(const SimtParams p) {
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kBK = Cfg::kBK;
  constexpr int kTM = Cfg::kTM, kTN = Cfg::kTN;
  __shared__ __align__(16) float as[Cfg::kStages][kBK * Cfg::kLdA];  // (BLOCK_K, BLOCK_M + 4)
  __shared__ __align__(16) float bs[Cfg::kStages][kBK * Cfg::kLdB];  // (BLOCK_K, BLOCK_N + 4)
  const int tid = threadIdx.x;
  int row0, col0;
  if constexpr (Cfg::kWarpLayout) {
    const int warp = tid / 32, lane = tid % 32;
    row0 = (warp % Cfg::kWarpsM) * (Cfg::kLanesM * kTM) + (lane / Cfg::kLanesN) * 4;
    col0 = (warp / Cfg::kWarpsM) * (Cfg::kLanesN * kTN) + (lane % Cfg::kLanesN) * 4;
  } else {
    row0 = (tid / (kBN / kTN)) * 4;
    col0 = (tid % (kBN / kTN)) * 4;
  }
  int tm, tn;
  TileCoords(blockIdx.x, p.tiles_m, p.tiles_n, p.swizzle_group, &tm, &tn);
  const int m0 = tm * kBM, n0 = tn * kBN;
  // Whole tiles of aligned operands load without predicates.
  const bool interior =
      Cfg::kInterior && p.vec_a && p.vec_b && m0 + kBM <= p.m && n0 + kBN <= p.n;

  for (int64_t z = blockIdx.z; z < ZCount(p); z += gridDim.z) {
    const int64_t bi = z / p.splits;
    const int s = static_cast<int>(z - bi * p.splits);
    const int k_begin = s * p.k_per_split;
    const int k_end = min(p.k, k_begin + p.k_per_split);
    const int ntiles = k_end > k_begin ? (k_end - k_begin + kBK - 1) / kBK : 0;
    const int nfull = Cfg::kInterior && interior && k_end > k_begin ? (k_end - k_begin) / kBK : 0;

    // A as (o = m, k); B as (o = n, k).
    TileLoader<kBM, kBK, Cfg::kThreads, kAKContig> la(p.a + bi * p.stride_a, p.lda, m0, p.m,
                                                      k_begin, k_end, p.vec_a, tid);
    TileLoader<kBN, kBK, Cfg::kThreads, kBKContig> lb(p.b + bi * p.stride_b, p.ldb, n0, p.n,
                                                      k_begin, k_end, p.vec_b, tid);
    float4 ra[Cfg::kLoadsA], rb[Cfg::kLoadsB];
    float acc[kTM][kTN];
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) acc[i][j] = 0.f;

    if constexpr (Cfg::kDoubleBuffer) {
      if (ntiles > 0) {
        la.Load(k_begin, ra);
        lb.Load(k_begin, rb);
        la.Store(ra, as[0]);
        lb.Store(rb, bs[0]);
      }
      __syncthreads();
      for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
        const bool more = t + 1 < ntiles;
        if (Cfg::kInterior && t + 1 < nfull) {
          la.LoadInterior(ra);
          lb.LoadInterior(rb);
        } else if (more) {
          la.Load(k_begin + (t + 1) * kBK, ra);
          lb.Load(k_begin + (t + 1) * kBK, rb);
        }
        float fa[2][kTM], fb[2][kTN];
        LoadFragments<Cfg>(as[cur], bs[cur], 0, row0, col0, fa[0], fb[0]);
#pragma unroll
        for (int kk = 0; kk < kBK; ++kk) {
          if (kk + 1 < kBK)
            LoadFragments<Cfg>(as[cur], bs[cur], kk + 1, row0, col0, fa[(kk + 1) & 1],
                               fb[(kk + 1) & 1]);
          OuterProduct<kTM, kTN>(fa[kk & 1], fb[kk & 1], acc);
        }
        if (more) {
          la.Store(ra, as[cur ^ 1]);
          lb.Store(rb, bs[cur ^ 1]);
        }
        __syncthreads();
      }
    } else {
      for (int t = 0; t < ntiles; ++t) {
        la.Load(k_begin + t * kBK, ra);
        lb.Load(k_begin + t * kBK, rb);
        la.Store(ra, as[0]);
        lb.Store(rb, bs[0]);
        __syncthreads();
        // Not unrolled, for the same reason as in reg8x8.
#pragma unroll 1
        for (int kk = 0; kk < kBK; ++kk) {
          float fa[kTM], fb[kTN];
          LoadFragments<Cfg>(as[0], bs[0], kk, row0, col0, fa, fb);
          OuterProduct<kTM, kTN>(fa, fb, acc);
        }
        __syncthreads();
      }
    }

    // Epilogue: alpha * acc (+ beta * C), 16-byte accesses where aligned.
    float* c = p.c + bi * p.stride_c + s * p.stride_split;
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const int gm = m0 + row0 + (i / 4) * Cfg::kRowStep + (i % 4);
      if (gm >= p.m) continue;
      float* crow = c + int64_t(gm) * p.ldc;
      const float* srow = CSrc(p, bi, int64_t(gm) * p.ldc);  // read only with beta (s == 0)
#pragma unroll
      for (int h = 0; h < kTN / 4; ++h) {
        const int gn = n0 + col0 + h * Cfg::kColStep;
        float4 v = make_float4(p.alpha * acc[i][4 * h + 0], p.alpha * acc[i][4 * h + 1],
                               p.alpha * acc[i][4 * h + 2], p.alpha * acc[i][4 * h + 3]);
        if (p.vec_c && gn + 3 < p.n) {
          float4* cp = reinterpret_cast<float4*>(crow + gn);
          if (p.beta != 0.f) {
            const float4 old = *reinterpret_cast<const float4*>(srow + gn);
            v.x = fmaf(p.beta, old.x, v.x);
            v.y = fmaf(p.beta, old.y, v.y);
            v.z = fmaf(p.beta, old.z, v.z);
            v.w = fmaf(p.beta, old.w, v.w);
          }
          *cp = v;
        } else {
          const float vals[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (gn + j < p.n) {
              crow[gn + j] = p.beta == 0.f ? vals[j] : fmaf(p.beta, srow[gn + j], vals[j]);
            }
          }
        }
      }
    }
    __syncthreads();  // shared memory is reused by the next batch entry
  }
}

// Sums the split-K partials (workspace [batch][splits][m][n]) and applies
// alpha and beta. kVec: 4 consecutive columns per thread (n % 4 == 0, C aligned).
template <bool kVec>
__global__ void __launch_bounds__(256) SplitKReduceKernel(const SimtParams p, const float* ws) {
  const int64_t mn = int64_t(p.m) * p.n;
  const int width = kVec ? 4 : 1;
  const int64_t total = p.batch * mn / width;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = idx * width;
    const int64_t bi = e / mn;
    const int64_t r = e - bi * mn;
    const int64_t i = r / p.n, j = r - i * p.n;
    const float* src = ws + bi * p.splits * mn + r;
    float* dst = p.c + bi * p.stride_c + i * p.ldc + j;
    const float* old_at = CSrc(p, bi, i * p.ldc + j);
    if (kVec) {
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s = 0; s < p.splits; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(src + s * mn);
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
      float4 out = make_float4(p.alpha * sum.x, p.alpha * sum.y, p.alpha * sum.z, p.alpha * sum.w);
      if (p.beta != 0.f) {
        const float4 old = *reinterpret_cast<const float4*>(old_at);
        out.x = fmaf(p.beta, old.x, out.x);
        out.y = fmaf(p.beta, old.y, out.y);
        out.z = fmaf(p.beta, old.z, out.z);
        out.w = fmaf(p.beta, old.w, out.w);
      }
      *reinterpret_cast<float4*>(dst) = out;
    } else {
      float sum = 0.f;
      for (int s = 0; s < p.splits; ++s) sum += src[s * mn];
      *dst = Blend(sum, old_at, p.alpha, p.beta);
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------
enum class Rung { kNaive, kSmem32, kReg8x8, kVec4, kDbuf, kSwizzle, kWarptile, kSplitK };

const char* const kRungNames[] = {"naive", "smem32",   "reg8x8",   "vec4",
                                  "dbuf",  "swizzle", "warptile", "splitk"};

bool ParseVariant(std::string_view v, Rung* rung) {
  for (int i = 0; i < 8; ++i) {
    if (v == kRungNames[i]) {
      *rung = static_cast<Rung>(i);
      return true;
    }
  }
  return false;
}

// Raster group of the swizzle rung (tile-rows walked together). It did not pay
// on the H200 (42.5 -> 42.4 TFLOP/s at 4096^3, 43.4 -> 42.5 at 8192^3: the
// 60 MB L2 already holds the operand panels of a raster wave), so the later
// rungs keep the plain raster.
constexpr int kSwizzleGroup = 8;
// K per split never drops below this (short slices cost more in partial traffic
// than they win in parallelism). Up to 128 slices: with at most 16, a small C
// over a long K left most SMs idle (128x128x16384 as 2 tiles x 16 slices ran
// 0.19x cuBLAS, 256x256x65536 as 8 x 16 0.43x; sweep-gemm.md run 11); 64
// slices of at least 256: 0.56x and 0.88x (run 12).
constexpr int kMinKPerSplit = 128;
constexpr int kMaxSplits = 128;

// Tile configurations the warptile and splitk rungs choose from.
enum class TileShape { k256x128, k128x128, k64x128, k64x128Wide, k64x64, k32x32 };

struct ShapeInfo {
  TileShape shape;
  int bm, bn;
  int warps;          // per block
  int blocks_per_sm;  // resident blocks per SM the registers allow
  double efficiency;  // throughput at full occupancy, relative to 256x128 (4096^3, H200)
  bool for_splits;    // candidate for split-K
  bool for_one_slice;
};
constexpr ShapeInfo kShapes[] = {
    {TileShape::k256x128, 256, 128, 8, 1, 1.00, false, true},
    {TileShape::k128x128, 128, 128, 4, 2, 0.99, true, true},
    {TileShape::k64x128, 64, 128, 4, 4, 0.90, false, true},
    {TileShape::k64x128Wide, 64, 128, 2, 4, 0.95, true, false},
    // 16 FMA per two 16-byte shared loads: bound by shared memory.
    {TileShape::k64x64, 64, 64, 8, 4, 0.55, true, true},
    {TileShape::k32x32, 32, 32, 2, 8, 0.45, true, true},
};

// What a launch does: which kernel, tile, raster and K split.
struct Plan {
  Rung rung = Rung::kWarptile;
  TileShape shape = TileShape::k256x128;
  int swizzle_group = 1;
  int splits = 1;
  int k_per_split = 0;
};

// Relative time of a warp-tiled launch: the busiest SM's share of tile work in
// units of one 128x128xK tile (blocks are spread evenly; an SM holding fewer
// blocks than it could runs up to 16% slower, as measured for one block of
// four warps against two; fewer than four warps on an SM leave some of its
// four schedulers idle: sqrt(warps / 4) of the rate), plus, for split-K, the
// partial traffic and the reduction launch in the same unit (a 128x128xK tile
// at ~0.36 TFLOP/s per SM against ~3 TB/s).
double PlanCost(const GemmArgs& args, const ShapeInfo& info, int splits, int sms) {
  const int64_t blocks =
      CeilDiv(args.m, info.bm) * CeilDiv(args.n, info.bn) * args.batch * splits;
  const double unit = double(info.bm) * info.bn / (128.0 * 128.0) / splits;
  const int64_t per_sm = CeilDiv(blocks, sms);
  const double residency = double(std::min<int64_t>(per_sm, info.blocks_per_sm)) / info.blocks_per_sm;
  const int warps = static_cast<int>(std::min<int64_t>(per_sm, info.blocks_per_sm)) * info.warps;
  const double rate = info.efficiency * (1.0 - 0.16 * (1.0 - residency)) *
                      (warps < 4 ? std::sqrt(warps / 4.0) : 1.0);
  double cost = double(per_sm) * unit / rate;
  if (splits > 1) {
    const double tile_seconds = 2.0 * 128 * 128 * double(args.k) / 0.36e12;
    const double bytes = 4.0 * (splits + 1) * double(args.m) * args.n * args.batch;
    cost += (bytes / 3e12 + 4e-6) / tile_seconds;
  }
  return cost;
}

// Splits of K for `splits_wanted` slices: k_per_split a multiple of 8, no empty slice.
void SetSplits(const GemmArgs& args, int splits_wanted, Plan* plan) {
  const int64_t kps = CeilDiv(CeilDiv(args.k, splits_wanted), 8) * 8;
  plan->k_per_split = static_cast<int>(kps);
  plan->splits = static_cast<int>(CeilDiv(args.k, kps));
}

Plan MakePlan(const GemmArgs& args, Rung rung, bool auto_pick, int sms) {
  Plan plan;
  plan.rung = rung;
  plan.k_per_split = static_cast<int>(args.k);
  if (rung == Rung::kSwizzle) plan.swizzle_group = kSwizzleGroup;
  if (rung != Rung::kWarptile && rung != Rung::kSplitK) return plan;
  // Tile shape and split count with the least modelled cost (ties go to fewer
  // splits and larger tiles); "warptile" keeps one slice, "splitk" takes at
  // least two where K allows, "" takes either.
  const int max_splits = static_cast<int>(
      std::clamp<int64_t>(args.k / (rung == Rung::kSplitK && !auto_pick ? 8 : kMinKPerSplit), 1,
                          kMaxSplits));
  const int min_splits = (rung == Rung::kSplitK && !auto_pick && max_splits >= 2) ? 2 : 1;
  const int top = (rung == Rung::kWarptile && !auto_pick) ? 1 : max_splits;
  double best = 1e300;
  for (int s = min_splits; s <= top; ++s) {
    for (const ShapeInfo& info : kShapes) {
      if (s == 1 ? !info.for_one_slice : !info.for_splits) continue;
      const double cost = PlanCost(args, info, s, sms);
      if (cost < best * 0.99) {
        best = cost;
        plan.shape = info.shape;
        SetSplits(args, s, &plan);
      }
    }
  }
  if (plan.splits == 1) plan.k_per_split = static_cast<int>(args.k);
  plan.rung = plan.splits > 1 ? Rung::kSplitK : Rung::kWarptile;
  return plan;
}

bool Aligned16(const void* ptr, int64_t ld, int64_t stride, int64_t batch) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && ld % 4 == 0 && (batch == 1 || stride % 4 == 0);
}

SimtParams MakeParams(const GemmArgs& args) {
  SimtParams p;
  p.m = static_cast<int>(args.m);
  p.n = static_cast<int>(args.n);
  p.k = static_cast<int>(args.k);
  p.batch = args.batch;
  p.k_per_split = p.k;
  p.a = static_cast<const float*>(args.a);
  p.lda = args.lda;
  p.stride_a = args.stride_a;
  p.b = static_cast<const float*>(args.b);
  p.ldb = args.ldb;
  p.stride_b = args.stride_b;
  p.c = static_cast<float*>(args.c);
  p.ldc = args.ldc;
  p.stride_c = args.stride_c;
  const GemmAddend addend = ChooseGemmAddend(args);
  p.c_src = static_cast<const float*>(addend.ptr);
  p.stride_c_src = addend.stride;
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.trans_a = args.trans_a;
  p.trans_b = args.trans_b;
  p.vec_a = Aligned16(args.a, args.lda, args.stride_a, args.batch);
  p.vec_b = Aligned16(args.b, args.ldb, args.stride_b, args.batch);
  p.vec_c = GemmCAligned(args, 16);
  return p;
}

template <class Cfg>
cudaError_t LaunchTiled(SimtParams p, cudaStream_t stream) {
  p.tiles_m = static_cast<int>(CeilDiv(p.m, Cfg::kBM));
  p.tiles_n = static_cast<int>(CeilDiv(p.n, Cfg::kBN));
  const dim3 grid(static_cast<unsigned>(int64_t(p.tiles_m) * p.tiles_n), 1, GridZ(p));
  const dim3 block(Cfg::kThreads);
  // A is k-contiguous when not transposed, B when transposed.
  if (!p.trans_a && !p.trans_b) TiledKernel<Cfg, true, false><<<grid, block, 0, stream>>>(p);
  else if (!p.trans_a && p.trans_b) TiledKernel<Cfg, true, true><<<grid, block, 0, stream>>>(p);
  else if (p.trans_a && !p.trans_b) TiledKernel<Cfg, false, false><<<grid, block, 0, stream>>>(p);
  else TiledKernel<Cfg, false, true><<<grid, block, 0, stream>>>(p);
  return cudaGetLastError();
}

size_t PartialsBytes(const GemmArgs& args, const Plan& plan) {
  if (plan.splits <= 1) return 0;
  return sizeof(float) * size_t(plan.splits) * size_t(args.batch) * size_t(args.m) * size_t(args.n);
}

// --- Operands whose rows are not on 16 bytes (odd K or N, or an unaligned
// base) take the kernels' element-by-element loads: 999^3 ran 90 us against
// cuBLAS's 51, 1000x3000x777 144 against 121 (H100, sweep-gemm.md). Where the
// problem is large enough that a copy is cheap beside it, such an operand is
// first copied into the workspace with its rows padded to 16 bytes
// (cudaMemcpy2DAsync), and the kernels read the copy with 16-byte loads.
constexpr double kPadMinVolume = 134217728.0;  // batch * m * n * k, 2^27 (512^3)
constexpr int64_t kPadMaxCopies = 64;          // one 2-D copy per batch entry, at most

// One operand as stored: `rows` rows of `cols` floats, `ld` apart, per batch
// entry `stride` apart (`count` entries stored; 1 when shared).
struct OperandRows {
  const void* ptr;
  int64_t rows, cols, ld, stride, count;
};
OperandRows StoredRows(const void* ptr, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                       int64_t batch) {
  return {ptr, rows, cols, ld, stride, batch > 1 && stride != 0 ? batch : 1};
}
OperandRows RowsA(const GemmArgs& a) {  // [m][k], or [k][m] transposed
  return StoredRows(a.a, a.trans_a ? a.k : a.m, a.trans_a ? a.m : a.k, a.lda, a.stride_a, a.batch);
}
OperandRows RowsB(const GemmArgs& a) {  // [k][n], or [n][k] transposed
  return StoredRows(a.b, a.trans_b ? a.n : a.k, a.trans_b ? a.k : a.n, a.ldb, a.stride_b, a.batch);
}
int64_t PaddedLd(int64_t cols) { return CeilDiv(cols, 4) * 4; }

// Bytes of the padded copy of `o`, 0 when it is not copied.
size_t PadBytes(const GemmArgs& args, const OperandRows& o) {
  const double volume = double(args.batch) * double(args.m) * double(args.n) * double(args.k);
  if (Aligned16(o.ptr, o.ld, o.stride, args.batch) || volume < kPadMinVolume) return 0;
  const bool contiguous = o.count == 1 || o.stride == o.rows * o.ld;
  if (!contiguous && o.count > kPadMaxCopies) return 0;
  const size_t bytes = sizeof(float) * size_t(o.rows) * size_t(PaddedLd(o.cols)) * size_t(o.count);
  return CeilDiv(int64_t(bytes), 256) * 256;  // the next region stays 256-byte aligned
}

// Copies `o` into `dst` with rows of PaddedLd(cols) floats; *ptr, *ld and
// *stride then describe the copy.
cudaError_t PadOperand(const OperandRows& o, void* dst, const float** ptr, int64_t* ld,
                       int64_t* stride, cudaStream_t stream) {
  const int64_t pld = PaddedLd(o.cols);
  const size_t width = sizeof(float) * size_t(o.cols);
  if (o.count == 1 || o.stride == o.rows * o.ld) {
    // The batch entries follow each other: one copy of rows * count rows.
    if (cudaError_t e =
            cudaMemcpy2DAsync(dst, sizeof(float) * pld, o.ptr, sizeof(float) * o.ld, width,
                              size_t(o.rows * o.count), cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess)
      return e;
  } else {
    for (int64_t b = 0; b < o.count; ++b)
      if (cudaError_t e = cudaMemcpy2DAsync(
              static_cast<float*>(dst) + b * o.rows * pld, sizeof(float) * pld,
              static_cast<const float*>(o.ptr) + b * o.stride, sizeof(float) * o.ld, width,
              size_t(o.rows), cudaMemcpyDeviceToDevice, stream);
          e != cudaSuccess)
        return e;
  }
  *ptr = static_cast<const float*>(dst);
  *ld = pld;
  *stride = o.count > 1 ? o.rows * pld : 0;
  return cudaSuccess;
}

// The warptile and splitk rungs' workspace: [A copy][B copy][split-K partials].
size_t WorkspaceFor(const GemmArgs& args, const Plan& plan) {
  if (plan.rung != Rung::kWarptile && plan.rung != Rung::kSplitK) return 0;
  return PadBytes(args, RowsA(args)) + PadBytes(args, RowsB(args)) + PartialsBytes(args, plan);
}

Support CheckArgs(const GemmArgs& args) {
  if (args.ab_type != DType::kF32 || args.c_type != DType::kF32)
    return Support::No("gemm_simt computes fp32 only (ab_type and c_type kF32); f16/bf16 run on "
                       "the tensor-core ladder");
  if (args.m < 1 || args.n < 1 || args.k < 1 || args.batch < 1)
    return Support::No("gemm_simt needs m, n, k, batch >= 1");
  if (args.m > INT_MAX || args.n > INT_MAX || args.k > INT_MAX)
    return Support::No("gemm_simt needs m, n, k < 2^31");
  if (!args.a || !args.b || !args.c) return Support::No("null matrix pointer");
  if (args.lda < (args.trans_a ? args.m : args.k)) return Support::No("lda smaller than a row of A");
  if (args.ldb < (args.trans_b ? args.k : args.n)) return Support::No("ldb smaller than a row of B");
  if (args.ldc < args.n) return Support::No("ldc < n");
  if (args.stride_a < 0 || args.stride_b < 0 || args.stride_c < 0)
    return Support::No("negative batch stride");
  if (args.batch > 1 && args.stride_c == 0)
    return Support::No("stride_c 0 with batch > 1 would write one C from several batch entries");
  if (args.stride_c_in < 0) return Support::No("negative stride_c_in");
  if (CeilDiv(args.m, 8) * CeilDiv(args.n, 32) > INT_MAX)
    return Support::No("too many tiles for one grid");
  return Support::Yes();
}

}  // namespace

const std::vector<std::string>& GemmSimtVariants() {
  static const std::vector<std::string> names(std::begin(kRungNames), std::end(kRungNames));
  return names;
}

std::string GemmSimtDefaultRung(const GemmArgs& args) {
  if (!CheckArgs(args)) return kRungNames[static_cast<int>(Rung::kWarptile)];
  return kRungNames[static_cast<int>(MakePlan(args, Rung::kWarptile, true, SmCount()).rung)];
}

Support CanImplementGemmSimt(const GemmArgs& args, std::string_view variant) {
  Rung rung;
  if (!variant.empty() && !ParseVariant(variant, &rung))
    return Support::No("unknown gemm_simt variant '" + std::string(variant) + "'");
  return CheckArgs(args);
}

size_t GemmSimtWorkspaceBytes(const GemmArgs& args, std::string_view variant) {
  Rung rung = Rung::kWarptile;
  const bool auto_pick = variant.empty();
  if (!auto_pick && !ParseVariant(variant, &rung)) return 0;
  if (!CheckArgs(args)) return 0;
  return WorkspaceFor(args, MakePlan(args, rung, auto_pick, SmCount()));
}

cudaError_t LaunchGemmSimt(const GemmArgs& args, std::string_view variant, void* workspace,
                           cudaStream_t stream) {
  Rung rung = Rung::kWarptile;
  const bool auto_pick = variant.empty();
  if (!auto_pick && !ParseVariant(variant, &rung)) return cudaErrorInvalidValue;
  if (!CheckArgs(args)) return cudaErrorInvalidValue;
  Plan plan = MakePlan(args, rung, auto_pick, SmCount());
  if (plan.splits > 1 && workspace == nullptr) {
    if (!auto_pick) return cudaErrorInvalidValue;
    plan = MakePlan(args, Rung::kWarptile, false, SmCount());  // no scratch: one slice
  }
  SimtParams p = MakeParams(args);
  char* ws = static_cast<char*>(workspace);
  if (ws != nullptr && (plan.rung == Rung::kWarptile || plan.rung == Rung::kSplitK)) {
    // Unaligned rows copied padded (PadBytes); without a workspace the
    // kernels read them element by element.
    const OperandRows oa = RowsA(args), ob = RowsB(args);
    if (const size_t bytes = PadBytes(args, oa); bytes != 0) {
      if (cudaError_t e = PadOperand(oa, ws, &p.a, &p.lda, &p.stride_a, stream); e != cudaSuccess)
        return e;
      p.vec_a = true;
      ws += bytes;
    }
    if (const size_t bytes = PadBytes(args, ob); bytes != 0) {
      if (cudaError_t e = PadOperand(ob, ws, &p.b, &p.ldb, &p.stride_b, stream); e != cudaSuccess)
        return e;
      p.vec_b = true;
      ws += bytes;
    }
  }
  p.swizzle_group = plan.swizzle_group;
  switch (plan.rung) {
    case Rung::kNaive: {
      p.tiles_m = static_cast<int>(CeilDiv(p.m, kNaiveRows));
      p.tiles_n = static_cast<int>(CeilDiv(p.n, kNaiveCols));
      const dim3 grid(static_cast<unsigned>(int64_t(p.tiles_m) * p.tiles_n), 1, GridZ(p));
      NaiveKernel<<<grid, dim3(kNaiveCols, kNaiveRows), 0, stream>>>(p);
      return cudaGetLastError();
    }
    case Rung::kSmem32: {
      p.tiles_m = static_cast<int>(CeilDiv(p.m, kSmemTile));
      p.tiles_n = static_cast<int>(CeilDiv(p.n, kSmemTile));
      const dim3 grid(static_cast<unsigned>(int64_t(p.tiles_m) * p.tiles_n), 1, GridZ(p));
      Smem32Kernel<<<grid, dim3(kSmemTile, kSmemTile), 0, stream>>>(p);
      return cudaGetLastError();
    }
    case Rung::kReg8x8: {
      p.tiles_m = static_cast<int>(CeilDiv(p.m, Reg8x8Config::kBM));
      p.tiles_n = static_cast<int>(CeilDiv(p.n, Reg8x8Config::kBN));
      const dim3 grid(static_cast<unsigned>(int64_t(p.tiles_m) * p.tiles_n), 1, GridZ(p));
      Reg8x8Kernel<<<grid, Reg8x8Config::kThreads, 0, stream>>>(p);
      return cudaGetLastError();
    }
    case Rung::kVec4:
      return LaunchTiled<Vec4Config>(p, stream);
    case Rung::kDbuf:
    case Rung::kSwizzle:
      return LaunchTiled<DbufConfig>(p, stream);
    case Rung::kWarptile:
    case Rung::kSplitK:
      break;
  }
  SimtParams q = p;
  if (plan.splits > 1) {
    // Partials [batch][splits][m][n] in the workspace, alpha 1, beta 0.
    q.splits = plan.splits;
    q.k_per_split = plan.k_per_split;
    q.c = reinterpret_cast<float*>(ws);
    q.ldc = q.n;
    q.stride_split = int64_t(q.m) * q.n;
    q.stride_c = q.stride_split * q.splits;
    q.alpha = 1.f;
    q.beta = 0.f;
    q.vec_c = reinterpret_cast<uintptr_t>(ws) % 16 == 0 && q.n % 4 == 0;
  }
  cudaError_t err = cudaSuccess;
  switch (plan.shape) {
    case TileShape::k256x128: err = LaunchTiled<Warp256Config>(q, stream); break;
    case TileShape::k128x128: err = LaunchTiled<Warp128Config>(q, stream); break;
    case TileShape::k64x128: err = LaunchTiled<Warp64Config>(q, stream); break;
    case TileShape::k64x128Wide: err = LaunchTiled<Warp64WideConfig>(q, stream); break;
    case TileShape::k64x64:
      err = LaunchTiled<Warp64SmallConfig>(q, stream);
      break;
    case TileShape::k32x32:
      err = LaunchTiled<Warp32SmallConfig>(q, stream);
      break;
  }
  if (err != cudaSuccess || plan.splits <= 1) return err;
  p.splits = plan.splits;
  const bool vec = p.vec_c && p.n % 4 == 0 && q.vec_c;
  const int64_t work = p.batch * int64_t(p.m) * p.n / (vec ? 4 : 1);
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(work, 256), 1, 8 * 1024));
  if (vec) SplitKReduceKernel<true><<<blocks, 256, 0, stream>>>(p, q.c);
  else SplitKReduceKernel<false><<<blocks, 256, 0, stream>>>(p, q.c);
  return cudaGetLastError();
}

}  // namespace gpucompute::kernels
