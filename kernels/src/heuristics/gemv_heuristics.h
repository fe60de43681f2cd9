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
//   - fp16/bf16 A x with 5..8 columns: cuBLAS's GemmEx was faster than every
//     kernel of ours (mma 0.6-0.7x, batched 0.4-0.6x at 8 columns): the
//     default is the vendor fallback "cublas" there, named as such; fp32
//     with one column and few rows (m under a quarter of the target warps),
//     and fp16/bf16 with one column, 2000 rows or more of 16k elements or
//     more, too.
//   - One column with a quarter of the machine's warps in rows of 1k..16k
//     elements (fp32: 1k and longer): a warp per row ("vec16").
//   - Otherwise a warp per group of 2 or 4 rows ("batched"), with 2, 4 or 8
//     warps sharing each row group along k ("batched_w2/_w4/_w8") until the
//     machine is full (short, wide A); one launch, no workspace. fp32 with one
//     column takes element loads there ("scalar_w*": fewer x loads per
//     element of A, faster on every such shape of the sweep).
//   - Where the fallback cannot run (an output dtype cuBLAS does not write
//     from the input's, sizes past 32 bits): A^T x "trans_mma" (16-bit) or
//     "trans_split" (fp32); fp16/bf16 with 5..8
//     columns "mma" (tensor cores; the FMA kernels run out of issue slots
//     there), split like batched, where its 16-row groups fill half the
//     machine (wide, short A stays on batched).
//   - fp32 with 5..8 columns: "scalar" (element loads; the 16-byte kernel
//     holds too many accumulators and x vectors to keep loads in flight).
//   - Pointers or a row stride that forbid 16-byte vectors: "scalar"
//     (element loads, every column at once), split like batched.
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
// fp16/bf16 with at least this many columns run on the tensor cores, when
// their 16-row groups alone fill half the machine (wide, short A: batched).
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

// A^T x: fp32 with 5..8 columns runs ours (trans_split) from this many
// columns of op(A) (m); 16-bit with 5..8 columns from this k, or on fewer
// than a wave of 128-column tiles.
inline constexpr int64_t kGemvTransFp32MinM8 = 4096;
inline constexpr int64_t kGemvTransMinK16Wide = 4096;

// Splits of k that meet in a thread-block cluster's shared memory: at most
// the portable cluster size.
inline constexpr int kGemvMaxClusterSplits = 8;
// A split of trans_mma reads at least this many rows of the stored A (two
// 16-row steps per warp of its CTA).
inline constexpr int64_t kGemvTransMinRowsPerSplit = 256;

// trans_mma's launch: column tiles of `tile_cols` (128 or 64), k split over
// `splits` CTAs of a cluster (1..8) of `rows_per_split` rows each (a multiple
// of 16); tiles * splits CTAs.
struct GemvTransPlan {
  int tile_cols = 128;
  int splits = 1;
  int64_t rows_per_split = 16;
  int64_t tiles = 1;
};

// The plan for op(A) = A^T of [m, k] when `resident` CTAs fit on the device
// at once: 128-column tiles (256-byte row pieces in 16-bit) with as many
// splits as fill the resident CTAs in one wave; 64-column tiles only where
// they fill as many CTAs with fewer splits (4096^2: 64 x 2 CTAs, 8.96 us,
// against 32 x 4 of 128 columns, 14.9 us). At the same split the wide tile
// streams more bytes per step and wins (1000 x 100000 bf16, 8 splits: 53.6
// against 71.6 us; 50000 x 1024, no split: 30.7 against 37.5).
inline GemvTransPlan ChooseGemvTransPlan(int64_t m, int64_t k, int64_t resident,
                                         int only_cols = 0) {
  auto plan_for = [&](int cols) {
    GemvTransPlan p;
    p.tile_cols = cols;
    p.tiles = (m + cols - 1) / cols;
    int64_t splits = resident / p.tiles;
    splits = splits < 1 ? 1 : (splits > kGemvMaxClusterSplits ? kGemvMaxClusterSplits : splits);
    const int64_t by_rows = k / kGemvTransMinRowsPerSplit;
    if (splits > by_rows) splits = by_rows < 1 ? 1 : by_rows;
    p.rows_per_split = ((k + splits - 1) / splits + 15) / 16 * 16;
    p.splits = static_cast<int>((k + p.rows_per_split - 1) / p.rows_per_split);
    return p;
  };
  const GemvTransPlan wide = plan_for(128), narrow = plan_for(64);
  if (only_cols != 0) return only_cols == 64 ? narrow : wide;
  return narrow.splits < wide.splits && narrow.tiles * narrow.splits >= wide.tiles * wide.splits
             ? narrow
             : wide;
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
  // Where our kernels still lose, the vendor's (named "cublas" in the shard
  // timings): fp16/bf16 with 5..8 columns.
  if (s.vendor_ok && !fp32 && s.ncols >= kGemvMmaMinColumns) return "cublas";
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
  if (!fp32 && s.ncols >= kGemvMmaMinColumns && (s.m + 15) / 16 * 8 * 2 >= target)
    return WithSplit("mma", GemvSplitFor(s, 16, sm_count, 4 * vec));
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
