// Transpose ladder: [B, R, C] -> [B, C, R] for 2- and 4-byte elements. The
// general permutation (permute.cu) routes batched 2-D transposes here.
//
// What must move: every element read once and written once, 2 * B*R*C * size
// bytes (16384^2: 2.15 GB fp32, 1.07 GB fp16/bf16); no FLOPs. Floor on the
// H200: a D2D copy of the same bytes, measured beside each case (0.504 ms for
// 16384^2 fp32, 0.256 ms for fp16, i.e. ~4.2 TB/s read + write).
//
// Versions. MEASURED on the H200 (kernels/bench/results/transpose.md,
// 2026-12-01 23:07 UTC), 16384^2, GB/s (read + write) and ratio to the D2D
// copy, fp32 / fp16 (bf16 the same within 1%); cuBLAS geam fp32 3971 (0.93),
// cuBLASLt MatrixTransform fp32 3489 (0.82) / fp16 2293 (0.55):
//   naive                  one thread per element, reads coalesced, writes
//                          strided by R: 472 (0.11) / 276 (0.07).
//   smem                   32x32 threads stage a 32x32 tile in shared memory;
//                          both global sides coalesced, the column read hits one
//                          bank 32 times (16 for 2-byte): 832 (0.20) / 517 (0.12).
//   smem_padded            tile padded to [32][33]: conflict free: 1107 (0.26) /
//                          568 (0.14).
//   coarsened              32x8 threads, each moving 4 rows of the padded tile:
//                          4 loads in flight per thread: 3278 (0.77) / 1855 (0.44).
//   coarsened_vec          16-byte loads and stores on both global sides through
//                          an XOR-swizzled tile (conflict free without padding,
//                          which would break 16-byte alignment); tiles 64x64
//                          fp32, 128x128 16-bit: 3370 (0.79) / 2141 (0.51).
//   coarsened_vec_grouped  the same kernel, tiles visited in bands of 16 tile
//                          rows (R first inside a band) so tiles in flight cover
//                          a squarish patch: 3208 (0.75) / 2670 (0.64).
//   pipelined              persistent blocks, cp.async straight into the swizzled
//                          tile, 3 stages (fp32 64x64) or 2 (16-bit 128x128):
//                          3198 (0.75) / 2318 (0.55). More bytes in flight did
//                          not help.
//   pipelined_grouped      pipelined with the grouped order: 3192 (0.75) / 2327
//                          (0.56).
//   coarsened_64           a 64x64 padded tile, 64 bytes per thread each way
//                          (fp32: 32x8 threads, 2 columns x 8 rows; 16-bit: 32x4,
//                          2 x 16), element accesses (any shape and alignment),
//                          fp32 tiles R first: 4109 (0.97) / 3360 (0.80). The
//                          default for fp32 and for 16-bit shapes pairs refuses.
//   pairs                  16-bit with even rows and cols: each 2x2 block is
//                          two 32-bit words, transposed in registers by a byte
//                          permute, so the tile moves 4-byte words like fp32:
//                          128x128 elements, 32x8 threads: - / 3904 (0.93).
//   pairs_64               the same on a 64x64 tile (32x4 threads), for
//                          extents under 128: - / 3681 (0.88).
// A tile study the same day (a scratch kernel family, CUDA events, 16384^2 and
// 12288^2, 16-byte tiles 32..256 on a side, five tile orders, streaming and
// L2-prefetch hints, bulk-copy stores) put every 16-byte-access tile at
// 0.59-0.80 (fp32) and 0.40-0.64 (16-bit) of copy with plain stores, the best
// at 0.80-0.88 with streaming stores; element tiles with 16 fp32 elements per
// thread reached 0.94-0.97 (16-bit with 32: 0.77-0.85), and 16-bit pairs
// through the same pattern 0.93-0.94.
#include "gpucompute/kernels/transpose.h"

#include <algorithm>
#include <cstdint>

#include "heuristics/transpose_heuristics.h"
#include "launch_util.h"
#include "transpose_common.h"

