// flash_mma: FlashAttention-2 forward on warp-level tensor cores.
//
// One block owns kBr query rows (4 warps x 16 kMT rows, each warp its own rows,
// so the softmax statistics never leave a warp) and streams the key/value
// tiles of its (batch, kv head) through a two-stage cp.async ring. Per key
// tile: S = Q K^T (mma.sync m16n8k16, Q and K fragments by ldmatrix), mask,
// online softmax in registers, O += P V (P re-packed from the S accumulators
// as A fragments, V fragments by ldmatrix.trans). Shared tiles are stored with
// their 16-byte chunks XOR-swizzled by (row % 8), so ldmatrix and cp.async are
// free of bank conflicts without padding.
//
// Rows are packed over the query heads that share one kv head: row r of the
// (batch, kv head) problem is query head kvh * group + r / seq_q, position
// r % seq_q. For prefill that changes nothing; for decode (seq_q of 1..16 with
// grouped heads) it fills the tile with useful rows. When the grid would not
// fill the GPU, the keys are split over gridDim.z and a second kernel merges
// the fp32 partial results by their LSE.
#ifndef GPUCOMPUTE_KERNELS_SRC_ATTENTION_MMA_CUH_
#define GPUCOMPUTE_KERNELS_SRC_ATTENTION_MMA_CUH_

#include "attention_common.cuh"

