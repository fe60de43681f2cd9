// Rungs 2-5 of the tensor-core GEMM ladder: TMA tiles in 128B-swizzled shared
// memory, mbarrier completion and wgmma (sm_90a). Included by gemm_tc.cu only.
//
//   WgmmaTmaKernel: one warpgroup computes a 64 x 256 tile; thread 0 also
//     issues the TMA loads of a kStages-deep ring (rung 2).
//   WgmmaWsKernel: warp-specialised. Warpgroup 0 is the producer (one thread
//     issues TMA into the ring, waits on "empty" barriers); warpgroups 1..2
//     each compute 64 rows of a 128 x 256 tile and release stages on the
//     "empty" barriers; setmaxnreg moves registers from producer to consumers.
//     The kernel walks tiles t = blockIdx.x, blockIdx.x + gridDim.x, ...: with
//     one block per tile it is rung 3, with one block per SM (persistent,
//     grouped tile order) rung 4, where the producer already loads the next
//     tile while the consumers run the epilogue. With kCluster == 2 (rung 5)
//     the kernel runs as 2-CTA clusters that share the B tile by TMA multicast.
//     With p.splits > 1 (wgmma_splitk) it walks (tile, K range) units and
//     writes fp32 partial sums, added up by SplitKReduceKernel. Cfg picks the
//     tile width (256, 128 or 64 columns); the consumers' epilogue
//     (ConsumerEpilogue) stages 16-bit C and C read for beta through shared
//     memory and writes C^T for swap-AB (p.c_trans).
#ifndef GPUCOMPUTE_KERNELS_SRC_GEMM_TC_WGMMA_CUH_
#define GPUCOMPUTE_KERNELS_SRC_GEMM_TC_WGMMA_CUH_

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "gemm_tc_common.cuh"
#include "gemm_tc_sm90.cuh"
#include "sm90_primitives.cuh"

namespace gpucompute::kernels::tc {

// Tile configuration of the wgmma rungs (byte sizes are the same for
// bf16/fp16 and tf32: a stage always holds 128 bytes of K per row). Every
// consumer warpgroup owns 64 rows of the tile and kBN / 2 fp32 accumulators
// per thread (one m64nkBN wgmma per k-step).
template <int kConsumers_, int kStages_, int kBN_ = 256>
struct WgmmaConfig {
  static constexpr int kConsumers = kConsumers_;    // consumer warpgroups, 64 rows each
  static constexpr int kStages = kStages_;          // TMA ring depth
  static constexpr int kBM = 64 * kConsumers;       // (BLOCK_M)
  static constexpr int kBN = kBN_;                  // (BLOCK_N) 256, 192, 128, 64, 32 or 16
  static constexpr int kAcc = kBN / 2;              // accumulators per consumer thread
  static constexpr int kRowBytes = 128;             // (row, 128 bytes of K) per stage
  static constexpr int kKSteps = kRowBytes / 32;    // wgmma k-steps of 32 bytes per stage
  static constexpr int kABytes = kBM * kRowBytes;   // (BLOCK_M, 128 B)
  static constexpr int kBBytes = kBN * kRowBytes;   // (BLOCK_N, 128 B)
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kMnBlockBytes = 64 * kRowBytes;  // MN-major: 64 values x 64 K rows
  static constexpr int kTf32MBlockBytes = 32 * kRowBytes;  // M-major tf32 A: 32 values x 32 K rows
  // Staged epilogue (StagedEpilogue16, StagedEpilogueBeta): per consumer, 64
  // rows of 32 words (64 16-bit or 32 fp32 values) kEpiLd words apart (4
  // words of padding: conflict-free fragment writes and 16-byte row reads).
  static constexpr int kEpiLd = 32 + 4;
  static constexpr int kEpiBytes = kConsumers * 64 * kEpiLd * 4;
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kEpiBytes + 2 * kStages * 8 + 1024;  // + align
  static_assert(kStageBytes % 1024 == 0, "swizzle atoms stay 1024-byte aligned");
  // Thin tiles (32 or 16 columns: a few tokens against a weight, as C^T)
  // load B K-major only and write C from the fragments; the staged
  // epilogues walk whole 64-column chunks.
  static constexpr bool kThin = kBN < 64;
  static_assert(kBN % 64 == 0 || kBN == 32 || kBN == 16, "tile widths: 256, 192, 128, 64, 32, 16");
  // Cluster split-K (WgmmaWsKernel's kClusterSplit): the tile's fp32 sums, rows
  // kRedLd floats apart (conflict-free 8-byte fragment writes), in the ring.
  static constexpr int kRedLd = kBN + 8;
  static_assert(kBM * kRedLd * 4 <= kStages * kStageBytes, "the sums fit the TMA ring");
  static_assert(kSmemBytes <= 227 * 1024, "fits the H200's shared memory per block");
};

// Issues the TMA loads of k-block kb into one stage. Boxes (inner first):
//   A K-major {BK, BM}; A M-major {64, 64} per 64 rows of M (tf32: {32, 32}
//   per 32 rows);
//   B K-major {BK, 256 / kCluster}; B N-major {64, 64} per 64 columns of N.
// With a 2-CTA cluster (kCluster == 2) both CTAs work on the same columns of
// C: CTA `rank` loads its half of the B stage and multicasts it to both, so
// each CTA reads 16 KB of A and 16 KB of B from L2 per stage instead of 48 KB.
template <typename T, bool kTransA, bool kTransB, typename Cfg, int kCluster = 1>
__device__ __forceinline__ void IssueStage(const CUtensorMap* map_a, const CUtensorMap* map_b,
                                           uint32_t sa, uint32_t sb, uint32_t full, int kb,
                                           int m0, int n0, int ba, int bb, int rank = 0) {
  static_assert(kTransB || !Cfg::kThin, "thin tiles load B K-major");
  constexpr int kBK = Cfg::kRowBytes / sizeof(T);
  sm90::MbarArriveExpectTx(full, Cfg::kStageBytes);  // all of A and both halves of B
  if constexpr (kTransA && std::is_same_v<T, float>) {
#pragma unroll
    for (int c = 0; c < Cfg::kBM / 32; ++c)
      sm90::TmaLoad3d(sa + c * Cfg::kTf32MBlockBytes, map_a, m0 + 32 * c, kb * kBK, ba, full);
  } else if constexpr (kTransA) {
#pragma unroll
    for (int c = 0; c < Cfg::kBM / 64; ++c)
      sm90::TmaLoad3d(sa + c * Cfg::kMnBlockBytes, map_a, m0 + 64 * c, kb * kBK, ba, full);
  } else {
    sm90::TmaLoad3d(sa, map_a, kb * kBK, m0, ba, full);
  }
  if constexpr (kCluster == 1) {
    if constexpr (kTransB) {
      sm90::TmaLoad3d(sb, map_b, kb * kBK, n0, bb, full);
    } else {
#pragma unroll
      for (int c = 0; c < Cfg::kBN / 64; ++c)
        sm90::TmaLoad3d(sb + c * Cfg::kMnBlockBytes, map_b, n0 + 64 * c, kb * kBK, bb, full);
    }
  } else {
    static_assert(kCluster == 2, "pairs of CTAs");
    constexpr uint16_t kBoth = 0x3;
    constexpr int kHalf = Cfg::kBN / 2;
    if constexpr (kTransB) {
      TmaLoad3dMulticast(sb + rank * kHalf * Cfg::kRowBytes, map_b, kb * kBK, n0 + rank * kHalf,
                         bb, full, kBoth);
    } else {
#pragma unroll
      for (int c = 0; c < kHalf / 64; ++c) {
        const int chunk = rank * (kHalf / 64) + c;
        TmaLoad3dMulticast(sb + chunk * Cfg::kMnBlockBytes, map_b, n0 + 64 * chunk, kb * kBK, bb,
                           full, kBoth);
      }
    }
  }
}

// True when the stage's A is M-major tf32, which wgmma takes from registers.
template <typename T, bool kTransA>
inline constexpr bool kRegistersA = kTransA&& std::is_same_v<T, float>;

// A warpgroup's tf32 A fragments of one stage, read from its 64-row slab `sa`
// of two 32-row M-major blocks: f[j] holds k-step j's four values per thread
// in WgmmaM64NTf32Rs's layout. In a block, value (m, k) lies at byte k * 128 +
// ((m / 4) ^ (k % 8)) * 16 + (m % 4) * 4 (TMA's 128B swizzle); a warp's 32
// reads of one register fall on 16 banks, two lanes each.
template <typename Cfg>
__device__ __forceinline__ void LoadTf32Fragments(uint32_t (&f)[Cfg::kKSteps][4], uint32_t sa) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const int t = lane % 4, m = 16 * (warp % 2) + lane / 4;  // m: row in the 32-row block
  const uint32_t block = sa + (warp / 2) * Cfg::kTf32MBlockBytes + (m % 4) * 4;
  const int q0 = m / 4, q1 = q0 + 2;  // 16-byte chunks of rows m and m + 8
  const uint32_t off[4] = {block + t * 128 + ((q0 ^ t) << 4), block + t * 128 + ((q1 ^ t) << 4),
                           block + (t + 4) * 128 + ((q0 ^ (t + 4)) << 4),
                           block + (t + 4) * 128 + ((q1 ^ (t + 4)) << 4)};
#pragma unroll
  for (int j = 0; j < Cfg::kKSteps; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) f[j][r] = sm90::LdShared32(off[r] + j * 1024);
}

