// flash_wgmma: FlashAttention forward for Hopper (sm_90a).
//
// A block owns kBr = 64 * kConsumers query rows of one (batch, query head) and
// runs 1 + kConsumers warpgroups. Warpgroup 0 is the producer: it drops its
// registers (setmaxnreg) and one of its threads issues the TMA copies, Q once
// and then the K and V tiles of every key block into a kStages-deep ring; each
// tile lands on its own "full" mbarrier (transaction count), and a stage is
// refilled only after every consumer warp has arrived on its "empty" mbarrier.
// The other warpgroups are consumers, 64 query rows apiece: S = Q K^T by wgmma
// with both operands in shared memory (K-major, 128-byte swizzle, exactly as
// TMA wrote them), the mask and online softmax on the accumulators in
// registers, then O += P V by wgmma with P straight from registers (the S
// accumulator layout is the wgmma A-fragment layout) and V read N-major
// (transposed by the instruction) from the swizzled tile. While one consumer
// runs its softmax the others' GEMMs keep the tensor cores busy. With
// kPipelined each consumer also overlaps its own softmax of block n with its
// P V of block n - 1 (measured slower as compiled; see attention.cu).
//
// Shared layouts: every tile is stored as head_dim / 64 column panels of
// (rows x 64) elements, 128 bytes per row, 1024-byte aligned, swizzled by TMA
// (SWIZZLE_128B). A K-major wgmma operand descriptor then has SBO = 1024
// (eight rows) and steps 32 bytes per k16 inside a panel; the N-major V
// operand has SBO = 1024 (eight keys) and LBO = one panel (to the next 64
// columns of head_dim).
#ifndef GPUCOMPUTE_KERNELS_SRC_ATTENTION_WGMMA_CUH_
#define GPUCOMPUTE_KERNELS_SRC_ATTENTION_WGMMA_CUH_

#include <cuda.h>

#include "attention_common.cuh"
#include "sm90_primitives.cuh"

namespace gpucompute::kernels::attention {

template <int kD_, int kConsumers_>
struct WgmmaTile {
  static constexpr int kD = kD_;
  static constexpr int kConsumers = kConsumers_;         // consumer warpgroups, 64 rows each
  static constexpr int kBr = 64 * kConsumers;            // query tile (BLOCK_M)
  static constexpr int kBc = 128;                        // key tile (BLOCK_N)
  static constexpr int kStages = kD == 64 ? 4 : 2;       // K/V ring depth
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kPanels = kD / 64;                // 128-byte column panels
  static constexpr int kQBytes = kBr * kD * 2;           // (kBr, kD)
  static constexpr int kKVBytes = kBc * kD * 2;          // (kBc, kD), one of K or V
  static constexpr int kBarrierBytes = 8 * (1 + 3 * kStages);
  static constexpr size_t kSmemBytes =
      1024 + kQBytes + 2 * size_t(kStages) * kKVBytes + kBarrierBytes;
  static constexpr int kProducerRegs = kConsumers == 3 ? 24 : 40;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 232;
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128");
  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
                "register budget of one block per SM");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one SM");
};

// S (+)= A B^T with A and B both K-major in shared memory, N = 128.
template <typename M>
__device__ __forceinline__ void WgmmaSS128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                           int scale_d) {
#define GC_ATTN_SS128(TYPES)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" GC_WGMMA_OP("m64n128k16", TYPES, \
                                                                         GC_WGMMA_D64)   \
               "%64, %65, p, 1, 1, 0, 0;\n}\n"                                           \
               : GC_WGMMA_ACC64(d)                                                       \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<M, __half>) {
    GC_ATTN_SS128("f16.f16");
  } else {
    GC_ATTN_SS128("bf16.bf16");
  }
#undef GC_ATTN_SS128
}

// O += P V with P (m64 x k16) in registers and V N-major in shared memory, N = 64.
template <typename M>
__device__ __forceinline__ void WgmmaRS64(float (&d)[32], const uint32_t (&a)[4],
                                          uint64_t desc_b, int scale_d) {
#define GC_ATTN_RS64(TYPES)                                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" GC_WGMMA_OP("m64n64k16", TYPES, \
                                                                         GC_WGMMA_D32)    \
               "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                              \
               : GC_WGMMA_ACC32(d)                                                        \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<M, __half>) {
    GC_ATTN_RS64("f16.f16");
  } else {
    GC_ATTN_RS64("bf16.bf16");
  }
