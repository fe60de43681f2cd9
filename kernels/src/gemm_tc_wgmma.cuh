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
//     writes fp32 partial sums, added up by SplitKReduceKernel.
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
// bf16/fp16 and tf32: a stage always holds 128 bytes of K per row).
template <int kConsumers_, int kStages_>
struct WgmmaConfig {
  static constexpr int kConsumers = kConsumers_;    // consumer warpgroups, 64 rows each
  static constexpr int kStages = kStages_;          // TMA ring depth
  static constexpr int kBM = 64 * kConsumers;       // (BLOCK_M)
  static constexpr int kBN = 256;                   // (BLOCK_N) one m64n256 wgmma per k-step
  static constexpr int kRowBytes = 128;             // (row, 128 bytes of K) per stage
  static constexpr int kKSteps = kRowBytes / 32;    // wgmma k-steps of 32 bytes per stage
  static constexpr int kABytes = kBM * kRowBytes;   // (BLOCK_M, 128 B)
  static constexpr int kBBytes = kBN * kRowBytes;   // (BLOCK_N, 128 B)
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kMnBlockBytes = 64 * kRowBytes;  // MN-major: 64 values x 64 K rows
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + align
  static_assert(kStageBytes % 1024 == 0, "swizzle atoms stay 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "fits the H200's shared memory per block");
};

// Issues the TMA loads of k-block kb into one stage. Boxes (inner first):
//   A K-major {BK, BM}; A M-major {64, 64} per 64 rows of M;
//   B K-major {BK, 256 / kCluster}; B N-major {64, 64} per 64 columns of N.
// With a 2-CTA cluster (kCluster == 2) both CTAs work on the same columns of
// C: CTA `rank` loads its half of the B stage and multicasts it to both, so
// each CTA reads 16 KB of A and 16 KB of B from L2 per stage instead of 48 KB.
template <typename T, bool kTransA, bool kTransB, typename Cfg, int kCluster = 1>
__device__ __forceinline__ void IssueStage(const CUtensorMap* map_a, const CUtensorMap* map_b,
                                           uint32_t sa, uint32_t sb, uint32_t full, int kb,
                                           int m0, int n0, int ba, int bb, int rank = 0) {
  constexpr int kBK = Cfg::kRowBytes / sizeof(T);
  sm90::MbarArriveExpectTx(full, Cfg::kStageBytes);  // all of A and both halves of B
  if constexpr (kTransA) {
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

// The wgmma k-steps of one stage for one consumer warpgroup: `sa` is its
// 64-row slab of A, `sb` the whole B stage. Commits them as one group.
template <typename T, bool kTransA, bool kTransB, typename Cfg>
__device__ __forceinline__ void MmaStage(float (&d)[128], uint32_t sa, uint32_t sb) {
  sm90::WgmmaFence();
#pragma unroll
  for (int j = 0; j < Cfg::kKSteps; ++j) {
    const uint64_t da = kTransA ? sm90::MakeSmemDesc(sa + j * 2048, Cfg::kMnBlockBytes, 1024)
                                : sm90::MakeSmemDesc(sa + j * 32, 16, 1024);
    const uint64_t db = kTransB ? sm90::MakeSmemDesc(sb + j * 32, 16, 1024)
                                : sm90::MakeSmemDesc(sb + j * 2048, Cfg::kMnBlockBytes, 1024);
    // wgmma's transpose flags mean "MN-major": A transposed, B not transposed.
    WgmmaM64N256<T, kTransA ? 1 : 0, kTransB ? 0 : 1>(d, da, db);
  }
  sm90::WgmmaCommit();
}

// Writes a consumer warpgroup's 64 x 256 accumulator block whose first row is
// `row0` (already including the warpgroup's slab) and first column `col0`.
template <typename T>
__device__ __forceinline__ void Epilogue(const TcParams& p, int bi, int row0, int col0,
                                         const float (&d)[128]) {
  if (row0 >= p.m) return;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const int row = row0 + warp * 16 + lane / 4;
  const int col = col0 + 2 * (lane % 4);
  // Inside C, beta == 0 and pairs aligned: plain paired stores, no checks.
  const bool plain = p.beta == 0.f && p.c_pairs && row0 + 64 <= p.m && col0 + 256 <= p.n;
  auto store = [&](auto* c) {
    using Tc = std::remove_pointer_t<decltype(c)>;
    using P = typename Pair<Tc>::Type;
    if (plain) {
      P* r0 = reinterpret_cast<P*>(c + static_cast<int64_t>(row) * p.ldc + col);
      P* r8 = reinterpret_cast<P*>(c + static_cast<int64_t>(row + 8) * p.ldc + col);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
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
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      StoreC2<Tc>(p, c, row, col + 8 * i, d[4 * i], d[4 * i + 1]);
      StoreC2<Tc>(p, c, row + 8, col + 8 * i, d[4 * i + 2], d[4 * i + 3]);
    }
  };
  if (p.c_type == 0) store(BatchC<float>(p, bi));
  else if constexpr (std::is_same_v<T, __half>) store(BatchC<__half>(p, bi));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) store(BatchC<__nv_bfloat16>(p, bi));
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
    sm90::WgmmaWait<1>();  // k-block kb-1 has been read by this thread's warp
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
template <typename T, bool kTransA, bool kTransB, int kCluster>
__global__ void __launch_bounds__(384, 1)
    WgmmaWsKernel(const __grid_constant__ CUtensorMap map_a,
                  const __grid_constant__ CUtensorMap map_b, const TcParams p) {
  using Cfg = WgmmaConfig<2, 4>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = AlignedSmemBase(smem_raw);
  const uint32_t full = base + Cfg::kStages * Cfg::kStageBytes;  // full[kStages]
  const uint32_t empty = full + 8 * Cfg::kStages;                 // empty[kStages]
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
        int bi, tm, tn;
        DecodeTile(p, unit % p.tiles, bi, tm, tn);
        const int kb0 = static_cast<int>(unit / p.tiles) * kb_per_unit;
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
  } else {
    sm90::SetMaxRegistersInc<232>();
    const int consumer = wg - 1;
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
      int bi, tm, tn;
      DecodeTile(p, unit % p.tiles, bi, tm, tn);
      const int split = static_cast<int>(unit / p.tiles);
      const int kb0 = split * kb_per_unit, kb1 = min(kblocks, kb0 + kb_per_unit);
      float d[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) d[i] = 0.f;
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
      sm90::FenceRegisters(d);
      const int row0 = (tm * kCluster + rank) * Cfg::kBM + consumer * 64, col0 = tn * Cfg::kBN;
      if (p.splits > 1) {  // this range's fp32 sums, dense, alpha and beta later
        TcParams q = p;
        q.c = p.partials + int64_t(split) * p.batch * p.m * p.n;
        q.ldc = p.n;
        q.stride_c = int64_t(p.m) * p.n;
        q.c_type = 0;
        q.alpha = 1.f;
        q.beta = 0.f;
        q.c_pairs = p.n % 2 == 0;
        Epilogue<T>(q, bi, row0, col0, d);
      } else {
        Epilogue<T>(p, bi, row0, col0, d);
      }
    }
  }
  // No CTA may leave while its partner can still arrive on its barriers.
  if constexpr (kCluster > 1) ClusterSync();
}

}  // namespace gpucompute::kernels::tc

#endif  // GPUCOMPUTE_KERNELS_SRC_GEMM_TC_WGMMA_CUH_