// The k-steps of one stage with A from registers `f` (LoadTf32Fragments) and
// K-major B at `sb`, committed as one group. The group reads `f` until it
// retires: those registers must not be written before a wait covers it.
template <typename Cfg>
__device__ __forceinline__ void MmaStageTf32Rs(float (&d)[Cfg::kAcc],
                                               const uint32_t (&f)[Cfg::kKSteps][4], uint32_t sb) {
  sm90::WgmmaFence();
#pragma unroll
  for (int j = 0; j < Cfg::kKSteps; ++j)
    WgmmaM64NTf32Rs<Cfg::kBN>(d, f[j], sm90::MakeSmemDesc(sb + j * 32, 16, 1024));
  sm90::WgmmaCommit();
}

// The wgmma k-steps of one stage for one consumer warpgroup: `sa` is its
// 64-row slab of A, `sb` the whole B stage. Commits them as one group. With
// A from registers (kRegistersA) the caller must wait for this group to
// retire before the next call, which reuses the fragment registers.
template <typename T, bool kTransA, bool kTransB, typename Cfg>
__device__ __forceinline__ void MmaStage(float (&d)[Cfg::kAcc], uint32_t sa, uint32_t sb) {
  if constexpr (kRegistersA<T, kTransA>) {
    static_assert(kTransB, "tf32 B is read K-major");
    uint32_t f[Cfg::kKSteps][4];
    LoadTf32Fragments<Cfg>(f, sa);
    MmaStageTf32Rs<Cfg>(d, f, sb);
  } else {
    sm90::WgmmaFence();
#pragma unroll
    for (int j = 0; j < Cfg::kKSteps; ++j) {
      const uint64_t da = kTransA ? sm90::MakeSmemDesc(sa + j * 2048, Cfg::kMnBlockBytes, 1024)
                                  : sm90::MakeSmemDesc(sa + j * 32, 16, 1024);
      const uint64_t db = kTransB ? sm90::MakeSmemDesc(sb + j * 32, 16, 1024)
                                  : sm90::MakeSmemDesc(sb + j * 2048, Cfg::kMnBlockBytes, 1024);
      // wgmma's transpose flags mean "MN-major": A transposed, B not transposed.
      WgmmaM64N<T, Cfg::kBN, kTransA ? 1 : 0, kTransB ? 0 : 1>(d, da, db);
    }
    sm90::WgmmaCommit();
  }
}