namespace gpucompute::kernels {
namespace {

// Kernel arguments of the transpose ladder. Element offsets are 64-bit.
struct TransposeParams {
  const void* in;
  void* out;
  int64_t batch, rows, cols;
  int64_t tiles_r, tiles_c;  // tiles along R and C
};

// Tile index -> (batch, first row, first col); tiles run fastest along C so
// neighbouring blocks read neighbouring segments of the same input rows.
struct TileCoord {
  int64_t b, r0, c0;
};
__device__ __forceinline__ TileCoord DecodeTile(const TransposeParams& p, int64_t t, int tile_r,
                                                int tile_c) {
  int64_t tc = t % p.tiles_c;
  int64_t rest = t / p.tiles_c;
  int64_t tr = rest % p.tiles_r;
  return {rest / p.tiles_r, tr * tile_r, tc * tile_c};
}

// Grouped order: bands of kGroup tile rows; inside a band tiles run along R
// first, then along C. Tiles in flight at once then cover a squarish patch, so
// both the input rows they read and the output rows they write come in runs of
// several tiles instead of one side being scattered over the whole matrix.
// kGroup == 0 is the plain order of DecodeTile.
template <int kGroup>
__device__ __forceinline__ TileCoord DecodeTileOrdered(const TransposeParams& p, int64_t t,
                                                       int tile_r, int tile_c) {
  if constexpr (kGroup == 0) {
    return DecodeTile(p, t, tile_r, tile_c);
  } else {
    const int64_t per_matrix = p.tiles_r * p.tiles_c;
    const int64_t b = t / per_matrix, w = t - b * per_matrix;
    const int64_t band = w / (kGroup * p.tiles_c);
    const int64_t first_tr = band * kGroup;
    const int64_t band_rows = std::min<int64_t>(kGroup, p.tiles_r - first_tr);
    const int64_t in_band = w - first_tr * p.tiles_c;
    return {b, (first_tr + in_band % band_rows) * tile_r, (in_band / band_rows) * tile_c};
  }
}

// ---- v1: naive -------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256) TransposeNaiveKernel(TransposeParams p) {
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const int64_t rc = p.rows * p.cols;
  const int64_t n = p.batch * rc;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t c = i % p.cols;
    int64_t rest = i / p.cols;
    int64_t r = rest % p.rows;
    int64_t b = rest / p.rows;
    out[b * rc + c * p.rows + r] = in[i];
  }
}

// ---- v2, v3: 32x32 tile, one element per thread ----------------------------
struct SmemTileConfig {
  static constexpr int kTile = 32;  // (TILE_R, TILE_C) = (32, 32)
  static constexpr int kThreadsX = 32, kThreadsY = 32;
};

template <typename T, int kPad>
__global__ void __launch_bounds__(1024) TransposeSmemKernel(TransposeParams p) {
  using Cfg = SmemTileConfig;
  __shared__ T tile[Cfg::kTile][Cfg::kTile + kPad];
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t total = p.batch * p.tiles_r * p.tiles_c;
  const int64_t rc = p.rows * p.cols;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    TileCoord tc = DecodeTile(p, t, Cfg::kTile, Cfg::kTile);
    int64_t r = tc.r0 + ty, c = tc.c0 + tx;
    if (r < p.rows && c < p.cols) tile[ty][tx] = in[tc.b * rc + r * p.cols + c];
    __syncthreads();
    int64_t orow = tc.c0 + ty, ocol = tc.r0 + tx;  // output [C, R]
    if (orow < p.cols && ocol < p.rows) out[tc.b * rc + orow * p.rows + ocol] = tile[tx][ty];
    __syncthreads();
  }
}

// ---- v4: 32x8 threads, 4 rows each, padded tile -----------------------------
struct CoarsenedConfig {
  static constexpr int kTile = 32;  // (TILE_R, TILE_C) = (32, 32)
  static constexpr int kThreadsX = 32, kThreadsY = 8;
  static constexpr int kRowsPerThread = kTile / kThreadsY;
  static_assert(kTile % kThreadsY == 0, "rows per thread must be whole");
};

