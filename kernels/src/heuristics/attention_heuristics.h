// Attention: which version the default (an empty variant) runs, and the
// wgmma kernel's tile. Host-only; src/attention.cu asks it and launches what
// it names. Key splitting of flash_mma (decode, short query blocks) is
// planned in src/attention.cu (PlanMma), from the occupancy it queries.
//
// Derived from the server-path sweep (tests/sweep/attention_sweep.cc; table
// and command in kernels/bench/results/sweep-attention.md), which times every
// version on every shape of its list (106 cases, 9 classes), against PyTorch
// SDPA's cuDNN and FlashAttention-2 backends in the same run, and from the
// ladder benchmark (kernels/bench/results/attention.md). Final run, each
// version forced, x the faster vendor:
//   - flash_wgmma (TMA, wgmma, producer + consumer warpgroups, split-KV) is
//     the fastest from 128 query rows: squares 0.70-0.96x, head dims
//     0.62-0.92x, causal chunked prefill with Sq 128-2048 1.52-1.70x, where
//     flash_mma reaches 0.51-0.70x; flash_wgmma_pingpong is 0.92-1.02x its
//     speed;
//   - flash_mma packs the query heads of one kv head into its tile rows and
//     splits the keys over blocks: decode 0.92-0.97x at Sq 1 (the HBM floor)
//     and 2.4-5.1x at Sq 4-16 with grouped heads, where flash_wgmma reaches
//     0.18-0.91x and 1.03-1.42x; the only version for fp32 inputs on the
//     tensor cores;
//   - head dims run the tile of the next of 64, 128, 192 (flash_wgmma) or 256
//     wide, zero-filled past D: D96 costs 0.97-1.00x the time of D128.
#ifndef GPUCOMPUTE_KERNELS_SRC_HEURISTICS_ATTENTION_HEURISTICS_H_
#define GPUCOMPUTE_KERNELS_SRC_HEURISTICS_ATTENTION_HEURISTICS_H_

#include <cstdint>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// What the choice depends on.
struct AttentionShape {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_kv = 0, head_dim = 0;
  bool causal = false;
  DType dtype = DType::kBF16;
  bool wgmma_ok = false;  // flash_wgmma takes these arguments
  bool mma_ok = false;    // flash_mma takes them
};

// Query rows (seq_q) from which flash_wgmma's 128-row tiles beat flash_mma's
// packed rows and key splits.
inline constexpr int64_t kAttentionWgmmaMinRows = 128;

// The version the default runs, by name.
inline const char* ChooseAttentionVariant(const AttentionShape& s) {
  if (s.wgmma_ok && s.seq_q >= kAttentionWgmmaMinRows) return "flash_wgmma";
  if (s.mma_ok) return "flash_mma";
  return "reference";
}

// Consumer warpgroups of flash_wgmma (64 query rows each) at a padded head
// dim of 64: three for long query blocks, where the softmax weighs most
// against the GEMMs (measured +5..10% at 4k and 16k), two below 2048 (a
// partial 192-row tile and worse causal balance: -11% at 1k causal). Head
// dims past 64 keep two (registers).
inline int WgmmaConsumers(const AttentionShape& s) {
  return s.head_dim <= 64 && s.seq_q >= 2048 ? 3 : 2;
}

// Whether flash_wgmma runs a persistent grid (one block per SM walking the
// work tiles, the next tile's loads under the current one's work) rather
// than one block per tile. Measured against one block per tile (sweep runs
// 1, 4-7, 16k tokens): 0.60-0.78x the time at 128 keys, 0.78-1.01x at
// 512-1024, 0.93-1.01x at 2048; from 4096 keys up 1.00-1.02x without the
// mask but 1.02-1.12x with it (a static round robin balances causal tiles
// worse than the hardware's block scheduler), so causal shapes past 2048
// keys take one block per tile.
inline bool WgmmaPersistent(const AttentionShape& s) { return !s.causal || s.seq_kv <= 2048; }

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
