// Attention forward, O = softmax(scale Q K^T + mask) V: the ladder.
//
// What must be done, per (batch, query head): 4 * seq_q * seq_kv * head_dim
// FLOPs (two GEMMs; half of that under the causal mask), and at least Q, K, V
// read once and O written once: 2 bytes * head_dim * (2 seq_q heads_q +
// 2 seq_kv heads_kv) * batch. At the benchmark sizes (32k tokens, heads *
// head_dim = 2048, bf16) that is 0.55 TFLOP against 0.5 GB at seq 4096: the
// floor is the tensor cores (~990 TFLOP/s dense bf16 on the H200, ~0.55 ms),
// not HBM (~0.12 ms at 4.2 TB/s). Decode (seq_q 1..16 against 32k keys) is the
// other way round: K and V must stream once at HBM bandwidth.
//
// Versions, with what each MEASURED on the H200 (bf16, 32k tokens, heads *
// head_dim = 2048, same-run ratios to PyTorch SDPA's FlashAttention-2 and
// cuDNN backends; all numbers in kernels/bench/results/attention.md):
//   reference   - the "standard attention" of the derivation: S = scale Q K^T
//                 written to scratch (fp32), a row softmax in place, O = P V,
//                 one thread per element. O(seq^2) scratch and traffic; the
//                 GPU oracle for small sizes. 176 ms at seq 1k, d 64
//                 (1.6 TFLOP/s).
//   flash_mma   - FlashAttention-2: online softmax, Q tile resident, K/V tiles
//                 streamed through a two-stage cp.async ring, mma.sync
//                 m16n8k16 with ldmatrix from XOR-swizzled tiles, 32 query rows
//                 per warp, causal tiles above the diagonal skipped.
//                 230-270 TFLOP/s = 0.75-0.85x FA2 (mma.sync tops out well
//                 below wgmma on Hopper). Query heads of one kv head packed into
//                 the rows and keys split over blocks (merged by LSE) for short
//                 query blocks: decode seq_q 16 vs 32k keys, GQA 4: 4.35x FA2,
//                 2.3x cuDNN. A 16-row decode tile whose four warps split the
//                 keys (merged in shared memory) took seq_q 1 from 0.365 to
//                 0.265 ms, and one wave of equal key splits (instead of 17
//                 splits in 2.75 waves) to 0.255 ms = 4.2 TB/s, 0.99-1.00x FA2.
//                 Against cuDNN (sweep runs 20-27, 2026-12-04): 0.93-0.97x at
//                 seq_q 1, its stream at 4.44 against cuDNN's 4.60 TB/s; K's
//                 copies before V's took 0.3-1.3% off, and a TMA rung
//                 (flash_decode: a third of the instructions), deeper rings
//                 and cuDNN's tile shape did not help (not kept). The decode
//                 tile as wide as D rounded up to 32 (256 before past 128,
//                 one block per SM) and two warps a block past 192 columns
//                 where the work fills three blocks per SM: 0.54x the time
//                 at 160 wide, 0.67x at 192, 0.75x (224) and 0.95x (256)
//                 with two warps, 0.77x at 32 (geometric means of random
//                 decode shapes, sweep run 37 on an H100).
//   flash_wgmma - Hopper: TMA into a multi-stage K/V ring on mbarriers, a
//                 producer warpgroup and two or three consumer warpgroups
//                 (setmaxnreg), wgmma for Q K^T (both operands in shared
//                 memory) and P V (P from registers, V transposed by the
//                 instruction). 333-530 TFLOP/s = 1.11-1.57x FA2, 0.70-0.94x
//                 cuDNN. Three consumers (192-row tiles) at head_dim 64 took
//                 seq 4k from 383 to 407 and 16k from 397 to 434 TFLOP/s but
//                 seq 1k causal from 248 down to 221, so seq_q < 2048 keeps two.
//                 Since then (server-path sweep, 106 shapes, against the
//                 faster of cuDNN and FA2; kernels/bench/results/
//                 sweep-attention.md): every head dim that is a multiple of 8
//                 up to 256 on tiles 64, 128, 192 or 256 wide (D96 was the
//                 fp32 reference at 20 ms; now 0.97-1.00x the time of D128), a
//                 persistent grid for short tiles (S128 squares 0.60-0.78x
//                 the time), split-KV when the tiles leave SMs idle (chunked
//                 prefill Sq128: 0.53-0.65x -> 1.51-1.67x the vendor): the
//                 default went from 0.925x to 0.996x the vendor (geomean).
//   flash_wgmma_pipelined - the same with the softmax of block n overlapping
//                 P V of block n - 1 inside each warpgroup (FlashAttention-3's
//                 order: both GEMMs issued together, O rescaled under Q K^T).
//                 First built as a regression (0.51-0.69x the vendor): it
//                 waited on a fixed ring stage at each tile's first block
//                 (a persistent grid trapped), ptxas injected warpgroup
//                 arrivals before P V (no wgmma fence there) and, with the
//                 consumers' tile loop written with a break after the wait,
//                 compiled under the 168-register entry cap instead of the
//                 232 setmaxnreg grants (208 bytes of spills, wgmmas
//                 serialised; ptxas C7512 / C7519). Fixed: 0.92x the vendor
//                 (geomean over the sweep, forced; flash_wgmma 0.92x).
//   flash_wgmma_pingpong - flash_wgmma with the consumers issuing Q K^T in
//                 turns (named barriers), so that one's softmax runs under the
//                 other's product: 0.89-1.02x the speed of flash_wgmma
//                 (geomean 0.99x).
//   flash_wgmma_overlap - both overlaps: each consumer pipelined as above and
//                 its two GEMMs of a block issued in turns with the other
//                 consumers: 0.99-1.17x the speed of flash_wgmma from 128
//                 query rows (geomean 1.08x). With it (server-path sweep runs
//                 9-12, 2026-12-02): the softmax's exp2 as ex2.approx.ftz (exp2f
//                 wraps it in a 3-instruction range fix-up), K handed back
//                 to the producer as soon as Q K^T has read it, causal grids
//                 fed by a tile counter (head-major order: K/V stay in L2),
//                 three consumers at D64 in every schedule, key tiles 176 /
//                 96 / 80 at D128 (long unmasked rows) / D192 / D256. The
//                 default: geomean 0.996x -> 1.152x the faster of cuDNN and
//                 FA2, 18 -> 58 of 106 shapes >= 1.0x, minimum 0.62 -> 0.82x.
//                 Then (runs 15-17, 2026-12-04) O by TMA store through
//                 shared memory, each tile worked out once by the producer,
//                 wgmma descriptors stepped by one add: 1.152x -> 1.198x,
//                 58 -> 81 of 106 >= 1.0x, minimum 0.82 -> 0.86x.
//                 Then (runs 30-31, 2026-12-06, H200, against the base in
//                 the same runs) the last round of a persistent grid without
//                 the mask dealt out by key blocks (stream-K over the tail;
//                 heuristics' WgmmaTailBlocks): 0.974x the time at B32 H32
//                 S512 D64 (4 tiles left of 4096), 0.976x at B1 H16 S16384
//                 D128, 0.82-0.88x on random shapes with a short last round;
//                 where the merge outweighs the blocks saved it is not taken.
// Best version against the floor: 692 TFLOP/s at d 128 (B1 H16 S16384,
// non-causal, sweep run 12) is 70% of the ~990 TFLOP/s dense bf16 peak (cuDNN
// 687 on the same shape); decode streams K/V at 4.2 TB/s, the copy ceiling.

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "attention_common.cuh"
#include "attention_mma.cuh"
#include "attention_wgmma.cuh"
#include "gpucompute/kernels/attention.h"
#include "heuristics/attention_heuristics.h"
#include "launch_util.h"