template <typename T>
__global__ void __launch_bounds__(256) TransposeCoarsenedKernel(TransposeParams p) {
  using Cfg = CoarsenedConfig;
  __shared__ T tile[Cfg::kTile][Cfg::kTile + 1];
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t total = p.batch * p.tiles_r * p.tiles_c;
  const int64_t rc = p.rows * p.cols;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    TileCoord tc = DecodeTile(p, t, Cfg::kTile, Cfg::kTile);
    const T* src = in + tc.b * rc;
    T* dst = out + tc.b * rc;
    const int64_t c = tc.c0 + tx;
    T v[Cfg::kRowsPerThread];
#pragma unroll
    for (int k = 0; k < Cfg::kRowsPerThread; ++k) {
      int64_t r = tc.r0 + ty + k * Cfg::kThreadsY;
      if (r < p.rows && c < p.cols) v[k] = src[r * p.cols + c];
    }
#pragma unroll
    for (int k = 0; k < Cfg::kRowsPerThread; ++k) {
      int64_t r = tc.r0 + ty + k * Cfg::kThreadsY;
      if (r < p.rows && c < p.cols) tile[ty + k * Cfg::kThreadsY][tx] = v[k];
    }
    __syncthreads();
    const int64_t ocol = tc.r0 + tx;
#pragma unroll
    for (int k = 0; k < Cfg::kRowsPerThread; ++k) {
      int64_t orow = tc.c0 + ty + k * Cfg::kThreadsY;
      if (orow < p.cols && ocol < p.rows)
        dst[orow * p.rows + ocol] = tile[tx][ty + k * Cfg::kThreadsY];
    }
    __syncthreads();
  }
}

// ---- v5, v6: 16-byte accesses, swizzled tile -------------------------------
// A 16-byte chunk holds kVec elements. The tile keeps kChunksPerRow chunks per
// input row; chunk j of row r sits at slot j ^ ((r / kVec) % 8). Load phase: a
// quarter warp stores 8 consecutive chunks of one row (a permutation of one
// aligned group of 8 slots: all 32 banks once). Gather phase: lane l reads
// column c = cbase + l % kVec of rows kVec * i + k, i = ibase + l / kVec; the
// XOR spreads the 32 / kVec values of i over distinct slots, so fp32 lanes hit
// 32 distinct banks and 16-bit lanes 16 banks, lane pairs sharing a word.
template <typename T, int kTileR_, int kTileC_>
struct VecTileConfig {
  static constexpr int kVec = 16 / int(sizeof(T));  // elements per chunk
  static constexpr int kTileR = kTileR_;            // (TILE_R, TILE_C) input tile
  static constexpr int kTileC = kTileC_;
  static constexpr int kThreads = 256;
  static constexpr int kChunksPerRow = kTileC / kVec;     // input chunks per tile row
  static constexpr int kOutChunksPerRow = kTileR / kVec;  // output chunks per tile column
  static constexpr int kChunks = kTileR * kChunksPerRow;
  static constexpr int kChunksPerThread = kChunks / kThreads;
  static_assert(kChunksPerRow % 8 == 0, "the swizzle permutes groups of 8 chunks");
  static_assert(kChunks % kThreads == 0, "chunks per thread must be whole");
  static_assert(kTileR % kVec == 0, "output chunks must be whole");
  static_assert(32 % kVec == 0 && (32 / kVec) <= 8, "a warp's rows must fit one swizzle group");
  static_assert(kOutChunksPerRow % (32 / kVec) == 0, "a warp stays inside one tile column group");
};

// Tile slot (in chunks) of input chunk j of tile row r.
template <class Cfg>
__device__ __forceinline__ int SwizzledSlot(unsigned r, unsigned j) {
  return int(r * Cfg::kChunksPerRow + (j ^ ((r / Cfg::kVec) & 7)));
}

// Gather phase shared by v5 and v6: each thread assembles kChunksPerThread
// 16-byte chunks of output rows from the tile and stores them.
template <typename T, class Cfg>
__device__ __forceinline__ void GatherAndStore(const uint4* tile, T* dst, const TransposeParams& p,
                                               const TileCoord& tc) {
  constexpr int V = Cfg::kVec;
  const T* ts = reinterpret_cast<const T*>(tile);
#pragma unroll
  for (int m = 0; m < Cfg::kChunksPerThread; ++m) {
    const int q = threadIdx.x + m * Cfg::kThreads;
    const int c = q % V + V * (q / (V * Cfg::kOutChunksPerRow));
    const int i = (q / V) % Cfg::kOutChunksPerRow;
    const int slot_j = c / V, e = c % V;
    union {
      uint4 u;
      T x[V];
    } w;
#pragma unroll
    for (int k = 0; k < V; ++k)  // row V * i + k: its swizzle group is i
      w.x[k] = ts[((V * i + k) * Cfg::kChunksPerRow + (slot_j ^ (i & 7))) * V + e];
    const int64_t orow = tc.c0 + c, ocol = tc.r0 + int64_t(i) * V;
    if (orow < p.cols && ocol < p.rows)
      *reinterpret_cast<uint4*>(dst + orow * p.rows + ocol) = w.u;
  }
}

template <typename T>
using VecConfig = VecTileConfig<T, sizeof(T) == 4 ? 64 : 128, sizeof(T) == 4 ? 64 : 128>;

