// flash_wgmma: FlashAttention forward for Hopper (sm_90a).
//
// A work tile is kBr = 64 * kConsumers query rows of one (batch, query head)
// against one split of the keys. A block runs 1 + kConsumers warpgroups and
// walks one or more tiles (see FlashWgmmaKernel: a persistent grid where there
// are more tiles than SMs). Without the mask the last round of a persistent
// grid may be dealt out by key blocks instead (TailSplit): each
// block takes an equal run of the last tiles' key blocks, one piece per tile
// it meets, and the pieces' fp32 partials are merged by their LSE after
// (TailSplit, CombineTailKernel). Warpgroup 0 is the producer: it drops its
// registers (setmaxnreg) and one of its threads picks the tiles (a fixed
// stride, or a counter in global memory) and issues the TMA copies: each
// tile's Q into one of its Q slots (kQSlots), then the K and V tiles of
// every key block into a kStages-deep ring. Each copy lands on its own "full" mbarrier
// (transaction count); a K or V stage is refilled only after every consumer
// warp has arrived on its "empty" mbarrier (K as soon as Q K^T has read it,
// V after P V). Each tile travels with its Q (its rows, head and key range,
// worked out by the producer), so the consumers follow whatever order the
// producer chose.
// The other warpgroups are consumers, 64 query rows apiece: S = Q K^T by wgmma
// with both operands in shared memory (K-major, 128-byte swizzle, exactly as
// TMA wrote them), the mask and online softmax on the accumulators in
// registers, then O += P V by wgmma with P straight from registers (the S
// accumulator layout is the wgmma A-fragment layout) and V read N-major
// (transposed by the instruction) from the swizzled tile. Four schedules, one
// rung each:
//   kSchedInOrder   - Q K^T, wait, softmax, P V, wait; the other consumers'
//                     GEMMs run under one's softmax.
//   kSchedPingPong  - the same with the consumers' Q K^T issued in turns
//                     (named barriers).
//   kSchedPipelined - inside each consumer, Q K^T of block n and P V of block
//                     n - 1 issued together, O rescaled under Q K^T and the
//                     softmax of block n under P V of block n - 1
//                     (FlashAttention-3's intra-warpgroup overlap; S, P and O
//                     live at once).
//   kSchedOverlap   - kSchedPipelined with each block's two GEMMs issued in
//                     turns with the other consumers (both of FlashAttention-
//                     3's overlaps): the default.
//
// Head dims: the tile is kD = 64, 128, 192 or 256 wide (WgmmaHeadDim: the
// next of those, so that every 64-column panel holds some of D); the tensor
// maps span the tensors' own D (a multiple of 8), so TMA zero-fills the
// columns past it. Q K^T runs over the whole padded width (a runtime bound on
// its k steps cost the d128 kernel 128 bytes of spills and serialised
// wgmmas), P V too, and the columns past D are never stored. Key tiles: 128
// at kD 64 and 128 (176 at kD 128 for long unmasked rows, 64 at kD 64 and
// 128 for at most 64 keys: the heuristics' choice), 96 at kD 192, 80 at kD
// 256: the widest whose ring fits beside Q; from 192 on the Q tile has one
// slot, on 64-key tiles four (kQSlots).
//
// Shared layouts: every tile is stored as kD / 64 column panels of
// (rows x 64) elements, 128 bytes per row, 1024-byte aligned, swizzled by TMA
// (SWIZZLE_128B). A K-major wgmma operand descriptor then has SBO = 1024
// (eight rows) and steps 32 bytes per k16 inside a panel; the N-major V
// operand has SBO = 1024 (eight keys) and LBO = one panel (to the next 64
// columns of head_dim).
//
// The epilogue: 16-bit O leaves by TMA store (sweep run 15 against 13: 58 ->
// 69 of 106 shapes at or past the vendor): each consumer warpgroup writes its
// 64 rows, normalised and swizzled, into shared memory (in persistent grids
// a staging buffer where it fits, else its rows of Q's slot) and one of
// its threads stores each panel; fp32 O and key-split partials are stored by
// the threads. Per-tile costs weigh where a tile has one or two key blocks
// (Nsight Compute at 128 keys: 1.25x cuDNN's instructions and 1.24x its
// time), so the producer works each tile out once and hands it over with its
// Q, and the wgmma descriptors are made once and stepped by one add (run 16:
// B128 H32 S128 D64 84 -> 78 us).
#ifndef GPUCOMPUTE_KERNELS_SRC_ATTENTION_WGMMA_CUH_
#define GPUCOMPUTE_KERNELS_SRC_ATTENTION_WGMMA_CUH_

#include <cuda.h>

#include <algorithm>

#include "attention_common.cuh"
#include "sm90_primitives.cuh"