namespace gpucompute::kernels {
namespace attention {
namespace {

// ---------------------------------------------------------------------------
// reference: S materialised.
// ---------------------------------------------------------------------------

// S[bh, i, j] = scale q_i . k_j, or -inf where the causal mask hides key j.
// One thread per (i, j); a (16 x 16) block of them.
template <typename T>
__global__ void RefScoresKernel(const AttnParams p, int head_dim, float* S) {
  const int j = blockIdx.x * 16 + threadIdx.x;
  const int i = blockIdx.y * 16 + threadIdx.y;
  const int bh = blockIdx.z;
  if (i >= p.seq_q || j >= p.seq_kv) return;
  const int b = bh / p.heads_q, h = bh % p.heads_q;
  const int bkv = b * p.heads_kv + h / p.group;
  const T* qr = static_cast<const T*>(p.q) + (int64_t(bh) * p.seq_q + i) * head_dim;
  const T* kr = static_cast<const T*>(p.k) + (int64_t(bkv) * p.seq_kv + j) * head_dim;
  float acc = 0.f;
  for (int d = 0; d < head_dim; ++d) acc = fmaf(ToFloat(qr[d]), ToFloat(kr[d]), acc);
  const bool visible = !p.causal || j <= i + p.causal_off;
  S[(int64_t(bh) * p.seq_q + i) * p.seq_kv + j] = visible ? acc * p.scale : -INFINITY;
}

// Row softmax of S in place (S becomes P) and the row LSE. One block per row.
__global__ void __launch_bounds__(256) RefSoftmaxKernel(const AttnParams p, float* S) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  float* s = S + row * p.seq_kv;
  auto block_reduce = [&](float x, bool is_max) {
    for (int o = 16; o > 0; o >>= 1) {
      const float y = __shfl_xor_sync(0xffffffffu, x, o);
      x = is_max ? fmaxf(x, y) : x + y;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = red[0];
    for (int w = 1; w < int(blockDim.x >> 5); ++w) x = is_max ? fmaxf(x, red[w]) : x + red[w];
    __syncthreads();
    return x;
  };
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < p.seq_kv; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = block_reduce(mx, true);
  // Masked scores are -inf (P 0); a NaN score passes the maximum by and
  // makes the sum NaN: the row comes out NaN. A row that saw no key has sum 0.
  const float m_use = mx == -INFINITY ? 0.f : mx;
  float sum = 0.f;
  for (int j = threadIdx.x; j < p.seq_kv; j += blockDim.x) sum += expf(s[j] - m_use);
  sum = block_reduce(sum, false);
  const bool empty = sum == 0.f;
  const float inv = empty ? 0.f : 1.f / sum;
  for (int j = threadIdx.x; j < p.seq_kv; j += blockDim.x)
    s[j] = empty ? 0.f : expf(s[j] - m_use) * inv;
  if (threadIdx.x == 0 && p.lse) p.lse[row] = empty ? -INFINITY : m_use + logf(sum);
}

// O[bh, i, d] = sum_j P[bh, i, j] V[bkv, j, d]. One block per row, one thread
// per d.
template <typename T>
__global__ void RefPVKernel(const AttnParams p, int head_dim, const float* P) {
  const int64_t row = blockIdx.x;  // bh * seq_q + i
  const int bh = int(row / p.seq_q);
  const int b = bh / p.heads_q, h = bh % p.heads_q;
  const int bkv = b * p.heads_kv + h / p.group;
  const float* pr = P + row * p.seq_kv;
  const T* v = static_cast<const T*>(p.v) + int64_t(bkv) * p.seq_kv * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < p.seq_kv; ++j)
      acc = fmaf(pr[j], ToFloat(v[int64_t(j) * head_dim + d]), acc);
    StoreOut<T>(p, row * head_dim + d, acc);
  }
}

template <typename T>
cudaError_t LaunchReference(const AttnParams& p, int head_dim, float* S, cudaStream_t stream) {
  dim3 grid((p.seq_kv + 15) / 16, (p.seq_q + 15) / 16, p.batch * p.heads_q);
  RefScoresKernel<T><<<grid, dim3(16, 16), 0, stream>>>(p, head_dim, S);
  const unsigned rows = unsigned(p.batch) * p.heads_q * p.seq_q;
  RefSoftmaxKernel<<<rows, 256, 0, stream>>>(p, S);
  RefPVKernel<T><<<rows, std::min(head_dim, 256), 0, stream>>>(p, head_dim, S);
  return cudaGetLastError();
}

AttentionShape AttentionShapeOf(const AttentionArgs& a) {
  AttentionShape s;
  s.batch = a.batch;
  s.heads_q = a.heads_q;
  s.heads_kv = a.heads_kv;
  s.seq_q = a.seq_q;
  s.seq_kv = a.seq_kv;
  s.head_dim = a.head_dim;
  s.wgmma_head_dim = WgmmaHeadDim(a.head_dim);
  s.causal = a.causal;
  s.dtype = a.dtype;
  return s;
}

// ---------------------------------------------------------------------------
// flash_mma: tile choice, key splitting, launch.
// ---------------------------------------------------------------------------

struct MmaPlan {
  bool decode = false;  // 16-row tiles, warps split the keys (<= 16 packed rows)
  bool small = false;   // 64-row tiles (one m16 tile per warp) for short query blocks
  int kd = 128;         // the tile's width (and the key-split partials')
  int decode_warps = 4;  // the decode tile's warps (DecodeWarps)
  int br = 128;
  int bc = 64;
  int m_blocks = 1;
  int splits = 1;
  int split_len = 0;
  size_t workspace = 0;
};

// Resident decode blocks per SM (shared memory or registers bound them),
// asked once per tile.
template <typename T, typename Tile>
int DecodeBlocksPerSm() {
  static const int n = [] {
    auto kernel = FlashMmaDecodeKernel<T, Tile>;
    int blocks = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(Tile::kSmemBytes)) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Tile::kThreads,
                                                      Tile::kSmemBytes) != cudaSuccess)
      blocks = 1;
    return std::max(1, blocks);
  }();
  return n;
}

