// GEMM: what the default (an empty variant) runs. Host-only; the dispatcher
// (src/gemm_dispatch.cc) asks it and launches what it names.
//
// Derived from the server-path sweep (tests/sweep/gemm_sweep.cc; table and
// command in kernels/bench/results/sweep-gemm.md), which times every version
// on every shape of its list (168 cases, 11 classes), our rungs forced one by
// one and the cuBLASLt fallback, against cuBLAS in the same run. What it
// showed on the H200 (the best of our rungs / cuBLAS, by class; run 7 of
// sweep-gemm.md, runs 1-2 before wgmma_splitk and wgmma_packed):
//   - squares 128-16384: bf16/fp16 0.3-0.4x up to 1024 (every kernel of
//     ours costs >= 7 us where cuBLAS takes 2-5 us), 0.8x at 2048, 0.91-0.93x
//     at 4096-8192, 0.97-0.98x at 16384; tf32 0.85-0.94x from 4096 up
//     (wgmma_packed; mma_sync before: 0.22x); exact fp32 0.52-0.98x;
//   - small K (16-256): 0.32-0.50x (16-bit), up to 1.03x (tf32);
//   - large K with small M*N: wgmma_splitk 0.6-0.97x (bf16);
//   - thin M (1-256) against LLM weights: wgmma_splitk / wgmma_ws 0.58-0.99x,
//     one case past 1.0x (M = 64 against a 128256 x 4096 weight: 1.04-1.07x,
//     its neighbours M = 16 and 128 at 0.82x and 0.99x: not a class);
//   - rows TMA cannot read (odd K or N): wgmma_packed 1.32-3.1x from
//     batch*M*N*K = 2^31 up (999^3: 0.63-0.70x); tf32 TN 1.02-1.16x;
//   - transposes (16-bit) 0.9x; batches 0.36-0.97x.
// Runs 1-2 found no class where one of our rungs is ahead of cuBLASLt beyond
// the run-to-run spread (+-3-5%). Run 4 added wgmma_packed (operands TMA
// cannot read copied K-major first), which is ahead on two classes, large
// enough to pay for the copies (below); everywhere else the default is the
// vendor fallback wherever it runs, named "cublaslt" in the shard timings and
// kernel metrics, and our ladders run where it does not (an output dtype or a
// size it refuses). Run 11 (staged epilogue, tile widths, swap-AB: own
// kernels 0.900x geomean) still found no other class ahead of cuBLASLt, only
// single shapes (thin M against a 128256 x 4096 weight, 1.04-1.10x). Runs
// 21-27 timed the default on 534 random shapes of the sweep's classes too
// (--random): the bound of 2^31 for wgmma_packed gave way to what its copies
// and C cost (below), and the fallback's batches sharing an operand to one
// batched call (gemm_vendor.cc). Their forced times also found a class the
// list had no case of: C's rows off 16 bytes with A and B as TMA reads them,
// where wgmma_splitk runs 1.8x faster than the fallback (below). Run 28
// forced cublasGemmStridedBatchedEx itself ("cublas") through the same path:
// no class ahead of cuBLASLt (list geomean 0.987 against 0.997), so the
// default never picks it.
#ifndef GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMM_HEURISTICS_H_
#define GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMM_HEURISTICS_H_

#include <algorithm>
#include <cstdint>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// What the choice depends on.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;  // op(A) is [m, k], op(B) [k, n]
  DType ab = DType::kF32;
  bool tf32 = false;  // fp32 inputs on the tensor cores
  bool trans_a = false, trans_b = false;
  bool tma_ok = false;    // A and B as TMA takes them (the wgmma rungs run; implies aligned)
  bool aligned = true;    // A's and B's bases, rows and batch strides on 16 bytes
  int ab_align = 16;      // ... on this many bytes (the largest power of two, at most 16)
  bool vendor_ok = true;  // the cuBLASLt fallback takes these arguments
  bool beta = false;      // C is read (beta != 0)
  int sms = 132;
  // Bytes of A and B that wgmma_packed copies first (GemmTcPackedCopyBytes).
  double copy_bytes = 0;
  int c_bytes = 2;        // bytes of one element of C
  bool c_aligned = true;  // C (and c_in) with base, rows and batch stride on 16 bytes
  bool c_sectors = true;  // ... on 32 bytes (an L2 sector)
};