namespace gpucompute::kernels::attention {

// How each consumer warpgroup orders its products (one rung each):
inline constexpr int kSchedInOrder = 0;    // flash_wgmma
inline constexpr int kSchedPipelined = 1;  // flash_wgmma_pipelined: softmax of n under P V of n - 1
inline constexpr int kSchedPingPong = 2;   // flash_wgmma_pingpong: the GEMMs issued in turns
inline constexpr int kSchedOverlap = 3;    // flash_wgmma_overlap: pipelined and in turns

// Whether a schedule issues its GEMMs in turns with the other consumers.
template <int kSched>
inline constexpr bool kSchedInTurns = kSched == kSchedPingPong || kSched == kSchedOverlap;

// The key tile a padded head dim takes unless told otherwise: 128 up to 128,
// then 96 and 80, the widest whose K/V ring and Q tile fit shared memory.
inline constexpr int WgmmaDefaultKeyTile(int kd) { return kd <= 128 ? 128 : (kd == 192 ? 96 : 80); }

// The tile of a padded head dim kD_; kBc_ = 0 takes WgmmaDefaultKeyTile.
template <int kD_, int kConsumers_, int kBc_ = 0>
struct WgmmaTile {
  static constexpr int kD = kD_;
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups, 64 rows each
  static constexpr int kBr = 64 * kConsumers;     // query tile (BLOCK_M)
  static constexpr int kBc = kBc_ ? kBc_ : WgmmaDefaultKeyTile(kD);  // key tile (BLOCK_N)
  static constexpr int kStages = kD == 64 ? 4 : 2;                   // K/V ring depth
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kPanels = kD / 64;        // 128-byte column panels
  static constexpr int kQBytes = kBr * kD * 2;   // (kBr, kD)
  static constexpr int kKVBytes = kBc * kD * 2;  // (kBc, kD), one of K or V
  // Q full and empty (up to kMaxQSlots slots each), then per stage K full,
  // V full, K empty and V empty (K is handed back as soon as Q K^T has read
  // it), then the work tile of each Q slot (32 bytes each).
  static constexpr int kMaxQSlots = 4;
  static constexpr int kBarrierBytes = 8 * (2 * kMaxQSlots + 4 * kStages) + 32 * kMaxQSlots;
  // From the 1024-aligned base: Q slot 0, the K ring, the V ring, the
  // barriers, then Q slot 1 (the next tile's Q loads while this one's is
  // still read) where it fits, the O staging buffer (below) where it fits,
  // and Q slots 2 and 3 where they fit; only a persistent grid uses the
  // slots past 0: a grid of one tile per block is launched with
  // kOneTileSmemBytes.
  static constexpr size_t kSmemLimit = 227 * 1024;
  static constexpr size_t kRingEnd = size_t(kQBytes) + 2 * size_t(kStages) * kKVBytes;
  static constexpr size_t kQ1Offset = (kRingEnd + kBarrierBytes + 1023) / 1024 * 1024;
  static constexpr size_t kOneTileSmemBytes = 1024 + kRingEnd + kBarrierBytes;
  static constexpr bool kTwoQSlots = 1024 + kQ1Offset + kQBytes <= kSmemLimit;
  // A persistent grid stages O for its TMA store in a buffer of its own
  // after Q slot 1 where that fits (kD = 64, and 128 on 128-key tiles), so
  // that Q's slot goes back to the producer before the epilogue; else O is
  // staged in Q's slot, which goes back once the store has read it.
  static constexpr size_t kOStageOffset = (kQ1Offset + kQBytes + 1023) / 1024 * 1024;
  static constexpr bool kOStaged = kTwoQSlots && 1024 + kOStageOffset + kQBytes <= kSmemLimit;
  // Q slots past the second, after the O staging buffer, on 64-key tiles
  // (one key block a tile: the producer runs that many tiles further
  // ahead). Sweep run 48 (H100) timed four slots on every tile: on 128-key
  // tiles at kD 64 with one key block (65-128 keys) 1.046x the time of two,
  // B128 H32 S128 D64 1.04x, the list 1.004x; the 64-key tiles were timed
  // with four.
  static constexpr size_t kQ2Offset = (kOStageOffset + kQBytes + 1023) / 1024 * 1024;
  static constexpr int kMoreQSlots =
      !kOStaged || kQ2Offset + 1024 > kSmemLimit
          ? 0
          : int(std::min<size_t>(kMaxQSlots - 2, (kSmemLimit - 1024 - kQ2Offset) / kQBytes));
  static constexpr int kQSlots = kTwoQSlots ? 2 + (kBc == 64 ? kMoreQSlots : 0) : 1;
  static constexpr size_t kSmemBytes = kQSlots > 2
                                           ? 1024 + kQ2Offset + size_t(kQSlots - 2) * kQBytes
                                       : kTwoQSlots ? 1024 + kQ1Offset + kQBytes
                                                    : kOneTileSmemBytes;
  static constexpr size_t kStagedSmemBytes =
      kOStaged ? std::max<size_t>(1024 + kOStageOffset + kQBytes, kSmemBytes) : kSmemBytes;
  // Shared-memory offset of Q slot `slot` from the aligned base.
  static constexpr uint32_t QSlotOffset(int slot) {
    return slot == 0   ? 0u
           : slot == 1 ? uint32_t(kQ1Offset)
                       : uint32_t(kQ2Offset + size_t(slot - 2) * kQBytes);
  }
  static constexpr int kProducerRegs = kConsumers == 3 ? 24 : 40;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : (kConsumers == 2 ? 232 : 240);
  static_assert(kD % 64 == 0 && kD <= 256, "padded head_dim 64, 128, 192 or 256");
  static_assert(kConsumers >= 1 && kConsumers <= 3, "one to three consumer warpgroups");
  // ptxas allocates the consumers' code under the count setmaxnreg raises
  // them to (the kernel's launch bounds fix the count at entry): at kD = 256
  // two consumers on 80-key tiles (O 128 registers, S 40, P 20) compile
  // without spills in order (4 bytes pipelined), kD = 128 on 176-key tiles
  // (O 64, S 88, P 44) without any.
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
                "register budget of one block per SM");
  static_assert(kOneTileSmemBytes <= 227 * 1024, "shared memory of one SM");
};