// Calls f(std::integral_constant<int, kD>()) for the width among kWidths
// that equals kd (the last where none does) and returns what it returns.
template <int kWidth, int... kRest, typename F>
auto WithWidthAmong(int kd, F&& f) {
  if constexpr (sizeof...(kRest) == 0) {
    return f(std::integral_constant<int, kWidth>());
  } else {
    if (kd == kWidth) return f(std::integral_constant<int, kWidth>());
    return WithWidthAmong<kRest...>(kd, f);
  }
}

// flash_mma's tile widths (32 to 256, a multiple of 32).
template <typename F>
auto WithTileWidth(int kd, F&& f) {
  return WithWidthAmong<32, 64, 96, 128, 160, 192, 224, 256>(kd, f);
}

// flash_wgmma's tile widths (64, 128, 192 or 256).
template <typename F>
auto WithWgmmaTileWidth(int kd, F&& f) {
  return WithWidthAmong<64, 128, 192, 256>(kd, f);
}

// Calls f(DecodeTile<...>()) for the decode tile kd wide with `warps` warps
// (two only from 224 columns on, as DecodeWarps chooses; else four) and
// returns what it returns: the one place a decode plan becomes a tile type.
// Two-warp tiles keep one K and one V buffer (DecodeTile's kStages 1): 35-40
// KiB instead of 63-72, four blocks per SM (bound by registers) instead of
// three (by shared memory); 0.89-0.98x the time of the two-stage ring on the
// rows DecodeWarps gives two warps (sweep-attention.md, run 42). Four-warp
// tiles keep their ring: one stage there was 1.11-1.16x the time on grids of
// 1-12 kv heads (two blocks per SM instead of one: twice the key splits).
template <typename F>
auto WithDecodeTile(int kd, int warps, F&& f) {
  return WithTileWidth(kd, [&](auto w) {
    constexpr int kD = decltype(w)::value;
    if constexpr (kD >= 224) {
      if (warps == 2) return f(DecodeTile<kD, 2, 1>());
    }
    return f(DecodeTile<kD, 4>());
  });
}