// wgmma_packed (gc_sweep_gemm's list and 11 x 60 random shapes, H100,
// sweep-gemm.md runs 21-27, against the fallback): its copies pay where the
// product outweighs them and C, and the problem is not thin.
//   - FLOPs per byte copied >= 400: 999^3 bf16 (500) 1.48x, 1537x2049x999
//     tf32 (439) 1.19x, 1000x3000x777 (3000) 3.45x; 948x235x32768 TN with
//     beta (188) 0.73x, 512x377x21031 (217) 0.71x, 764x512x4222 TT (306)
//     0.74x, 6*1790x55x751 (53) 0.75x; tf32 TN 64*512x256x1024 (256) 0.63x.
//   - FLOPs per byte of C (2 K over its element size): >= 256 where C's rows
//     are off 16 bytes and C is fp32 or read (element by element then):
//     11119x2187x123 bf16 with beta 0.44x, 8192x5341x204 bf16 -> fp32 0.54x,
//     8192x15295x161 tf32 0.52x; 1537x2049x999 tf32 (500) 1.19x. Else >= 64
//     (>= 128 under 2^30 batch * M * N * K): 6456x11512x125 f16 2.04x,
//     8192x13916x128 bf16 1.39x, 4096x4096x70 f16 (1.2e9) 1.21x,
//     16384x1024x77 with beta 1.35x; 16384x14530x32 0.77x, 5980x1194x78 NT
//     (5.6e8) 0.81x, 1024x1114x91 (1.0e8) 0.73x.
//     Below that, 16-bit C on 16 bytes from 2^27 where the copied operand
//     is small (>= 2048 FLOPs a copied byte: with one operand copied, the
//     other side at least 2048 wide): odd K of 8-82 against a wide
//     operand, which the fallback reads without TMA (runs 21-31: 17 shapes,
//     1.41x geomean, the least 1.22x: 12641x2272x8 TN 1.71x, 2959x4096x79 f16 1.67x,
//     4795x8192x20 f16 with beta 1.22x). Not with fp32 C (5108x4604x64 f16
//     -> fp32 0.62x, 3802x16028x8 TT tf32 0.51x) nor a smaller problem or
//     copy (1024x1024x29 0.65x, 4050x2048x22 0.91x, 1242x8192x26 TT 0.85x).
//   - min(M, N) of 17-127 only from batch * M * N * K = 2^31 up (the thin
//     tiles take 16 columns and fewer): 64x2048x853 f16 0.80x, 46x1024x1169
//     TN tf32 0.63x; 94x8192x9865 TN tf32 (7.6e9) 1.45x; 2-16 rows against
//     a wide B 1.12-3.22x. Or from 2^28 where only the thin operand is
//     copied (>= 1024 FLOPs a copied byte), a few tokens with odd K against
//     a weight that stays in place, which the fallback reads without TMA:
//     66x4096x5089 3.48x, 28x4096x14179 2.89x, 29x12200x1501 with beta
//     2.40x (runs 21-31: 18 shapes, 1.65x geomean, the least 54x4096x2048
//     TN 0.99x); under 2^28 64x3360x1046 f16 0.80x, 1024x18x1024 0.64x;
//     copying the wide operand 64x4096x15290 NT 0.26x.
//   - From kGemmOursMinVolume up (runs 21-31): under it the copy's launch
//     outweighs the product (512x150x128 TN 5.6 us against the fallback's
//     3.2, 7x2048x1024 TT f16 0.84x; 2x1024x3894 1.13x, 2x4096x1753 TN
//     1.11x given up).
//   - Not on 16-bit rows off 16 bytes but on 4 (an even count of elements
//     in every such row) over a K of 33-400 in a small problem: under 1.5 *
//     2^27 batch * M * N * K, or under 2^29 with K up to 160. cuBLAS reads
//     such rows 4 or 8 bytes at a time and runs them in 4-10 us, where our
//     copy and kernel cost at least ~6.5 us. The default's 27 such rows in
//     runs 44-48 (H100) ran 0.88x geomean, 10 under 0.8x (588x512x158 0.61x,
//     1024x1014x128 TN 0.68x, 534x6928x73 TN 0.70x, 2048x512x148 0.71x,
//     1020x512x128 TT 0.72x, 8*128x512x180 with B shared f16 0.77x,
//     1024x3226x128 f16 0.79x), 3 past 1.1x (3*494x286x256 with B shared f16
//     1.48x, 2*278x2048x128 TN 1.21x, 2245x138x256 1.10x); the fallback ran
//     0.97-1.01x the vendor on the 14 it was forced on. With rows on 2 bytes
//     (an odd count) the vendor is slower and ours ahead at the same sizes
//     (16-bit, K up to 400, 2^26-2^29: 60 rows, 1.33x geomean, the least
//     0.84x; 859x512x165 1.29x, 2048x512x131 1.09x). K up to 32 stays with
//     the short-K rule above (2946x16384x8 TN 1.25x, 2183x8192x14 1.12x).
//     Run 49 (H100, after the rule, sweep-gemm.md): 19 fresh seeds none under
//     0.8x (512x5434x128 TN 0.75x -> 1.00x); of 90 random shapes of the class
//     it moved 6, two up (404x448x220 f16 0.73x, 420x1464x150 f16 0.78x ->
//     1.0x) and four TT rows down (1096x524x132 1.10x, 2656x755x154 1.58x ->
//     1.0x, three with only B's rows off 16 bytes): a layout bound is next.
//   - Not with beta on 16-bit C whose rows are off 16 bytes (C read element
//     by element, two bytes at a time): 14 of 16 such shapes behind the
//     fallback, at every K (1476x2653x256 0.52x, 617x502x1072 0.94x,
//     683x3915x128 0.48x, 64*50x273x512 0.73x); the two ahead 1.04x and
//     1.15x.
inline constexpr double kGemmPackedMinFlopsPerCopiedByte = 400;
inline constexpr double kGemmPackedMinFlopsPerCByte = 64;
inline constexpr double kGemmPackedMinFlopsPerCByteSmall = 128;  // under kGemmPackedSmallVolume
inline constexpr double kGemmPackedMinFlopsPerCByteSlowC = 256;  // fp32 or read, rows off 16 B
inline constexpr double kGemmPackedSmallVolume = 1073741824.0;   // 2^30
inline constexpr double kGemmPackedShortKMinVolume = 134217728.0;  // 2^27
inline constexpr double kGemmPackedShortKMinFlopsPerCopiedByte = 2048;
inline constexpr int64_t kGemmPackedThinMax = 16;
inline constexpr int64_t kGemmPackedPairsMinK = 33;
inline constexpr int64_t kGemmPackedPairsMaxK = 400;
inline constexpr double kGemmPackedPairsMinVolume = 201326592.0;  // 1.5 * 2^27
inline constexpr int64_t kGemmPackedPairsShortK = 160;
inline constexpr double kGemmPackedPairsShortMinVolume = 536870912.0;  // 2^29
inline constexpr double kGemmPackedMinVolume = 2147483648.0;         // 2^31
inline constexpr double kGemmPackedThinCopyMinVolume = 268435456.0;  // 2^28
inline constexpr double kGemmPackedThinMinFlopsPerCopiedByte = 1024;
// Ours from this batch * M * N * K up where it adds a pass to the product
// (wgmma_packed's copies, the K split for C's rows off 16 bytes below).
inline constexpr double kGemmOursMinVolume = 16777216.0;  // 2^24
// tf32 NN with K up to this over at least 2^23 outputs runs ours (below).
inline constexpr int64_t kGemmTf32ShortK = 128;
// tf32 NN batches under kGemmPackedMinVolume run ours from these (below).
inline constexpr int64_t kGemmTf32BatchMinSide = 192;
inline constexpr double kGemmTf32BatchMinVolume = 134217728.0;  // 2^27