// Writes a consumer warpgroup's 64 x (kAcc * 2) accumulator block whose
// first row is `row0` (already including the warpgroup's slab) and first
// column `col0` straight from the fragments: per store instruction a warp
// writes 8 rows x 4 pairs, whole 32-byte sectors for fp32 C, half sectors
// for 16-bit C (which StagedEpilogue16 writes in whole rows instead).
template <typename T, int kAcc>
__device__ __forceinline__ void Epilogue(const TcParams& p, int bi, int row0, int col0,
                                         const float (&d)[kAcc]) {
  if (row0 >= p.m) return;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const int row = row0 + warp * 16 + lane / 4;
  const int col = col0 + 2 * (lane % 4);
  // Inside C, beta == 0 and pairs aligned: plain paired stores, no checks.
  const bool plain = p.beta == 0.f && p.c_pairs && row0 + 64 <= p.m && col0 + kAcc * 2 <= p.n;
  auto store = [&](auto* c) {
    using Tc = std::remove_pointer_t<decltype(c)>;
    using P = typename Pair<Tc>::Type;
    const Tc* cs = BatchCSrc<Tc>(p, bi);
    if (plain) {
      P* r0 = reinterpret_cast<P*>(c + static_cast<int64_t>(row) * p.ldc + col);
      P* r8 = reinterpret_cast<P*>(c + static_cast<int64_t>(row + 8) * p.ldc + col);
#pragma unroll
      for (int i = 0; i < kAcc / 4; ++i) {
        P v0, v1;
        v0.x = FromFloat<Tc>(p.alpha * d[4 * i]);
        v0.y = FromFloat<Tc>(p.alpha * d[4 * i + 1]);
        v1.x = FromFloat<Tc>(p.alpha * d[4 * i + 2]);
        v1.y = FromFloat<Tc>(p.alpha * d[4 * i + 3]);
        r0[4 * i] = v0;
        r8[4 * i] = v1;
      }
      return;
    }
    WithBeta(p.beta, [&](auto beta) {
      constexpr bool kBeta = decltype(beta)::value;
#pragma unroll
      for (int i = 0; i < kAcc / 4; ++i) {
        StoreC2<Tc, kBeta>(p, c, cs, row, col + 8 * i, d[4 * i], d[4 * i + 1]);
        StoreC2<Tc, kBeta>(p, c, cs, row + 8, col + 8 * i, d[4 * i + 2], d[4 * i + 3]);
      }
    });
  };
  if (p.c_type == 0) store(BatchC<float>(p, bi));
  else if constexpr (std::is_same_v<T, __half>) store(BatchC<__half>(p, bi));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) store(BatchC<__nv_bfloat16>(p, bi));
}