template <typename T>
int DecodeBlocksPerSmOf(int kd, int warps) {
  return WithDecodeTile(kd, warps, [](auto tile) {
    using Tile = decltype(tile);
    return DecodeBlocksPerSm<T, Tile>();
  });
}

// Resident blocks per SM of the decode tile kd wide with `warps` warps.
int DecodeBlocksPerSm(DType t, int kd, int warps) {
  if (t == DType::kF32) return DecodeBlocksPerSmOf<float>(kd, warps);
  if (t == DType::kF16) return DecodeBlocksPerSmOf<__half>(kd, warps);
  return DecodeBlocksPerSmOf<__nv_bfloat16>(kd, warps);
}

MmaPlan PlanMma(const AttentionArgs& a) {
  MmaPlan pl;
  const int64_t rows = a.heads_q / a.heads_kv * a.seq_q;
  // The decode tile takes one row block of 16 packed rows. In two to four
  // row blocks it also took 17-64 rows (each block streaming K and V), at
  // 0.48-2.2x the time of the 64-row tile on random decode shapes, with no
  // pattern read from them (sweep run 43, H100): from 17 rows on, the 64-
  // and 128-row tiles.
  pl.decode = rows <= 16;
  const int kd = pl.decode ? DecodeHeadDim(a.head_dim) : PaddedHeadDim(a.head_dim);
  pl.kd = kd;
  // 64-row tiles for short query blocks, and always at a padded head dim of
  // 256 (two m16 tiles per warp would not fit the registers).
  pl.small = !pl.decode && (rows <= 64 || kd == 256);
  pl.br = pl.decode ? 16 : (pl.small ? 64 : 128);
  pl.bc = kd == 256 && !pl.decode ? 32 : ((pl.decode || pl.small || kd == 64) ? 64 : 32);
  pl.m_blocks = int((rows + pl.br - 1) / pl.br);
  const int64_t ctas = int64_t(pl.m_blocks) * a.batch * a.heads_kv;
  const int sms = SmCount();
  if (pl.decode) {
    pl.decode_warps = DecodeWarps(kd, ctas, a.seq_kv, sms);
    pl.bc = 16 * pl.decode_warps;
  }
  const int64_t key_blocks = (a.seq_kv + pl.bc - 1) / pl.bc;
  int64_t wave_splits = 1;
  if (pl.decode && ctas >= sms) {
    const int64_t slots = int64_t(sms) * DecodeBlocksPerSm(a.dtype, kd, pl.decode_warps);
    wave_splits = DecodeWaveSplits(ctas, slots, key_blocks);
  }
  if (wave_splits > 1) {
    const int64_t per = (key_blocks + wave_splits - 1) / wave_splits;
    pl.split_len = int(per * pl.bc);
    pl.splits = int((a.seq_kv + pl.split_len - 1) / pl.split_len);
    if (pl.splits > 1) {
      pl.workspace = size_t(pl.splits) * a.batch * a.heads_q * a.seq_q * (kd + 1) * 4;
    } else {
      pl.split_len = 0;
    }
  } else if (ctas < sms && key_blocks >= 8) {
    // Decode: exactly one wave of equal splits over every resident block slot,
    // each DecodeMinSplitBlocks long or more (heuristics). Otherwise about
    // four blocks per SM, each split four key blocks or more.
    const int64_t want =
        pl.decode ? std::max<int64_t>(
                        1, int64_t(sms) * DecodeBlocksPerSm(a.dtype, kd, pl.decode_warps) / ctas)
                  : (4 * int64_t(sms) + ctas - 1) / ctas;
    const int64_t floor_blocks = pl.decode ? DecodeMinSplitBlocks(ctas, want, key_blocks, sms) : 4;
    const int64_t splits =
        std::max<int64_t>(1, std::min<int64_t>({want, key_blocks / floor_blocks, 128}));
    const int64_t per = (key_blocks + splits - 1) / splits;
    pl.split_len = int(per * pl.bc);
    pl.splits = int((a.seq_kv + pl.split_len - 1) / pl.split_len);
    if (pl.splits > 1)
      pl.workspace = size_t(pl.splits) * a.batch * a.heads_q * a.seq_q * (kd + 1) * 4;
    else
      pl.split_len = 0;
  }
  return pl;
}

// Merges the key splits of p (their partials kd wide) into O and the LSE: a
// warp per row up to kWarpMergeMax splits where the heuristics ask for it,
// else a block per row.
template <typename T>
void LaunchCombine(const AttnParams& p, int kd, cudaStream_t stream) {
  const unsigned rows = unsigned(p.batch) * p.heads_q * p.seq_q;
  constexpr unsigned kRowsPerBlock = kCombineThreads / 32;
  const bool warp = p.num_splits <= kWarpMergeMax && MergeByWarps(rows, SmCount());
  WithTileWidth(kd, [&](auto w) {
    constexpr int kD = decltype(w)::value;
    if (warp) {
      CombineSplitsWarpKernel<T, kD>
          <<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kCombineThreads, 0, stream>>>(p);
    } else {
      CombineSplitsKernel<T, kD><<<rows, kCombineThreads, 0, stream>>>(p);
    }
  });
}

