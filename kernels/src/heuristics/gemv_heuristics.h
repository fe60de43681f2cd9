// GEMV: which version the default (an empty variant) runs. Host-only; the
// kernels file asks it and launches what it names.
//
// Derived from the server-path sweep (tests/sweep/memops_sweep.cc; table and
// command in kernels/bench/results/sweep-memops.md), which times every
// version on every shape of its list. What it showed, by class:
//   - A^T x, fp16/bf16: "trans_mma" (tensor cores, A streamed by cp.async
//     through a ring per warp where rows are 16-byte aligned, register
//     loads otherwise; k split over a cluster): 0.97-1.9x cuBLAS from 2
//     columns (odd lda 3001 x 2000: 1.2x). The vendor keeps one column (its
//     gemv reads A faster than a D2D copy: ours 0.83-1.09x) and 5..8 columns
//     over short k on many tiles (50000 x 1024: 0.83-0.86x).
//   - A^T x, fp32: "trans_split" from 2 columns (1.1-2.8x cuBLAS's GemmEx),
//     but the vendor for one column and for 5..8 columns of fewer than 4096
//     columns of op(A) (0.88-0.93x; one column: 0.66-1.12x).
//   - fp16/bf16 A x with 5..8 columns: "mma_ring" (tensor cores, A streamed
//     through a cp.async ring per warp, persistent tiles) on A of up to
//     64 MiB or with rows of up to 2048 elements: 1.0-2.4x cuBLAS (mma
//     0.6-0.7x, batched 0.4-0.6x at 8 columns); on larger A with longer
//     rows ours reach 0.90-0.98x and the default is the vendor fallback
//     "cublas", named as such. The vendor also takes fp32 with one column
//     and few rows (m under a quarter of the target warps), and fp16/bf16
//     with one column, 2000 rows or more of 16k elements or more.
//   - One column with a quarter of the machine's warps in rows of 1k..16k
//     elements (fp32: 1k and longer): a warp per row ("vec16").
//   - Otherwise a warp per group of 2 or 4 rows ("batched"), with 2, 4 or 8
//     warps sharing each row group along k ("batched_w2/_w4/_w8") until the
//     machine is full (short, wide A); one launch, no workspace. fp32 with one
//     column takes element loads there ("scalar_w*": fewer x loads per
//     element of A, faster on every such shape of the sweep).
//   - Where the fallback cannot run (an output dtype cuBLAS does not write
//     from the input's, sizes past 32 bits): A^T x "trans_mma" (16-bit) or
//     "trans_split" (fp32); fp16/bf16 A x with 5..8 columns "mma_ring"
//     whatever the size of A.
//   - fp32 with 5..8 columns: "scalar" (element loads; the 16-byte kernel
//     holds too many accumulators and x vectors to keep loads in flight).
//   - Pointers or a row stride that forbid 16-byte vectors: "scalar"
//     (element loads, every column at once), split like batched; but
//     "cublas" for fp16 with 4 columns or more on long rows.
#ifndef GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMV_HEURISTICS_H_
#define GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMV_HEURISTICS_H_

#include <cstdint>
#include <string_view>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// What the choice depends on.
struct GemvShape {
  int64_t m = 0, k = 0;  // op(A) is [m, k]
  int ncols = 1;
  DType dtype = DType::kF32;
  bool trans_a = false;
  bool vector_friendly = true;  // A and x 16-byte aligned, lda a multiple of 16 bytes
  bool vendor_ok = true;        // the cuBLAS fallback takes these arguments
};

// Warps the row-group versions aim to keep busy per SM.
inline constexpr int64_t kGemvTargetWarpsPerSm = 48;
// A warp of a split row group should still read at least this many 16-byte
// vectors per lane along k.
inline constexpr int64_t kGemvMinVectorsPerLane = 2;
// fp16/bf16 with at least this many columns run on the tensor cores (or
// the vendor's GEMM).
inline constexpr int kGemvMmaMinColumns = 5;
// fp16/bf16 with one column, at least kGemvVendorMinRows16 rows of at least
// kGemvVendorMinK16 elements: cuBLAS streams A faster than a D2D copy there
// (a read-only stream), 5-10% ahead of our kernels, which stay at the copy.
inline constexpr int64_t kGemvVendorMinRows16 = 2000;
inline constexpr int64_t kGemvVendorMinK16 = 16384;

// One warp per row ("vec16") for one column when there are at least this
// share of the target's warps in rows, of at least kGemvVec16MinK elements
// (and at most kGemvVec16MaxK16 for 16-bit types, whose long rows stream
// better through split row groups).
inline constexpr double kGemvVec16MinFill = 0.25;
inline constexpr int64_t kGemvVec16MinK = 1024;
inline constexpr int64_t kGemvVec16MaxK16 = 16384;