// Named barrier `id` (1 + consumer index; 0 is __syncthreads) over the 128
// threads of one consumer warpgroup.
__device__ __forceinline__ void WarpgroupBarrier(int id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

// Eight elements of C as they lie in memory (16 or 32 bytes).
template <typename Tc>
struct Row8 {
  uint4 q[8 * sizeof(Tc) / 16];
};

// C[row, col..col+7] (src_row points at C[row, 0]; zeros outside C, and for
// the whole piece when !live); 16-byte loads where C's rows lie on 16 bytes.
template <typename Tc>
__device__ __forceinline__ Row8<Tc> LoadRow8(const TcParams& p, const Tc* src_row, int col,
                                             bool live) {
  Row8<Tc> r;
  if (live && p.c_vec && col + 8 <= p.n) {
#pragma unroll
    for (int q = 0; q < 8 * int(sizeof(Tc)) / 16; ++q)
      r.q[q] = reinterpret_cast<const uint4*>(src_row + col)[q];
    return r;
  }
  Tc* e = reinterpret_cast<Tc*>(r.q);
#pragma unroll
  for (int j = 0; j < 8; ++j) e[j] = live && col + j < p.n ? src_row[col + j] : FromFloat<Tc>(0.f);
  return r;
}

// v[0..7] += beta * the eight values of `old`.
template <typename Tc>
__device__ __forceinline__ void AddRow8(float beta, const Row8<Tc>& old, float (&v)[8]) {
  const Tc* o = reinterpret_cast<const Tc*>(old.q);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = fmaf(beta, ToFloat(o[j]), v[j]);
}

// C[row, col..col+7] = v for the columns inside C; 16-byte stores where C's
// rows lie on 16 bytes.
template <typename Tc>
__device__ __forceinline__ void StoreRow8(const TcParams& p, Tc* c_row, int col,
                                          const float (&v)[8]) {
  if (p.c_vec && col + 8 <= p.n) {
    constexpr int kVecs = 8 * sizeof(Tc) / 16;
    alignas(16) Tc out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = FromFloat<Tc>(v[j]);
#pragma unroll
    for (int q = 0; q < kVecs; ++q)
      reinterpret_cast<uint4*>(c_row + col)[q] = reinterpret_cast<const uint4*>(out)[q];
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (col + j < p.n) c_row[col + j] = FromFloat<Tc>(v[j]);
}

// Brings the rows row0..row0+63, columns col0..col0+kBN-1 of C into L2 (one
// warpgroup, before its tile's main loop when beta != 0), so that the
// epilogue's reads of C, which come a chunk at a time after the previous
// chunk's stores, wait on L2 rather than HBM. Measured together with
// StagedEpilogueBeta (sweep-gemm.md runs 9 -> 11): 2048^3 tf32 with beta
// 98.3 -> 83 us; 4096^3 bf16 with beta unchanged (235 -> 237 us, 53 us more
// than without beta: that epilogue is bound by its own instructions).
template <int kBN>
__device__ __forceinline__ void PrefetchC(const TcParams& p, int bi, int row0, int col0) {
  if (row0 >= p.m) return;
  const int cs = p.c_type == 0 ? 4 : 2;
  const char* base =
      static_cast<const char*>(p.c_src) + static_cast<int64_t>(bi) * p.stride_c_src * cs;
  const int cols = min(kBN, p.n - col0);
  const int lines = (cols * cs + 127) / 128 + 1;  // 128-byte lines a row touches, at most
  const int rows = min(64, p.m - row0);
  for (int q = threadIdx.x % 128; q < rows * lines; q += 128) {
    const int r = q / lines, l = q % lines;
    const int64_t first = (static_cast<int64_t>(row0 + r) * p.ldc + col0) * cs;
    const int64_t line = (first & ~int64_t(127)) + 128 * l;  // relative to base
    if (line < first + int64_t(cols) * cs)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(base + line));
  }
}

// Two fp32 values as the 16-bit pair (lo, hi) in one 32-bit word.
template <typename Tc>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  typename Pair<Tc>::Type v;
  v.x = FromFloat<Tc>(lo);
  v.y = FromFloat<Tc>(hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The 16-bit C of a consumer warpgroup's 64 x kBN block (first row `row0`,
// first column `col0`) with beta == 0, written in whole rows through shared
// memory: the fragments' 4-byte stores left the small-K cases bound by the
// store queue ("LG throttle" 62% of the stalls of 4096x4096x64 bf16 in
// Nsight Compute). Chunk by chunk of 64 columns: every thread converts its
// fragment pairs (one cvt a pair) into `buf` (64 rows x 128 bytes, rows
// kEpiLd words apart: conflict-free 4-byte writes and 16-byte reads), the
// warpgroup syncs on named barrier `bar_id`, and each thread copies 16 bytes
// of four rows to C: one 16-byte store where C's rows lie on 16 bytes,
// element by element (a warp's lanes on adjacent columns) where not.
template <typename Tc, typename Cfg>
__device__ __forceinline__ void StagedEpilogue16(const TcParams& p, Tc* c, int row0, int col0,
                                                 float (&d)[Cfg::kAcc], uint32_t* buf, int bar_id) {
  constexpr int kLd = Cfg::kEpiLd;  // words per staged row (64 values + padding)
  const int t = threadIdx.x % 128, lane = t % 32, warp = t / 32;
  const int fr = warp * 16 + lane / 4, fq = lane % 4;  // fragment row, pair in its 8 columns
  const int rr = t / 8, rg = t % 8;                    // read back: rows rr + 16 i, 16 bytes rg
  if (p.alpha != 1.f) {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) d[i] *= p.alpha;
  }
  const bool inside = p.c_vec && !p.c_trans && row0 + 64 <= p.m && col0 + Cfg::kBN <= p.n;
#pragma unroll
  for (int ch = 0; ch < Cfg::kBN / 64; ++ch) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = ch * 8 + j;  // the fragment's 8-column group
      buf[fr * kLd + 4 * j + fq] = PackPair<Tc>(d[4 * i], d[4 * i + 1]);
      buf[(fr + 8) * kLd + 4 * j + fq] = PackPair<Tc>(d[4 * i + 2], d[4 * i + 3]);
    }
    WarpgroupBarrier(bar_id);
    const int cc = col0 + ch * 64;  // first column of the chunk
    if (p.c_trans) {
      // C^T: column cc + cl of the chunk is row cc + cl of C, the block's
      // rows its adjacent columns. Lanes take adjacent columns of the chunk
      // (conflict-free reads), warps groups of 8 rows; each thread stores 8
      // adjacent elements of one row of C.
      const Tc* staged = reinterpret_cast<const Tc*>(buf);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int cl = lane + 32 * h, col = cc + cl;
#pragma unroll
        for (int g = warp; g < 8; g += 4) {
          const int row = row0 + 8 * g;
          if (col >= p.n || row >= p.m) continue;
          alignas(16) Tc v[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = staged[(8 * g + e) * 2 * kLd + cl];
          Tc* dst = c + static_cast<int64_t>(col) * p.ldc + row;
          if (p.c_vec && row + 8 <= p.m) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
          } else {
            for (int e = 0; e < 8 && row + e < p.m; ++e) dst[e] = v[e];
          }
        }
      }
    } else if (inside) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = rr + 16 * i;
        *reinterpret_cast<uint4*>(c + static_cast<int64_t>(row0 + r) * p.ldc + cc + 8 * rg) =
            *reinterpret_cast<const uint4*>(buf + r * kLd + 4 * rg);
      }
    } else if (p.c_vec) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = rr + 16 * i, col = cc + 8 * rg;
        if (row0 + r >= p.m || col >= p.n) continue;
        Tc* dst = c + static_cast<int64_t>(row0 + r) * p.ldc + col;
        const Tc* src = reinterpret_cast<const Tc*>(buf + r * kLd + 4 * rg);
        if (col + 8 <= p.n) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
          for (int e = 0; e < p.n - col; ++e) dst[e] = src[e];
        }
      }
    } else {
      // Rows not on 16 bytes: warp w takes rows w, w + 4, ..., lanes take
      // adjacent columns (64 contiguous bytes a store instruction).
      const Tc* staged = reinterpret_cast<const Tc*>(buf);
#pragma unroll 4
      for (int r = warp; r < 64; r += 4) {
        if (row0 + r >= p.m) break;
        Tc* dst = c + static_cast<int64_t>(row0 + r) * p.ldc;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int col = cc + lane + 32 * h;
          if (col < p.n) dst[col] = staged[r * 2 * kLd + lane + 32 * h];
        }
      }
    }
    WarpgroupBarrier(bar_id);  // the chunk is read before the next one overwrites it
  }
}

// C (16-bit or fp32) of a consumer warpgroup's block with beta != 0: as
// StagedEpilogue16, but staged in fp32 (32 columns a chunk) so that
// alpha * acc + beta * C is rounded once. The addend (cs, BatchCSrc) is
// loaded kAhead chunks before its chunk is stored, so that its latency
// overlaps the staging of the chunks between (one chunk's loads waited out
// before each store left 4096^3 bf16 with beta ~35 us slower than without).
template <typename Tc, typename Cfg>
__device__ __forceinline__ void StagedEpilogueBeta(const TcParams& p, Tc* c, const Tc* cs, int row0,
                                                   int col0, const float (&d)[Cfg::kAcc],
                                                   float* buf, int bar_id) {
  constexpr int kLd = Cfg::kEpiLd;  // floats per staged row (32 values + padding)
  constexpr int kChunks = Cfg::kBN / 32, kAhead = 2;
  const int t = threadIdx.x % 128, lane = t % 32, warp = t / 32;
  const int fr = warp * 16 + lane / 4, fc = 2 * (lane % 4);  // fragment row and column
  const int rr = t / 4, rc = 8 * (t % 4);                    // read back: rows rr, rr + 32
  Row8<Tc> old[kAhead + 1][2];  // the addend of chunks ch .. ch + kAhead, rows rr and rr + 32
  auto load = [&](int ch, Row8<Tc>(&dst)[2]) {
    const int col = col0 + ch * 32 + rc;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + rr + 32 * h;
      dst[h] = LoadRow8(p, cs + static_cast<int64_t>(row) * p.ldc, col, row < p.m && col < p.n);
    }
  };