namespace gpucompute::kernels::attention {

template <int kD_, int kMT_, int kBc_>
struct MmaTile {
  static constexpr int kD = kD_;
  static constexpr int kMT = kMT_;                 // m16 tiles per warp
  static constexpr int kBc = kBc_;                 // key tile (BLOCK_N)
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = kWarps * 16 * kMT;    // query tile (BLOCK_M)
  static constexpr int kStages = 2;                // K/V ring depth
  static constexpr int kChunks = kD / 8;           // 16-byte chunks per row
  static constexpr int kNT = kBc / 8;              // n8 tiles of S per m16 tile
  static constexpr int kDT = kD / 8;               // n8 tiles of O per m16 tile
  // sQ (kBr, kD) + sK, sV (kStages, kBc, kD), 16-bit elements.
  static constexpr size_t kSmemBytes = size_t(kBr + 2 * kStages * kBc) * kD * 2;
  static_assert(kD % 64 == 0, "the prefill tiles are 64, 128 or 256 wide");
  static_assert(kBc % 16 == 0, "key tile must be a multiple of the mma k (16)");
  static_assert((kBr * kChunks) % kThreads == 0 && (kBc * kChunks) % kThreads == 0,
                "tile loads are split evenly over the threads");
};

// Element offset of (row, 16-byte chunk) in a swizzled tile of width kD (a
// multiple of 32). Each group of eight chunks is swizzled by (row % 8); a
// last group of four (kD % 64 == 32) by (row / 2 % 4). Either way the eight
// rows an ldmatrix phase reads at one chunk land in eight different 16-byte
// bank groups: a row is kD / 8 chunks long, 4 (mod 8) when kD % 64 == 32, so
// row r starts at bank group 4 (r % 2) and the swizzle spreads the rest.
template <int kD>
__device__ __forceinline__ int SwzOff(int row, int chunk) {
  static_assert(kD % 32 == 0, "tiles are a multiple of 32 columns wide");
  constexpr int kWhole = kD / 64 * 8;  // chunks in whole groups of eight
  const int sw = (kD % 64 == 0 || chunk < kWhole) ? chunk ^ (row & 7) : chunk ^ ((row >> 1) & 3);
  return row * kD + (sw << 3);
}

// Copies 8 elements (one chunk) of a row into the swizzled shared tile; a null
// `src` zero-fills. 16-bit inputs go through cp.async; fp32 inputs are loaded,
// rounded to M and stored synchronously.
template <typename T, typename M, int kD>
__device__ __forceinline__ void LoadChunk(M* tile, int row, int chunk, const T* src,
                                          const void* any_valid) {
  M* dst = tile + SwzOff<kD>(row, chunk);
  if constexpr (sizeof(T) == 2) {
    CpAsync16(SmemAddr(dst), src ? static_cast<const void*>(src + chunk * 8) : any_valid,
              src ? 16 : 0);
  } else {
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    if (src) {
      a = __ldg(reinterpret_cast<const float4*>(src + chunk * 8));
      b = __ldg(reinterpret_cast<const float4*>(src + chunk * 8 + 4));
    }
    uint4 packed;
    packed.x = PackPair<M>(a.x, a.y);
    packed.y = PackPair<M>(a.z, a.w);
    packed.z = PackPair<M>(b.x, b.y);
    packed.w = PackPair<M>(b.z, b.w);
    *reinterpret_cast<uint4*>(dst) = packed;
  }
}

template <typename T, typename Tile>
__global__ void __launch_bounds__(Tile::kThreads)
    FlashMmaKernel(const AttnParams p) {
  using M = typename MmaType<T>::type;
  constexpr int kD = Tile::kD, kBr = Tile::kBr, kBc = Tile::kBc, kMT = Tile::kMT;
  constexpr int kNT = Tile::kNT, kDT = Tile::kDT, kChunks = Tile::kChunks;
  extern __shared__ uint4 smem_raw[];
  M* sQ = reinterpret_cast<M*>(smem_raw);
  M* sK = sQ + kBr * kD;
  M* sV = sK + Tile::kStages * kBc * kD;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int bkv = blockIdx.y;  // batch * heads_kv + kv head
  const int b = bkv / p.heads_kv, kvh = bkv % p.heads_kv;
  const int rows_total = p.group * p.seq_q;
  const int m_block = p.causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int r0 = m_block * kBr;
  const T* q = static_cast<const T*>(p.q);
  // Rows of D elements in memory; the tiles are kD wide, zero past D. Both
  // products run over the whole tile (fully unrolled, as for kD = D); the
  // output columns past D are never stored.
  const int d = p.head_dim, dchunks = d >> 3;
  const T* k = static_cast<const T*>(p.k) + int64_t(bkv) * p.seq_kv * d;
  const T* v = static_cast<const T*>(p.v) + int64_t(bkv) * p.seq_kv * d;

  // Keys this block must visit: all, or under the causal mask up to the last
  // key its latest query position sees; then this block's split of them.
  int key_end = p.seq_kv;
  if (p.causal) {
    const int r_last = min(r0 + kBr, rows_total) - 1;
    const int i_last = (r_last / p.seq_q == r0 / p.seq_q) ? r_last % p.seq_q : p.seq_q - 1;
    key_end = max(0, min(p.seq_kv, i_last + p.causal_off + 1));
  }
  int key_begin = 0;
  if (p.num_splits > 1) {
    key_begin = blockIdx.z * p.split_len;
    key_end = min(key_end, key_begin + p.split_len);
  }
  const int nblocks = key_end > key_begin ? (key_end - key_begin + kBc - 1) / kBc : 0;

  // Query position i of this thread's rows (mt, h), for the causal mask.
  int row_i[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      row_i[mt][h] = (r0 + warp * 16 * kMT + mt * 16 + g + 8 * h) % p.seq_q;

  // Q tile (stage-0 group together with the first K/V tile).
  for (int c = tid; c < kBr * kChunks; c += Tile::kThreads) {
    const int row = c / kChunks, chunk = c % kChunks, r = r0 + row;
    const T* src = nullptr;
    if (r < rows_total && chunk < dchunks) {
      const int head = kvh * p.group + r / p.seq_q, i = r % p.seq_q;
      src = q + ((int64_t(b) * p.heads_q + head) * p.seq_q + i) * d;
    }
    LoadChunk<T, M, kD>(sQ, row, chunk, src, p.q);
  }
  auto load_kv = [&](int blk, int stage) {
    const int n0 = key_begin + blk * kBc;
    M* dk = sK + stage * kBc * kD;
    M* dv = sV + stage * kBc * kD;
    for (int c = tid; c < kBc * kChunks; c += Tile::kThreads) {
      const int row = c / kChunks, chunk = c % kChunks, key = n0 + row;
      const bool ok = key < p.seq_kv && chunk < dchunks;
      LoadChunk<T, M, kD>(dk, row, chunk, ok ? k + int64_t(key) * d : nullptr, p.k);
      LoadChunk<T, M, kD>(dv, row, chunk, ok ? v + int64_t(key) * d : nullptr, p.v);
    }
  };
  if (nblocks > 0) load_kv(0, 0);
  CpAsyncCommit();

  float o[kMT][kDT][4];
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int j = 0; j < kDT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][j][e] = 0.f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }

