// flash_wgmma: FlashAttention forward for Hopper (sm_90a).
//
// A work tile is kBr = 64 * kConsumers query rows of one (batch, query head);
// the grid is persistent (one block per SM walks the tiles, see
// FlashWgmmaKernel), and a block runs 1 + kConsumers warpgroups. Warpgroup 0
// is the producer: it drops its registers (setmaxnreg) and one of its threads
// issues the TMA copies, each tile's Q and then the K and V tiles of every key
// block into a kStages-deep ring; each
// tile lands on its own "full" mbarrier (transaction count), and a stage is
// refilled only after every consumer warp has arrived on its "empty" mbarrier.
// The other warpgroups are consumers, 64 query rows apiece: S = Q K^T by wgmma
// with both operands in shared memory (K-major, 128-byte swizzle, exactly as
// TMA wrote them), the mask and online softmax on the accumulators in
// registers, then O += P V by wgmma with P straight from registers (the S
// accumulator layout is the wgmma A-fragment layout) and V read N-major
// (transposed by the instruction) from the swizzled tile. While one consumer
// runs its softmax the others' GEMMs keep the tensor cores busy. With
// kSchedPipelined each consumer also overlaps its own softmax of block n with
// its P V of block n - 1 (measured slower as compiled; see attention.cu); with
// kSchedPingPong the consumers issue their Q K^T in turns (NamedBarrierSync).
//
// Head dims: the tile is kD = 64, 128, 192 or 256 wide (WgmmaHeadDim: the
// next of those, so that every 64-column panel holds some of D); the tensor
// maps span the tensors' own D (a multiple of 8), so TMA zero-fills the
// columns past it. Q K^T runs over the whole padded width (a runtime bound on
// its k steps cost the d128 kernel 128 bytes of spills and serialised
// wgmmas), P V too, and the columns past D are never stored. kD = 192 takes
// 64-key tiles and kD = 256 32-key tiles, so that O and S fit the 168
// registers of two consumers (64-key tiles at kD = 256 spilled 4.5 KB; one
// consumer warpgroup instead ran 0.54-0.61x cuDNN, two on 32-key tiles
// 0.62-0.64x).
//
// Shared layouts: every tile is stored as kD / 64 column panels of
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

// How each consumer warpgroup orders its products (one rung each):
inline constexpr int kSchedInOrder = 0;    // flash_wgmma
inline constexpr int kSchedPipelined = 1;  // flash_wgmma_pipelined: softmax of n under P V of n - 1
inline constexpr int kSchedPingPong = 2;   // flash_wgmma_pingpong: Q K^T issued in turns

// The tile of a padded head dim kD_; kBc_ = 0 takes the key tile by head dim
// (128; 64 at 192; 32 at 256).
template <int kD_, int kConsumers_, int kBc_ = 0>
struct WgmmaTile {
  static constexpr int kD = kD_;
  static constexpr int kConsumers = kConsumers_;         // consumer warpgroups, 64 rows each
  static constexpr int kBr = 64 * kConsumers;            // query tile (BLOCK_M)
  static constexpr int kBc =  // key tile (BLOCK_N)
      kBc_ ? kBc_ : (kD == 256 ? 32 : (kD > 128 ? 64 : 128));
  static constexpr int kStages = kD == 64 ? 4 : 2;       // K/V ring depth
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kPanels = kD / 64;                // 128-byte column panels
  static constexpr int kQBytes = kBr * kD * 2;           // (kBr, kD)
  static constexpr int kKVBytes = kBc * kD * 2;          // (kBc, kD), one of K or V
  // Q full and empty (two slots each), K full, V full and K/V empty per stage.
  static constexpr int kBarrierBytes = 8 * (4 + 3 * kStages);
  // From the 1024-aligned base: Q slot 0, the K ring, the V ring, the
  // barriers, then Q slot 1 (the next tile's Q loads while this one's is
  // still read), which only a persistent grid uses: a grid of one tile per
  // block is launched with kOneTileSmemBytes.
  static constexpr size_t kQ1Offset =
      (size_t(kQBytes) + 2 * size_t(kStages) * kKVBytes + kBarrierBytes + 1023) / 1024 * 1024;
  static constexpr size_t kOneTileSmemBytes =
      1024 + kQBytes + 2 * size_t(kStages) * kKVBytes + kBarrierBytes;
  static constexpr size_t kSmemBytes = 1024 + kQ1Offset + kQBytes;
  static constexpr int kProducerRegs = kConsumers == 3 ? 24 : 40;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : (kConsumers == 2 ? 232 : 240);
  static_assert(kD % 64 == 0 && kD <= 256, "padded head_dim 64, 128, 192 or 256");
  static_assert(kConsumers >= 1 && kConsumers <= 3, "one to three consumer warpgroups");
  // ptxas compiles the consumers under the launch's cap (65536 / kThreads
  // registers), whatever setmaxnreg grants them later: a padded head dim of
  // 256 (128 accumulator registers for O alone) takes one consumer or 32-key
  // tiles (two consumers on 64-key tiles spilled 4.5 KB and serialised the
  // wgmmas).
  static_assert(kD < 256 || kConsumers == 1 || kBc <= 32,
                "head_dim 256 runs one consumer warpgroup or 32-key tiles");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
                "register budget of one block per SM");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one SM");
};