// The wgmma wrappers, one per N: WgmmaSS<N> for S (+)= A B^T with A and B
// both K-major in shared memory (Q K^T; N = the key tile), WgmmaRS<N> for
// O += P V with P (m64 x k16) in registers and V N-major in shared memory
// (N = the padded head dim). ACC = N / 2 accumulators per thread; the other
// arguments are the asm operand numbers that follow them (PTX operands are
// numbered, so each N spells its own): descriptors, A fragments and the
// scale_d predicate's source.
#define GC_ATTN_SS_ASM(N, ACC, DA, DB, P, TYPES)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n" GC_WGMMA_OP(        \
                   "m64n" #N "k16", TYPES, GC_WGMMA_D##ACC) "%" #DA ", %" #DB       \
                                                            ", p, 1, 1, 0, 0;\n}\n" \
               : GC_WGMMA_ACC##ACC(d)                                               \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define GC_ATTN_DEFINE_SS(N, ACC, DA, DB, P)                                                   \
  template <typename M>                                                                        \
  __device__ __forceinline__ void WgmmaSS##N(float(&d)[ACC], uint64_t desc_a, uint64_t desc_b, \
                                             int scale_d) {                                    \
    if constexpr (std::is_same_v<M, __half>) {                                                 \
      GC_ATTN_SS_ASM(N, ACC, DA, DB, P, "f16.f16");                                            \
    } else {                                                                                   \
      GC_ATTN_SS_ASM(N, ACC, DA, DB, P, "bf16.bf16");                                          \
    }                                                                                          \
  }
#define GC_ATTN_RS_ASM(N, ACC, A0, A1, A2, A3, DB, P, TYPES)                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n" GC_WGMMA_OP(                       \
                   "m64n" #N "k16", TYPES, GC_WGMMA_D##ACC) "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 \
                                                            "}, %" #DB ", p, 1, 1, 1;\n}\n"        \
               : GC_WGMMA_ACC##ACC(d)                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
#define GC_ATTN_DEFINE_RS(N, ACC, A0, A1, A2, A3, DB, P)                            \
  template <typename M>                                                             \
  __device__ __forceinline__ void WgmmaRS##N(float(&d)[ACC], const uint32_t(&a)[4], \
                                             uint64_t desc_b, int scale_d) {        \
    if constexpr (std::is_same_v<M, __half>) {                                      \
      GC_ATTN_RS_ASM(N, ACC, A0, A1, A2, A3, DB, P, "f16.f16");                     \
    } else {                                                                        \
      GC_ATTN_RS_ASM(N, ACC, A0, A1, A2, A3, DB, P, "bf16.bf16");                   \
    }                                                                               \
  }

GC_ATTN_DEFINE_SS(64, 32, 32, 33, 34)
GC_ATTN_DEFINE_SS(80, 40, 40, 41, 42)
GC_ATTN_DEFINE_SS(96, 48, 48, 49, 50)
GC_ATTN_DEFINE_SS(128, 64, 64, 65, 66)
GC_ATTN_DEFINE_SS(176, 88, 88, 89, 90)
GC_ATTN_DEFINE_RS(64, 32, 32, 33, 34, 35, 36, 37)
GC_ATTN_DEFINE_RS(128, 64, 64, 65, 66, 67, 68, 69)
GC_ATTN_DEFINE_RS(192, 96, 96, 97, 98, 99, 100, 101)
GC_ATTN_DEFINE_RS(256, 128, 128, 129, 130, 131, 132, 133)
#undef GC_ATTN_DEFINE_RS
#undef GC_ATTN_RS_ASM
#undef GC_ATTN_DEFINE_SS
#undef GC_ATTN_SS_ASM

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
  static_assert(kBc == 64 || kBc == 80 || kBc == 96 || kBc == 128 || kBc == 176,
                "key tiles of 64, 80, 96, 128 or 176");
  if constexpr (kBc == 64) {
    WgmmaSS64<M>(d, desc_a, desc_b, scale_d);
  } else if constexpr (kBc == 80) {
    WgmmaSS80<M>(d, desc_a, desc_b, scale_d);
  } else if constexpr (kBc == 96) {
    WgmmaSS96<M>(d, desc_a, desc_b, scale_d);
  } else if constexpr (kBc == 128) {
    WgmmaSS128<M>(d, desc_a, desc_b, scale_d);
  } else {
    WgmmaSS176<M>(d, desc_a, desc_b, scale_d);
  }
}