// v5: one tile per block; loads staged through registers.
template <typename T, int kGroup>
__global__ void __launch_bounds__(256) TransposeVecKernel(TransposeParams p) {
  using Cfg = VecConfig<T>;
  constexpr int V = Cfg::kVec;
  __shared__ uint4 tile[Cfg::kChunks];
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const int tid = threadIdx.x;
  const int64_t total = p.batch * p.tiles_r * p.tiles_c;
  const int64_t rc = p.rows * p.cols;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    TileCoord tc = DecodeTileOrdered<kGroup>(p, t, Cfg::kTileR, Cfg::kTileC);
    const T* src = in + tc.b * rc;
    uint4 v[Cfg::kChunksPerThread];
#pragma unroll
    for (int m = 0; m < Cfg::kChunksPerThread; ++m) {
      int q = tid + m * Cfg::kThreads;
      int r = q / Cfg::kChunksPerRow, j = q % Cfg::kChunksPerRow;
      int64_t gr = tc.r0 + r, gc = tc.c0 + int64_t(j) * V;
      v[m] = make_uint4(0, 0, 0, 0);
      if (gr < p.rows && gc < p.cols)
        v[m] = __ldg(reinterpret_cast<const uint4*>(src + gr * p.cols + gc));
    }
#pragma unroll
    for (int m = 0; m < Cfg::kChunksPerThread; ++m) {
      int q = tid + m * Cfg::kThreads;
      tile[SwizzledSlot<Cfg>(q / Cfg::kChunksPerRow, q % Cfg::kChunksPerRow)] = v[m];
    }
    __syncthreads();
    GatherAndStore<T, Cfg>(tile, out + tc.b * rc, p, tc);
    __syncthreads();
  }
}

// v6: persistent blocks walk tiles t = blockIdx.x + k * gridDim.x; cp.async
// copies each tile's chunks straight into the swizzled slots of one of kStages
// shared-memory stages, kStages - 1 tiles ahead of the gather.
template <typename T, int kTileR, int kTileC, int kStages, int kGroup>
struct PipeConfig : VecTileConfig<T, kTileR, kTileC> {
  static constexpr int kNumStages = kStages;
  static constexpr int kTileGroup = kGroup;  // tile order, see DecodeTileOrdered
  static constexpr size_t kSmemBytes = size_t(kStages) * VecTileConfig<T, kTileR, kTileC>::kChunks * 16;
  static_assert(kStages >= 2, "at least double buffering");
};

__device__ __forceinline__ void CpAsync16(uint4* smem_dst, const void* gmem_src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem_src));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

template <typename T, class Cfg>
__global__ void __launch_bounds__(256) TransposePipeKernel(TransposeParams p) {
  constexpr int V = Cfg::kVec;
  constexpr int S = Cfg::kNumStages;
  extern __shared__ uint4 stages[];  // [S][kChunks]
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const int64_t total = p.batch * p.tiles_r * p.tiles_c;
  const int64_t rc = p.rows * p.cols;
  auto coord = [&](int64_t t) {
    return DecodeTileOrdered<Cfg::kTileGroup>(p, t, Cfg::kTileR, Cfg::kTileC);
  };
  auto issue = [&](int64_t t, int stage) {
    const TileCoord tc = coord(t);
    const T* src = in + tc.b * rc;
    uint4* tile = stages + stage * Cfg::kChunks;
#pragma unroll
    for (int m = 0; m < Cfg::kChunksPerThread; ++m) {
      const int q = threadIdx.x + m * Cfg::kThreads;
      const int r = q / Cfg::kChunksPerRow, j = q % Cfg::kChunksPerRow;
      const int64_t gr = tc.r0 + r, gc = tc.c0 + int64_t(j) * V;
      if (gr < p.rows && gc < p.cols) CpAsync16(tile + SwizzledSlot<Cfg>(r, j), src + gr * p.cols + gc);
    }
  };
  const int64_t stride = gridDim.x;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    const int64_t t = blockIdx.x + s * stride;
    if (t < total) issue(t, s);
    CpAsyncCommit();
  }
  int stage = 0;
  for (int64_t t = blockIdx.x; t < total; t += stride) {
    const int64_t ahead = t + (S - 1) * stride;
    if (ahead < total) issue(ahead, (stage + S - 1) % S);
    CpAsyncCommit();
    CpAsyncWait<S - 1>();  // this thread's copies of tile t have landed
    __syncthreads();       // and everyone else's
    const TileCoord tc = coord(t);
    GatherAndStore<T, Cfg>(stages + stage * Cfg::kChunks, out + tc.b * rc, p, tc);
    __syncthreads();  // the stage is refilled by the next iteration's issue
    stage = (stage + 1) % S;
  }
  CpAsyncWait<0>();
}