#undef GC_ATTN_RS64
}

// The same with N = 128.
template <typename M>
__device__ __forceinline__ void WgmmaRS128(float (&d)[64], const uint32_t (&a)[4],
                                           uint64_t desc_b, int scale_d) {
#define GC_ATTN_RS128(TYPES)                                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" GC_WGMMA_OP("m64n128k16", TYPES, \
                                                                         GC_WGMMA_D64)     \
               "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                               \
               : GC_WGMMA_ACC64(d)                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<M, __half>) {
    GC_ATTN_RS128("f16.f16");
  } else {
    GC_ATTN_RS128("bf16.bf16");
  }
#undef GC_ATTN_RS128
}

template <typename M, int kD>
__device__ __forceinline__ void WgmmaPV(float (&d)[kD / 2], const uint32_t (&a)[4],
                                        uint64_t desc_b) {
  if constexpr (kD == 64) {
    WgmmaRS64<M>(d, a, desc_b, 1);
  } else {
    WgmmaRS128<M>(d, a, desc_b, 1);
  }
}

template <typename M, typename Tile, bool kCausal, bool kPipelined>
__device__ __forceinline__ void ConsumeBlocks(const AttnParams& p, int cw, int m0, int bh,
                                              int nblocks, uint32_t s_q, uint32_t s_k,
                                              uint32_t s_v, uint32_t bars);

template <typename M, typename Tile, bool kCausal, bool kPipelined>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    FlashWgmmaKernel(const __grid_constant__ CUtensorMap tmap_q,
                     const __grid_constant__ CUtensorMap tmap_k,
                     const __grid_constant__ CUtensorMap tmap_v, const AttnParams p) {
  constexpr int kBr = Tile::kBr, kBc = Tile::kBc, kStages = Tile::kStages;
  extern __shared__ __align__(1024) uint8_t wg_smem_raw[];
  const uint32_t base = (SmemAddr(wg_smem_raw) + 1023u) & ~1023u;
  const uint32_t s_q = base;
  const uint32_t s_k = s_q + Tile::kQBytes;                 // + stage * kKVBytes
  const uint32_t s_v = s_k + kStages * Tile::kKVBytes;      // + stage * kKVBytes
  const uint32_t bars = s_v + kStages * Tile::kKVBytes;
  const uint32_t bar_q = bars;
  auto bar_kfull = [&](int s) { return bars + 8u * (1 + s); };
  auto bar_vfull = [&](int s) { return bars + 8u * (1 + kStages + s); };
  auto bar_empty = [&](int s) { return bars + 8u * (1 + 2 * kStages + s); };

  const int wg = threadIdx.x / 128;
  const int bh = blockIdx.y;  // batch * heads_q + head
  const int b = bh / p.heads_q, h = bh % p.heads_q;
  const int bkv = b * p.heads_kv + h / p.group;
  const int m_block = kCausal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int m0 = m_block * kBr;
  int key_end = p.seq_kv;
  if (kCausal) key_end = max(0, min(p.seq_kv, min(m0 + kBr, p.seq_q) + p.causal_off));
  const int nblocks = (key_end + kBc - 1) / kBc;

  if (threadIdx.x == 0) {
    sm90::MbarInit(bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::MbarInit(bar_kfull(s), 1);
      sm90::MbarInit(bar_vfull(s), 1);
      sm90::MbarInit(bar_empty(s), 4 * Tile::kConsumers);  // one arrival per consumer warp
    }
    sm90::FenceMbarrierInit();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer.
    sm90::SetMaxRegistersDec<Tile::kProducerRegs>();
    if (threadIdx.x == 0 && nblocks > 0) {
      sm90::MbarArriveExpectTx(bar_q, Tile::kQBytes);
#pragma unroll
      for (int c = 0; c < Tile::kPanels; ++c)
        sm90::TmaLoad3d(s_q + c * kBr * 128, &tmap_q, 64 * c, m0, bh, bar_q);
      for (int n = 0; n < nblocks; ++n) {
        const int st = n % kStages, use = n / kStages;
        if (use > 0) sm90::MbarWaitOrTrap(bar_empty(st), (use - 1) & 1);
        sm90::MbarArriveExpectTx(bar_kfull(st), Tile::kKVBytes);
#pragma unroll
        for (int c = 0; c < Tile::kPanels; ++c)
          sm90::TmaLoad3d(s_k + st * Tile::kKVBytes + c * kBc * 128, &tmap_k, 64 * c, n * kBc,
                          bkv, bar_kfull(st));
        sm90::MbarArriveExpectTx(bar_vfull(st), Tile::kKVBytes);
#pragma unroll
        for (int c = 0; c < Tile::kPanels; ++c)
          sm90::TmaLoad3d(s_v + st * Tile::kKVBytes + c * kBc * 128, &tmap_v, 64 * c, n * kBc,
                          bkv, bar_vfull(st));
      }
    }
  } else {
    // Consumers.
    sm90::SetMaxRegistersInc<Tile::kConsumerRegs>();
    ConsumeBlocks<M, Tile, kCausal, kPipelined>(p, wg - 1, m0, bh, nblocks, s_q, s_k, s_v, bars);
  }
}