// In turns (kSchedPingPong, kSchedOverlap): consumer warpgroup cw issues its
// GEMMs of a key block only after the previous one (cw - 1, cyclically) has
// issued its own, on named barrier 1 + cw (256 threads: its 128 syncing, the
// previous one's 128 arriving). The warpgroups' products then run in turns on
// the tensor cores, each one's softmax under the others' products. The last
// warpgroup arrives once at the start so that the first one may begin.
__device__ __forceinline__ void NamedBarrierSync(int id) {
  asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id) {
  asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}

// The mbarriers, 8 bytes each from `base`: Q full (kQ slots), then per
// stage K full, V full, K empty and V empty, then Q empty (kQ slots); then
// the work tile whose Q each slot holds, as the producer worked it out
// (StoreWork, LoadWork: the consumers do no division per tile).
template <int kStages, int kQ>
struct WgmmaBars {
  uint32_t base;
  __device__ uint32_t q(int slot) const { return base + 8u * slot; }
  __device__ uint32_t kfull(int s) const { return base + 8u * (kQ + s); }
  __device__ uint32_t vfull(int s) const { return base + 8u * (kQ + kStages + s); }
  __device__ uint32_t kempty(int s) const { return base + 8u * (kQ + 2 * kStages + s); }
  __device__ uint32_t vempty(int s) const { return base + 8u * (kQ + 3 * kStages + s); }
  __device__ uint32_t qempty(int slot) const { return base + 8u * (kQ + 4 * kStages + slot); }
  __device__ uint32_t work(int slot) const {
    return base + 8u * (2 * kQ + 4 * kStages) + 32u * slot;
  }
};

// One work tile: kBr query rows of one (batch, query head) against one split
// of the keys (all of them when p.num_splits is 1). Tiles are numbered
// head-major, then by query block (the longest causal block first), then by
// split: the tiles that read the same K and V run close together in time.
// Under the causal mask a persistent grid takes them from the counter, so
// each block gets the next tile when it is free (a fixed stride over tiles
// numbered by weight, sweep runs 4-8, balanced the work but spread each
// head's tiles over the whole run: K and V were read from HBM once per query
// block where they outgrow L2; the counter took B16 H16 S1024 D128 causal
// from 0.79x to 0.96x cuDNN).
struct WgmmaWork {
  int m0;         // first query row
  int bh;         // batch * heads_q + head
  int bkv;        // batch * heads_kv + kv head
  int split;      // key split; -1 - slot for a piece of a tail tile (TailSplit)
  int key_begin;  // first key
  int nblocks;    // key blocks it visits from key_begin
};

