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
//     the tensor cores; its decode tile is as wide as D rounded up to 32
//     (DecodeTile; runs 35-37);
//   - flash_wgmma's head dims run the tile of the next of 64, 128, 192 or
//     256 wide, zero-filled past D: D96 costs 0.97-0.99x the time of D128.
#ifndef GPUCOMPUTE_KERNELS_SRC_HEURISTICS_ATTENTION_HEURISTICS_H_
#define GPUCOMPUTE_KERNELS_SRC_HEURISTICS_ATTENTION_HEURISTICS_H_

#include <algorithm>
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

// flash_mma packs the query heads of a kv head into its tile rows (16-row
// decode tile, 64- and 128-row tiles) and reads K and V once for all of
// them; flash_wgmma_overlap's 128-row tiles hold one query head each, so
// they are mostly empty and read K and V once per query head, but its
// tensor cores run 2-4x faster. flash_mma runs while seq_q <= 16, or <= 24
// with 8 or more query heads per kv head. Each version forced by name on the
// same shapes (sweep runs 32 on an H200 and 33 on an H100, us, flash_mma
// against flash_wgmma_overlap; g: query heads per kv head):
//   g1 Sq1 (two caches): 276 / 267 and 982 / 1018; g1 Sq32: 179 / 136;
//   g1 Sq62 D96: 122 / 60; g1 Sq64: 180 / 135; g2 Sq18: 12.2 / 12.0;
//   g4 Sq24: 114 / 109; g4 Sq32 (three shapes): 1.3-1.7x slower on flash_mma;
//   g8 Sq8: 60 / 198; g8 Sq16: 102 / 200; g8 Sq26: 94 / 81 (run 33);
//   g8 Sq32 D16: 35 / 45.
// Before run 32 the bound was 64 packed rows (g x seq_q): g1 Sq32-64 ran
// flash_mma at 0.51-1.17x the vendor, g8 Sq16 flash_wgmma_overlap at 1.77x
// where flash_mma reaches 3.27x.
inline constexpr int64_t kAttentionMmaMaxSeqQ = 16;
inline constexpr int64_t kAttentionMmaMaxSeqQGrouped = 24;  // 8 or more heads per kv head