// S (+)= A B^T with A and B both K-major in shared memory, N = 32.
template <typename M>
__device__ __forceinline__ void WgmmaSS32(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                          int scale_d) {
#define GC_ATTN_SS32(TYPES)                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" GC_WGMMA_OP("m64n32k16", TYPES, \
                                                                         GC_WGMMA_D16)   \
               "%16, %17, p, 1, 1, 0, 0;\n}\n"                                           \
               : GC_WGMMA_ACC16(d)                                                       \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<M, __half>) {
    GC_ATTN_SS32("f16.f16");
  } else {
    GC_ATTN_SS32("bf16.bf16");
  }
#undef GC_ATTN_SS32
}

// The same with N = 64.
template <typename M>
__device__ __forceinline__ void WgmmaSS64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                          int scale_d) {
#define GC_ATTN_SS64(TYPES)                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" GC_WGMMA_OP("m64n64k16", TYPES, \
                                                                         GC_WGMMA_D32)   \
               "%32, %33, p, 1, 1, 0, 0;\n}\n"                                           \
               : GC_WGMMA_ACC32(d)                                                       \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<M, __half>) {
    GC_ATTN_SS64("f16.f16");
  } else {
    GC_ATTN_SS64("bf16.bf16");
  }
#undef GC_ATTN_SS64
}

// The same with N = 96.
template <typename M>
__device__ __forceinline__ void WgmmaSS96(float (&d)[48], uint64_t desc_a, uint64_t desc_b,
                                          int scale_d) {
#define GC_ATTN_SS96(TYPES)                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n" GC_WGMMA_OP("m64n96k16", TYPES, \
                                                                         GC_WGMMA_D48)   \
               "%48, %49, p, 1, 1, 0, 0;\n}\n"                                           \
               : GC_WGMMA_ACC48(d)                                                       \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<M, __half>) {
    GC_ATTN_SS96("f16.f16");
  } else {
    GC_ATTN_SS96("bf16.bf16");
  }
#undef GC_ATTN_SS96
}

// The same with N = 128.
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

// The same with N = 192.
template <typename M>
__device__ __forceinline__ void WgmmaRS192(float (&d)[96], const uint32_t (&a)[4],
                                           uint64_t desc_b, int scale_d) {
#define GC_ATTN_RS192(TYPES)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n" GC_WGMMA_OP("m64n192k16", TYPES, \
                                                                          GC_WGMMA_D96)     \
               "{%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"                              \
               : GC_WGMMA_ACC96(d)                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<M, __half>) {
    GC_ATTN_RS192("f16.f16");
  } else {
    GC_ATTN_RS192("bf16.bf16");
  }
#undef GC_ATTN_RS192
}

// The same with N = 256.
template <typename M>
__device__ __forceinline__ void WgmmaRS256(float (&d)[128], const uint32_t (&a)[4],
                                           uint64_t desc_b, int scale_d) {
#define GC_ATTN_RS256(TYPES)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" GC_WGMMA_OP("m64n256k16", TYPES, \
                                                                          GC_WGMMA_D128)    \
               "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                          \
               : GC_WGMMA_ACC128(d)                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<M, __half>) {
    GC_ATTN_RS256("f16.f16");
  } else {
    GC_ATTN_RS256("bf16.bf16");
  }