template <typename Tile, bool kCausal>
__device__ __forceinline__ WgmmaWork WgmmaTileWork(const AttnParams& p, int tile, int m_blocks) {
  WgmmaWork w;
  w.split = tile % p.num_splits;
  const int qt = tile / p.num_splits;
  const int m_block = kCausal ? m_blocks - 1 - qt % m_blocks : qt % m_blocks;
  w.bh = qt / m_blocks;
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

// A work tile in shared memory at `addr` (20 bytes): nblocks first, -1 for
// "no more tiles" (the rest then unset).
__device__ __forceinline__ void StoreWork(uint32_t addr, const WgmmaWork& w) {
  sm90::StShared32(addr, uint32_t(w.nblocks));
  sm90::StShared32(addr + 4, uint32_t(w.m0));
  sm90::StShared32(addr + 8, uint32_t(w.bh));
  sm90::StShared32(addr + 12, uint32_t(w.key_begin));
  sm90::StShared32(addr + 16, uint32_t(w.split));
}
// The fields past nblocks (bkv, the producer's alone, is not kept).
__device__ __forceinline__ void LoadWork(uint32_t addr, WgmmaWork& w) {
  w.m0 = int(sm90::LdShared32(addr + 4));
  w.bh = int(sm90::LdShared32(addr + 8));
  w.key_begin = int(sm90::LdShared32(addr + 12));
  w.split = int(sm90::LdShared32(addr + 16));
  w.bkv = 0;
}

template <typename M, typename Tile, bool kCausal, int kSched>
__device__ __forceinline__ void ConsumeBlocks(
    const AttnParams& p, const CUtensorMap* tmap_o, uint32_t s_o, int cw, const WgmmaWork& work,
    int kv0, int q_slot, uint32_t s_q, uint32_t s_k, uint32_t s_v,
    const WgmmaBars<Tile::kStages, Tile::kMaxQSlots>& bar);

// A 128-thread barrier of one consumer warpgroup (ids 4.., after the turns'
// barriers 1..3).
__device__ __forceinline__ void WarpgroupBarrierSync(int cw) {
  asm volatile("bar.sync %0, 128;" ::"r"(4 + cw) : "memory");
}

// Block b starts with tile b and takes the next from p.tile_counter when it
// is set (zeroed before the launch; tiles gridDim.x, gridDim.x + 1, ... in
// the order the blocks ask), else tiles b + gridDim.x, b + 2 gridDim.x, ...
// (a persistent grid with one block per SM, or one tile per block).
// With o_tma (16-bit O, no key splits) each consumer warpgroup writes its
// rows of O into shared memory and one of its threads stores them with TMA
// through tmap_o (a map like Q's with 64-row boxes), which clips the rows
// past seq_q and the columns past head_dim: with o_tma == 2 into its rows of
// the O staging buffer (Tile::kOStaged, launched with kStagedSmemBytes), else
// into its rows of the tile's Q slot. Else the threads store O themselves.
// The producer runs ahead across tiles: Q has up to Tile::kQSlots slots, so
// the next tiles' Q loads (once every consumer warp is done with the tile
// that used that slot before, on its "q empty" mbarrier) together with their
// first K/V tiles while the consumers still work on the current one. The
// K/V ring's stage and phase follow a block count that runs on across tiles.
template <typename M, typename Tile, bool kCausal, int kSched>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    FlashWgmmaKernel(const __grid_constant__ CUtensorMap tmap_q,
                     const __grid_constant__ CUtensorMap tmap_k,
                     const __grid_constant__ CUtensorMap tmap_v,
                     const __grid_constant__ CUtensorMap tmap_o, const AttnParams p,
                     const TailSplit tail, int o_tma) {
  constexpr int kBr = Tile::kBr, kBc = Tile::kBc, kStages = Tile::kStages;
  extern __shared__ __align__(1024) uint8_t wg_smem_raw[];
  const uint32_t base = (SmemAddr(wg_smem_raw) + 1023u) & ~1023u;
  const uint32_t s_q = base;                            // slot 0; slot i at QSlotOffset(i)
  const uint32_t s_k = s_q + Tile::kQBytes;             // + stage * kKVBytes
  const uint32_t s_v = s_k + kStages * Tile::kKVBytes;  // + stage * kKVBytes
  const uint32_t bars = s_v + kStages * Tile::kKVBytes;
  const WgmmaBars<kStages, Tile::kMaxQSlots> bar{bars};

  const int wg = threadIdx.x / 128;
  const int m_blocks = (p.seq_q + kBr - 1) / kBr;
  const int ntiles = m_blocks * p.batch * p.heads_q * p.num_splits;
  // Tiles run whole (without the mask the last round's may be split).
  const int nwhole = !kCausal && tail.per ? tail.first : ntiles;

  if (threadIdx.x == 0) {
    for (int slot = 0; slot < Tile::kMaxQSlots; ++slot) {
      sm90::MbarInit(bar.q(slot), 1);
      sm90::MbarInit(bar.qempty(slot), 4 * Tile::kConsumers);  // one per consumer warp
    }
    for (int s = 0; s < kStages; ++s) {
      sm90::MbarInit(bar.kfull(s), 1);
      sm90::MbarInit(bar.vfull(s), 1);
      sm90::MbarInit(bar.kempty(s), 4 * Tile::kConsumers);
      sm90::MbarInit(bar.vempty(s), 4 * Tile::kConsumers);
    }
    sm90::FenceMbarrierInit();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: one thread picks the tiles and issues every copy. Each tile
    // goes to the consumers with its Q (written before the arrival on the
    // slot's "q full" barrier, read after the wait on it); -1 ends.
    sm90::SetMaxRegistersDec<Tile::kProducerRegs>();
    if (threadIdx.x == 0) {
      constexpr uint32_t kQTx = uint32_t(Tile::kPanels * kBr * 128);
      constexpr uint32_t kKVTx = uint32_t(Tile::kPanels * kBc * 128);
      int kv = 0, q_use = 0;
      // Waits until the consumers are done with the next Q slot; returns it.
      auto claim_slot = [&] {
        const int slot = q_use % Tile::kQSlots, q_round = q_use / Tile::kQSlots;
        if (q_round > 0) sm90::MbarWaitOrTrap(bar.qempty(slot), (q_round - 1) & 1);
        return slot;
      };
      // Hands tile w over with its Q and issues its K/V copies.
      auto issue = [&](const WgmmaWork& w) {
        const int slot = claim_slot();
        ++q_use;
        StoreWork(bar.work(slot), w);
        if (w.nblocks == 0) {
          // Rows that see no key (or an empty key split): written, not read.
          sm90::MbarArrive(bar.q(slot));
          return;
        }
        sm90::MbarArriveExpectTx(bar.q(slot), kQTx);
#pragma unroll
        for (int c = 0; c < Tile::kPanels; ++c)
          sm90::TmaLoad3d(s_q + Tile::QSlotOffset(slot) + c * kBr * 128, &tmap_q, 64 * c, w.m0,
                          w.bh, bar.q(slot));
        for (int n = 0; n < w.nblocks; ++n) {
          const int g = kv + n, st = g % kStages, use = g / kStages;
          if (use > 0) sm90::MbarWaitOrTrap(bar.kempty(st), (use - 1) & 1);
          sm90::MbarArriveExpectTx(bar.kfull(st), kKVTx);
#pragma unroll
          for (int c = 0; c < Tile::kPanels; ++c)
            sm90::TmaLoad3d(s_k + st * Tile::kKVBytes + c * kBc * 128, &tmap_k, 64 * c,
                            w.key_begin + n * kBc, w.bkv, bar.kfull(st));
          if (use > 0) sm90::MbarWaitOrTrap(bar.vempty(st), (use - 1) & 1);
          sm90::MbarArriveExpectTx(bar.vfull(st), kKVTx);
#pragma unroll
          for (int c = 0; c < Tile::kPanels; ++c)
            sm90::TmaLoad3d(s_v + st * Tile::kKVBytes + c * kBc * 128, &tmap_v, 64 * c,
                            w.key_begin + n * kBc, w.bkv, bar.vfull(st));
        }
        kv += w.nblocks;
      };
      for (int tile = blockIdx.x; tile < nwhole;
           tile = p.tile_counter ? int(gridDim.x) + atomicAdd(p.tile_counter, 1)
                                 : tile + int(gridDim.x))
        issue(WgmmaTileWork<Tile, kCausal>(p, tile, m_blocks));
      if (!kCausal && tail.per) {
        // The tail: this block's run of the last round's key blocks (tile by
        // tile, tail.blocks each), one piece per tile it meets.
        const int nb = tail.blocks, per = tail.per;
        const int total = (ntiles - tail.first) * nb;
        const int g_end = min(total, (int(blockIdx.x) + 1) * per);
        for (int g = int(blockIdx.x) * per; g < g_end;) {
          const int tt = g / nb, kb0 = g % nb, len = min(nb - kb0, g_end - g);
          WgmmaWork w = WgmmaTileWork<Tile, kCausal>(p, tail.first + tt, m_blocks);
          w.key_begin = kb0 * kBc;
          w.nblocks = len;
          w.split = -1 - (tt * tail.pieces + int(blockIdx.x) - tail.FirstBlock(tt));
          issue(w);
          g += len;
        }
      }
      const int slot = claim_slot();
      sm90::StShared32(bar.work(slot), uint32_t(-1));
      sm90::MbarArrive(bar.q(slot));
    }
  } else {
    // Consumers: the tiles the producer hands over, until -1.
    sm90::SetMaxRegistersInc<Tile::kConsumerRegs>();
    if constexpr (kSchedInTurns<kSched> && Tile::kConsumers > 1) {
      if (wg == Tile::kConsumers) NamedBarrierArrive(1);
    }
    // (Written as a loop on the tile number: the same loop with a break
    // after the wait compiled under the 168-register entry cap, with 208
    // bytes of spills and serialised wgmmas at head_dim 128.)
    int kv = 0, q_use = 0;
    const CUtensorMap* o_map = o_tma ? &tmap_o : nullptr;
    const uint32_t s_o = Tile::kOStaged && o_tma == 2 ? base + uint32_t(Tile::kOStageOffset) : 0;
    // The next tile's key block count (-1: none left).
    auto next_tile = [&] {
      const int slot = q_use % Tile::kQSlots;
      sm90::MbarWaitOrTrap(bar.q(slot), uint32_t((q_use / Tile::kQSlots) & 1));
      return int(sm90::LdShared32(bar.work(slot)));
    };
    for (int nblocks = next_tile(); nblocks >= 0; nblocks = next_tile()) {
      WgmmaWork w;
      w.nblocks = nblocks;
      const int slot = q_use % Tile::kQSlots;
      LoadWork(bar.work(slot), w);
      ConsumeBlocks<M, Tile, kCausal, kSched>(p, o_map, s_o, wg - 1, w, kv, slot, s_q, s_k, s_v,
                                              bar);
      kv += w.nblocks;
      ++q_use;
    }
  }
}

// The consumer warpgroup `cw`: its 64 query rows of one work tile against
// every key block of the tile, then the epilogue (the output, or with key
// splits the fp32 partial output and LSE that CombineSplitsKernel merges).
// kv0 is the ring's block count at the tile's first block; the tile's Q has
// landed in slot q_slot (a tile without key blocks only writes its rows).
template <typename M, typename Tile, bool kCausal, int kSched>
__device__ __forceinline__ void ConsumeBlocks(
    const AttnParams& p, const CUtensorMap* tmap_o, uint32_t s_o, int cw, const WgmmaWork& work,
    int kv0, int q_slot, uint32_t s_q, uint32_t s_k, uint32_t s_v,
    const WgmmaBars<Tile::kStages, Tile::kMaxQSlots>& bar) {
  const int m0 = work.m0, bh = work.bh, nblocks = work.nblocks;
  constexpr bool kInTurns = kSchedInTurns<kSched> && Tile::kConsumers > 1;
  constexpr bool kPipelined = kSched == kSchedPipelined || kSched == kSchedOverlap;
  constexpr int kD = Tile::kD, kBr = Tile::kBr, kBc = Tile::kBc, kStages = Tile::kStages;
  constexpr int kNT = kBc / 8;  // n8 tiles of S per row slice
  constexpr int kDT = kD / 8;   // n8 tiles of O per row slice
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
  float alpha[2] = {1.f, 1.f};  // O's scale from the last softmax, not yet applied
  float(&s_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(s);
  float(&o_flat)[kDT * 4] = reinterpret_cast<float(&)[kDT * 4]>(o);

  // This warpgroup's 64 rows of every panel of the tile's Q slot.
  const uint32_t q_rows = s_q + Tile::QSlotOffset(q_slot) + 64 * cw * 128;
  uint32_t pa[kBc / 16][4];  // P of the block whose P V is next

  // Operand descriptors: made once, stepped by one add each (a descriptor
  // built per k step from its address cost ~4 instructions, per warp and
  // block; that weighs where a tile has one or two key blocks).
  const uint64_t q_desc = sm90::MakeSmemDesc(q_rows, 16, 1024);
  const uint64_t k_desc = sm90::MakeSmemDesc(s_k, 16, 1024);
  const uint64_t v_desc = sm90::MakeSmemDesc(s_v, kBc * 128, 1024);

  // S = Q K^T of block n, issued and committed (not waited for).
  auto issue_qk = [&](int n) {
    const uint64_t k_tile = sm90::SmemDescAdvance(k_desc, stage(n) * Tile::kKVBytes);
    sm90::FenceRegisters(s_flat);
    sm90::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t da = sm90::SmemDescAdvance(q_desc, (kk >> 2) * kBr * 128 + (kk & 3) * 32);
      const uint64_t db = sm90::SmemDescAdvance(k_tile, (kk >> 2) * kBc * 128 + (kk & 3) * 32);
      WgmmaQK<M, kBc>(s_flat, da, db, kk > 0 ? 1 : 0);
    }
    sm90::WgmmaCommit();
  };
  // O += P V of block n, issued and committed.
  auto issue_pv = [&](int n) {
    const uint64_t v_tile = sm90::SmemDescAdvance(v_desc, stage(n) * Tile::kKVBytes);
    sm90::FenceRegisters(o_flat);
    sm90::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      WgmmaPV<M, kD>(o_flat, pa[kk], sm90::SmemDescAdvance(v_tile, kk * 16 * 128));
    sm90::WgmmaCommit();
  };
  // Mask and online softmax of block n's S (in place: S becomes P, fp32);
  // alpha is what O must be scaled by before P V of block n.
  auto softmax = [&](int n) {
    const int n0 = work.key_begin + n * kBc;
    const bool need_mask =
        n0 + kBc > p.seq_kv || (kCausal && n0 + kBc - 1 > wg_row0 + p.causal_off);
    if (need_mask) MaskBlock<kNT>(s, row, n0 + 2 * t, p.seq_kv, kCausal, p.causal_off);
    OnlineSoftmax<kNT>(s, m, l, alpha, p.scale_log2);
  };
  // O keeps its scale while no row of the warp raised its maximum
  // (OnlineSoftmax's kMaxLagLog2: after the first key blocks, most of them),
  // from a 128-wide tile on and with three consumers. Sweep runs 44 and 47
  // (H100), the skip everywhere and only from 128 columns on, each against
  // the code before: 0.97-0.99x the time at D 80-256; at D <= 64 with three
  // consumers (2048 keys and more) 0.98-0.99x with it, 1.02-1.03x without;
  // with two (128-1024 keys: 32 products a thread, the vote and branch weigh
  // more) 1.01-1.03x with it, 0.98-0.99x without.
  auto rescale_o = [&] {
    if constexpr (kD >= 128 || Tile::kConsumers == 3) {
      if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
    }
#pragma unroll
    for (int j = 0; j < kDT; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
  };
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      pa[kk][0] = PackPair<M>(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = PackPair<M>(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = PackPair<M>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = PackPair<M>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  };
  // Hands a stage's K or V tile back to the producer (one arrival per warp).
  auto release = [&](uint32_t empty_bar) {
    __syncwarp();
    if (lane == 0) sm90::MbarArrive(empty_bar);
  };
  auto parity = [&](int n) { return uint32_t(((kv0 + n) / kStages) & 1); };
  auto turn_begin = [&] {
    if constexpr (kInTurns) NamedBarrierSync(1 + cw);
  };
  auto turn_end = [&] {
    if constexpr (kInTurns) NamedBarrierArrive(1 + (cw + 1) % Tile::kConsumers);
  };

  if constexpr (!kPipelined) {
    // Each block in order: Q K^T, wait, softmax, P V, wait.
    for (int n = 0; n < nblocks; ++n) {
      sm90::MbarWaitOrTrap(bar.kfull(stage(n)), parity(n));
      turn_begin();
      issue_qk(n);
      turn_end();
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(s_flat);
      release(bar.kempty(stage(n)));
      softmax(n);
      rescale_o();
      pack_p();
      sm90::MbarWaitOrTrap(bar.vfull(stage(n)), parity(n));
      issue_pv(n);
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(o_flat);
      release(bar.vempty(stage(n)));
    }
  } else if (nblocks > 0) {
    // Software pipeline inside the warpgroup (FlashAttention-3's order): Q K^T
    // of block n and P V of block n - 1 are issued together; O is rescaled
    // while Q K^T runs, and the softmax of block n runs while P V of block
    // n - 1 still executes.
    sm90::MbarWaitOrTrap(bar.kfull(stage(0)), parity(0));
    turn_begin();
    issue_qk(0);
    turn_end();
    sm90::WgmmaWait<0>();
    sm90::FenceRegisters(s_flat);
    release(bar.kempty(stage(0)));
    softmax(0);
    pack_p();
    for (int n = 1; n < nblocks; ++n) {
      sm90::MbarWaitOrTrap(bar.kfull(stage(n)), parity(n));
      turn_begin();
      issue_qk(n);
      rescale_o();
      sm90::MbarWaitOrTrap(bar.vfull(stage(n - 1)), parity(n - 1));
      issue_pv(n - 1);
      turn_end();
      sm90::WgmmaWait<1>();  // S of block n is ready; P V of block n - 1 may still run
      sm90::FenceRegisters(s_flat);
      release(bar.kempty(stage(n)));
      softmax(n);
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(o_flat);
      release(bar.vempty(stage(n - 1)));
      pack_p();
    }
    rescale_o();
    sm90::MbarWaitOrTrap(bar.vfull(stage(nblocks - 1)), parity(nblocks - 1));
    issue_pv(nblocks - 1);
    sm90::WgmmaWait<0>();
    sm90::FenceRegisters(o_flat);
    release(bar.vempty(stage(nblocks - 1)));
  }

  float inv[2], lse[2];
  FinishRows(m, l, inv, lse, p.scale);
  const bool piece = !kCausal && work.split < 0;  // of a tail tile
  if (tmap_o && !piece) {
    // (Each release of Q's slot sits in its branch: one before the branch,
    // taken or not, cost the D64 and D128 pipelined kernels their wgmma
    // overlap, ptxas C7512.)
    if (s_o) release(bar.qempty(q_slot));
    // O in this warpgroup's rows of the staging buffer (once the last store
    // from it has read it: its thread waited for that before this barrier)
    // or of Q's slot (every product that read Q has completed), with the
    // 128-byte swizzle TMA reads: 16-byte chunk c of row r at chunk
    // c ^ (r % 8), so that a warp's 32 stores of one n8 tile hit 32 banks;
    // then one thread stores each 64-column panel that holds some of
    // head_dim, and waits until the store has read shared memory.
    const uint32_t o_rows = s_o ? s_o + 64 * cw * 128 : q_rows;
    if (s_o) WarpgroupBarrierSync(cw);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = 16 * w + g + 8 * hh;  // r % 8 == g
#pragma unroll
      for (int j = 0; j < kDT; ++j)
        sm90::StShared32(o_rows + (j / 8) * kBr * 128 + r * 128 + (((j % 8) ^ g) << 4) + 4 * t,
                         PackPair<M>(o[j][2 * hh] * inv[hh], o[j][2 * hh + 1] * inv[hh]));
      if (t == 0 && p.lse && row[hh] < p.seq_q) p.lse[int64_t(bh) * p.seq_q + row[hh]] = lse[hh];
    }
    sm90::FenceProxyAsync();
    WarpgroupBarrierSync(cw);
    if (ltid == 0) {
#pragma unroll
      for (int c = 0; c < Tile::kPanels; ++c)
        if (64 * c < p.head_dim && wg_row0 < p.seq_q)
          sm90::TmaStore3d(tmap_o, o_rows + c * kBr * 128, 64 * c, wg_row0, bh);
      sm90::BulkCommitGroup();
      // Staged in Q's slot, the slot goes back once the store has read it
      // (for the warpgroup's four warps). (A wait or release any later, in
      // the tile loop, after it or before the next tile's key blocks, cost
      // the D64 and D128 pipelined kernels their wgmma overlap: ptxas C7512.)
      sm90::BulkWaitGroupRead<0>();
      if (!s_o) sm90::MbarArriveCount(bar.qempty(q_slot), 4);
    }
    return;
  }
  // Every product that reads Q has completed: the producer may load the next
  // tile's Q (or hand over the next tile) while this one's epilogue runs.
  release(bar.qempty(q_slot));
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (row[hh] >= p.seq_q) continue;
    const int64_t lrow = int64_t(bh) * p.seq_q + row[hh];
    if (p.num_splits > 1 || piece) {
      // Partials kD wide: [split, batch * heads_q * seq_q, kD], LSE alike;
      // a tail piece's [slot, kBr, kD].
      const int64_t zrow = piece ? int64_t(-1 - work.split) * kBr + (row[hh] - m0)
                                 : int64_t(work.split) * p.batch * p.heads_q * p.seq_q + lrow;
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