// The version the default runs, by name.
inline const char* ChooseAttentionVariant(const AttentionShape& s) {
  const int64_t group = s.heads_kv > 0 ? s.heads_q / s.heads_kv : 1;
  const int64_t mma_max = group >= 8 ? kAttentionMmaMaxSeqQGrouped : kAttentionMmaMaxSeqQ;
  if (s.wgmma_ok && (s.seq_q > mma_max || !s.mma_ok)) return "flash_wgmma_overlap";
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
// At most kWgmmaShortKeys keys without the mask (cross attention on short
// contexts), a 64-key tile at a padded head dim of 64 or 128 with two
// consumers: the 128-key tile's products are at least half padding there,
// and the narrower ring leaves room for four Q slots (WgmmaTile::kQSlots).
// Sweep run 48 (H100, 98 random cross-attention rows, against the 128-key
// tile with two Q slots): its 17 rows of at most 64 keys at these widths
// 0.85x the time at 64, 0.88x at 128 (B32 H16/2 Sq1024 Skv39 D64 85.8 ->
// 68.1 us, 0.87 -> 1.09x cuDNN; B64 H12/3 Sq4096 Skv64 D128 638 -> 590 us);
// the set 0.976x. Three consumers (64 wide from 2048 query rows) keep 128.
inline constexpr int64_t kWgmmaWideKeysFrom = 2048;
inline constexpr int64_t kWgmmaShortKeys = 64;
inline int WgmmaKeyTile(const AttentionShape& s) {
  if (!s.causal && s.seq_kv <= kWgmmaShortKeys &&
      (s.wgmma_head_dim == 64 || s.wgmma_head_dim == 128) && WgmmaConsumers(s) == 2)
    return 64;
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

// Key splits of flash_mma's decode tile when its blocks (one per kv head)
// are fewer than the SMs: one wave of equal splits over every resident block
// slot (17 splits in 2.75 waves lost ~8% to the tail), each at least this
// many 64-key blocks long. At 4, B1 H32/8 Sq1 Skv1024 D128 ran 4 splits of
// 256 keys, 32 blocks on 132 SMs: 12.4 us against cuDNN's 9.8 (sweep run 29,
// H100). At 1 (sweep runs 30-31, H200, against 4 in the same runs): 12.2 ->
// 8.0 us there (0.77 -> 1.17x the vendor), 13.0 -> 12.2 us at 4096 keys,
// 10.8 -> 10.1 us at B4 Skv2048 D64, 9.5 -> 5.1 us at B1 H1 Skv1057 D64.
inline constexpr int64_t kDecodeMinSplitBlocks = 1;

// A longer floor, kDecodeLongSplitBlocks key blocks a split, where the grid
// keeps a block for every SM with it: a split's fixed costs (Q, the warps'
// merge, the partial and its row of the split merge) weigh against a body of
// one to three key blocks, and with the SMs all busy the stream loses nothing
// by fewer, longer splits. Sweep run 39 (H100, the floor of 4 everywhere
// against 1, two decode sets and the list): of the 40 rows whose plan it
// changes, the 13 whose grid stays at or past the SMs took 0.84-1.06x the
// time (B5 H4/1 Sq4 Skv8192 D64 causal 0.84x, B2 H64/8 Sq1 Skv8192 D64
// 0.85x), the 27 whose grid falls under them 0.95-1.58x (B12 H32/4 Sq1 Skv512
// D128, 384 blocks of one key block: 1.14x as 96 blocks of four). This rule
// against the floor of one, same build (run 45, H100): 0.992x and 0.994x the
// time over two random decode sets, every row that moved by more than 3%
// faster (B5 H4/1 Sq4 Skv8192 D64 causal 0.75x, B2 H64/8 Sq1 Skv8192 D64
// 0.83x: 0.87 -> 1.05x cuDNN).
inline constexpr int64_t kDecodeLongSplitBlocks = 4;
inline int64_t DecodeMinSplitBlocks(int64_t blocks, int64_t want, int64_t key_blocks, int sms) {
  const int64_t long_splits = std::min(want, key_blocks / kDecodeLongSplitBlocks);
  return blocks * long_splits >= sms ? kDecodeLongSplitBlocks : kDecodeMinSplitBlocks;
}

// Warps of flash_mma's decode block (16 keys each per key tile) at a tile
// width of 224 or 256, where four warps leave room for one block per SM and
// two warps for three (four since run 42, below): two where the grid's
// blocks (kv heads x row blocks) reach the SMs or the cache is long (blocks x
// keys >= kDecodeTwoWarpKeys), else four. Sweep run 36 (H100, two random
// decode sets and the list, two warps at every width past 192 against
// four): 0.54-0.81x the time where
// the blocks reach the SMs (B21 H16 Sq4 Skv1024 D200, 336 blocks: 182 -> 132
// us) or the blocks x keys reach 425k (B9 H8 Sq1 Skv8192 D216: 398 -> 211
// us; B8 H12/6 Skv26613 D216, 16 blocks: 648 -> 432), but 1.04-1.6x where
// they stay under 344k (B4 H8/1 Skv16384 D256, 4 blocks: 36.6 -> 51.6 us;
// B4 H16/2 Sq2 Skv1024 D240: 20.4 -> 32.6; B25 H1 Sq6 Skv13772 D256, 25
// blocks: +4%): split finer to fill three slots per SM, the short splits'
// fixed costs and partials outweigh the extra warps. With this rule (run
// 37, the same sets): the 12 rows it gives two warps 0.78x the time of the
// 256-wide four-warp tile (geometric mean), the list's D256 row as before.
// Since run 42 the two-warp tile keeps one K and one V buffer and fits four
// blocks per SM (0.89-0.98x the time on the rows this rule gives it); the
// bound is as run 37 set it.
inline constexpr int64_t kDecodeTwoWarpKeys = 400000;
inline int DecodeWarps(int tile_d, int64_t blocks, int64_t seq_kv, int sms) {
  if (tile_d < 224) return 4;
  return blocks >= sms || blocks * seq_kv >= kDecodeTwoWarpKeys ? 2 : 4;
}

// How the partials of key splits and tail pieces are merged: a warp per row
// (up to 8 partials a row, the kernel's bound) where there are at least
// kWarpMergeRowsPerSm rows per SM, else a block of four warps per row, each
// warp a share of the partials. Sweep run 35 (H100, against the block per
// row for every row count): 6.5k rows of 2 splits (B1 H2 Sq3248 Skv512 D80)
// 16.4 -> 12.6 us, 4096 rows of 2 (B1 H8 S512 D128 causal) 13.2 -> 10.8, of
// 4 (B1 H32/8 Sq128 Skv4096) 24.9 -> 22.1; but 16 rows of 8 splits (B4 H4
// Sq1 Skv1596 D256, run 37) 18.3 -> 20.2 us: few rows want the block's four
// warps on each.
inline constexpr int64_t kWarpMergeRowsPerSm = 4;
inline bool MergeByWarps(int64_t rows, int sms) { return rows >= kWarpMergeRowsPerSm * sms; }

// Key splits of flash_wgmma (flash-decoding): when its work tiles (query
// blocks x heads) leave SMs idle, the keys of each are split; the partial
// results are merged by their LSE. 1: no split.
//   - Up to half the SMs: about one wave of splits (sms / tiles), each at
//     least two key blocks long, at most 64.
//   - Between half and all of them one wave is one split a tile, and up to
//     half the SMs idle: the count (2 to 64) whose busiest SM costs least,
//     rounds x (key blocks a split + kWgmmaSplitCostBlocks, a split's fixed
//     cost: its Q, its fp32 partial and its share of the merge), fewest
//     splits among equals. Sweep run 47 (H100, against one split): B5 H16/8
//     Sq17 Skv32768 D64 causal, 80 tiles of 256 key blocks, 8 splits: 299 ->
//     200 us (0.63 -> 0.94x FA2); B1 H4/1 S4096 D32 causal lse, 88 tiles, 3
//     splits: 52.8 -> 42.0 us (0.81 -> 1.02x cuDNN); B1 H8/1 Sq1348 Skv6287
//     D128 causal 0.84x and B32 H3 Sq39 Skv32768 D64 causal 0.90x the time.
//     Without the fixed cost B13 H8/1 Sq97 Skv1112 D232 causal (104 tiles of
//     14 key blocks, one Q slot) took 5 splits of 3 blocks: 31.8 -> 78.6 us;
//     with it, one. Below half the SMs the same count moved B3 H16 Sq67
//     Skv8192 D64 causal from 2 splits to 5 (44.5 -> 45.6 us): not taken.
inline constexpr int64_t kWgmmaSplitCostBlocks = 2;
inline int64_t WgmmaKeySplits(int64_t tiles, int64_t key_blocks, int sms) {
  if (tiles >= sms || key_blocks < 4) return 1;
  const int64_t most = std::min<int64_t>(64, key_blocks / 2);
  if (2 * tiles <= sms) return std::max<int64_t>(1, std::min<int64_t>(sms / tiles, most));
  auto busiest = [&](int64_t s) {
    return (tiles * s + sms - 1) / sms * ((key_blocks + s - 1) / s + kWgmmaSplitCostBlocks);
  };
  int64_t best = 1;
  for (int64_t s = 2; s <= most; ++s)
    if (busiest(s) < busiest(best)) best = s;
  return best;
}

// The tail of flash_wgmma's persistent grid without the mask: `tiles` work
// tiles of `key_blocks` key blocks each on one block per SM run in
// ceil(tiles / sms) rounds, the last one r = tiles % sms tiles wide: 2048
// tiles on 132 SMs run 16 rounds for 15.5 rounds of work, 704 run 6 for 5.3.
// The key blocks of the last round's tiles are dealt out evenly over every
// SM instead (stream-K over the tail: a block's run of them may cross tiles,
// each piece writes an fp32 partial, merged by LSE after), so the last round
// costs ceil(r * key_blocks / sms) blocks. That costs the merge and the
// partial rows: ~19 us per 8.6k rows of tail tiles (2.2 ns a row) against
// 1.3-2.3 us a key block (sweep runs 30-31, H200, every shape whose tail was
// split, time against the whole tail: 0.974x at S512 D64 with 4 tiles left,
// 0.976x at S16384 D128 with 68 left, but 1.067x at B16 H16 S1024 D128 where
// 68 tiles saved 3 blocks of 8, 1.15x at B3 H16 S344 D64). So it is taken
// where the blocks saved outweigh the tail's rows (`tile_rows` a tile) at
// 450 rows a block, two blocks at least. Returns the key blocks each SM
// takes in the tail, 0 for none. Under the mask the tiles come from a
// counter, longest first, so the last round already holds the shortest ones.
inline int64_t WgmmaTailBlocks(int64_t tiles, int64_t key_blocks, int64_t tile_rows, int sms,
                               bool causal) {
  if (causal || sms <= 0 || tiles <= sms) return 0;
  const int64_t r = tiles % sms;
  if (r == 0) return 0;
  const int64_t per = (r * key_blocks + sms - 1) / sms;
  const int64_t saved = key_blocks - per;
  return saved >= 2 && saved * 450 > r * tile_rows ? per : 0;
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_ATTENTION_HEURISTICS_H_