#undef GC_ATTN_RS256
}

template <typename M, int kD>
__device__ __forceinline__ void WgmmaPV(float (&d)[kD / 2], const uint32_t (&a)[4],
                                        uint64_t desc_b) {
  if constexpr (kD == 64) {
    WgmmaRS64<M>(d, a, desc_b, 1);
  } else if constexpr (kD == 128) {
    WgmmaRS128<M>(d, a, desc_b, 1);
  } else if constexpr (kD == 192) {
    WgmmaRS192<M>(d, a, desc_b, 1);
  } else {
    WgmmaRS256<M>(d, a, desc_b, 1);
  }
}

// S (+)= Q K^T for one k16 step, N = the key tile.
template <typename M, int kBc>
__device__ __forceinline__ void WgmmaQK(float (&d)[kBc / 2], uint64_t desc_a, uint64_t desc_b,
                                        int scale_d) {
  if constexpr (kBc == 32) {
    WgmmaSS32<M>(d, desc_a, desc_b, scale_d);
  } else if constexpr (kBc == 64) {
    WgmmaSS64<M>(d, desc_a, desc_b, scale_d);
  } else if constexpr (kBc == 96) {
    WgmmaSS96<M>(d, desc_a, desc_b, scale_d);
  } else {
    WgmmaSS128<M>(d, desc_a, desc_b, scale_d);
  }
}

// Ping-pong (kSchedPingPong): consumer warpgroup cw issues its Q K^T only
// after the previous one (cw - 1, cyclically) has issued its own, on named
// barrier 1 + cw (256 threads: its 128 syncing, the previous one's 128
// arriving). The warpgroups' Q K^T products then run in turns on the tensor
// cores, each one's softmax under the others' products. The last warpgroup
// arrives once at the start so that the first one may begin.
__device__ __forceinline__ void NamedBarrierSync(int id) {
  asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id) {
  asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}

// One work tile: kBr query rows of one (batch, query head) against one split
// of the keys (all of them when p.num_splits is 1). Tiles are numbered
// head-major, then by query block (the longest causal block first), then by
// split: the tiles that read the same K and V run close together in time.
// A persistent grid under the causal mask (by_weight) numbers them by weight
// instead, the longest query blocks of every head first: block b takes tiles
// b, b + gridDim.x, ..., so every block gets one of each weight (numbered
// head-major, a block whose stride is a multiple of the query blocks per head
// got the same weight every time: 1.5-1.75x slower in sweep run 3).
struct WgmmaWork {
  int m0;         // first query row
  int bh;         // batch * heads_q + head
  int bkv;        // batch * heads_kv + kv head
  int split;      // key split
  int key_begin;  // first key
  int nblocks;    // key blocks it visits from key_begin
};

template <typename Tile, bool kCausal>
__device__ __forceinline__ WgmmaWork WgmmaTileWork(const AttnParams& p, int tile, int m_blocks,
                                                   bool by_weight) {
  WgmmaWork w;
  w.split = tile % p.num_splits;
  const int qt = tile / p.num_splits;
  int m_block;
  if (kCausal && by_weight) {
    const int heads = p.batch * p.heads_q;
    m_block = m_blocks - 1 - qt / heads;
    w.bh = qt % heads;
  } else {
    m_block = kCausal ? m_blocks - 1 - qt % m_blocks : qt % m_blocks;
    w.bh = qt / m_blocks;
  }
  const int b = w.bh / p.heads_q, h = w.bh % p.heads_q;
  w.bkv = b * p.heads_kv + h / p.group;
  w.m0 = m_block * Tile::kBr;
  int key_end = p.seq_kv;
  if (kCausal) key_end = max(0, min(p.seq_kv, min(w.m0 + Tile::kBr, p.seq_q) + p.causal_off));
  w.key_begin = 0;
  if (p.num_splits > 1) {
    w.key_begin = w.split * p.split_len;
    key_end = min(key_end, w.key_begin + p.split_len);
  }
  w.nblocks = key_end > w.key_begin ? (key_end - w.key_begin + Tile::kBc - 1) / Tile::kBc : 0;
  return w;
}