#pragma unroll
  for (int ch = 0; ch < kAhead && ch < kChunks; ++ch) load(ch, old[ch]);
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
    if (ch + kAhead < kChunks) load(ch + kAhead, old[(ch + kAhead) % (kAhead + 1)]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = ch * 4 + j;  // the fragment's 8-column group
      *reinterpret_cast<float2*>(buf + fr * kLd + 8 * j + fc) = make_float2(d[4 * i], d[4 * i + 1]);
      *reinterpret_cast<float2*>(buf + (fr + 8) * kLd + 8 * j + fc) =
          make_float2(d[4 * i + 2], d[4 * i + 3]);
    }
    WarpgroupBarrier(bar_id);
    const int col = col0 + ch * 32 + rc;
    float v[2][8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* src = buf + (rr + 32 * h) * kLd + rc;
#pragma unroll
      for (int e = 0; e < 8; ++e) v[h][e] = p.alpha * src[e];
    }
    if (col < p.n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) AddRow8(p.beta, old[ch % (kAhead + 1)][h], v[h]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (row0 + rr + 32 * h < p.m)
          StoreRow8(p, c + static_cast<int64_t>(row0 + rr + 32 * h) * p.ldc, col, v[h]);
    }
    WarpgroupBarrier(bar_id);  // the chunk is read before the next one overwrites it
  }
}

// C^T (swap-AB) of a consumer warpgroup's block with fp32 C or beta != 0,
// element by element from the fragments: (row, col) of the block goes to
// C[col, row]. Swap-AB runs thin problems, whose C is small.
template <typename Tc, int kAcc>
__device__ __forceinline__ void TransposedEpilogue(const TcParams& p, Tc* c, const Tc* cs, int row0,
                                                   int col0, const float (&d)[kAcc]) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const int row = row0 + warp * 16 + lane / 4, col = col0 + 2 * (lane % 4);
  auto put = [&](auto value) {
#pragma unroll
    for (int i = 0; i < kAcc / 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row + 8 * (e / 2), cl = col + 8 * i + e % 2;
        if (r >= p.m || cl >= p.n) continue;
        const int64_t at = static_cast<int64_t>(cl) * p.ldc + r;
        c[at] = FromFloat<Tc>(value(at, p.alpha * d[4 * i + e]));
      }
  };
  // Two loops, not one with a test per element: with that test (and since
  // the addend's loads may alias C) tf32 NN's C^T stores ran one after
  // another, 4096x4096x16 in 31.5 us against 21.2 us as two loops (H200).
  if (p.beta == 0.f)
    put([](int64_t, float v) { return v; });
  else
    put([&](int64_t at, float v) { return fmaf(p.beta, ToFloat(cs[at]), v); });
}

// A consumer warpgroup's epilogue: with beta != 0 through shared memory in
// fp32 (StagedEpilogueBeta); 16-bit C through shared memory
// (StagedEpilogue16, C^T too); fp32 C (the split-K partials too) straight
// from the fragments, whose stores fill whole sectors there; C^T with fp32 C
// or beta by TransposedEpilogue. `buf` is the
// warpgroup's kEpiBytes / kConsumers bytes, `bar_id` its named barrier.
template <typename T, typename Cfg>
__device__ __forceinline__ void ConsumerEpilogue(const TcParams& p, int bi, int row0, int col0,
                                                 float (&d)[Cfg::kAcc], float* buf, int bar_id) {
  if (row0 >= p.m) return;  // uniform over the warpgroup
  if constexpr (Cfg::kThin) {  // C small: from the fragments
    if (p.c_trans) {
      if (p.c_type == 0)
        TransposedEpilogue(p, BatchC<float>(p, bi), BatchCSrc<float>(p, bi), row0, col0, d);
      else if constexpr (!std::is_same_v<T, float>)
        TransposedEpilogue(p, BatchC<T>(p, bi), BatchCSrc<T>(p, bi), row0, col0, d);
    } else {
      Epilogue<T>(p, bi, row0, col0, d);
    }
    return;
  }
  if (p.c_trans && (p.beta != 0.f || p.c_type == 0)) {
    if (p.c_type == 0)
      TransposedEpilogue(p, BatchC<float>(p, bi), BatchCSrc<float>(p, bi), row0, col0, d);
    else if constexpr (!std::is_same_v<T, float>)
      TransposedEpilogue(p, BatchC<T>(p, bi), BatchCSrc<T>(p, bi), row0, col0, d);
    return;
  }
  if (p.beta != 0.f) {
    if (p.c_type == 0)
      StagedEpilogueBeta<float, Cfg>(p, BatchC<float>(p, bi), BatchCSrc<float>(p, bi), row0, col0,
                                     d, buf, bar_id);
    else if constexpr (!std::is_same_v<T, float>)
      StagedEpilogueBeta<T, Cfg>(p, BatchC<T>(p, bi), BatchCSrc<T>(p, bi), row0, col0, d, buf,
                                 bar_id);
    return;
  }
  if constexpr (!std::is_same_v<T, float>) {
    if (p.c_type != 0 && p.beta == 0.f) {
      StagedEpilogue16<T, Cfg>(p, BatchC<T>(p, bi), row0, col0, d, reinterpret_cast<uint32_t*>(buf),
                               bar_id);
      return;
    }
  }
  Epilogue<T>(p, bi, row0, col0, d);
}