// ---- v9: 64x64 padded tile, 64 bytes per thread each way ---------------------
// The rungs above keep 16 (coarsened_vec, fp32) or 4 (coarsened) elements per
// thread; this one moves a 64x64 tile with 32x8 threads (fp32: 2 columns x 8
// rows each) or 32x4 (16-bit: 2 x 16), plain element accesses (any shape and
// alignment), the tile padded by one 32-bit word per row. fp32 visits tiles R
// first (each band of concurrent tiles writes long runs of output rows).
template <typename T>
struct Coarsened64Config {
  static constexpr int kTile = 64;  // (TILE_R, TILE_C) = (64, 64)
  static constexpr int kThreadsX = 32;
  static constexpr int kThreadsY = sizeof(T) == 4 ? 8 : 4;
  static constexpr int kThreads = kThreadsX * kThreadsY;
  static constexpr int kColsPerThread = kTile / kThreadsX;
  static constexpr int kRowsPerThread = kTile / kThreadsY;
  static constexpr int kPad = int(4 / sizeof(T));  // one 32-bit word per row
  static constexpr bool kRowFirst = sizeof(T) == 4;
};

// Tile index -> coordinates, R fastest (DecodeTile runs C fastest).
__device__ __forceinline__ TileCoord DecodeTileRowFirst(const TransposeParams& p, int64_t t,
                                                        int tile_r, int tile_c) {
  int64_t tr = t % p.tiles_r;
  int64_t rest = t / p.tiles_r;
  int64_t tc = rest % p.tiles_c;
  return {rest / p.tiles_c, tr * tile_r, tc * tile_c};
}

template <typename T>
__global__ void __launch_bounds__(Coarsened64Config<T>::kThreads)
    TransposeCoarsened64Kernel(TransposeParams p) {
  using Cfg = Coarsened64Config<T>;
  constexpr int kRows = Cfg::kRowsPerThread, kCols = Cfg::kColsPerThread;
  __shared__ T tile[Cfg::kTile][Cfg::kTile + Cfg::kPad];
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t total = p.batch * p.tiles_r * p.tiles_c;
  const int64_t rc = p.rows * p.cols;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const TileCoord tc = Cfg::kRowFirst ? DecodeTileRowFirst(p, t, Cfg::kTile, Cfg::kTile)
                                        : DecodeTile(p, t, Cfg::kTile, Cfg::kTile);
    const T* src = in + tc.b * rc;
    T* dst = out + tc.b * rc;
    T v[kRows][kCols];
#pragma unroll
    for (int k = 0; k < kRows; ++k)
#pragma unroll
      for (int x = 0; x < kCols; ++x) {
        const int64_t r = tc.r0 + ty + k * Cfg::kThreadsY, c = tc.c0 + tx + x * Cfg::kThreadsX;
        if (r < p.rows && c < p.cols) v[k][x] = src[r * p.cols + c];
      }
#pragma unroll
    for (int k = 0; k < kRows; ++k)
#pragma unroll
      for (int x = 0; x < kCols; ++x)
        tile[ty + k * Cfg::kThreadsY][tx + x * Cfg::kThreadsX] = v[k][x];
    __syncthreads();
    // Output tile: rows c0.. (one per input column), lanes along r.
#pragma unroll
    for (int k = 0; k < Cfg::kTile / Cfg::kThreadsY; ++k)
#pragma unroll
      for (int x = 0; x < Cfg::kTile / Cfg::kThreadsX; ++x) {
        const int oc = ty + k * Cfg::kThreadsY, orr = tx + x * Cfg::kThreadsX;
        const int64_t orow = tc.c0 + oc, ocol = tc.r0 + orr;
        if (orow < p.cols && ocol < p.rows) dst[orow * p.rows + ocol] = tile[orr][oc];
      }
    __syncthreads();
  }
}