  // Lane-constant parts of the ldmatrix addresses.
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_chunk = lane >> 4;      // Q (A)
  const int k_row = (lane & 7) + 8 * (lane >> 4), k_chunk = (lane >> 3) & 1;      // K (B)
  const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1), v_chunk = lane >> 4;      // V (B, trans)
  const int warp_row0 = warp * 16 * kMT;
  // Lowest query position of the block: a key tile wholly at or below it
  // needs no causal mask.
  const int i_first = r0 % p.seq_q;
  const bool single_head_block = (r0 / p.seq_q) == ((min(r0 + kBr, rows_total) - 1) / p.seq_q);

  for (int blk = 0; blk < nblocks; ++blk) {
    const int stage = blk & 1;
    if (blk + 1 < nblocks) load_kv(blk + 1, stage ^ 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const M* tk = sK + stage * kBc * kD;
    const M* tv = sV + stage * kBc * kD;

    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;

#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        LdMatrixX4(SmemAddr(sQ + SwzOff<kD>(warp_row0 + mt * 16 + a_row, 2 * kk + a_chunk)),
                   a[mt]);
#pragma unroll
      for (int nn = 0; nn < kBc / 16; ++nn) {
        uint32_t bf[4];
        LdMatrixX4(SmemAddr(tk + SwzOff<kD>(nn * 16 + k_row, 2 * kk + k_chunk)), bf);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Mma16816<M>(s[mt][2 * nn], a[mt], bf[0], bf[1]);
          Mma16816<M>(s[mt][2 * nn + 1], a[mt], bf[2], bf[3]);
        }
      }
    }

    const int n0 = key_begin + blk * kBc;
    const bool need_mask =
        n0 + kBc > p.seq_kv ||
        (p.causal && !(single_head_block && n0 + kBc - 1 <= i_first + p.causal_off));
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      if (need_mask) MaskBlock<kNT>(s[mt], row_i[mt], n0 + 2 * t, p.seq_kv, p.causal, p.causal_off);
      float alpha[2];
      OnlineSoftmax<kNT>(s[mt], m[mt], l[mt], alpha, p.scale_log2);
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        o[mt][j][0] *= alpha[0];
        o[mt][j][1] *= alpha[0];
        o[mt][j][2] *= alpha[1];
        o[mt][j][3] *= alpha[1];
      }
    }

#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = PackPair<M>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = PackPair<M>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = PackPair<M>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = PackPair<M>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dd = 0; dd < kD / 16; ++dd) {
        uint32_t bf[4];
        LdMatrixX4Trans(SmemAddr(tv + SwzOff<kD>(kk * 16 + v_row, 2 * dd + v_chunk)), bf);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Mma16816<M>(o[mt][2 * dd], a[mt], bf[0], bf[1]);
          Mma16816<M>(o[mt][2 * dd + 1], a[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // the stage just read is refilled next iteration
  }
  CpAsyncWait<0>();

  // Epilogue: normalise and store (or store the fp32 partials of this split).
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    float inv[2], lse[2];
    FinishRows(m[mt], l[mt], inv, lse, p.scale);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + warp * 16 * kMT + mt * 16 + g + 8 * h;
      if (r >= rows_total) continue;
      const int head = kvh * p.group + r / p.seq_q;
      const int64_t lrow = (int64_t(b) * p.heads_q + head) * p.seq_q + r % p.seq_q;
      const int64_t off = lrow * d;
      if (p.num_splits > 1) {
        float* po = p.part_o + (int64_t(blockIdx.z) * p.batch * p.heads_q * p.seq_q + lrow) * kD;
#pragma unroll
        for (int j = 0; j < kDT; ++j)
          if (8 * j < d)
            StorePair<float>(po + 8 * j + 2 * t, o[mt][j][2 * h] * inv[h],
                             o[mt][j][2 * h + 1] * inv[h]);
        if (t == 0)
          p.part_lse[int64_t(blockIdx.z) * p.batch * p.heads_q * p.seq_q + lrow] = lse[h];
      } else {
#pragma unroll
        for (int j = 0; j < kDT; ++j)
          if (8 * j < d)
            StoreOutPair<T>(p, off + 8 * j + 2 * t, o[mt][j][2 * h] * inv[h],
                            o[mt][j][2 * h + 1] * inv[h]);
        if (t == 0 && p.lse) p.lse[lrow] = lse[h];
      }
    }
  }
}