// Unit `unit` of the split-K walk -> (tile, K range): ranges outermost, or
// with kClusterSplit the ranges of a tile adjacent (one cluster).
template <bool kClusterSplit>
__device__ __forceinline__ void DecodeUnit(const TcParams& p, int64_t unit, int64_t& tile,
                                           int& split) {
  if constexpr (kClusterSplit) {
    tile = unit / p.splits;
    split = static_cast<int>(unit % p.splits);
  } else {
    tile = unit % p.tiles;
    split = static_cast<int>(unit / p.tiles);
  }
}

// C[i, j] (C^T's with c_trans) = alpha * v + beta * C for an element inside C
// (the addend read from cs, this batch's BatchCSrc).
template <typename Tc>
__device__ __forceinline__ void PutC(const TcParams& p, Tc* c, const Tc* cs, int i, int j,
                                     float v) {
  const int64_t at =
      p.c_trans ? static_cast<int64_t>(j) * p.ldc + i : static_cast<int64_t>(i) * p.ldc + j;
  v *= p.alpha;
  if (p.beta != 0.f) v = fmaf(p.beta, ToFloat(cs[at]), v);
  c[at] = FromFloat<Tc>(v);
}

// Cluster split-K, after every CTA of the cluster has put its K range's sums
// of the 128 x kBN tile at (m0, n0) into its ring (`red`, rows kRedLd floats
// apart) and the cluster has synced: CTA `rank` of `splits` adds up its share
// of the tile's 4-column pieces over every CTA's sums (distributed shared
// memory) and writes them to C. Run by the 256 consumer threads; pieces are
// numbered so that adjacent threads write adjacent elements of C (adjacent
// rows of the tile for C^T).
template <typename Tc, typename Cfg>
__device__ __forceinline__ void ClusterReduce(const TcParams& p, Tc* c, const Tc* cs, int m0,
                                              int n0, uint32_t red, int rank, int splits) {
  constexpr int kPieces = Cfg::kBM * (Cfg::kBN / 4);
  const int t = threadIdx.x - 128;
  uint32_t remote[8];
#pragma unroll
  for (int s = 0; s < 8; ++s) remote[s] = s < splits ? MapaShared(red, s) : 0;
  const int first = rank * kPieces / splits, last = (rank + 1) * kPieces / splits;
  // kBatch pieces a thread at a time, all their loads issued before the sums
  // wait on them (one piece at a time waited ~the DSMEM latency per piece:
  // 128 x 128 tiles in two ranges ran 2.5 us slower than the partials).
  constexpr int kBatch = 4;
  for (int q0 = first + t; q0 < last; q0 += 256 * kBatch) {
    float4 v[kBatch];
    uint32_t off[kBatch];
    int row[kBatch], col[kBatch];
    bool live[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int q = q0 + 256 * u;
      const int r = p.c_trans ? q % Cfg::kBM : q / (Cfg::kBN / 4);
      const int cq = p.c_trans ? q / Cfg::kBM : q % (Cfg::kBN / 4);
      row[u] = m0 + r;
      col[u] = n0 + 4 * cq;
      live[u] = q < last && row[u] < p.m && col[u] < p.n;
      off[u] = (r * Cfg::kRedLd + 4 * cq) * 4;
      v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      if (s >= splits) break;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (!live[u]) continue;
        const float4 w = LdSharedCluster4(remote[s] + off[u]);
        v[u].x += w.x;
        v[u].y += w.y;
        v[u].z += w.z;
        v[u].w += w.w;
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (!live[u]) continue;
      const int i = row[u], j = col[u];
      if (!p.c_trans && p.beta == 0.f && p.c_vec && j + 4 <= p.n) {
        // C's rows on 16 bytes and j a multiple of 4: 4 elements in one store.
        alignas(16) Tc out[4] = {FromFloat<Tc>(p.alpha * v[u].x), FromFloat<Tc>(p.alpha * v[u].y),
                                 FromFloat<Tc>(p.alpha * v[u].z), FromFloat<Tc>(p.alpha * v[u].w)};
        Tc* dst = c + static_cast<int64_t>(i) * p.ldc + j;
        if constexpr (sizeof(Tc) == 4)
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
        else
          *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(out);
        continue;
      }
      const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (j + k < p.n) PutC(p, c, cs, i, j + k, e[k]);
    }
  }
}

__device__ __forceinline__ uint32_t AlignedSmemBase(unsigned char* raw) {
  return (SmemAddr(raw) + 1023u) & ~1023u;
}