// ---- v10: 16-bit elements as 2x2 blocks of two 32-bit words ------------------
// With rows and cols even, the 2x2 block (2i..2i+1, 2j..2j+1) is two 32-bit
// words of the input (rows 2i and 2i+1) and, transposed, two words of the
// output (rows 2j and 2j+1): a byte permute swaps their halves in registers.
// What moves through shared memory is then a 4-byte transpose of the
// [R/2, C/2] block grid, two word tiles at once, with the access pattern that
// reaches the copy ceiling in fp32 (v9). kBlocks x kBlocks blocks per tile
// (2 kBlocks elements square), 32 x kThreadsY threads.
template <int kBlocks, int kThreadsY_>
struct PairsConfig {
  static constexpr int kTile = kBlocks;  // in blocks
  static constexpr int kThreadsX = 32, kThreadsY = kThreadsY_;
  static constexpr int kThreads = kThreadsX * kThreadsY;
  static constexpr int kColsPerThread = kBlocks / kThreadsX;
  static constexpr int kRowsPerThread = kBlocks / kThreadsY;
  static_assert(kBlocks % kThreadsX == 0 && kBlocks % kThreadsY == 0, "whole blocks per thread");
};
// "pairs": 128x128 elements, 32x8 threads (16 blocks, 32 words per thread);
// "pairs_64": 64x64 elements, 32x4 threads (8 blocks) for shapes with an
// extent under 128, where the larger tile would run half empty.
using PairsLarge = PairsConfig<64, 8>;
using PairsSmall = PairsConfig<32, 4>;

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) TransposePairsKernel(TransposeParams p) {
  constexpr int kRows = Cfg::kRowsPerThread, kCols = Cfg::kColsPerThread;
  __shared__ uint32_t lo[Cfg::kTile][Cfg::kTile + 1];  // output rows 2j
  __shared__ uint32_t hi[Cfg::kTile][Cfg::kTile + 1];  // output rows 2j + 1
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t rb = p.rows / 2, cb = p.cols / 2;  // block grid [rb, cb]
  const int64_t words = p.rows * p.cols / 2;      // per matrix
  const int64_t total = p.batch * p.tiles_r * p.tiles_c;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const TileCoord tc = DecodeTile(p, t, Cfg::kTile, Cfg::kTile);  // in blocks
    const uint32_t* src = static_cast<const uint32_t*>(p.in) + tc.b * words;
    uint32_t* dst = static_cast<uint32_t*>(p.out) + tc.b * words;
    uint32_t top[kRows][kCols], bottom[kRows][kCols];
#pragma unroll
    for (int k = 0; k < kRows; ++k)
#pragma unroll
      for (int x = 0; x < kCols; ++x) {
        const int64_t i = tc.r0 + ty + k * Cfg::kThreadsY, j = tc.c0 + tx + x * Cfg::kThreadsX;
        if (i < rb && j < cb) {
          top[k][x] = __ldg(src + 2 * i * cb + j);
          bottom[k][x] = __ldg(src + (2 * i + 1) * cb + j);
        }
      }
#pragma unroll
    for (int k = 0; k < kRows; ++k)
#pragma unroll
      for (int x = 0; x < kCols; ++x) {
        const int i = ty + k * Cfg::kThreadsY, j = tx + x * Cfg::kThreadsX;
        // Little-endian: the low half of a word is the element on the left.
        lo[i][j] = __byte_perm(top[k][x], bottom[k][x], 0x5410);  // (2i, 2j), (2i+1, 2j)
        hi[i][j] = __byte_perm(top[k][x], bottom[k][x], 0x7632);  // (2i, 2j+1), (2i+1, 2j+1)
      }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < Cfg::kTile / Cfg::kThreadsY; ++k)
#pragma unroll
      for (int x = 0; x < Cfg::kTile / Cfg::kThreadsX; ++x) {
        const int oj = ty + k * Cfg::kThreadsY, oi = tx + x * Cfg::kThreadsX;
        const int64_t j = tc.c0 + oj, i = tc.r0 + oi;
        if (j < cb && i < rb) {
          dst[2 * j * rb + i] = lo[oi][oj];
          dst[(2 * j + 1) * rb + i] = hi[oi][oj];
        }
      }
    __syncthreads();
  }
}

// ---- Host side --------------------------------------------------------------
enum class Rung {
  kNaive, kSmem, kSmemPadded, kCoarsened, kVec, kVecGrouped, kPipe, kPipeGrouped, kCoarsened64,
  kPairs, kPairsSmall, kUnknown
};

bool NeedsVectorAccess(Rung r) { return r >= Rung::kVec && r <= Rung::kPipeGrouped; }
bool IsPairs(Rung r) { return r == Rung::kPairs || r == Rung::kPairsSmall; }