// The variant the default runs: "cublaslt" (the vendor fallback), a rung of
// the dtype's ladder by name, or "" for the ladder's own choice.
inline const char* ChooseGemmVariant(const GemmShape& s) {
  if (!s.vendor_ok) return "";
  const double volume = double(s.batch) * double(s.m) * double(s.n) * double(s.k);
  const bool tensor_cores = s.ab != DType::kF32 || s.tf32;
  // Rows not on 16 bytes (odd K or N in 16-bit, K or N not a multiple of 4
  // in tf32): cuBLAS has no TMA kernel for them; ours copies them K-major,
  // then wgmma: 1.32-2.93x (bf16/fp16), 1.32-1.56x (tf32) in run 4, where
  // the copies pay (kGemmPackedMinFlopsPerCopiedByte and below).
  const bool copies_pay = 2.0 * volume >= kGemmPackedMinFlopsPerCopiedByte * s.copy_bytes;
  const bool thin_copied = 2.0 * volume >= kGemmPackedThinMinFlopsPerCopiedByte * s.copy_bytes &&
                           volume >= kGemmPackedThinCopyMinVolume;
  const bool slow_c = !s.c_aligned && (s.c_bytes >= 4 || s.beta);
  const double c_min = slow_c                            ? kGemmPackedMinFlopsPerCByteSlowC
                       : volume < kGemmPackedSmallVolume ? kGemmPackedMinFlopsPerCByteSmall
                                                         : kGemmPackedMinFlopsPerCByte;
  const bool c_pays = 2.0 * double(s.k) >= c_min * s.c_bytes;
  const bool short_k_pays = s.c_aligned && s.c_bytes == 2 && volume >= kGemmPackedShortKMinVolume &&
                            2.0 * volume >= kGemmPackedShortKMinFlopsPerCopiedByte * s.copy_bytes;
  const int64_t thin = std::min(s.m, s.n);
  const bool c_read_by_halves = s.beta && !s.c_aligned && s.c_bytes < 4;
  const bool vendor_reads_pairs =
      s.ab != DType::kF32 && s.ab_align >= 4 && s.k >= kGemmPackedPairsMinK &&
      ((s.k <= kGemmPackedPairsMaxK && volume < kGemmPackedPairsMinVolume) ||
       (s.k <= kGemmPackedPairsShortK && volume < kGemmPackedPairsShortMinVolume));
  // One row or column (a matrix-vector product, which cuBLAS runs on its
  // GEMV kernels whatever the alignment): 1x8192x1448 TT bf16 -> fp32 0.69x
  // on wgmma_packed (run 26).
  if (tensor_cores && !s.aligned && copies_pay && (c_pays || short_k_pays) && thin > 1 &&
      (thin <= kGemmPackedThinMax || thin >= 128 || volume >= kGemmPackedMinVolume ||
       thin_copied) &&
      volume >= kGemmOursMinVolume && !c_read_by_halves && !vendor_reads_pairs)
    return "wgmma_packed";
  // A and B as TMA reads them, C's rows off 16 bytes (N not a multiple of 8
  // in 16-bit, of 4 in fp32): cuBLAS(Lt) slows down there, ours writes such
  // rows from the fragments. wgmma_splitk against the fallback, same run
  // (H100, sweep-gemm.md runs 25-30, 81 shapes of the list and --random):
  // 1.47x geomean, 66 ahead (737x11635x256 NT 77.2 -> 18.5 us, 16*256x943x512
  // NT 46.4 -> 11.3, 6753x5542x512 NT f16 178 -> 93, 4x1853x4096 NT tf32 18.7
  // -> 10.6), 14 behind: under 2^24 batch * M * N * K (268x314x32 NT tf32
  // with beta 3.4 against 9.5 us, 64x106x792 NT 4.4 against 6.4), and where
  // C costs more than the product, by C's criterion of wgmma_packed above
  // (8192x13337x64 NT tf32 with beta 470 against 1205 us, 1708x5811x128 NT
  // bf16 -> fp32 47.8 against 86.8, 2048x14725x32 NT 0.80x). With both: 60
  // shapes, 1.78x, all ahead (the least 1.03x); left out 3 that were ahead
  // (2350x2739x112 NT 1.89x, 1747x4019x32 NT 1.21x). Run 31, 15 seeds no
  // rule was set from: the 15 shapes it takes 1.56x, the least 1.01x. Left
  // out too: one row or column (cuBLAS's GEMV), and tf32 NN with beta (run
  // as C^T, read element by element: below).
  //
  // Nor with beta on 16-bit C (read element by element, two bytes at a time)
  // where 128 x 128 tiles alone fill the SMs: the fallback then runs whole
  // waves too, and C's reads outweigh what the split saves (H100, runs
  // 44-48): the two such rows the default gave it ran 0.60x (2934x2726x512 NT
  // f16) and 0.46x (4*1308x724x256 NT f16), and the five it was forced on
  // (K of 8-128, which c_pays leaves to the fallback anyway) 0.32-0.46x,
  // where the fallback ran 0.96-1.28x. With fewer tiles, 20 of the default's
  // 22 such rows ran 1.0x or better (512x885x512 NT 1.42x, 257x493x4096 NT
  // 1.87x), the other two 0.78x (122x3412x1024 NT) and 0.85x (16*512x142x512
  // TT).
  const bool tf32_nn = s.tf32 && !s.trans_a && !s.trans_b;
  const double tiles_128 = double(s.batch) * double((s.m + 127) / 128) * double((s.n + 127) / 128);
  if (tensor_cores && s.tma_ok && !s.c_aligned && thin > 1 && c_pays &&
      volume >= kGemmOursMinVolume && !(tf32_nn && s.beta) &&
      !(c_read_by_halves && tiles_128 >= s.sms))
    return "wgmma_splitk";
  // tf32 with A transposed and B not (TN): cuBLAS's tf32 TN kernels ran
  // ~1.6x slower than its NT ones; one operand copied K-major first:
  // 1.02-1.16x (4096^3 1.27x, 2000x3000x1000 1.28x in run 21); C as above,
  // at least kGemmPackedMinFlopsPerCByteSmall FLOPs a byte of C (K >= 256)
  // at every size: 16384x16007x16 TN 0.23x in runs 25-26 (C's fp32 rows off
  // 16 bytes), 16384x4096x131 0.78x and 1264x16384x170 0.94x in run 31;
  // 1431x4096x256 1.56x.
  const bool tn_c_pays =
      c_pays && 2.0 * double(s.k) >= kGemmPackedMinFlopsPerCByteSmall * s.c_bytes;
  if (s.tf32 && s.trans_a && !s.trans_b && volume >= kGemmPackedMinVolume && copies_pay &&
      tn_c_pays)
    return "wgmma_packed";
  // tf32 NN (B N-major), which ours runs as C^T with B^T from registers
  // (sweep-gemm.md runs 12-13): batches of large problems (8*1024^3, 16 x
  // 256x4096x4096 with B shared: 1.17-1.21x) and long K over few outputs
  // (K >= 64 max(M, N): 256x256x65536 1.33x, 512x512x32768 1.13x) are ahead
  // of cuBLAS's tf32 NN kernels; beta is not (C^T read element by element).
  // Short K (at most 128) over a large C, since C^T's stores no longer test
  // beta per element (sweep-gemm.md runs 17 and 19): 4096x4096x16 to 16384^2 x
  // 128 1.08-1.31x on an H200; those and 32 x 512x512x64 0.96-1.30x on an H100.
  // Such a product is bound by C's writes; with C's rows off 32 bytes (an L2
  // sector) C^T's stores ran at half the fallback's rate: 8192x5700x32 140 us
  // against 81 (H100, run 31; every tile width 120-173 us).
  //
  // Smaller batches: ours where each problem is at least kGemmTf32BatchMinSide
  // on both sides, from kGemmTf32BatchMinVolume (H100, runs 29-33 and the
  // probes of run 44, against the fallback in the same run): 15 shapes,
  // 1.00-1.67x but one (4*1024x768x64 0.93x; 3*535x1024x144 with B shared
  // 1.67x, where the fallback ran 0.69x the vendor; 4*192x1024x512 1.13x,
  // 2*1500x260x512 1.49x, 10*1000x200x128 with B shared 1.16x). With a side
  // of 128 or less ours was behind (4*256x128x256 0.51x, 3*128x336x1024
  // 0.53x, 4*1131x128x2048 0.80x, 3*2048x88x512 0.89x), and under 2^27 it
  // was either way (5*256x256x256 0.78x, 2*300x700x200 1.16x). Run 45 (L2
  // flushed before each run): the 11 probes it takes 0.90-1.43x cuBLAS,
  // 1.12x geomean.
  //
  // Neither batch rule where K is short and C's rows are off 32 bytes: such a
  // product is bound by C^T's stores at half rate, as above (run 45:
  // 16*2048x1404x64 with B shared 0.70x, the fallback 0.96x; with K from 300
  // such rows ran ahead, 16*300x300x300 1.12x, 2*1500x260x512 1.37x).
  if (tf32_nn && s.tma_ok && !s.beta) {
    const bool slow_short_c = s.k <= kGemmTf32ShortK && !s.c_sectors;
    if (s.batch > 1 && volume >= kGemmPackedMinVolume && !slow_short_c) return "wgmma_splitk";
    if (s.batch > 1 && std::min(s.m, s.n) >= kGemmTf32BatchMinSide &&
        volume >= kGemmTf32BatchMinVolume && !slow_short_c)
      return "wgmma_splitk";
    if (s.k >= 64 * std::max(s.m, s.n) && s.m * s.n >= 65536) return "wgmma_splitk";
    if (s.k <= kGemmTf32ShortK && s.c_sectors &&
        double(s.m) * double(s.n) * double(s.batch) >= 8388608.0)
      return "wgmma_splitk";
  }
  return "cublaslt";
}