// The consumer warpgroup `cw` (0 or 1): its 64 query rows against every key
// block, then the epilogue.
template <typename M, typename Tile, bool kCausal, bool kPipelined>
__device__ __forceinline__ void ConsumeBlocks(const AttnParams& p, int cw, int m0, int bh,
                                              int nblocks, uint32_t s_q, uint32_t s_k,
                                              uint32_t s_v, uint32_t bars) {
  constexpr int kD = Tile::kD, kBr = Tile::kBr, kBc = Tile::kBc, kStages = Tile::kStages;
  constexpr int kNT = kBc / 8;  // n8 tiles of S per row slice
  constexpr int kDT = kD / 8;   // n8 tiles of O per row slice
  auto bar_kfull = [&](int s) { return bars + 8u * (1 + s); };
  auto bar_vfull = [&](int s) { return bars + 8u * (1 + kStages + s); };
  auto bar_empty = [&](int s) { return bars + 8u * (1 + 2 * kStages + s); };
  const uint32_t bar_q = bars;
  const int ltid = threadIdx.x & 127, w = ltid >> 5, lane = ltid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int wg_row0 = m0 + 64 * cw;
  const int row[2] = {wg_row0 + 16 * w + g, wg_row0 + 16 * w + g + 8};

  float o[kDT][4];
  float s[kNT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float(&s_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(s);
  float(&o_flat)[kDT * 4] = reinterpret_cast<float(&)[kDT * 4]>(o);

  const uint32_t q_rows = s_q + 64 * cw * 128;  // this warpgroup's 64 rows of every panel
  uint32_t pa[kBc / 16][4];                      // P of the block whose P V is next

  // S = Q K^T of block n, issued and committed (not waited for).
  auto issue_qk = [&](int n) {
    const uint32_t k_tile = s_k + (n % kStages) * Tile::kKVBytes;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t da =
          sm90::MakeSmemDesc(q_rows + (kk >> 2) * kBr * 128 + (kk & 3) * 32, 16, 1024);
      const uint64_t db =
          sm90::MakeSmemDesc(k_tile + (kk >> 2) * kBc * 128 + (kk & 3) * 32, 16, 1024);
      WgmmaSS128<M>(s_flat, da, db, kk > 0 ? 1 : 0);
    }
    sm90::WgmmaCommit();
  };
  // O += P V of block n, issued and committed.
  auto issue_pv = [&](int n) {
    const uint32_t v_tile = s_v + (n % kStages) * Tile::kKVBytes;
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      WgmmaPV<M, kD>(o_flat, pa[kk], sm90::MakeSmemDesc(v_tile + kk * 16 * 128, kBc * 128, 1024));
    sm90::WgmmaCommit();
  };
  // Mask and online softmax of block n's S (in place: S becomes P, fp32).
  auto softmax = [&](int n, float (&alpha)[2]) {
    const int n0 = n * kBc;
    const bool need_mask =
        n0 + kBc > p.seq_kv || (kCausal && n0 + kBc - 1 > wg_row0 + p.causal_off);
    if (need_mask) MaskBlock<kNT>(s, row, n0 + 2 * t, p.seq_kv, kCausal, p.causal_off);
    OnlineSoftmax<kNT>(s, m, l, alpha, p.scale_log2);
  };
  auto rescale_and_pack = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < kDT; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      pa[kk][0] = PackPair<M>(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = PackPair<M>(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = PackPair<M>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = PackPair<M>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  };
  auto release = [&](int n) {
    __syncwarp();
    if (lane == 0) sm90::MbarArrive(bar_empty(n % kStages));
  };
  auto parity = [&](int n) { return uint32_t((n / kStages) & 1); };

  if (nblocks > 0) sm90::MbarWaitOrTrap(bar_q, 0);
  if constexpr (!kPipelined) {
    // Each block in order: Q K^T, wait, softmax, P V, wait.
    for (int n = 0; n < nblocks; ++n) {
      sm90::MbarWaitOrTrap(bar_kfull(n % kStages), parity(n));
      sm90::FenceRegisters(s_flat);
      sm90::WgmmaFence();
      issue_qk(n);
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(s_flat);
      float alpha[2];
      softmax(n, alpha);
      rescale_and_pack(alpha);
      sm90::MbarWaitOrTrap(bar_vfull(n % kStages), parity(n));
      sm90::FenceRegisters(o_flat);
      sm90::WgmmaFence();
      issue_pv(n);
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(o_flat);
      release(n);
    }
  } else if (nblocks > 0) {
    // Software pipeline inside the warpgroup: Q K^T of block n and P V of
    // block n - 1 are in flight together; the softmax of block n runs while
    // P V of block n - 1 still executes.
    sm90::MbarWaitOrTrap(bar_kfull(0), 0);
    sm90::FenceRegisters(s_flat);
    sm90::WgmmaFence();
    issue_qk(0);
    sm90::WgmmaWait<0>();
    sm90::FenceRegisters(s_flat);
    {
      float alpha[2];
      softmax(0, alpha);
      rescale_and_pack(alpha);
    }
    for (int n = 1; n < nblocks; ++n) {
      sm90::MbarWaitOrTrap(bar_kfull(n % kStages), parity(n));
      sm90::FenceRegisters(s_flat);
      sm90::FenceRegisters(o_flat);
      sm90::WgmmaFence();
      issue_qk(n);
      sm90::MbarWaitOrTrap(bar_vfull((n - 1) % kStages), parity(n - 1));
      issue_pv(n - 1);
      sm90::WgmmaWait<1>();  // S of block n is ready; P V of block n - 1 may still run
      sm90::FenceRegisters(s_flat);
      float alpha[2];
      softmax(n, alpha);
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(o_flat);
      release(n - 1);
      rescale_and_pack(alpha);
    }
    sm90::MbarWaitOrTrap(bar_vfull((nblocks - 1) % kStages), parity(nblocks - 1));
    sm90::FenceRegisters(o_flat);
    sm90::WgmmaFence();
    issue_pv(nblocks - 1);
    sm90::WgmmaWait<0>();
    sm90::FenceRegisters(o_flat);
    release(nblocks - 1);
  }

  float inv[2], lse[2];
  FinishRows(m, l, inv, lse, p.scale);
  M* out = static_cast<M*>(p.o);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (row[hh] >= p.seq_q) continue;
    const int64_t lrow = int64_t(bh) * p.seq_q + row[hh];
#pragma unroll
    for (int j = 0; j < kDT; ++j)
      StorePair<M>(out + lrow * kD + 8 * j + 2 * t, o[j][2 * hh] * inv[hh],
                   o[j][2 * hh + 1] * inv[hh]);
    if (t == 0 && p.lse) p.lse[lrow] = lse[hh];
  }
}

}  // namespace gpucompute::kernels::attention

#endif  // GPUCOMPUTE_KERNELS_SRC_ATTENTION_WGMMA_CUH_