// Decode tile: 16 query rows (one m16 tile) shared by the block's warps;
// each warp takes its own 16 keys of every key tile and keeps its own running
// max, sum and output, merged through shared memory at the end. For a handful
// of query rows (seq_q 1..4 with grouped heads) this wastes 4x less tensor
// work than 64-row tiles, so K and V stream at bandwidth.
//
// A stream wants bytes in flight and warps to cover the latency: each block
// has about one ring stage of K and V on its way while it computes. The tile
// is therefore as narrow as D allows (DecodeHeadDim, a multiple of 32: a
// 128-wide tile for D 96 held three blocks of 24 KB in flight per SM where D
// 128 holds three of 32 KB, and streamed at 3.2 TB/s against 4.1, sweep run
// 32 on an H200; D 136-176 on the 256-wide tile ran one block per SM at half
// the speed of a 160- or 192-wide one, run 35). From 224 columns on, four
// warps on 64-key tiles fit one block per SM (four warps; 1.3-1.8 TB/s on an
// H100 on large caches, 0.50-0.63x cuDNN, run 35); two warps on 32-key tiles
// with one K and one V buffer (kStages 1) fit four (eight warps, bound by
// registers; with a two-stage ring three, run 42). The heuristics choose
// (DecodeWarps; WithDecodeTile in attention.cu the stages). At D <= 32 a
// stage is small (8 KB) and the registers, not shared memory, bound the
// blocks per SM: the ring there has a third stage, two of them on their way.
template <int kD_, int kWarps_ = 4, int kStages_ = (kD_ == 32 ? 3 : 2)>
struct DecodeTile {
  static constexpr int kD = kD_;
  static constexpr int kWarps = kWarps_;
  static_assert(kWarps == 2 || kWarps == 4, "two or four warps");
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = 16;                   // query rows (BLOCK_M)
  static constexpr int kBc = 16 * kWarps;          // keys per tile (BLOCK_N), 16 per warp
  // 1: one K and one V buffer, V's copy issued behind the barrier that frees
  // it and K's next behind the one after Q K^T (FlashAttention-2's order);
  // 2 or 3: a ring of whole K/V tiles, kStages - 1 on their way.
  static constexpr int kStages = kStages_;
  static_assert(kStages >= 1 && kStages <= 3, "one to three stages");
  static constexpr int kChunks = kD / 8;
  static constexpr int kDT = kD / 8;
  // K and V tiles are copied by rows of kLanes threads (the power of two at
  // or above kChunks; those past kChunks idle), kRowsPerPass rows a pass: each
  // thread keeps one chunk column, so that a copy costs an add and a compare
  // instead of a division by kChunks (28 at D 224, where the copies' address
  // arithmetic was two thirds of a two-warp block's instructions).
  static constexpr int kLanes = kChunks <= 4 ? 4 : (kChunks <= 8 ? 8 : (kChunks <= 16 ? 16 : 32));
  static constexpr int kRowsPerPass = kThreads / kLanes;
  // sQ (kBr, kD) + sK, sV (kStages, kBc, kD), 16-bit; the fp32 merge area
  // (kWarps, kBr, kD) reuses all of it after the loop.
  static constexpr size_t kSmemBytes = size_t(kBr + 2 * kStages * kBc) * kD * 2;
  static_assert(kD % 32 == 0 && kD >= 32 && kD <= 256, "32 to 256 columns, a multiple of 32");
  static_assert(size_t(kWarps) * kBr * kD * 4 + 2 * kWarps * kBr * 4 <= kSmemBytes,
                "merge area fits in the tile's shared memory");
  static_assert(kBc % kRowsPerPass == 0, "tile copies split evenly");
};