// --- The tile and K split of wgmma_splitk (and of wgmma_packed, which runs
// its kernel): 128 rows by 256, 192, 128 or 64 columns (32 and 16 for thin
// problems), K cut into ranges whose fp32 partial sums one more kernel (or
// the tile's cluster) adds up.
//
// A block of the persistent kernel works on one tile at a time, so a problem
// of few tiles leaves SMs idle (1024^3 bf16 as 32 tiles of 128 x 256: 0.33x
// cuBLAS; each tile ~31k cycles on its SM in Nsight Compute). Narrower tiles
// make more of them but cost more loads per FLOP; a K split makes more units
// but costs the partial sums' traffic and a second kernel. The choice is the
// cheapest of every width, with and without a split, in a small cost model
// whose constants come from the server-path sweep (sweep-gemm.md):
//   - a k-block (128 bytes of K) of a 128 x 256 tile at the tensor-core peak:
//     kGemmKBlockUs (bf16 and tf32 alike: tf32 has half the FLOPs a byte at
//     half the rate);
//   - narrower tiles run at kGemmTileSpeed of that per column (2048^3 bf16:
//     25.7 us on 128 x 256 tiles, 29.2 on 128 x 128 in two waves, 38.6 on
//     128 x 64 in four);
//   - whole waves: a problem of 1.45 waves of 128 x 256 tiles costs two
//     (2048x3072x1024 bf16: 192 tiles on 132 SMs, 0.83x cuBLAS); 128 x 192
//     tiles cut it into 256 tiles, 1.94 waves of three quarters the work
//     (0.90x, sweep-gemm.md run 18; 2000x3000x1000, whose rows are off 128
//     bytes, stays at 0.79x on either);
//   - a split adds kGemmSplitLaunchUs and (2 splits + 1) passes over M x N
//     fp32 values at kGemmHbmBytesPerUs (1024^3 bf16 on 128 x 128 tiles in two
//     ranges: 17.5 us, against 7.2 us unsplit on 128 x 64 tiles).
struct GemmTileSpeed {
  int bn;
  double speed;  // throughput per column relative to 128 x 256 tiles
};
// Thin tiles (32 and 16 columns, B K-major only) are bound by their loads:
// their speeds are 64 columns' cost per k-block scaled by the bytes a stage
// holds (20 and 18 KB against 24).
// 192 columns (40 KB a stage for 3/4 of 256 columns' FLOPs): 2048x3072x1024
// bf16 in two waves of each ran 22.0 us on 128 x 192 tiles, 26.2 on 128 x 256
// (H100, sweep-gemm.md run 18): 0.75 / (22.0 / 26.2) = 0.89.
inline constexpr GemmTileSpeed kGemmTileSpeed[] = {{256, 1.0}, {192, 0.89}, {128, 0.88},
                                                   {64, 0.67}, {32, 0.40},  {16, 0.22}};
