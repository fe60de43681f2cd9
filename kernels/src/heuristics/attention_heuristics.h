// Attention: which version the default (an empty variant) runs, and the
// wgmma kernel's tile. Host-only; src/attention.cu asks it and launches what
// it names. Key splitting of flash_mma (decode, short query blocks) is
// planned in src/attention.cu (PlanMma), from the occupancy it queries.
//
// Derived from the server-path sweep (tests/sweep/attention_sweep.cc; table
// and command in kernels/bench/results/sweep-attention.md), which times every
// version on every shape of its list (137 cases in 13 classes since run 29,
// where the list grew by shapes outside it), against PyTorch
// SDPA's cuDNN and FlashAttention-2 backends in the same run, and from the
// ladder benchmark (kernels/bench/results/attention.md). Final run (12),
// each version forced, x the faster vendor:
//   - flash_wgmma_overlap (TMA, wgmma, producer + consumer warpgroups, both
//     of FlashAttention-3's overlaps, split-KV) is the fastest past 64 packed
//     query rows (below; its 128-row tile partly empty under 128): squares
//     0.81-1.11x, head dims 0.95-1.05x, GQA 0.95-1.02x, causal chunked
//     prefill 1.08-2.00x; 0.99-1.17x the speed of flash_wgmma (in
//     order), where flash_mma reaches 0.21-0.70x;
//   - flash_mma packs the query heads of one kv head into its tile rows and
//     splits the keys over blocks: decode 0.93-0.97x at Sq 1 (K and V
//     stream at 4.4 TB/s, cuDNN's at 4.6; sweep runs 20-27) and 2.4-5.1x
//     at Sq 4-16 with grouped heads, where flash_wgmma_overlap
//     reaches 0.22-0.91x and 1.24-1.75x; the only version for fp32 inputs on
//     the tensor cores;
//   - head dims run the tile of the next of 64, 128, 192 or 256 wide,
//     zero-filled past D: D96 costs 0.97-0.99x the time of D128.
#ifndef GPUCOMPUTE_KERNELS_SRC_HEURISTICS_ATTENTION_HEURISTICS_H_
#define GPUCOMPUTE_KERNELS_SRC_HEURISTICS_ATTENTION_HEURISTICS_H_

#include <cstdint>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// What the choice depends on.
struct AttentionShape {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_kv = 0, head_dim = 0;
  int wgmma_head_dim = 0;  // flash_wgmma's tile width for head_dim: 64, 128, 192 or 256
  bool causal = false;
  DType dtype = DType::kBF16;
  bool wgmma_ok = false;  // flash_wgmma takes these arguments
  bool mma_ok = false;    // flash_mma takes them
};

// Packed query rows (query heads per kv head x seq_q) up to which flash_mma
// runs: its 16-row decode tile and 64-row tile read K and V once for every
// query head of a kv head. Past them flash_wgmma_overlap's 128-row tiles win
// even when seq_q fills a fraction of a tile (sweep run 29, H100, each
// version forced, x the faster vendor; packed rows in brackets):
// Sq 1-16 with 4 or 8 query heads per kv head [4-64]: flash_mma faster on
// 19 of 20 rows, 0.78-3.82x against 0.30-1.86x (the one other: a 1024-key
// cache at batch 1, 0.78x against 1.00x, too few key splits); Sq 64 without
// grouping [64]: 1.17x against 1.21x; Sq 24 [96]: 1.64x against 1.79x; Sq 32
// [128]: 0.92x against 1.49x; Sq 64 [256]: 0.59x against 1.16x; Sq 96 [96]:
// 0.87x against 1.57x.
inline constexpr int64_t kAttentionMmaMaxPackedRows = 64;

// The version the default runs, by name.
inline const char* ChooseAttentionVariant(const AttentionShape& s) {
  const int64_t packed = s.heads_kv > 0 ? s.heads_q / s.heads_kv * s.seq_q : s.seq_q;
  if (s.wgmma_ok && (packed > kAttentionMmaMaxPackedRows || !s.mma_ok))
    return "flash_wgmma_overlap";
  if (s.mma_ok) return "flash_mma";
  return "reference";
}