// Merges the pieces of flash_wgmma's tail tiles (query tiles br rows high,
// kd 64, 128, 192 or 256 wide): a warp per row of every tail tile up to
// kWarpMergeMax pieces a tile where the heuristics ask for it, else a block
// per row (those past seq_q return).
template <typename T>
void LaunchCombineTail(const AttnParams& p, const TailSplit& t, int kd, int br,
                       cudaStream_t stream) {
  const int rows = int(br * (int64_t(p.batch) * p.heads_q * ((p.seq_q + br - 1) / br) - t.first));
  constexpr int kRowsPerBlock = kCombineThreads / 32;
  const bool warp = t.pieces <= kWarpMergeMax && MergeByWarps(rows, SmCount());
  const unsigned blocks = unsigned(warp ? (rows + kRowsPerBlock - 1) / kRowsPerBlock : rows);
  WithWgmmaTileWidth(kd, [&](auto w) {
    constexpr int kD = decltype(w)::value;
    if (warp) {
      CombineTailKernel<T, kD, true><<<blocks, kCombineThreads, 0, stream>>>(p, t, br, rows);
    } else {
      CombineTailKernel<T, kD, false><<<blocks, kCombineThreads, 0, stream>>>(p, t, br, rows);
    }
  });
}

template <typename T, typename Tile, bool kDecode = false>
cudaError_t LaunchMmaTile(const AttnParams& p, const MmaPlan& pl, cudaStream_t stream) {
  void (*kernel)(const AttnParams);
  if constexpr (kDecode) {
    kernel = FlashMmaDecodeKernel<T, Tile>;
  } else {
    kernel = FlashMmaKernel<T, Tile>;
  }
  // Per launch, not once: the attribute belongs to the current device.
  const cudaError_t attr = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tile::kSmemBytes));
  if (attr != cudaSuccess) return attr;
  dim3 grid(pl.m_blocks, p.batch * p.heads_kv, pl.splits);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  if (pl.splits > 1) LaunchCombine<T>(p, Tile::kD, stream);
  return cudaGetLastError();
}

// Tiles by the plan's width: the decode tile's (DecodeHeadDim), else the
// padded head dim (64, 128 or 256).
template <typename T>
cudaError_t LaunchMma(const AttnParams& p, const MmaPlan& pl, cudaStream_t stream) {
  const int kd = pl.kd;
  if (pl.decode) {
    return WithDecodeTile(kd, pl.decode_warps, [&](auto tile) {
      return LaunchMmaTile<T, decltype(tile), true>(p, pl, stream);
    });
  }
  if (kd == 64) {
    return pl.small ? LaunchMmaTile<T, MmaTile<64, 1, 64>>(p, pl, stream)
                    : LaunchMmaTile<T, MmaTile<64, 2, 64>>(p, pl, stream);
  }
  if (kd == 128) {
    return pl.small ? LaunchMmaTile<T, MmaTile<128, 1, 64>>(p, pl, stream)
                    : LaunchMmaTile<T, MmaTile<128, 2, 32>>(p, pl, stream);
  }
  return LaunchMmaTile<T, MmaTile<256, 1, 32>>(p, pl, stream);
}