// Which orientations may take thin tiles (ChooseWgmmaTilePlan's thin_sides):
// those whose B (op(B), or op(A)^T swapped) is K-major.
inline constexpr unsigned kGemmThinUnswapped = 1, kGemmThinSwapped = 2;
inline constexpr double kGemmKBlockUs = 0.56;
inline constexpr double kGemmSplitLaunchUs = 2.0;
inline constexpr double kGemmHbmBytesPerUs = 3.0e6;
// A split whose ranges add up inside one thread block cluster (2-8 CTAs,
// through distributed shared memory): two cluster barriers and the sums'
// reads instead of the partials' round trip through HBM and a second kernel.
// Its cost grows with the ranges (H100, sweep-gemm.md run 46, each split
// forced with and without the cluster on problems of 4-64 tiles): against
// the partials' split of as many ranges, 16-bit on 64-192 columns, 0.2-3.4
// us less at 2 ranges (640x512x1024 bf16 on 128 x 64 tiles: 7.4 against 9.2
// us, 6.7 unsplit), within 1.5 us at 4, 1.3-2.9 us more at 8 (256x256x8192
// on 128 x 128 tiles: 13.7 against 12.0); tf32 more (512x128x10080 in 8
// ranges: 33.9 against 25.2). It was charged 1 us, which took 8-range
// cluster splits of a few wide tiles (640x512x1024: 11.6 us in run 44). Now
// kGemmClusterReduceUs plus kGemmClusterReducePerSplitUs a range (read from
// run 44's splits; with the thin tiles below, runs 46-48 measured it).
inline constexpr int kGemmMaxClusterSplits = 8;
inline constexpr double kGemmClusterReduceUs = 1.9;
inline constexpr double kGemmClusterReducePerSplitUs = 0.45;