// Rung 2: TMA + mbarrier + wgmma, one warpgroup, no specialisation.
template <typename T, bool kTransA, bool kTransB>
__global__ void __launch_bounds__(128, 1)
    WgmmaTmaKernel(const __grid_constant__ CUtensorMap map_a,
                   const __grid_constant__ CUtensorMap map_b, const TcParams p) {
  using Cfg = WgmmaConfig<1, 5>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = AlignedSmemBase(smem_raw);
  const uint32_t bars = base + Cfg::kStages * Cfg::kStageBytes;  // full[kStages]
  auto stage_a = [&](int s) { return base + s * Cfg::kStageBytes; };
  auto stage_b = [&](int s) { return base + s * Cfg::kStageBytes + Cfg::kABytes; };
  constexpr int kBK = Cfg::kRowBytes / sizeof(T);

  if (threadIdx.x == 0) {
    TmaPrefetchDescriptor(&map_a);
    TmaPrefetchDescriptor(&map_b);
    for (int s = 0; s < Cfg::kStages; ++s) sm90::MbarInit(bars + 8 * s, 1);
    sm90::FenceMbarrierInit();  // the barriers, to the other threads ...
    sm90::FenceProxyAsync();    // ... and to the async (TMA) proxy
  }
  __syncthreads();

  int bi, tm, tn;
  DecodeTile(p, blockIdx.x, bi, tm, tn);
  const int m0 = tm * Cfg::kBM, n0 = tn * Cfg::kBN;
  const int ba = bi * p.a_batched, bb = bi * p.b_batched;
  const int kblocks = (p.k + kBK - 1) / kBK;

  if (threadIdx.x == 0)
    for (int kb = 0; kb < min(kblocks, Cfg::kStages); ++kb)
      IssueStage<T, kTransA, kTransB, Cfg>(&map_a, &map_b, stage_a(kb), stage_b(kb), bars + 8 * kb,
                                           kb, m0, n0, ba, bb);

  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;

  for (int kb = 0; kb < kblocks; ++kb) {
    const int s = kb % Cfg::kStages;
    sm90::MbarWait(bars + 8 * s, (kb / Cfg::kStages) & 1);
    MmaStage<T, kTransA, kTransB, Cfg>(d, stage_a(s), stage_b(s));
    // k-block kb-1 has been read by this thread's warp (with A from
    // registers: k-block kb too, whose fragment registers the next stage reuses)
    if constexpr (kRegistersA<T, kTransA>)
      sm90::WgmmaWait<0>();
    else
      sm90::WgmmaWait<1>();
    __syncthreads();  // ... and by every warp: refill its stage
    const int refill = kb - 1 + Cfg::kStages;
    if (threadIdx.x == 0 && kb >= 1 && refill < kblocks) {
      const int rs = (kb - 1) % Cfg::kStages;
      IssueStage<T, kTransA, kTransB, Cfg>(&map_a, &map_b, stage_a(rs), stage_b(rs),
                                           bars + 8 * rs, refill, m0, n0, ba, bb);
    }
  }
  sm90::WgmmaWait<0>();
  sm90::FenceRegisters(d);
  Epilogue<T>(p, bi, m0, n0, d);
}

// Rungs 3-5: producer warpgroup + kConsumers consumer warpgroups. kCluster == 2
// (rung 5): CTA pairs of one cluster take tile rows 2t and 2t+1 of the same
// tile column and share B through TMA multicast; a stage may be refilled only
// when the consumers of both CTAs have released it, so every consumer warp
// arrives on the "empty" barrier of both CTAs.
//
// With kClusterSplit (split-K of 2-8 ranges, kCluster == 1) the grid holds
// every unit once, CTA r of each cluster of p.splits on K range r of the
// cluster's tile, and the ranges add up through distributed shared memory
// (ClusterReduce): no partials, no second kernel. Its own instantiation, so
// that the other kernels' code stays as it was (with the reduction compiled
// in but not run, the small-K and tf32 cases ran 5-8% slower on an H100).
template <typename T, bool kTransA, bool kTransB, int kCluster, typename Cfg = WgmmaConfig<2, 4>,
          bool kClusterSplit = false>