template <typename M, typename Tile, bool kCausal, int kSched>
__device__ __forceinline__ void ConsumeBlocks(const AttnParams& p, int cw,
                                              const WgmmaWork& work, int kv0, int q_use, uint32_t s_q, uint32_t s_k,
                                              uint32_t s_v, uint32_t bars);

// gridDim.x blocks walk the work tiles blockIdx.x, blockIdx.x + gridDim.x, ...
// (persistent with one block per SM, or one tile per block; the heuristics
// choose). The producer runs ahead across tiles: Q has two slots, so the next
// tile's Q loads (once every consumer warp is done with the tile that used
// that slot before, on its "q empty" mbarrier) together with its first K/V
// tiles while the consumers still work on the current one. The K/V ring's
// stage and phase follow a block count that runs on across tiles.
template <typename M, typename Tile, bool kCausal, int kSched>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    FlashWgmmaKernel(const __grid_constant__ CUtensorMap tmap_q,
                     const __grid_constant__ CUtensorMap tmap_k,
                     const __grid_constant__ CUtensorMap tmap_v, const AttnParams p) {
  constexpr int kBr = Tile::kBr, kBc = Tile::kBc, kStages = Tile::kStages;
  extern __shared__ __align__(1024) uint8_t wg_smem_raw[];
  const uint32_t base = (SmemAddr(wg_smem_raw) + 1023u) & ~1023u;
  const uint32_t s_q = base;                                // slot 0
  const uint32_t s_q1 = base + uint32_t(Tile::kQ1Offset);   // slot 1
  const uint32_t s_k = s_q + Tile::kQBytes;                 // + stage * kKVBytes
  const uint32_t s_v = s_k + kStages * Tile::kKVBytes;      // + stage * kKVBytes
  const uint32_t bars = s_v + kStages * Tile::kKVBytes;
  auto bar_q = [&](int slot) { return bars + 8u * slot; };
  auto bar_kfull = [&](int s) { return bars + 8u * (2 + s); };
  auto bar_vfull = [&](int s) { return bars + 8u * (2 + kStages + s); };
  auto bar_empty = [&](int s) { return bars + 8u * (2 + 2 * kStages + s); };
  auto bar_qempty = [&](int slot) { return bars + 8u * (2 + 3 * kStages + slot); };

  const int wg = threadIdx.x / 128;
  const int m_blocks = (p.seq_q + kBr - 1) / kBr;
  const int ntiles = m_blocks * p.batch * p.heads_q * p.num_splits;
  const bool by_weight = int(gridDim.x) < ntiles;  // persistent

  if (threadIdx.x == 0) {
    for (int slot = 0; slot < 2; ++slot) {
      sm90::MbarInit(bar_q(slot), 1);
      sm90::MbarInit(bar_qempty(slot), 4 * Tile::kConsumers);  // one arrival per consumer warp
    }
    for (int s = 0; s < kStages; ++s) {
      sm90::MbarInit(bar_kfull(s), 1);
      sm90::MbarInit(bar_vfull(s), 1);
      sm90::MbarInit(bar_empty(s), 4 * Tile::kConsumers);
    }
    sm90::FenceMbarrierInit();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: one thread issues every copy.
    sm90::SetMaxRegistersDec<Tile::kProducerRegs>();
    if (threadIdx.x == 0) {
      constexpr uint32_t kQTx = uint32_t(Tile::kPanels * kBr * 128);
      constexpr uint32_t kKVTx = uint32_t(Tile::kPanels * kBc * 128);
      int kv = 0, q_use = 0;
      for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const WgmmaWork w = WgmmaTileWork<Tile, kCausal>(p, tile, m_blocks, by_weight);
        if (w.nblocks == 0) continue;
        const int slot = q_use & 1;
        if (q_use >= 2) sm90::MbarWaitOrTrap(bar_qempty(slot), ((q_use >> 1) - 1) & 1);
        sm90::MbarArriveExpectTx(bar_q(slot), kQTx);
#pragma unroll
        for (int c = 0; c < Tile::kPanels; ++c)
          sm90::TmaLoad3d((slot ? s_q1 : s_q) + c * kBr * 128, &tmap_q, 64 * c, w.m0, w.bh,
                          bar_q(slot));
        for (int n = 0; n < w.nblocks; ++n) {
          const int g = kv + n, st = g % kStages, use = g / kStages;
          if (use > 0) sm90::MbarWaitOrTrap(bar_empty(st), (use - 1) & 1);
          sm90::MbarArriveExpectTx(bar_kfull(st), kKVTx);
#pragma unroll
          for (int c = 0; c < Tile::kPanels; ++c)
            sm90::TmaLoad3d(s_k + st * Tile::kKVBytes + c * kBc * 128, &tmap_k, 64 * c,
                            w.key_begin + n * kBc, w.bkv, bar_kfull(st));
          sm90::MbarArriveExpectTx(bar_vfull(st), kKVTx);
#pragma unroll
          for (int c = 0; c < Tile::kPanels; ++c)
            sm90::TmaLoad3d(s_v + st * Tile::kKVBytes + c * kBc * 128, &tmap_v, 64 * c,
                            w.key_begin + n * kBc, w.bkv, bar_vfull(st));
        }
        kv += w.nblocks;
        ++q_use;
      }
    }
  } else {
    // Consumers.
    sm90::SetMaxRegistersInc<Tile::kConsumerRegs>();
    if constexpr (kSched == kSchedPingPong && Tile::kConsumers > 1) {
      if (wg == Tile::kConsumers) NamedBarrierArrive(1);
    }
    int kv = 0, q_use = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
      const WgmmaWork w = WgmmaTileWork<Tile, kCausal>(p, tile, m_blocks, by_weight);
      ConsumeBlocks<M, Tile, kCausal, kSched>(p, wg - 1, w, kv, q_use, s_q, s_k, s_v, bars);
      if (w.nblocks > 0) {
        kv += w.nblocks;
        ++q_use;
      }
    }
  }
}