struct GemmTilePlan {
  int bn = 256;          // tile columns (128 rows)
  int splits = 1;        // K ranges
  int kb_per_split = 0;  // k-blocks (128 bytes of K) per range
  bool swap = false;     // computes C^T = op(B)^T op(A)^T (m and n trade places)
  bool cluster = false;  // the ranges of a tile add up in one cluster (2-8 splits)
};

// How many clusters of s CTAs (index s, 0-8) of the split-K kernel the GPU
// holds at once; 0 where none (no cluster split of that size).
struct GemmClusterFit {
  int clusters[kGemmMaxClusterSplits + 1] = {};
};

// K cut for 128 x bn tiles: with fewer tiles than SMs and at least 4
// k-blocks, ranges of at least 2 k-blocks (at most 64 ranges) until the
// units (tile, range) about fill one wave; else one range. With `fit`, a
// cluster split: at most 8 ranges, and only as many as let every tile's
// cluster be resident at once (else one range).
inline GemmTilePlan PlanGemmSplitK(int64_t m, int64_t n, int64_t kblocks, int64_t batch, int bn,
                                   int sms, const GemmClusterFit* fit = nullptr) {
  GemmTilePlan plan;
  plan.bn = bn;
  plan.kb_per_split = static_cast<int>(std::min<int64_t>(kblocks, INT32_MAX));
  const int64_t tiles = ((m + 127) / 128) * ((n + bn - 1) / bn) * batch;
  if (tiles >= sms || kblocks < 4) return plan;
  int64_t want = std::min<int64_t>({sms / tiles, kblocks / 2, 64});
  if (fit != nullptr) {
    want = std::min<int64_t>(want, kGemmMaxClusterSplits);
    while (want > 1 && fit->clusters[want] < tiles) --want;
  }
  if (want <= 1) return plan;
  const int64_t per = (kblocks + want - 1) / want;
  plan.kb_per_split = static_cast<int>(per);
  plan.splits = static_cast<int>((kblocks + per - 1) / per);
  plan.cluster = fit != nullptr;
  return plan;
}