template <typename T, typename Tile>
__global__ void __launch_bounds__(Tile::kThreads) FlashMmaDecodeKernel(const AttnParams p) {
  using M = typename MmaType<T>::type;
  constexpr int kD = Tile::kD, kBr = Tile::kBr, kBc = Tile::kBc, kDT = Tile::kDT;
  constexpr int kChunks = Tile::kChunks, kStages = Tile::kStages;
  extern __shared__ uint4 smem_raw[];
  M* sQ = reinterpret_cast<M*>(smem_raw);
  M* sK = sQ + kBr * kD;
  M* sV = sK + Tile::kStages * kBc * kD;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int bkv = blockIdx.y;
  const int b = bkv / p.heads_kv, kvh = bkv % p.heads_kv;
  const int rows_total = p.group * p.seq_q;
  const int r0 = blockIdx.x * kBr;
  const T* q = static_cast<const T*>(p.q);
  // Rows of D elements in memory; the tiles are kD wide, zero past D.
  const int d = p.head_dim, dchunks = d >> 3;
  const T* k = static_cast<const T*>(p.k) + int64_t(bkv) * p.seq_kv * d;
  const T* v = static_cast<const T*>(p.v) + int64_t(bkv) * p.seq_kv * d;

  int key_end = p.seq_kv;
  if (p.causal) {
    const int r_last = min(r0 + kBr, rows_total) - 1;
    const int i_last = (r_last / p.seq_q == r0 / p.seq_q) ? r_last % p.seq_q : p.seq_q - 1;
    key_end = max(0, min(p.seq_kv, i_last + p.causal_off + 1));
  }
  int key_begin = 0;
  if (p.num_splits > 1) {
    key_begin = blockIdx.z * p.split_len;
    key_end = min(key_end, key_begin + p.split_len);
  }
  const int nblocks = key_end > key_begin ? (key_end - key_begin + kBc - 1) / kBc : 0;

  const int row_i[2] = {(r0 + g) % p.seq_q, (r0 + g + 8) % p.seq_q};
  for (int c = tid; c < kBr * kChunks; c += Tile::kThreads) {
    const int row = c / kChunks, chunk = c % kChunks, r = r0 + row;
    const T* src = nullptr;
    if (r < rows_total && chunk < dchunks) {
      const int head = kvh * p.group + r / p.seq_q, i = r % p.seq_q;
      src = q + ((int64_t(b) * p.heads_q + head) * p.seq_q + i) * d;
    }
    LoadChunk<T, M, kD>(sQ, row, chunk, src, p.q);
  }
  // K's tile, then V's, each a run of whole rows in memory: copies of K and V
  // interleaved chunk by chunk measured 0.3-1.3% slower at Sq 1 (sweep-
  // attention.md, run 24). The L2::256B prefetch hint on these copies was
  // 4-9% slower (run 24), a third ring stage (two blocks per SM at D128)
  // 3-7% slower (run 25).
  const int my_chunk = tid % Tile::kLanes, my_row = tid / Tile::kLanes;
  const bool chunk_in_d = my_chunk < dchunks;
  // Tile blk of K or V (src; `fill` for LoadChunk's zero fill) into stage
  // `stage` of its ring.
  auto load_rows = [&](const T* src, const void* fill, M* ring, int blk, int stage) {
    const int n0 = key_begin + blk * kBc;
    M* dst = ring + stage * kBc * kD;
    if constexpr (sizeof(T) == 2) {
      if (my_chunk >= kChunks) return;
      const int rows = p.seq_kv - n0;  // keys left from n0
      const T* base = src + int64_t(n0) * d;
#pragma unroll
      for (int i = 0; i < kBc / Tile::kRowsPerPass; ++i) {
        const int row = my_row + i * Tile::kRowsPerPass;
        const bool ok = chunk_in_d && row < rows;
        LoadChunk<T, M, kD>(dst, row, my_chunk, ok ? base + row * d : nullptr, fill);
      }
    } else {
      // fp32 inputs are loaded and rounded by the threads themselves: the
      // unrolled passes above would hold every pass's loads in registers
      // (255 and spills from 224 columns on).
      for (int c = tid; c < kBc * kChunks; c += Tile::kThreads) {
        const int row = c / kChunks, chunk = c % kChunks, key = n0 + row;
        const bool ok = key < p.seq_kv && chunk < dchunks;
        LoadChunk<T, M, kD>(dst, row, chunk, ok ? src + int64_t(key) * d : nullptr, fill);
      }
    }
  };
  auto load_k = [&](int blk, int stage) { load_rows(k, p.k, sK, blk, stage); };
  auto load_v = [&](int blk, int stage) { load_rows(v, p.v, sV, blk, stage); };
  // Q and the first kStages - 1 tiles, one commit group each (Q with the
  // first), so that group blk is tile blk; with one stage, Q and K's first
  // tile (V's tiles are issued in the loop).
  if constexpr (kStages == 1) {
    if (nblocks > 0) load_k(0, 0);
    CpAsyncCommit();
  }
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nblocks) {
      load_k(st, st);
      load_v(st, st);
    }
    CpAsyncCommit();
  }

  float o[kDT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_chunk = lane >> 4;
  const int k_row = (lane & 7) + 8 * (lane >> 4), k_chunk = (lane >> 3) & 1;
  const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1), v_chunk = lane >> 4;
  const int wk = warp * 16;  // this warp's keys within a tile

  for (int blk = 0; blk < nblocks; ++blk) {
    const int stage = blk % kStages;
    if constexpr (kStages == 1) {
      // K's tile blk is here, and every warp is done with V's last tile.
      CpAsyncWait<0>();
      __syncthreads();
      load_v(blk, 0);
      CpAsyncCommit();
    } else {
      // The stage refilled here was last read in iteration blk - 1, behind
      // the barrier that ends it.
      if (blk + kStages - 1 < nblocks) {
        load_k(blk + kStages - 1, (blk + kStages - 1) % kStages);
        load_v(blk + kStages - 1, (blk + kStages - 1) % kStages);
      }
      CpAsyncCommit();
      CpAsyncWait<kStages - 1>();
      __syncthreads();
    }
    const M* tk = sK + stage * kBc * kD;
    const M* tv = sV + stage * kBc * kD;

    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[4], bf[4];
      LdMatrixX4(SmemAddr(sQ + SwzOff<kD>(a_row, 2 * kk + a_chunk)), a);
      LdMatrixX4(SmemAddr(tk + SwzOff<kD>(wk + k_row, 2 * kk + k_chunk)), bf);
      Mma16816<M>(s[0], a, bf[0], bf[1]);
      Mma16816<M>(s[1], a, bf[2], bf[3]);
    }
    if constexpr (kStages == 1) {
      // V's tile blk is here, and every warp is done with K's.
      CpAsyncWait<0>();
      __syncthreads();
      if (blk + 1 < nblocks) load_k(blk + 1, 0);
      CpAsyncCommit();
    }
    const int n0 = key_begin + blk * kBc + wk;
    if (n0 + 16 > p.seq_kv || p.causal)
      MaskBlock<2>(s, row_i, n0 + 2 * t, p.seq_kv, p.causal, p.causal_off);
    float alpha[2];
    OnlineSoftmax<2>(s, m, l, alpha, p.scale_log2);
    // O keeps its scale while no row of the warp raised its maximum (most
    // key tiles of a long cache; OnlineSoftmax's kMaxLagLog2).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
      }
    }
    uint32_t a[4];
    a[0] = PackPair<M>(s[0][0], s[0][1]);
    a[1] = PackPair<M>(s[0][2], s[0][3]);
    a[2] = PackPair<M>(s[1][0], s[1][1]);
    a[3] = PackPair<M>(s[1][2], s[1][3]);