// Warps sharing one row group (1, 2, 4 or 8) when a warp owns
// `rows_per_warp` rows and reads `vector_elems` elements of a row at a time
// per lane, for A x with `sm_count` SMs.
inline int GemvSplitFor(const GemvShape& s, int64_t rows_per_warp, int sm_count,
                        int64_t vector_elems) {
  const int64_t groups = (s.m + rows_per_warp - 1) / rows_per_warp;
  const int64_t vectors = s.k / vector_elems;
  const int64_t target = int64_t(sm_count) * kGemvTargetWarpsPerSm;
  int split = 1;
  while (split < 8 && groups * split < target &&
         vectors >= int64_t(2 * split) * 32 * kGemvMinVectorsPerLane)
    split *= 2;
  return split;
}

// fp16/bf16 A x with 5..8 columns runs mma_ring on A of at most
// kGemvRingMaxBytes, or with rows of at most kGemvRingMaxK elements; cuBLAS
// on larger A with longer rows. On the sweep of 2026-12-02 (n = 8, bf16, us,
// ours against the vendor): 4096^2 (32 MiB) 8.7 against 13.9, 1000 x 16384
// 10.6 against 12.3, 100000 x 1000 (191 MiB) 53.0 against 57.5, 50000 x 1024
// 29.9 against 29.4; but 1024 x 50000 (98 MiB) 32.2 against 31.5, 16384^2
// 142.4 against 134.6, 2000 x 100000 112.1 against 100.8.
inline constexpr int64_t kGemvRingMaxBytes = int64_t(64) << 20;
inline constexpr int64_t kGemvRingMaxK = 2048;

// fp16 A x on rows that forbid 16-byte loads: cuBLAS from this many columns
// on rows of at least this many elements (see ChooseGemv).
inline constexpr int kGemvScalarVendorMinColumns16 = 4;
inline constexpr int64_t kGemvScalarVendorMinK16 = 4096;

// A^T x: fp32 with 5..8 columns runs ours (trans_split) from this many
// columns of op(A) (m); 16-bit with 5..8 columns from this k, or on fewer
// than a wave of 128-column tiles.
inline constexpr int64_t kGemvTransFp32MinM8 = 4096;
inline constexpr int64_t kGemvTransMinK16Wide = 4096;

// Splits of k that meet in a thread-block cluster's shared memory: at most
// the portable cluster size.
inline constexpr int kGemvMaxClusterSplits = 8;
// A split of a clustered tensor-core launch (trans_mma, mma_ring) takes at
// least this many steps of k: two per warp of its CTA.
inline constexpr int64_t kGemvMinStepsPerSplit = 16;

// The launch of trans_mma (A^T x) and mma_ring (A x): output tiles of `tile`
// rows of y (columns of the stored A for A^T x, rows for A x), k
// split over `splits` CTAs of a cluster (1..8) of `rows_per_split` k indices
// each (a multiple of the kernel's step); tiles * splits CTAs.
struct GemvTilePlan {
  int tile = 128;
  int splits = 1;
  int64_t rows_per_split = 16;
  int64_t tiles = 1;
};

// The plan for op(A) of [m, k] when `resident` CTAs fit on the device at
// once and a warp's step covers `step` indices of k (16 for trans_mma, 128 or
// 256 for mma_ring): 128-row tiles with as many splits as fill the resident
// CTAs in one wave; 64-row tiles only where they fill as many CTAs with fewer
// splits (A^T 4096^2: 64 x 2 CTAs, 8.96 us, against 32 x 4 of 128 columns,
// 14.9 us); `only_tile` (any size) where the caller names one. At the same
// split the wide tile streams more bytes per step and wins (A^T 1000 x 100000
// bf16, 8 splits: 53.6 against 71.6 us; 50000 x 1024, no split: 30.7 against
// 37.5).
inline GemvTilePlan ChooseGemvTilePlan(int64_t m, int64_t k, int64_t resident, int only_tile = 0,
                                       int64_t step = 16) {
  auto plan_for = [&](int tile) {
    GemvTilePlan p;
    p.tile = tile;
    p.tiles = (m + tile - 1) / tile;
    int64_t splits = resident / p.tiles;
    splits = splits < 1 ? 1 : (splits > kGemvMaxClusterSplits ? kGemvMaxClusterSplits : splits);
    const int64_t by_rows = k / (kGemvMinStepsPerSplit * step);
    if (splits > by_rows) splits = by_rows < 1 ? 1 : by_rows;
    p.rows_per_split = ((k + splits - 1) / splits + step - 1) / step * step;
    p.splits = static_cast<int>((k + p.rows_per_split - 1) / p.rows_per_split);
    return p;
  };
  if (only_tile != 0) return plan_for(only_tile);
  const GemvTilePlan wide = plan_for(128), narrow = plan_for(64);
  return narrow.splits < wide.splits && narrow.tiles * narrow.splits >= wide.tiles * wide.splits
             ? narrow
             : wide;
}

// mma_ring's tile for A with m rows: 32 rows (256 bytes of each per step)
// where such tiles leave k unsplit on `sm_count` SMs, else 16 (512 bytes of
// each per step): twice the tiles, k split over fewer CTAs, each with more
// steps to stream. On the sweep (2026-12-02, n = 8, bf16, us): 3001 x 2000
// 4.96 with 32 rows against 5.86 with 16, 50000 x 1024 29.5 against 41.1;
// 1000 x 16384 16.6 (4 splits) against 10.2 (2), 1024 x 50000 49.2 against
// 32.6.
inline int ChooseGemvRingTile(int64_t m, int sm_count) {
  return (m + 31) / 32 * 2 > sm_count ? 32 : 16;
}