// The cost model's estimate of `plan` in microseconds.
inline double GemmTilePlanUs(int64_t m, int64_t n, int64_t batch, const GemmTilePlan& plan,
                             double speed, int sms) {
  const int64_t units = ((m + 127) / 128) * ((n + plan.bn - 1) / plan.bn) * batch * plan.splits;
  const double waves = double((units + sms - 1) / sms);
  double us = waves * plan.kb_per_split * kGemmKBlockUs * (plan.bn / 256.0) / speed;
  const double c_bytes = double(m) * double(n) * double(batch) * 4.0;
  if (plan.splits > 1 && plan.cluster)
    us += kGemmClusterReduceUs + kGemmClusterReducePerSplitUs * plan.splits +
          c_bytes / kGemmHbmBytesPerUs;
  else if (plan.splits > 1)
    us += kGemmSplitLaunchUs + (2.0 * plan.splits + 1.0) * c_bytes / kGemmHbmBytesPerUs;
  return us;
}

// The plan of the split-K kernel for an op(A) [m, k] x op(B) [k, n] problem
// of `batch` entries and `kblocks` k-blocks: the cheapest width and split;
// only_bn != 0 keeps that width (a variant that names its tile).
//
// With allow_swap and fewer than 128 rows (thin M: a few tokens against a
// weight) the swapped problem C^T = op(B)^T op(A)^T is a candidate too: the
// wide side then fills the 128-row side of the tiles and the thin side one
// narrow tile column (16 x 4096 x 4096 bf16: 128 x 256 tiles in 8 K ranges
// ran 0.55x cuBLAS, every tile 112 of its 128 rows empty).
//
// With `fit` (the GPU's room for clusters of the split-K kernel) a split of
// 2-8 ranges that add up inside a cluster is a candidate too. Thin tiles
// (fewer than 64 columns) are candidates for the orientations thin_sides
// names (kGemmThinUnswapped, kGemmThinSwapped), where the width is named,
// the problem's columns are at most 32, or it has at least the tile's 128 rows. The
// last since run 46: run 45's forced widths had 16- and 32-column tiles
// ahead of the plan on wider problems (256x63x16384 NT f16 1.10x -> 1.68x
// cuBLAS, 512x885x512 NT with beta 1.42x -> 1.97x). With the reduction's
// cost above, against the model before both (H100, runs 46-47, 93 fresh
// seeds, each timed under both in turn): the 689 rows on our kernels in
// 0.983x the time, 84 more than 5% faster, 29 more than 5% slower
// (8*36x339x512 NT 0.54x, 512x957x256 NT 1.35x); leaving out the cluster
// split altogether was 1.004x the time of this (runs 47-48).
inline GemmTilePlan ChooseWgmmaTilePlan(int64_t m, int64_t n, int64_t kblocks, int64_t batch,
                                        int sms, int only_bn = 0, bool allow_swap = false,
                                        const GemmClusterFit* fit = nullptr,
                                        unsigned thin_sides = 0) {
  GemmTilePlan best;
  double best_us = -1;
  for (int swap = 0; swap < (allow_swap && m < 128 ? 2 : 1); ++swap) {
    const int64_t rows = swap ? n : m, cols = swap ? m : n;
    const bool thin_ok = thin_sides & (swap ? kGemmThinSwapped : kGemmThinUnswapped);
    for (const GemmTileSpeed& t : kGemmTileSpeed) {
      if (only_bn != 0 && t.bn != only_bn) continue;
      if (t.bn < 64 && (!thin_ok || (only_bn == 0 && cols > 32 && rows < 128))) continue;
      const GemmTilePlan split = PlanGemmSplitK(rows, cols, kblocks, batch, t.bn, sms);
      GemmTilePlan whole = split;
      whole.splits = 1;
      whole.kb_per_split = static_cast<int>(std::min<int64_t>(kblocks, INT32_MAX));
      const GemmTilePlan cluster =
          fit != nullptr ? PlanGemmSplitK(rows, cols, kblocks, batch, t.bn, sms, fit) : whole;
      for (GemmTilePlan plan : {whole, split, cluster}) {
        plan.swap = swap;
        const double us = GemmTilePlanUs(rows, cols, batch, plan, t.speed, sms);
        if (best_us < 0 || us < best_us) {
          best = plan;
          best_us = us;
        }
      }
    }
  }
  return best;
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMM_HEURISTICS_H_