__global__ void __launch_bounds__(384, 1)
    WgmmaWsKernel(const __grid_constant__ CUtensorMap map_a,
                  const __grid_constant__ CUtensorMap map_b, const TcParams p) {
  static_assert(Cfg::kConsumers == 2, "one producer and two consumer warpgroups");
  static_assert(!kClusterSplit || kCluster == 1, "a cluster split shares no B tile");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = AlignedSmemBase(smem_raw);
  // [stages][epilogue buffers][full barriers][empty barriers]
  float* const epi = reinterpret_cast<float*>(smem_raw + (base - SmemAddr(smem_raw)) +
                                              Cfg::kStages * Cfg::kStageBytes);
  const uint32_t full = base + Cfg::kStages * Cfg::kStageBytes + Cfg::kEpiBytes;  // full[kStages]
  const uint32_t empty = full + 8 * Cfg::kStages;                                 // empty[kStages]
  auto stage_a = [&](int s) { return base + s * Cfg::kStageBytes; };
  auto stage_b = [&](int s) { return base + s * Cfg::kStageBytes + Cfg::kABytes; };
  constexpr int kBK = Cfg::kRowBytes / sizeof(T);
  const int kblocks = (p.k + kBK - 1) / kBK;
  const int wg = threadIdx.x / 128;
  const int rank = kCluster > 1 ? static_cast<int>(ClusterCtaRank()) : 0;
  // Both CTAs of a cluster walk the same tiles (p.tiles_m counts CTA pairs).
  // A unit is a tile and one of its K ranges (one range without split-K).
  const int64_t first = blockIdx.x / kCluster, step = gridDim.x / kCluster;
  const int64_t units = p.tiles * p.splits;
  const int kb_per_unit = p.splits > 1 ? p.kb_per_split : kblocks;

  if (threadIdx.x == 0) {
    TmaPrefetchDescriptor(&map_a);
    TmaPrefetchDescriptor(&map_b);
    for (int s = 0; s < Cfg::kStages; ++s) {
      sm90::MbarInit(full + 8 * s, 1);
      sm90::MbarInit(empty + 8 * s, 4 * Cfg::kConsumers * kCluster);  // every consumer warp
    }
    sm90::FenceMbarrierInit();  // the barriers, to the other threads ...
    sm90::FenceProxyAsync();    // ... and to the async (TMA) proxy
  }
  if constexpr (kCluster > 1) ClusterSync();  // the partner's barriers exist before use
  else __syncthreads();

  if (wg == 0) {
    sm90::SetMaxRegistersDec<40>();
    if (threadIdx.x == 0) {
      uint32_t it = 0;
      for (int64_t unit = first; unit < units; unit += step) {
        int64_t tile;
        int split, bi, tm, tn;
        DecodeUnit<kClusterSplit>(p, unit, tile, split);
        DecodeTile(p, tile, bi, tm, tn);
        const int kb0 = split * kb_per_unit;
        const int kb1 = min(kblocks, kb0 + kb_per_unit);
        const int m0 = (tm * kCluster + rank) * Cfg::kBM, n0 = tn * Cfg::kBN;
        const int ba = bi * p.a_batched, bb = bi * p.b_batched;
        for (int kb = kb0; kb < kb1; ++kb, ++it) {
          const int s = it % Cfg::kStages;
          sm90::MbarWait(empty + 8 * s, ((it / Cfg::kStages) & 1) ^ 1);
          IssueStage<T, kTransA, kTransB, Cfg, kCluster>(&map_a, &map_b, stage_a(s), stage_b(s),
                                                         full + 8 * s, kb, m0, n0, ba, bb, rank);
        }
      }
    }
    if constexpr (kClusterSplit) {  // the consumers' two cluster barriers (one unit a CTA)
      __syncwarp();
      ClusterSync();
      ClusterSync();
    }
  } else {
    sm90::SetMaxRegistersInc<232>();
    const int consumer = wg - 1;
    float* const epi_buf = epi + consumer * 64 * Cfg::kEpiLd;
    const bool arriver = threadIdx.x % 32 == 0;
    auto release = [&](int s) {
      if constexpr (kCluster == 1) {
        sm90::MbarArrive(empty + 8 * s);
      } else {
#pragma unroll
        for (int r = 0; r < kCluster; ++r) MbarArriveCluster(empty + 8 * s, r);
      }
    };
    uint32_t it = 0;
    for (int64_t unit = first; unit < units; unit += step) {
      int64_t tile;
      int split, bi, tm, tn;
      DecodeUnit<kClusterSplit>(p, unit, tile, split);
      DecodeTile(p, tile, bi, tm, tn);
      const int kb0 = split * kb_per_unit, kb1 = min(kblocks, kb0 + kb_per_unit);
      const int row0 = (tm * kCluster + rank) * Cfg::kBM + consumer * 64, col0 = tn * Cfg::kBN;
      if (p.beta != 0.f && p.splits == 1 && !p.c_trans) PrefetchC<Cfg::kBN>(p, bi, row0, col0);
      float d[Cfg::kAcc];
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) d[i] = 0.f;
      if constexpr (kRegistersA<T, kTransA>) {
        // A from registers: ptxas serialises every wgmma (C7513) when the next
        // stage's fragments are loaded while a group that reads registers is in
        // flight, and a loop that reuses the registers unguarded computed wrong
        // sums; so each stage waits for its own group and hands its slot back
        // at once. The other consumer warpgroup keeps the tensor cores busy.
        for (int kb = kb0; kb < kb1; ++kb, ++it) {
          const int s = it % Cfg::kStages;
          sm90::MbarWait(full + 8 * s, (it / Cfg::kStages) & 1);
          MmaStage<T, kTransA, kTransB, Cfg>(d, stage_a(s) + consumer * 64 * Cfg::kRowBytes,
                                             stage_b(s));
          sm90::WgmmaWait<0>();
          if (arriver) release(s);
        }
      } else {
        for (int kb = kb0; kb < kb1; ++kb, ++it) {
          const int s = it % Cfg::kStages;
          sm90::MbarWait(full + 8 * s, (it / Cfg::kStages) & 1);
          MmaStage<T, kTransA, kTransB, Cfg>(d, stage_a(s) + consumer * 64 * Cfg::kRowBytes,
                                             stage_b(s));
          sm90::WgmmaWait<1>();  // the previous k-block's group is done: release its stage
          if (kb > kb0 && arriver) release((it - 1) % Cfg::kStages);
        }
        sm90::WgmmaWait<0>();
        if (arriver) release((it - 1) % Cfg::kStages);
      }
      sm90::FenceRegisters(d);
      if constexpr (kClusterSplit) {
        // This range's sums into the ring once both consumers' wgmma have read
        // it (named barrier 3 over their 256 threads), then the tile's sum
        // over the cluster (ClusterReduce) between two cluster barriers: the
        // first publishes every CTA's sums, the second keeps them until all
        // are read.
        asm volatile("bar.sync 3, 256;" ::: "memory");
        float* const red = reinterpret_cast<float*>(smem_raw + (base - SmemAddr(smem_raw)));
        const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
        const int fr = consumer * 64 + warp * 16 + lane / 4, fc = 2 * (lane % 4);
#pragma unroll
        for (int i = 0; i < Cfg::kAcc / 4; ++i) {
          *reinterpret_cast<float2*>(red + fr * Cfg::kRedLd + 8 * i + fc) =
              make_float2(d[4 * i], d[4 * i + 1]);
          *reinterpret_cast<float2*>(red + (fr + 8) * Cfg::kRedLd + 8 * i + fc) =
              make_float2(d[4 * i + 2], d[4 * i + 3]);
        }
        ClusterSync();
        const int m0 = tm * Cfg::kBM, cr = static_cast<int>(ClusterCtaRank());
        if (p.c_type == 0)
          ClusterReduce<float, Cfg>(p, BatchC<float>(p, bi), BatchCSrc<float>(p, bi), m0, col0,
                                    base, cr, p.splits);
        else if constexpr (!std::is_same_v<T, float>)
          ClusterReduce<T, Cfg>(p, BatchC<T>(p, bi), BatchCSrc<T>(p, bi), m0, col0, base, cr,
                                p.splits);
        ClusterSync();
      } else if (p.splits > 1) {  // this range's fp32 sums, dense, alpha and beta later
        TcParams q = p;
        q.c = p.partials + int64_t(split) * p.batch * p.m * p.n;
        q.ldc = p.n;
        q.stride_c = int64_t(p.m) * p.n;
        q.c_src = q.c;
        q.stride_c_src = q.stride_c;
        q.c_type = 0;
        q.alpha = 1.f;
        q.beta = 0.f;
        q.c_pairs = p.n % 2 == 0;
        q.c_trans = 0;  // the partials are C^T's, dense; the reduction transposes
        ConsumerEpilogue<T, Cfg>(q, bi, row0, col0, d, epi_buf, 1 + consumer);
      } else {
        ConsumerEpilogue<T, Cfg>(p, bi, row0, col0, d, epi_buf, 1 + consumer);
      }
    }
  }
  // No CTA may leave while its partner can still arrive on its barriers.
  if constexpr (kCluster > 1) ClusterSync();
}

}  // namespace gpucompute::kernels::tc

#endif  // GPUCOMPUTE_KERNELS_SRC_GEMM_TC_WGMMA_CUH_