Rung ParseRung(std::string_view v) {
  if (v == "naive") return Rung::kNaive;
  if (v == "smem") return Rung::kSmem;
  if (v == "smem_padded") return Rung::kSmemPadded;
  if (v == "coarsened") return Rung::kCoarsened;
  if (v == "coarsened_vec") return Rung::kVec;
  if (v == "coarsened_vec_grouped") return Rung::kVecGrouped;
  if (v == "pipelined") return Rung::kPipe;
  if (v == "pipelined_grouped") return Rung::kPipeGrouped;
  if (v == "coarsened_64") return Rung::kCoarsened64;
  if (v == "pairs") return Rung::kPairs;
  if (v == "pairs_64") return Rung::kPairsSmall;
  return Rung::kUnknown;
}

// Tile rows per band in the grouped order (DecodeTileOrdered).
constexpr int kTileGroup = 16;

Support CheckTranspose(const TransposeArgs& a, Rung rung) {
  if (rung == Rung::kUnknown) return Support::No("unknown transpose variant");
  if (!ValidDType(a.dtype)) return Support::No("unsupported dtype");
  if (a.batch < 0 || a.rows < 0 || a.cols < 0) return Support::No("negative extent");
  if (a.batch == 0 || a.rows == 0 || a.cols == 0) return Support::Yes();
  if (a.in == nullptr || a.out == nullptr) return Support::No("null pointer");
  const size_t es = DTypeSize(a.dtype);
  if (!Aligned(a.in, es) || !Aligned(a.out, es))
    return Support::No("pointers must be aligned to the element size");
  if (NeedsVectorAccess(rung)) {
    const int64_t v = int64_t(16 / es);
    if (a.rows % v || a.cols % v)
      return Support::No("16-byte access needs rows and cols divisible by " + std::to_string(v));
    if (!Aligned(a.in, 16) || !Aligned(a.out, 16))
      return Support::No("16-byte access needs 16-byte aligned pointers");
  }
  if (IsPairs(rung)) {
    if (es != 2) return Support::No("pairs moves 16-bit elements only");
    if (a.rows % 2 || a.cols % 2) return Support::No("pairs needs even rows and cols");
    if (!Aligned(a.in, 4) || !Aligned(a.out, 4))
      return Support::No("pairs needs 4-byte aligned pointers");
  }
  return Support::Yes();
}

Rung ChooseRung(const TransposeArgs& a, std::string_view variant) {
  if (!variant.empty()) return ParseRung(variant);
  TransposeShape shape;
  shape.batch = a.batch;
  shape.rows = a.rows;
  shape.cols = a.cols;
  shape.dtype = a.dtype;
  shape.pairs_ok = bool(CheckTranspose(a, Rung::kPairs));
  return ParseRung(ChooseTranspose(shape, SmCount()));
}