// Consumer warpgroups of flash_wgmma (64 query rows each) at a padded head
// dim of 64: three for long query blocks, where the softmax weighs most
// against the GEMMs (measured +5..10% at 4k and 16k in order; pipelined, the
// three took D64 S2048-16384 from 0.94-0.95x to 1.04-1.11x the vendor), two
// below 2048 (a partial 192-row tile and worse causal balance: -11% at 1k
// causal). Head dims past 64 keep two (registers).
inline int WgmmaConsumers(const AttentionShape& s) {
  return s.wgmma_head_dim == 64 && s.seq_q >= 2048 ? 3 : 2;
}

// flash_wgmma runs a persistent grid (one block per SM walking the work
// tiles, the next tile's loads under the current one's work) wherever there
// are more tiles than SMs: against one block per tile it measured 0.60-0.78x
// the time at 128 keys, 0.78-1.01x at 512-1024, 0.93-1.01x at 2048 and
// 1.00-1.02x from 4096 keys up without the mask (sweep runs 1, 4-7). Under
// the causal mask the tiles' work differs: a fixed stride over tiles numbered
// by weight balanced them worse than the hardware's block scheduler past 2048
// keys (1.02-1.12x the time) and spreads each head's tiles over the whole
// run, so K and V are read from HBM once per query block when the heads'
// K and V outgrow L2. Causal grids therefore take their tiles from a counter
// in the order heads-major, longest first (WgmmaTileCounter).
inline bool WgmmaTileCounter(const AttentionShape& s) { return s.causal; }

// flash_wgmma's key tile where it is not the head dim's default (0): 176 keys
// at a padded head dim of 128 without the mask from 2048 keys up
// (FlashAttention-3's tile for it: fewer barriers and softmax steps per key,
// but one Q slot). Against 128-key tiles (sweep runs 10 and 11, overlap
// schedule): 1.00-1.06x the vendor instead of 0.96-1.00x from 4096 keys,
// 1.01x the speed at 2048, a tie at 1024 and 0.92-0.94x at 128-512 keys
// (a 176-key block padded past 128 keys, no second Q slot).
inline constexpr int64_t kWgmmaWideKeysFrom = 2048;
inline int WgmmaKeyTile(const AttentionShape& s) {
  return s.wgmma_head_dim == 128 && !s.causal && s.seq_kv >= kWgmmaWideKeysFrom ? 176 : 0;
}

// Key splits of flash_mma's decode tile when its blocks (one per kv head and
// 16 packed rows) already fill the GPU but not in whole waves: the split
// count from 1 to 8 whose blocks fill their last wave best (fewest splits
// among equals), so that the tail wave is not left mostly idle (B64 H32/8
// Sq1 Skv4096: 512 blocks on 396 slots, 1.3 waves, ran at 0.76x cuDNN).
inline int64_t DecodeWaveSplits(int64_t blocks, int64_t slots, int64_t key_blocks) {
  int64_t best = 1;
  double best_fill = 0;
  for (int64_t s = 1; s <= 8 && s <= key_blocks / 4; ++s) {
    const double waves = double(blocks * s) / double(slots);
    const double fill = waves / double((blocks * s + slots - 1) / slots);
    if (fill > best_fill + 1e-9) {
      best_fill = fill;
      best = s;
    }
  }
  return best;
}

// Key splits of flash_wgmma (flash-decoding): when its work tiles (query
// blocks x heads) leave SMs idle, the keys of each are split so that about
// one wave of tiles runs, each split at least two key blocks long; the
// partial results are merged by their LSE. 1: no split.
inline int64_t WgmmaKeySplits(int64_t tiles, int64_t key_blocks, int sms) {
  if (tiles >= sms || key_blocks < 4) return 1;
  int64_t splits = sms / tiles;
  if (splits > key_blocks / 2) splits = key_blocks / 2;
  if (splits > 64) splits = 64;
  return splits < 1 ? 1 : splits;
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_ATTENTION_HEURISTICS_H_