#pragma unroll
    for (int dd = 0; dd < kD / 16; ++dd) {
      uint32_t bf[4];
      LdMatrixX4Trans(SmemAddr(tv + SwzOff<kD>(wk + v_row, 2 * dd + v_chunk)), bf);
      Mma16816<M>(o[2 * dd], a, bf[0], bf[1]);
      Mma16816<M>(o[2 * dd + 1], a, bf[2], bf[3]);
    }
    if constexpr (kStages > 1) __syncthreads();
  }
  CpAsyncWait<0>();
  __syncthreads();

  // Merge the warps' partial rows: sm_o (kWarps, kBr, kD) unnormalised,
  // sm_m / sm_l (kWarps, kBr).
  float* sm_o = reinterpret_cast<float*>(smem_raw);
  float* sm_m = sm_o + Tile::kWarps * kBr * kD;
  float* sm_l = sm_m + Tile::kWarps * kBr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = g + 8 * h;
    if (t == 0) {
      sm_m[warp * kBr + row] = m[h];
      sm_l[warp * kBr + row] = sum;
    }
#pragma unroll
    for (int j = 0; j < kDT; ++j) {
      float* dst = sm_o + (warp * kBr + row) * kD + 8 * j + 2 * t;
      dst[0] = o[j][2 * h];
      dst[1] = o[j][2 * h + 1];
    }
  }
  __syncthreads();
  for (int e = tid; e < kBr * kD; e += Tile::kThreads) {
    const int row = e / kD, col = e % kD, r = r0 + row;
    if (r >= rows_total || col >= d) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) mx = fmaxf(mx, sm_m[w * kBr + row]);
    // A warp whose m is -inf saw no key (its l and O are 0) or only NaN
    // scores (NaN l and O): its weight is 0, and 0 * NaN keeps the NaN.
    const float m_use = mx == -INFINITY ? 0.f : mx;
    float acc = 0.f, sum = 0.f;
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) {
      const float f = exp2f((sm_m[w * kBr + row] - m_use) * p.scale_log2);
      sum += f * sm_l[w * kBr + row];
      acc += f * sm_o[(w * kBr + row) * kD + col];
    }
    const bool empty = sum == 0.f;
    const float val = empty ? 0.f : acc / sum;
    const float lse = empty ? -INFINITY : mx * p.scale + logf(sum);
    const int head = kvh * p.group + r / p.seq_q;
    const int64_t lrow = (int64_t(b) * p.heads_q + head) * p.seq_q + r % p.seq_q;
    if (p.num_splits > 1) {
      const int64_t zrow = int64_t(blockIdx.z) * p.batch * p.heads_q * p.seq_q + lrow;
      p.part_o[zrow * kD + col] = val;
      if (col == 0) p.part_lse[zrow] = lse;
    } else {
      StoreOut<T>(p, lrow * d + col, val);
      if (col == 0 && p.lse) p.lse[lrow] = lse;
    }
  }
}