// `base` with the split suffix ("_w2", "_w4", "_w8") of `split`.
inline std::string_view WithSplit(std::string_view base, int split) {
  static constexpr std::string_view kBatched[] = {"batched", "batched_w2", "batched_w4",
                                                  "batched_w8"};
  static constexpr std::string_view kScalar[] = {"scalar", "scalar_w2", "scalar_w4", "scalar_w8"};
  static constexpr std::string_view kMma[] = {"mma", "mma_w2", "mma_w4", "mma_w8"};
  const int i = split >= 8 ? 3 : (split >= 4 ? 2 : (split >= 2 ? 1 : 0));
  if (base == "scalar") return kScalar[i];
  if (base == "mma") return kMma[i];
  return kBatched[i];
}

// The name of the version to run (one of GemvVariants()).
inline std::string_view ChooseGemv(const GemvShape& s, int sm_count) {
  const bool fp32 = s.dtype == DType::kF32;
  if (s.trans_a) {
    // One column: cuBLAS's gemv streams A faster than a D2D copy; fp32 with
    // 5..8 columns and few columns of op(A): its GemmEx. Else ours.
    if (fp32) {
      if (s.vendor_ok &&
          (s.ncols == 1 || (s.ncols >= kGemvMmaMinColumns && s.m < kGemvTransFp32MinM8)))
        return "cublas";
      return "trans_split";
    }
    // 16-bit: trans_mma, but the vendor for one column, and for 5..8
    // columns over short k on more than a wave of 128-column tiles (each
    // tile a few steps long).
    if (s.vendor_ok &&
        (s.ncols == 1 || (s.ncols >= kGemvMmaMinColumns && s.k < kGemvTransMinK16Wide &&
                          s.m >= int64_t(128) * sm_count)))
      return "cublas";
    return "trans_mma";
  }
  // fp16/bf16 with 5..8 columns: the tensor cores, A streamed through a
  // cp.async ring ("mma_ring"), on A of up to 64 MiB or rows of up to 2048
  // elements (1.0-2.4x cuBLAS); cuBLAS's GemmEx on larger A with longer rows
  // (named "cublas" in the shard timings; ours 0.90-0.98x there).
  if (!fp32 && s.ncols >= kGemvMmaMinColumns && s.vector_friendly &&
      (!s.vendor_ok || s.k <= kGemvRingMaxK ||
       s.m * s.k * int64_t(DTypeSize(s.dtype)) <= kGemvRingMaxBytes))
    return "mma_ring";
  if (s.vendor_ok && !fp32 && s.ncols >= kGemvMmaMinColumns) return "cublas";
  // fp16 rows that forbid 16-byte loads, 4 columns or more, long rows: the
  // element-load kernels issue a load per 2 bytes of A and fall behind
  // cuBLAS's GemmEx (777 x 12345, n = 4: 21.4 against 18.9 us); for bf16
  // the vendor is slower there (23.3 against 21.7), and on short rows ours
  // lead in both (12345 x 777: 13.1 against 16.3).
  if (s.vendor_ok && s.dtype == DType::kF16 && !s.vector_friendly &&
      s.ncols >= kGemvScalarVendorMinColumns16 && s.k >= kGemvScalarVendorMinK16)
    return "cublas";
  if (s.vendor_ok && !fp32 && s.ncols == 1 && s.m >= kGemvVendorMinRows16 &&
      s.k >= kGemvVendorMinK16)
    return "cublas";
  const int64_t vec = 16 / int64_t(DTypeSize(s.dtype));  // elements per 16-byte load
  const int64_t rows_per_warp = s.ncols <= 2 ? 2 : 4;    // BatchedConfig in gemv.cu
  // Element loads: any alignment; and fp32 with 5..8 columns, where the
  // 16-byte kernel's accumulators and x vectors leave too few loads in flight.
  if (!s.vector_friendly || (fp32 && s.ncols >= kGemvMmaMinColumns))
    return WithSplit("scalar", GemvSplitFor(s, rows_per_warp, sm_count, 1));
  const int64_t target = int64_t(sm_count) * kGemvTargetWarpsPerSm;
  if (s.ncols == 1) {
    if (double(s.m) >= kGemvVec16MinFill * double(target) && s.k >= kGemvVec16MinK &&
        (fp32 || s.k <= kGemvVec16MaxK16))
      return "vec16";
    if (fp32 && s.vendor_ok && double(s.m) < kGemvVec16MinFill * double(target)) return "cublas";
    if (fp32) return WithSplit("scalar", GemvSplitFor(s, rows_per_warp, sm_count, 1));
  }
  return WithSplit("batched", GemvSplitFor(s, rows_per_warp, sm_count, vec));
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMV_HEURISTICS_H_