// Persistent grid: as many blocks as fit on the machine at once.
template <typename T, class Cfg>
cudaError_t LaunchPipe(const TransposeParams& p, cudaStream_t s) {
  auto* kernel = TransposePipeKernel<T, Cfg>;
  if (Cfg::kSmemBytes > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(Cfg::kSmemBytes));
    if (err != cudaSuccess) return err;
  }
  static const int per_sm = [&] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Cfg::kThreads, Cfg::kSmemBytes) !=
        cudaSuccess)
      n = 1;
    return std::max(n, 1);
  }();
  const int sms = SmCount();
  const int64_t tiles = p.batch * p.tiles_r * p.tiles_c;
  const unsigned grid = unsigned(std::max<int64_t>(1, std::min<int64_t>(tiles, int64_t(sms) * per_sm)));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, s>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchTransposeTyped(const TransposeArgs& a, Rung rung, cudaStream_t s) {
  TransposeParams p{a.in, a.out, a.batch, a.rows, a.cols, 0, 0};
  auto tiles = [&](int tr, int tc) {
    p.tiles_r = (a.rows + tr - 1) / tr;
    p.tiles_c = (a.cols + tc - 1) / tc;
    return GridFor(a.batch * p.tiles_r * p.tiles_c, 1);
  };
  switch (rung) {
    case Rung::kNaive:
      TransposeNaiveKernel<T><<<GridFor(a.batch * a.rows * a.cols, 256), 256, 0, s>>>(p);
      break;
    case Rung::kSmem: {
      unsigned g = tiles(SmemTileConfig::kTile, SmemTileConfig::kTile);
      TransposeSmemKernel<T, 0>
          <<<g, dim3(SmemTileConfig::kThreadsX, SmemTileConfig::kThreadsY), 0, s>>>(p);
      break;
    }
    case Rung::kSmemPadded: {
      unsigned g = tiles(SmemTileConfig::kTile, SmemTileConfig::kTile);
      TransposeSmemKernel<T, 1>
          <<<g, dim3(SmemTileConfig::kThreadsX, SmemTileConfig::kThreadsY), 0, s>>>(p);
      break;
    }
    case Rung::kCoarsened: {
      unsigned g = tiles(CoarsenedConfig::kTile, CoarsenedConfig::kTile);
      TransposeCoarsenedKernel<T>
          <<<g, dim3(CoarsenedConfig::kThreadsX, CoarsenedConfig::kThreadsY), 0, s>>>(p);
      break;
    }
    case Rung::kVec:
    case Rung::kVecGrouped: {
      using Cfg = VecConfig<T>;
      unsigned g = tiles(Cfg::kTileR, Cfg::kTileC);
      if (rung == Rung::kVec) TransposeVecKernel<T, 0><<<g, Cfg::kThreads, 0, s>>>(p);
      else TransposeVecKernel<T, kTileGroup><<<g, Cfg::kThreads, 0, s>>>(p);
      break;
    }
    case Rung::kPipe:
    case Rung::kPipeGrouped: {
      // (TILE_R, TILE_C, stages): fp32 (64, 64, 3), 16-bit (128, 128, 2).
      constexpr int kTile = sizeof(T) == 4 ? 64 : 128, kStages = sizeof(T) == 4 ? 3 : 2;
      auto go = [&](auto cfg) {
        using Cfg = decltype(cfg);
        tiles(Cfg::kTileR, Cfg::kTileC);
        return LaunchPipe<T, Cfg>(p, s);
      };
      if (rung == Rung::kPipe) return go(PipeConfig<T, kTile, kTile, kStages, 0>{});
      return go(PipeConfig<T, kTile, kTile, kStages, kTileGroup>{});
    }
    case Rung::kCoarsened64: {
      using Cfg = Coarsened64Config<T>;
      unsigned g = tiles(Cfg::kTile, Cfg::kTile);
      TransposeCoarsened64Kernel<T><<<g, dim3(Cfg::kThreadsX, Cfg::kThreadsY), 0, s>>>(p);
      break;
    }
    case Rung::kPairs:
    case Rung::kPairsSmall: {
      auto go = [&](auto cfg) {
        using Cfg = decltype(cfg);
        // Tiles counted in 2x2 blocks.
        p.tiles_r = CeilDiv(a.rows / 2, int64_t(Cfg::kTile));
        p.tiles_c = CeilDiv(a.cols / 2, int64_t(Cfg::kTile));
        TransposePairsKernel<Cfg><<<GridFor(a.batch * p.tiles_r * p.tiles_c, 1),
                                    dim3(Cfg::kThreadsX, Cfg::kThreadsY), 0, s>>>(p);
      };
      if (rung == Rung::kPairs) go(PairsLarge{});
      else go(PairsSmall{});
      break;
    }
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

const std::vector<std::string>& TransposeVariants() {
  static const std::vector<std::string> v = {
      "naive",     "smem",      "smem_padded",      "coarsened", "coarsened_vec",
      "coarsened_vec_grouped", "pipelined", "pipelined_grouped", "coarsened_64", "pairs",
      "pairs_64"};
  return v;
}

Support CanImplementTranspose(const TransposeArgs& args, std::string_view variant) {
  return CheckTranspose(args, ChooseRung(args, variant));
}

std::string TransposeVariantName(const TransposeArgs& args, std::string_view variant) {
  const Rung rung = ChooseRung(args, variant);
  if (!CheckTranspose(args, rung)) return {};
  return TransposeVariants()[size_t(rung)];
}

cudaError_t LaunchTranspose(const TransposeArgs& args, std::string_view variant,
                            cudaStream_t stream) {
  const Rung rung = ChooseRung(args, variant);
  if (!CheckTranspose(args, rung)) return cudaErrorInvalidValue;
  if (args.batch == 0 || args.rows == 0 || args.cols == 0) return cudaSuccess;
  if (DTypeSize(args.dtype) == 4) return LaunchTransposeTyped<uint32_t>(args, rung, stream);
  return LaunchTransposeTyped<uint16_t>(args, rung, stream);
}

}  // namespace gpucompute::kernels