// Merges n fp32 partials of one row of O (partial z at row first + z *
// stride of part_o / part_lse, kD wide) into output row `row`: lse = log
// sum_z exp(lse_z), O = sum_z exp(lse_z - lse) O_z. Warp w of the block's
// kCombineThreads sums partials w, w + 4, ... over the row's kD columns
// (lane + 32 c), so a row of many partials is read by many loads in flight,
// not one chain (32 rows of 49 splits: 10.7 us as one thread per column
// looping over the splits); the four sums meet in shared memory. Columns
// past D are not stored.
inline constexpr int kCombineThreads = 128;
template <typename T, int kD>
__device__ __forceinline__ void MergePartials(const AttnParams& p, int64_t row, int64_t first,
                                              int64_t stride, int n) {
  constexpr int kWarps = kCombineThreads / 32, kCols = kD / 32;
  static_assert(kD % 32 == 0, "columns are spread over the lanes");
  __shared__ float s_acc[kWarps][kD];
  __shared__ float s_sum[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float* lse_z = p.part_lse + first;  // partial z at lse_z[z * stride]
  float mx = -INFINITY;
  for (int z = lane; z < n; z += 32) mx = fmaxf(mx, lse_z[z * stride]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.f;
  float wsum = 0.f;
  // Empty partials (LSE -inf, O 0) weigh 0; a NaN partial (LSE NaN, which
  // the maximum passes over) makes the row NaN.
  const float m_use = mx == -INFINITY ? 0.f : mx;
#pragma unroll 4
  for (int z = warp; z < n; z += kWarps) {
    const float w = __expf(lse_z[z * stride] - m_use);
    const float* po = p.part_o + (first + z * stride) * kD + lane;
    wsum += w;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] = fmaf(w, po[32 * c], acc[c]);
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) s_acc[warp][lane + 32 * c] = acc[c];
  if (lane == 0) s_sum[warp] = wsum;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += s_sum[w];
  const bool none = total == 0.f;
  for (int col = threadIdx.x; col < p.head_dim; col += kCombineThreads) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += s_acc[w][col];
    StoreOut<T>(p, row * p.head_dim + col, none ? 0.f : v / total);
  }
  if (threadIdx.x == 0 && p.lse) p.lse[row] = none ? -INFINITY : mx + logf(total);
}