// The consumer warpgroup `cw`: its 64 query rows of one work tile against
// every key block of the tile, then the epilogue (the output, or with key
// splits the fp32 partial output and LSE that CombineSplitsKernel merges).
// kv0 is the ring's block count at the tile's first block; q_use counts the
// Q tiles loaded before this one.
template <typename M, typename Tile, bool kCausal, int kSched>
__device__ __forceinline__ void ConsumeBlocks(const AttnParams& p, int cw, const WgmmaWork& work,
                                              int kv0, int q_use, uint32_t s_q, uint32_t s_k,
                                              uint32_t s_v, uint32_t bars) {
  const int m0 = work.m0, bh = work.bh, nblocks = work.nblocks;
  constexpr bool kPingPong = kSched == kSchedPingPong && Tile::kConsumers > 1;
  constexpr int kD = Tile::kD, kBr = Tile::kBr, kBc = Tile::kBc, kStages = Tile::kStages;
  constexpr int kNT = kBc / 8;  // n8 tiles of S per row slice
  constexpr int kDT = kD / 8;   // n8 tiles of O per row slice
  auto bar_kfull = [&](int s) { return bars + 8u * (2 + s); };
  auto bar_vfull = [&](int s) { return bars + 8u * (2 + kStages + s); };
  auto bar_empty = [&](int s) { return bars + 8u * (2 + 2 * kStages + s); };
  const int q_slot = q_use & 1;
  const uint32_t bar_q = bars + 8u * q_slot;
  const uint32_t bar_qempty = bars + 8u * (2 + 3 * kStages + q_slot);
  auto stage = [&](int n) { return (kv0 + n) % kStages; };
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

  // This warpgroup's 64 rows of every panel of the tile's Q slot.
  const uint32_t q_rows = (q_slot ? s_q + uint32_t(Tile::kQ1Offset) : s_q) + 64 * cw * 128;
  uint32_t pa[kBc / 16][4];                      // P of the block whose P V is next

  // S = Q K^T of block n, issued and committed (not waited for).
  auto issue_qk = [&](int n) {
    const uint32_t k_tile = s_k + stage(n) * Tile::kKVBytes;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t da =
          sm90::MakeSmemDesc(q_rows + (kk >> 2) * kBr * 128 + (kk & 3) * 32, 16, 1024);
      const uint64_t db =
          sm90::MakeSmemDesc(k_tile + (kk >> 2) * kBc * 128 + (kk & 3) * 32, 16, 1024);
      WgmmaQK<M, kBc>(s_flat, da, db, kk > 0 ? 1 : 0);
    }
    sm90::WgmmaCommit();
  };
  // O += P V of block n, issued and committed.
  auto issue_pv = [&](int n) {
    const uint32_t v_tile = s_v + stage(n) * Tile::kKVBytes;
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      WgmmaPV<M, kD>(o_flat, pa[kk], sm90::MakeSmemDesc(v_tile + kk * 16 * 128, kBc * 128, 1024));
    sm90::WgmmaCommit();
  };
  // Mask and online softmax of block n's S (in place: S becomes P, fp32).
  auto softmax = [&](int n, float (&alpha)[2]) {
    const int n0 = work.key_begin + n * kBc;
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
    if (lane == 0) sm90::MbarArrive(bar_empty(stage(n)));
  };
  auto parity = [&](int n) { return uint32_t(((kv0 + n) / kStages) & 1); };

  if (nblocks > 0) sm90::MbarWaitOrTrap(bar_q, uint32_t((q_use >> 1) & 1));
  if constexpr (kSched != kSchedPipelined) {
    // Each block in order: Q K^T, wait, softmax, P V, wait.
    for (int n = 0; n < nblocks; ++n) {
      sm90::MbarWaitOrTrap(bar_kfull(stage(n)), parity(n));
      sm90::FenceRegisters(s_flat);
      sm90::WgmmaFence();
      if constexpr (kPingPong) NamedBarrierSync(1 + cw);
      issue_qk(n);
      if constexpr (kPingPong) NamedBarrierArrive(1 + (cw + 1) % Tile::kConsumers);
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(s_flat);
      float alpha[2];
      softmax(n, alpha);
      rescale_and_pack(alpha);
      sm90::MbarWaitOrTrap(bar_vfull(stage(n)), parity(n));
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
      sm90::MbarWaitOrTrap(bar_kfull(stage(n)), parity(n));
      sm90::FenceRegisters(s_flat);
      sm90::FenceRegisters(o_flat);
      sm90::WgmmaFence();
      issue_qk(n);
      sm90::MbarWaitOrTrap(bar_vfull(stage(n - 1)), parity(n - 1));
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
    sm90::MbarWaitOrTrap(bar_vfull(stage(nblocks - 1)), parity(nblocks - 1));
    sm90::FenceRegisters(o_flat);
    sm90::WgmmaFence();
    issue_pv(nblocks - 1);
    sm90::WgmmaWait<0>();
    sm90::FenceRegisters(o_flat);
    release(nblocks - 1);
  }

  // Every product that reads Q has completed: the producer may load the next
  // tile's Q while this one's epilogue runs.
  if (nblocks > 0) {
    __syncwarp();
    if (lane == 0) sm90::MbarArrive(bar_qempty);
  }

  float inv[2], lse[2];
  FinishRows(m, l, inv, lse, p.scale);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (row[hh] >= p.seq_q) continue;
    const int64_t lrow = int64_t(bh) * p.seq_q + row[hh];
    if (p.num_splits > 1) {
      // Partials kD wide: [split, batch * heads_q * seq_q, kD], LSE alike.
      const int64_t zrow = int64_t(work.split) * p.batch * p.heads_q * p.seq_q + lrow;
      float* po = p.part_o + zrow * kD;
#pragma unroll
      for (int j = 0; j < kDT; ++j)
        if (8 * j < p.head_dim)
          StorePair<float>(po + 8 * j + 2 * t, o[j][2 * hh] * inv[hh], o[j][2 * hh + 1] * inv[hh]);
      if (t == 0) p.part_lse[zrow] = lse[hh];
      continue;
    }
#pragma unroll
    for (int j = 0; j < kDT; ++j)
      if (8 * j < p.head_dim)
        StoreOutPair<M>(p, lrow * p.head_dim + 8 * j + 2 * t, o[j][2 * hh] * inv[hh],
                        o[j][2 * hh + 1] * inv[hh]);
    if (t == 0 && p.lse) p.lse[lrow] = lse[hh];
  }
}

}  // namespace gpucompute::kernels::attention

#endif  // GPUCOMPUTE_KERNELS_SRC_ATTENTION_WGMMA_CUH_