// ---------------------------------------------------------------------------
// flash_wgmma: tensor maps, launch.
// ---------------------------------------------------------------------------

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, found once through the runtime (no link
// against libcuda).
EncodeTiledFn EncodeTiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return EncodeTiledFn(nullptr);
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A [planes, rows, d] 16-bit tensor as a 3-D tensor map with (box_rows x 64)
// boxes, 128-byte swizzle, zero fill out of bounds.
bool MakeTensorMap(CUtensorMap* map, const void* ptr, DType dtype, int64_t planes, int64_t rows,
                   int64_t d, int box_rows) {
  EncodeTiledFn enc = EncodeTiled();
  if (!enc) return false;
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(rows), cuuint64_t(planes)};
  const cuuint64_t strides[2] = {cuuint64_t(d * 2), cuuint64_t(rows * d * 2)};
  const cuuint32_t box[3] = {64, cuuint32_t(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return enc(map,
             dtype == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The work tiles of flash_wgmma and their key splits.
struct WgmmaPlan {
  int kd = 128;  // padded head dim
  int br = 128;  // query rows per tile
  int bc = 128;  // keys per block
  int64_t tiles = 0;  // query blocks x batch x heads_q (before key splits)
  int splits = 1;
  int split_len = 0;
  bool persistent = false;    // one block per SM walking the tiles (more tiles than SMs)
  bool tile_counter = false;  // a persistent grid fed by a counter (after the partials)
  size_t counter_offset = 0;
  TailSplit tail;  // the last round dealt out by key blocks (tail.per 0: not)
  size_t workspace = 0;
};

// The one place that chooses flash_wgmma's tile (LaunchWgmma launches what
// it says): three consumer warpgroups (192 rows) at a padded head dim of 64
// where the heuristics ask for them, else two (registers); the key tile; the
// key splits; a persistent grid where there are more tiles than SMs, fed by a
// counter under the causal mask.
WgmmaPlan PlanWgmma(const AttentionArgs& a) {
  WgmmaPlan pl;
  const AttentionShape shape = AttentionShapeOf(a);
  pl.kd = WgmmaHeadDim(a.head_dim);
  const int consumers = WgmmaConsumers(shape);
  pl.br = 64 * consumers;
  const int bc = WgmmaKeyTile(shape);
  pl.bc = bc ? bc : WgmmaDefaultKeyTile(pl.kd);
  const int64_t tiles = (a.seq_q + pl.br - 1) / pl.br * a.batch * a.heads_q;
  pl.tiles = tiles;
  const int64_t key_blocks = (a.seq_kv + pl.bc - 1) / pl.bc;
  const int64_t splits = WgmmaKeySplits(tiles, key_blocks, SmCount());
  if (splits > 1) {
    const int64_t per = (key_blocks + splits - 1) / splits;
    pl.split_len = int(per * pl.bc);
    pl.splits = int((a.seq_kv + pl.split_len - 1) / pl.split_len);
  }
  if (pl.splits > 1) {
    pl.workspace = size_t(pl.splits) * a.batch * a.heads_q * a.seq_q * (pl.kd + 1) * 4;
  } else {
    pl.split_len = 0;
  }
  pl.persistent = tiles * pl.splits > SmCount();
  pl.tile_counter = WgmmaTileCounter(shape) && pl.persistent;
  if (pl.splits == 1 && !pl.tile_counter) {
    const int64_t per = WgmmaTailBlocks(tiles, key_blocks, pl.br, SmCount(), a.causal);
    if (per > 0) {
      const int64_t r = tiles % SmCount();
      pl.tail.per = int(per);
      pl.tail.first = int(tiles - r);
      pl.tail.blocks = int(key_blocks);
      // The most pieces of one tail tile.
      for (int t = 0; t < int(r); ++t) pl.tail.pieces = std::max(pl.tail.pieces, pl.tail.Pieces(t));
      pl.workspace = size_t(r) * pl.tail.pieces * pl.br * (pl.kd + 1) * 4;
    }
  }
  if (pl.tile_counter) {
    pl.counter_offset = (pl.workspace + 15) / 16 * 16;
    pl.workspace = pl.counter_offset + 16;
  }
  return pl;
}

template <typename M, int kD, bool kCausal, int kSched, int kConsumers, int kBc = 0>
cudaError_t LaunchWgmmaTile(const AttentionArgs& a, const WgmmaPlan& pl, const AttnParams& p,
                            cudaStream_t stream) {
  using Tile = WgmmaTile<kD, kConsumers, kBc>;
  if (Tile::kBr != pl.br || Tile::kBc != pl.bc) return cudaErrorInvalidValue;
  // Maps over the tensors' own D: TMA zero-fills the tile columns past it.
  CUtensorMap tq, tk, tv;
  const int64_t d = a.head_dim;
  if (!MakeTensorMap(&tq, a.q, a.dtype, a.batch * a.heads_q, a.seq_q, d, Tile::kBr) ||
      !MakeTensorMap(&tk, a.k, a.dtype, a.batch * a.heads_kv, a.seq_kv, d, Tile::kBc) ||
      !MakeTensorMap(&tv, a.v, a.dtype, a.batch * a.heads_kv, a.seq_kv, d, Tile::kBc))
    return cudaErrorNotSupported;
  // 16-bit O of one key split leaves through shared memory by TMA (64-row
  // boxes: one consumer warpgroup's rows); fp32 O and key-split partials are
  // stored by the threads.
  CUtensorMap to{};
  int o_tma = !p.o_f32 && p.num_splits == 1 ? 1 : 0;
  if (o_tma && !MakeTensorMap(&to, a.o, a.dtype, a.batch * a.heads_q, a.seq_q, d, 64))
    return cudaErrorNotSupported;
  auto kernel = FlashWgmmaKernel<M, Tile, kCausal, kSched>;
  // Per launch, not once: the attribute belongs to the current device.
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                int(Tile::kStagedSmemBytes));
  if (attr != cudaSuccess) return attr;
  // Persistent (one block per SM: the shared memory allows no second one)
  // where there are more tiles than SMs, else one tile per block.
  const int64_t tiles = (a.seq_q + pl.br - 1) / pl.br * a.batch * a.heads_q * pl.splits;
  if (p.tile_counter) {
    if (cudaError_t e = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream); e != cudaSuccess)
      return e;
  }
  dim3 grid(unsigned(pl.persistent ? SmCount() : tiles));
  // A block that runs one tile never uses the Q slots past the first; a
  // persistent one stages O in a buffer of its own where that fits.
  size_t smem = pl.persistent ? Tile::kSmemBytes : Tile::kOneTileSmemBytes;
  if (o_tma && pl.persistent && Tile::kOStaged) {
    o_tma = 2;
    smem = Tile::kStagedSmemBytes;
  }
  kernel<<<grid, Tile::kThreads, smem, stream>>>(tq, tk, tv, to, p, pl.tail, o_tma);
  return cudaGetLastError();
}

// Launches the tile `pl` chose.
template <typename M, int kSched>
cudaError_t LaunchWgmma(const AttentionArgs& a, const WgmmaPlan& pl, const AttnParams& p,
                        cudaStream_t stream) {
  if (pl.kd == 64) {
    if (pl.br == 192)
      return a.causal ? LaunchWgmmaTile<M, 64, true, kSched, 3>(a, pl, p, stream)
                      : LaunchWgmmaTile<M, 64, false, kSched, 3>(a, pl, p, stream);
    if (a.causal) return LaunchWgmmaTile<M, 64, true, kSched, 2>(a, pl, p, stream);
    return pl.bc == 64 ? LaunchWgmmaTile<M, 64, false, kSched, 2, 64>(a, pl, p, stream)
                       : LaunchWgmmaTile<M, 64, false, kSched, 2>(a, pl, p, stream);
  }
  if (pl.kd == 128) {
    if (a.causal) return LaunchWgmmaTile<M, 128, true, kSched, 2>(a, pl, p, stream);
    if (pl.bc == 64) return LaunchWgmmaTile<M, 128, false, kSched, 2, 64>(a, pl, p, stream);
    return pl.bc == 176 ? LaunchWgmmaTile<M, 128, false, kSched, 2, 176>(a, pl, p, stream)
                        : LaunchWgmmaTile<M, 128, false, kSched, 2>(a, pl, p, stream);
  }
  if (pl.kd == 192)
    return a.causal ? LaunchWgmmaTile<M, 192, true, kSched, 2>(a, pl, p, stream)
                    : LaunchWgmmaTile<M, 192, false, kSched, 2>(a, pl, p, stream);
  return a.causal ? LaunchWgmmaTile<M, 256, true, kSched, 2>(a, pl, p, stream)
                  : LaunchWgmmaTile<M, 256, false, kSched, 2>(a, pl, p, stream);
}

// flash_wgmma with its key splits merged after.
template <typename M, int kSched>
cudaError_t LaunchWgmmaSplit(const AttentionArgs& a, AttnParams p, void* workspace,
                             cudaStream_t stream) {
  const WgmmaPlan pl = PlanWgmma(a);
  if (pl.splits > 1 || pl.tile_counter || pl.tail.per) {
    if (!workspace) return cudaErrorInvalidValue;
  }
  if (pl.tile_counter)
    p.tile_counter = reinterpret_cast<int*>(static_cast<char*>(workspace) + pl.counter_offset);
  if (pl.splits > 1) {
    p.num_splits = pl.splits;
    p.split_len = pl.split_len;
    p.part_o = static_cast<float*>(workspace);
    p.part_lse = p.part_o + size_t(pl.splits) * a.batch * a.heads_q * a.seq_q * pl.kd;
  }
  if (pl.tail.per) {
    // The tail's partials: [slots, br, kd], then their LSE [slots, br].
    const int64_t slots = int64_t(pl.tiles - pl.tail.first) * pl.tail.pieces;
    p.part_o = static_cast<float*>(workspace);
    p.part_lse = p.part_o + size_t(slots) * pl.br * pl.kd;
  }
  const cudaError_t err = LaunchWgmma<M, kSched>(a, pl, p, stream);
  if (err != cudaSuccess) return err;
  if (pl.splits > 1) LaunchCombine<M>(p, pl.kd, stream);
  if (pl.tail.per) LaunchCombineTail<M>(p, pl.tail, pl.kd, pl.br, stream);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------
// Argument checks and dispatch.
// ---------------------------------------------------------------------------

const std::vector<std::string>& Names() {
  static const std::vector<std::string> v = {"reference",
                                             "flash_mma",
                                             "flash_wgmma",
                                             "flash_wgmma_pipelined",
                                             "flash_wgmma_pingpong",
                                             "flash_wgmma_overlap"};
  return v;
}

// The flash_wgmma rungs (one kernel, four schedules).
bool IsWgmma(std::string_view v) {
  return v == "flash_wgmma" || v == "flash_wgmma_pipelined" || v == "flash_wgmma_pingpong" ||
         v == "flash_wgmma_overlap";
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

Support CheckCommon(const AttentionArgs& a) {
  if (!a.q || !a.k || !a.v || !a.o) return Support::No("null q, k, v or o");
  if (a.batch < 1 || a.heads_q < 1 || a.heads_kv < 1 || a.seq_q < 1 || a.seq_kv < 1 ||
      a.head_dim < 1)
    return Support::No("every size must be >= 1");
  if (a.heads_q % a.heads_kv != 0) return Support::No("heads_q must be a multiple of heads_kv");
  const int64_t big = int64_t(1) << 31;
  if (a.batch * a.heads_q * a.seq_q >= big || a.batch * a.heads_kv * a.seq_kv >= big ||
      a.batch * a.heads_q >= 65536)
    return Support::No("too large: rows must fit in int32 and batch * heads_q < 65536");
  return Support::Yes();
}

Support CheckFlash(const AttentionArgs& a) {
  if (a.head_dim % 8 != 0 || a.head_dim > 256)
    return Support::No("head_dim must be a multiple of 8 up to 256");
  if (!Aligned16(a.q) || !Aligned16(a.k) || !Aligned16(a.v) || !Aligned16(a.o))
    return Support::No("q, k, v and o must be 16-byte aligned");
  return Support::Yes();
}

Support CheckVariant(const AttentionArgs& a, std::string_view variant) {
  Support s = CheckCommon(a);
  if (!s) return s;
  if (variant == "reference") {
    if (a.head_dim > 1024) return Support::No("reference: head_dim must be <= 1024");
    return Support::Yes();
  }
  if (variant == "flash_mma") return CheckFlash(a);
  if (IsWgmma(variant)) {
    if (a.dtype == DType::kF32) return Support::No("flash_wgmma: fp16 or bf16 inputs only");
    s = CheckFlash(a);
    if (!s) return s;
    if (!EncodeTiled()) return Support::No("flash_wgmma: cuTensorMapEncodeTiled unavailable");
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (major != 9) return Support::No("flash_wgmma: needs an sm_90 (Hopper) GPU");
    return Support::Yes();
  }
  return Support::No("unknown variant '" + std::string(variant) + "'");
}

// The version the default runs (heuristics/attention_heuristics.h).
std::string_view Pick(const AttentionArgs& a) {
  AttentionShape s = AttentionShapeOf(a);
  s.wgmma_ok = bool(CheckVariant(a, "flash_wgmma"));
  s.mma_ok = bool(CheckVariant(a, "flash_mma"));
  return ChooseAttentionVariant(s);
}

AttnParams MakeParams(const AttentionArgs& a) {
  AttnParams p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.o = a.o;
  p.lse = a.lse;
  p.batch = int(a.batch);
  p.heads_q = int(a.heads_q);
  p.heads_kv = int(a.heads_kv);
  p.group = int(a.heads_q / a.heads_kv);
  p.seq_q = int(a.seq_q);
  p.seq_kv = int(a.seq_kv);
  p.causal = a.causal ? 1 : 0;
  p.causal_off = int(a.seq_kv - a.seq_q);
  p.head_dim = int(a.head_dim);
  p.o_f32 = a.out_f32 ? 1 : 0;
  p.scale = a.scale > 0.f ? a.scale : float(1.0 / std::sqrt(double(a.head_dim)));
  p.scale_log2 = p.scale * kLog2e;
  p.num_splits = 1;
  return p;
}

}  // namespace
}  // namespace attention

const std::vector<std::string>& AttentionVariants() { return attention::Names(); }

Support CanImplementAttention(const AttentionArgs& args, std::string_view variant) {
  if (variant.empty()) {
    Support s = attention::CheckCommon(args);
    if (!s) return s;
    return attention::CheckVariant(args, attention::Pick(args));
  }
  return attention::CheckVariant(args, variant);
}

std::string_view AttentionVariantName(const AttentionArgs& args, std::string_view variant) {
  return variant.empty() ? attention::Pick(args) : variant;
}

size_t AttentionWorkspaceBytes(const AttentionArgs& args, std::string_view variant) {
  if (variant.empty()) variant = attention::Pick(args);
  if (!attention::CheckVariant(args, variant)) return 0;
  if (variant == "reference")
    return size_t(args.batch) * args.heads_q * args.seq_q * args.seq_kv * sizeof(float);
  if (variant == "flash_mma") return attention::PlanMma(args).workspace;
  if (attention::IsWgmma(variant)) return attention::PlanWgmma(args).workspace;
  return 0;
}

cudaError_t LaunchAttention(const AttentionArgs& args, std::string_view variant, void* workspace,
                            cudaStream_t stream) {
  using namespace attention;
  if (variant.empty()) variant = Pick(args);
  if (!CheckVariant(args, variant)) return cudaErrorInvalidValue;
  AttnParams p = MakeParams(args);
  const int d = int(args.head_dim);
  if (variant == "reference") {
    if (!workspace) return cudaErrorInvalidValue;
    float* S = static_cast<float*>(workspace);
    switch (args.dtype) {
      case DType::kF32: return LaunchReference<float>(p, d, S, stream);
      case DType::kF16: return LaunchReference<__half>(p, d, S, stream);
      case DType::kBF16: return LaunchReference<__nv_bfloat16>(p, d, S, stream);
    }
    return cudaErrorInvalidValue;
  }
  if (variant == "flash_mma") {
    const MmaPlan pl = PlanMma(args);
    if (pl.splits > 1) {
      if (!workspace) return cudaErrorInvalidValue;
      p.num_splits = pl.splits;
      p.split_len = pl.split_len;
      p.part_o = static_cast<float*>(workspace);
      // The partials are as wide as the tile (PlanMma sized them so).
      p.part_lse =
          p.part_o + size_t(pl.splits) * args.batch * args.heads_q * args.seq_q * size_t(pl.kd);
    }
    switch (args.dtype) {
      case DType::kF32:
        return LaunchMma<float>(p, pl, stream);
      case DType::kF16:
        return LaunchMma<__half>(p, pl, stream);
      case DType::kBF16:
        return LaunchMma<__nv_bfloat16>(p, pl, stream);
    }
    return cudaErrorInvalidValue;
  }
  const bool f16 = args.dtype == DType::kF16;
  if (variant == "flash_wgmma")
    return f16 ? LaunchWgmmaSplit<__half, kSchedInOrder>(args, p, workspace, stream)
               : LaunchWgmmaSplit<__nv_bfloat16, kSchedInOrder>(args, p, workspace, stream);
  if (variant == "flash_wgmma_pingpong")
    return f16 ? LaunchWgmmaSplit<__half, kSchedPingPong>(args, p, workspace, stream)
               : LaunchWgmmaSplit<__nv_bfloat16, kSchedPingPong>(args, p, workspace, stream);
  if (variant == "flash_wgmma_pipelined")
    return f16 ? LaunchWgmmaSplit<__half, kSchedPipelined>(args, p, workspace, stream)
               : LaunchWgmmaSplit<__nv_bfloat16, kSchedPipelined>(args, p, workspace, stream);
  return f16 ? LaunchWgmmaSplit<__half, kSchedOverlap>(args, p, workspace, stream)
             : LaunchWgmmaSplit<__nv_bfloat16, kSchedOverlap>(args, p, workspace, stream);
}

}  // namespace gpucompute::kernels