// The same merge for rows of at most kWarpMergeMax partials, one warp per
// row: lane z reads partial z's LSE, the weights meet by shuffles, and every
// lane sums its kD / 32 columns over the partials, whose loads do not wait on
// each other. A block per row (above) spent three dependent round trips to
// memory and a block barrier on each row: 6.5k rows of 2 key splits (B1 H2
// Sq3248 Skv512) cost more than the splits saved.
inline constexpr int kWarpMergeMax = 8;
template <typename T, int kD>
__device__ __forceinline__ void MergePartialsWarp(const AttnParams& p, int64_t row, int64_t first,
                                                  int64_t stride, int n) {
  constexpr int kCols = kD / 32;
  static_assert(kD % 32 == 0, "columns are spread over the lanes");
  const int lane = threadIdx.x & 31;
  const float lz = lane < n ? p.part_lse[first + lane * stride] : -INFINITY;
  float mx = lz;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  // Lane z's weight for partial z; empty partials (LSE -inf) weigh 0, a NaN
  // partial (LSE NaN, passed over by the maximum) weighs NaN.
  const float w = lz == -INFINITY ? 0.f : __expf(lz - (mx == -INFINITY ? 0.f : mx));
  float total = w;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.f;
#pragma unroll
  for (int z = 0; z < kWarpMergeMax; ++z) {
    const float wz = __shfl_sync(0xffffffffu, w, z);
    if (z < n && wz != 0.f) {
      const float* po = p.part_o + (first + z * stride) * kD + lane;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] = fmaf(wz, po[32 * c], acc[c]);
    }
  }
  const bool none = total == 0.f;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int col = lane + 32 * c;
    if (col < p.head_dim) StoreOut<T>(p, row * p.head_dim + col, none ? 0.f : acc[c] / total);
  }
  if (lane == 0 && p.lse) p.lse[row] = none ? -INFINITY : mx + logf(total);
}

// Merges the key splits of every row, one block per row.
template <typename T, int kD>
__global__ void __launch_bounds__(kCombineThreads) CombineSplitsKernel(const AttnParams p) {
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seq_q;
  const int64_t row = blockIdx.x;
  MergePartials<T, kD>(p, row, row, rows, p.num_splits);
}

// The same for at most kWarpMergeMax key splits, one warp per row.
template <typename T, int kD>
__global__ void __launch_bounds__(kCombineThreads) CombineSplitsWarpKernel(const AttnParams p) {
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seq_q;
  const int64_t row = int64_t(blockIdx.x) * (kCombineThreads / 32) + threadIdx.x / 32;
  if (row < rows) MergePartialsWarp<T, kD>(p, row, row, rows, p.num_splits);
}

// Merges the pieces of flash_wgmma's tail tiles (TailSplit), one block (or
// warp) per row of each: row x is row x % br of tail tile x / br (br: the
// kernel's query tile), its pieces at slots (x / br) * t.pieces + z.
// kWarp: one warp per row (the tail's tiles have at most kWarpMergeMax
// pieces), row x = blockIdx.x * 4 + warp, `rows` of them.
template <typename T, int kD, bool kWarp>
__global__ void __launch_bounds__(kCombineThreads)
    CombineTailKernel(const AttnParams p, const TailSplit t, int br, int rows) {
  const int x =
      kWarp ? int(blockIdx.x) * (kCombineThreads / 32) + int(threadIdx.x) / 32 : int(blockIdx.x);
  if (x >= rows) return;
  const int tt = x / br, rr = x % br;
  const int m_blocks = (p.seq_q + br - 1) / br, tile = t.first + tt;
  const int i = tile % m_blocks * br + rr;
  if (i >= p.seq_q) return;
  const int64_t row = int64_t(tile / m_blocks) * p.seq_q + i;
  const int64_t first = int64_t(tt) * t.pieces * br + rr;
  if constexpr (kWarp) {
    MergePartialsWarp<T, kD>(p, row, first, br, t.Pieces(tt));
  } else {
    MergePartials<T, kD>(p, row, first, br, t.Pieces(tt));
  }
}

}  // namespace gpucompute::kernels::attention

#endif  // GPUCOMPUTE_KERNELS_SRC_ATTENTION_MMA_CUH_
