// GEMM on the Hopper tensor cores: C = alpha * op(A) * op(B) + beta * C for
// bf16/fp16 inputs (fp32 accumulation, C in the input type or fp32) and fp32
// inputs in tf32 mode (fp32 C). Row-major, transposes, strided batch.
//
// The two numbers, for M = N = K = 8192 bf16 (C bf16): FLOPs 2*M*N*K = 1.10e12;
// bytes that must move (A, B read once, C written once) 3 * 128 MiB = 403 MB.
// Floors on the H200: ~1.1 ms at the ~990 TFLOP/s dense bf16 peak versus
// ~0.1 ms of HBM traffic at 4.2 TB/s: compute-bound by 10x; the same holds at
// 4096^3 (0.14 ms vs 0.024 ms). tf32 has half the bf16 peak (~495 TFLOP/s).
//
// The ladder (rung names are the variant strings). Measured on the H200, bf16
// in / bf16 out, row-major A[m,k] and B[k,n], TFLOP/s at 4096^3 and 8192^3
// and the ratio to cuBLAS in the same run (kernels/bench/results/gemm_tc.md):
//   mma_sync          warp-level mma.sync (m16n8k16; m16n8k8 tf32) fed by ldmatrix
//                     from a 4-stage cp.async ring, 128x128x(64 B) block tiles,
//                     8 warps of 64x32. Takes every shape, transpose and alignment
//                     and is the fallback for what TMA cannot address.
//                     210 / 216 TFLOP/s = 0.27x / 0.29x.
//   wgmma_tma         TMA loads into 128B-swizzled shared memory, completion on
//                     mbarriers, wgmma m64n256 straight from shared memory; one
//                     warpgroup, 64x256 tiles, 5-stage ring refilled by thread 0.
//                     456 / 295 TFLOP/s = 0.58x / 0.40x (one warpgroup cannot hide
//                     its own waits; worse as K grows).
//   wgmma_ws          warp specialisation: one producer warp issues TMA into a
//                     4-stage ring, two consumer warpgroups (128x256 tiles) wait
//                     on raw mbarrier parities and release stages as soon as their
//                     wgmma group retires; setmaxnreg 40 / 232.
//                     683 / 614 TFLOP/s = 0.87x / 0.82x; 16384^3 only 0.69x in the
//                     plain row-major tile order (the grouped order below: 0.95x).
//   wgmma_persistent  the same kernel with one block per SM walking the tiles in
//                     groups of 16 tile rows (L2 reuse); the producer runs ahead
//                     into the next tile while the consumers store the last one.
//                     707 / 626 TFLOP/s = 0.90x / 0.84x; 16384^3 0.95x.
//   wgmma_cluster     2-CTA clusters (one per pair of tiles, grouped order): the
//                     two CTAs take vertically adjacent 128x256 tiles and share
//                     the B stage through TMA multicast (each loads half, both
//                     receive all), cutting the L2->SM traffic per CTA from 48 KB
//                     to 32 KB a stage; stages are released to both producers
//                     through remote mbarrier arrivals. 672 / 634 TFLOP/s =
//                     0.86x / 0.85x. The first version (persistent, with
//                     release.cluster semantics on those arrivals: a cluster-wide
//                     fence per warp per stage) measured 415 / 414 TFLOP/s
//                     (0.53x); the plain arrival fixed it.
//   wgmma_cluster_persistent  the same with as many clusters as fit at once,
//                     each walking pair tiles. 653 / 660 TFLOP/s = 0.83x / 0.89x;
//                     best at 8192^3, 16384^3 (0.98x) and 4096x14336x4096 (0.90x).
//   wgmma_splitk      wgmma_persistent over (tile, K range) units: with fewer
//                     128x256 tiles than SMs, K is cut into ranges of at least
//                     2 k-blocks (at most 64 ranges) until the units about fill
//                     one wave; each range writes fp32 sums to the workspace
//                     and one more kernel adds them up with alpha and beta
//                     (SplitKReduceKernel). Through the server's path, ratio to
//                     cuBLAS (kernels/bench/results/sweep-gemm.md, bf16):
//                     256x256x65536 0.04x -> 0.73x, 1024x1024x65536 0.30x ->
//                     0.97x, 64x4096x16384 0.25x -> 0.86x, M=1 against a
//                     4096x4096 weight 0.23x -> 0.67x; many tiles: one range,
//                     the same as wgmma_persistent.
//   wgmma_packed      for operands TMA or wgmma cannot read as they lie (rows
//                     not on 16 bytes: odd K or N in 16-bit; tf32 A transposed
//                     or B not): each such operand is first copied K-major
//                     with 16-byte rows into the workspace (PackKMajorKernel,
//                     32x32 tiles through shared memory), then wgmma_splitk's
//                     kernel runs on the copies. Through the server's path
//                     (sweep-gemm.md, run 7): odd sizes 1.32-3.1x cuBLAS
//                     (cuBLAS has no TMA kernel for such rows either; our
//                     mma_sync fallback ran 0.35-0.52x there), tf32 TN
//                     1.02-1.16x, tf32 NN 0.85x / 0.94x at 4096^3 / 8192^3
//                     (mma_sync: 0.22x).
//   epilogue and tiles (rungs 3-8; sweep-gemm.md run 7 -> run 11, own kernels
//                     alone against cuBLAS over the 155 cases: geomean 0.739x
//                     -> 0.900x): 16-bit C goes through shared memory and out
//                     in 16-byte row pieces (the fragments' 4-byte stores held
//                     small K at 0.32-0.41x: 4096x4096x16 bf16 33.5 -> 13.7 us,
//                     cuBLAS 13.4); with beta C is prefetched into L2 and read
//                     two chunks ahead of its store, from c_in where it lies
//                     (run 16: bf16 4096^3 0.74x -> 0.91x, tf32 2048^3 0.65x
//                     -> 0.79x, 8*512^3 0.30x -> 0.72x); the split-K kernel takes 128 x 256,
//                     128 x 128 or 128 x 64 tiles and its K split from a cost
//                     model (heuristics/gemm_heuristics.h): 128^3 6.9 -> 2.8
//                     us, 1024^3 16.2 -> 6.8 us (cuBLAS 2.1, 5.3); 4096^3 bf16
//                     0.91x -> 0.98x, fp16 0.91x -> 0.99x.
//   wgmma_splitk_128x128, wgmma_splitk_128x64   the split-K kernel on the
//                     named tile (tests and the sweep force each width).
//   wgmma_splitk_128x192  a 192-column tile (m64n192 wgmma, 5 stages of 40 KB)
//                     for problems that 128 x 256 tiles leave with a partial
//                     last wave (the cost model counts whole waves):
//                     2048x3072x1024 bf16 (192 tiles of 128 x 256, 1.45 waves;
//                     256 of 128 x 192, 1.94) 24.4 -> 22.0 us, cuBLAS 20.2;
//                     16384x16384x128 tf32 0.98x (H100, sweep-gemm.md run 18).
//   swap-AB           wgmma_splitk and wgmma_packed with fewer than 128 rows
//                     may compute C^T = op(B)^T op(A)^T instead, written
//                     transposed (c_trans): the wide side fills the tiles'
//                     128 rows. Thin M (1-64 tokens against a weight):
//                     16x14336x4096 bf16 39.9 -> 32.8 us (cuBLAS 30.2).
// Run-to-run spread on the H200 is about +-5% for both cuBLAS and us.
//   tf32 A from registers  wgmma reads 32-bit operands from shared memory
//                     K-major only; it takes A from registers in any layout. An
//                     M-major tf32 A (TT) is loaded by TMA in 32 x 32 blocks and
//                     read into fragments with ld.shared (kRegistersA in
//                     gemm_tc_wgmma.cuh); tf32 NN runs as C^T = B^T A^T with
//                     B^T, M-major, as that A. Every wgmma rung (but wgmma_tma
//                     for NN) now runs tf32 NN and TT in place, and wgmma_packed
//                     copies only operands TMA cannot address (and one of A and
//                     B for tf32 TN). Each stage waits for its own wgmma group
//                     before the next stage's fragment loads (ptxas serialises
//                     every wgmma otherwise). Through the server's path
//                     (sweep-gemm.md run 13 against run 11, own kernels): tf32
//                     4096^3 NN 0.85x -> 0.95x, TT 0.84x -> 0.93x, large K
//                     0.24-0.71x -> 0.91-1.33x, batches 0.61-1.04x ->
//                     1.01-1.21x; the 38 tf32 cases 15 -> 27 at >= 0.9x.
//                     tf32 NN from 8192 rows up (and with beta) still copies B:
//                     16384^3 1.00x copied against 0.92x as C^T.
// tf32 (K-major A and B): the best rung reaches 0.92-1.07x cuBLAS tf32 over the
// six shapes (344 TFLOP/s = 0.99x at 8192^3).
//
// The wgmma rungs need what TMA needs: A and B base addresses 16-byte aligned,
// row and batch strides multiples of 16 bytes, k >= 1; tf32 additionally needs
// B K-major or A K-major (not trans_a without trans_b), and wgmma_tma B
// K-major (it does not write C^T). The empty variant picks a
// wgmma rung when those hold (see DefaultRung) and mma_sync otherwise
// (wgmma_packed, which takes every layout, needs a workspace).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>

#include "gemm_addend.h"
#include "gemm_tc_common.cuh"
#include "gemm_tc_mma_sync.cuh"
#include "gemm_tc_wgmma.cuh"
#include "gpucompute/kernels/gemm.h"
#include "heuristics/gemm_heuristics.h"
#include "launch_util.h"

namespace gpucompute::kernels {
namespace {

using tc::TcParams;

enum class Rung {
  kMmaSync,
  kWgmmaTma,
  kWgmmaWs,
  kWgmmaPersistent,
  kWgmmaCluster,
  kWgmmaClusterPersistent,
  kWgmmaSplitK,
  kWgmmaPacked,
  kWgmmaSplitK128,
  kWgmmaSplitK64,
  kWgmmaSplitK32,
  kWgmmaSplitK16,
  kWgmmaSplitK192
};

constexpr const char* kRungNames[] = {"mma_sync",
                                      "wgmma_tma",
                                      "wgmma_ws",
                                      "wgmma_persistent",
                                      "wgmma_cluster",
                                      "wgmma_cluster_persistent",
                                      "wgmma_splitk",
                                      "wgmma_packed",
                                      "wgmma_splitk_128x128",
                                      "wgmma_splitk_128x64",
                                      "wgmma_splitk_128x32",
                                      "wgmma_splitk_128x16",
                                      "wgmma_splitk_128x192"};
constexpr int kNumRungs = 13;

bool ParseRung(std::string_view name, Rung* rung) {
  for (int i = 0; i < kNumRungs; ++i)
    if (name == kRungNames[i]) {
      *rung = static_cast<Rung>(i);
      return true;
    }
  return false;
}

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Checks every rung shares: types, sizes, leading dimensions, pointers.
Support CheckCommon(const GemmArgs& a) {
  const bool half_in = a.ab_type == DType::kBF16 || a.ab_type == DType::kF16;
  if (half_in) {
    if (a.c_type != a.ab_type && a.c_type != DType::kF32)
      return Support::No("C must have the input type or be fp32");
  } else {
    if (!a.allow_tf32)
      return Support::No("fp32 inputs run on the tensor cores only with allow_tf32");
    if (a.c_type != DType::kF32) return Support::No("tf32 mode writes fp32 C");
  }
  if (a.m < 0 || a.n < 0 || a.k < 0 || a.batch < 0) return Support::No("negative size");
  if (a.m > INT_MAX || a.n > INT_MAX || a.k > INT_MAX || a.batch > INT_MAX)
    return Support::No("a size exceeds 2^31 - 1");
  if (a.stride_a < 0 || a.stride_b < 0 || a.stride_c < 0 || a.stride_c_in < 0)
    return Support::No("negative stride");
  if (a.lda < std::max<int64_t>(1, a.trans_a ? a.m : a.k)) return Support::No("lda too small");
  if (a.ldb < std::max<int64_t>(1, a.trans_b ? a.k : a.n)) return Support::No("ldb too small");
  if (a.ldc < std::max<int64_t>(1, a.n)) return Support::No("ldc too small");
  const bool work = a.m > 0 && a.n > 0 && a.batch > 0;
  if (work && a.c == nullptr) return Support::No("C is null");
  if (work && a.k > 0 && (a.a == nullptr || a.b == nullptr)) return Support::No("A or B is null");
  return Support::Yes();
}

// What the TMA-fed wgmma rungs need beyond CheckCommon.
Support CheckTma(const GemmArgs& a) {
  const int64_t es = static_cast<int64_t>(DTypeSize(a.ab_type));
  if (a.k < 1) return Support::No("k == 0 leaves no operand tile for TMA");
  if (a.ab_type == DType::kF32 && a.trans_a && !a.trans_b)
    return Support::No(
        "tf32 wgmma reads B K-major (or, as C^T, A): trans_a without trans_b has neither");
  if (!Aligned(a.a, 16) || !Aligned(a.b, 16))
    return Support::No("TMA needs 16-byte aligned A and B");
  if ((a.lda * es) % 16 != 0 || (a.ldb * es) % 16 != 0)
    return Support::No("TMA needs lda and ldb to be multiples of 16 bytes");
  if (a.batch > 1 && ((a.stride_a * es) % 16 != 0 || (a.stride_b * es) % 16 != 0))
    return Support::No("TMA needs batch strides of A and B to be multiples of 16 bytes");
  return Support::Yes();
}

TcParams MakeParams(const GemmArgs& a, int bm, int bn, int group_m, bool c_trans = false) {
  const int64_t es = static_cast<int64_t>(DTypeSize(a.ab_type));
  const size_t cs = DTypeSize(a.c_type);
  TcParams p;
  p.m = static_cast<int>(a.m);
  p.n = static_cast<int>(a.n);
  p.k = static_cast<int>(a.k);
  p.batch = static_cast<int>(a.batch);
  p.a = a.a;
  p.lda = a.lda;
  p.stride_a = a.stride_a;
  p.b = a.b;
  p.ldb = a.ldb;
  p.stride_b = a.stride_b;
  p.c = a.c;
  p.ldc = a.ldc;
  p.stride_c = a.stride_c;
  const GemmAddend addend = ChooseGemmAddend(a);
  p.c_src = addend.ptr;
  p.stride_c_src = addend.stride;
  p.alpha = a.alpha;
  p.beta = a.beta;
  p.c_type = static_cast<int>(a.c_type);
  p.c_pairs = GemmCAligned(a, 2 * cs);
  p.c_vec = GemmCAligned(a, 16);
  p.c_trans = c_trans;
  p.a_vec =
      Aligned(a.a, 16) && (a.lda * es) % 16 == 0 && (a.batch <= 1 || (a.stride_a * es) % 16 == 0);
  p.b_vec =
      Aligned(a.b, 16) && (a.ldb * es) % 16 == 0 && (a.batch <= 1 || (a.stride_b * es) % 16 == 0);
  p.a_batched = a.batch > 1 && a.stride_a != 0;
  p.b_batched = a.batch > 1 && a.stride_b != 0;
  p.tiles_m = static_cast<int>((a.m + bm - 1) / bm);
  p.tiles_n = static_cast<int>((a.n + bn - 1) / bn);
  p.group_m = std::max(1, std::min(group_m, p.tiles_m));
  p.tiles = static_cast<int64_t>(p.tiles_m) * p.tiles_n * a.batch;
  return p;
}

// The tile width a split-K variant names; 0 where the plan chooses.
int RungWidth(Rung rung) {
  switch (rung) {
    case Rung::kWgmmaSplitK192:
      return 192;
    case Rung::kWgmmaSplitK128:
      return 128;
    case Rung::kWgmmaSplitK64:
      return 64;
    case Rung::kWgmmaSplitK32:
      return 32;
    case Rung::kWgmmaSplitK16:
      return 16;
    default:
      return 0;
  }
}

bool IsSplitK(Rung rung) { return rung == Rung::kWgmmaSplitK || RungWidth(rung) != 0; }

// The launch of `blocks` CTAs of 384 threads in clusters of `cluster` CTAs
// along x (config.attrs points into the object: not copyable).
struct ClusterLaunch {
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t config = {};

  ClusterLaunch(unsigned blocks, unsigned cluster, size_t smem, cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(384);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// How many clusters of 2-8 CTAs of the split-K kernel (one CTA per SM: all
// its tile configurations take ~216 KB of shared memory) the current device
// holds at once, asked once per device.
GemmClusterFit SplitKClusterFit() {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static GemmClusterFit fits[kMaxDevices];
  static bool known[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return {};
  }
  std::lock_guard<std::mutex> lock(mu);
  if (known[dev]) return fits[dev];
  using Cfg = tc::WgmmaConfig<2, 4>;
  auto* kernel = &tc::WgmmaWsKernel<__nv_bfloat16, false, true, 1, Cfg, true>;
  GemmClusterFit fit;
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           Cfg::kSmemBytes) == cudaSuccess) {
    for (int s = 2; s <= kGemmMaxClusterSplits; ++s) {
      const ClusterLaunch launch(s, s, Cfg::kSmemBytes, nullptr);
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) == cudaSuccess)
        fit.clusters[s] = clusters;
    }
  }
  (void)cudaGetLastError();
  fits[dev] = fit;
  known[dev] = true;
  return fit;
}

// The tile width, K split and orientation of the split-K kernel for `rung`
// (heuristics/gemm_heuristics.h): the width the variant names, else the
// cheapest; swap-AB only for the variants that leave the tile to the
// heuristics, never again for a problem already swapped (c_trans), and in
// tf32 only where the swapped B is K-major (A not transposed).
GemmTilePlan PlanSplitK(const GemmArgs& a, Rung rung, bool c_trans) {
  const int64_t kbk = 128 / static_cast<int64_t>(DTypeSize(a.ab_type));
  const int64_t kblocks = CeilDiv(std::max<int64_t>(a.k, 1), kbk);
  const int only_bn = RungWidth(rung);
  const bool swappable = !c_trans && (a.ab_type != DType::kF32 || !a.trans_a);
  // Thin tiles read B K-major: op(B) as it lies with trans_b, swapped op(A)^T
  // with A K-major.
  const unsigned thin =
      (a.trans_b ? kGemmThinUnswapped : 0u) | (!a.trans_a ? kGemmThinSwapped : 0u);
  const GemmClusterFit fit = SplitKClusterFit();
  return ChooseWgmmaTilePlan(a.m, a.n, kblocks, std::max<int64_t>(a.batch, 1), SmCount(), only_bn,
                             /*allow_swap=*/only_bn == 0 && swappable, &fit, thin);
}

// The problem C^T = op(B)^T op(A)^T, written into the same C transposed.
GemmArgs SwapAB(const GemmArgs& a) {
  GemmArgs s = a;
  s.m = a.n;
  s.n = a.m;
  s.a = a.b;
  s.lda = a.ldb;
  s.stride_a = a.stride_b;
  s.trans_a = !a.trans_b;
  s.b = a.a;
  s.ldb = a.lda;
  s.stride_b = a.stride_a;
  s.trans_b = !a.trans_a;
  return s;
}

// tf32 with B N-major and A K-major (NN) runs as C^T = B^T A^T: wgmma reads
// tf32 B only K-major, and takes B^T, M-major, from registers as the A side.
bool Tf32RunsTransposed(const GemmArgs& a) {
  return a.ab_type == DType::kF32 && !a.trans_a && !a.trans_b;
}

size_t SplitWorkspaceBytes(const GemmArgs& a, const GemmTilePlan& plan) {
  if (plan.splits <= 1 || plan.cluster) return 0;
  return sizeof(float) * size_t(plan.splits) * size_t(a.batch) * size_t(a.m) * size_t(a.n);
}

// --- wgmma_packed: operands TMA or wgmma cannot read, copied K-major ---------

// An operand as wgmma_packed sees it: [outer][k] K-major rows (outer = m for
// A, n for B) at `ptr` with leading dimension `ld`, one matrix per batch
// entry `stride` apart (0: shared), or transposed in memory.
struct Operand {
  const void* ptr = nullptr;
  int64_t ld = 0, stride = 0;
  bool k_major = true;
  bool batched = false;
};

Operand OperandA(const GemmArgs& a) {
  return {a.a, a.lda, a.stride_a, !a.trans_a, a.batch > 1 && a.stride_a != 0};
}
Operand OperandB(const GemmArgs& a) {
  return {a.b, a.ldb, a.stride_b, a.trans_b, a.batch > 1 && a.stride_b != 0};
}

// True when TMA can address the operand: base, rows and batch stride on 16
// bytes.
bool Addressable(const Operand& o, size_t es) {
  return Aligned(o.ptr, 16) && (o.ld * int64_t(es)) % 16 == 0 &&
         (!o.batched || (o.stride * int64_t(es)) % 16 == 0);
}

// The operands wgmma_packed copies K-major: those TMA cannot address and, in
// tf32, where the copy pays. The other layouts run as LaunchWgmma runs them
// (tf32 NN as C^T, TT with A from registers, both at ~0.9x the speed of the
// shared-memory form at 16384^3):
//   - TN (A M-major, B N-major), which no wgmma form reads: the smaller;
//   - NN with beta: B (C^T's epilogue reads C element by element: 2048^3 with
//     beta 0.51x cuBLAS as C^T, 0.65x copied, sweep-gemm.md runs 11-12);
//   - NN from kTf32CopyFrom rows (TT: columns) up, where the copy of B (A) is
//     spread over enough of C: 4096^3 NN 0.96x as C^T against 0.85x copied,
//     16384^3 0.92x against 1.03x.
inline constexpr int64_t kTf32CopyFrom = 8192;
struct Packing {
  bool a = false, b = false;
};
Packing ChoosePacking(const GemmArgs& a) {
  const size_t es = DTypeSize(a.ab_type);
  const Operand oa = OperandA(a), ob = OperandB(a);
  Packing p{!Addressable(oa, es), !Addressable(ob, es)};
  if (a.ab_type != DType::kF32) return p;
  const bool a_m = !p.a && !oa.k_major, b_n = !p.b && !ob.k_major;  // as they stay
  if (a_m && b_n) {
    const double bytes_a = double(a.m) * double(a.k) * (oa.batched ? double(a.batch) : 1.0);
    const double bytes_b = double(a.n) * double(a.k) * (ob.batched ? double(a.batch) : 1.0);
    (bytes_a <= bytes_b ? p.a : p.b) = true;
  } else if (b_n && (a.beta != 0 || a.m >= kTf32CopyFrom)) {
    p.b = true;
  } else if (a_m && a.n >= kTf32CopyFrom) {
    p.a = true;
  }
  return p;
}

// The layout wgmma_packed's kernel sees: copies are K-major.
GemmArgs PackedLayout(const GemmArgs& a) {
  const Packing pk = ChoosePacking(a);
  GemmArgs l = a;
  if (pk.a) l.trans_a = false;
  if (pk.b) l.trans_b = true;
  return l;
}

// Leading dimension of a K-major copy: k rounded up to 16 bytes.
int64_t PackedLd(int64_t k, size_t es) { return CeilDiv(k * int64_t(es), 16) * 16 / int64_t(es); }

size_t PackedBytes(const GemmArgs& a, const Operand& o, int64_t outer, bool copy) {
  const size_t es = DTypeSize(a.ab_type);
  if (!copy) return 0;
  const size_t bytes =
      size_t(outer) * size_t(PackedLd(a.k, es)) * es * size_t(o.batched ? a.batch : 1);
  return CeilDiv(int64_t(bytes), 256) * 256;  // the next region stays 256-byte aligned
}

// dst[b][o][kk] (leading dimension ld_dst, batch stride stride_dst) = element
// (o, kk) of batch entry b of the operand: src[o * ld + kk] when it is
// K-major, src[kk * ld + o] when not. 32 x 32 tiles through shared memory, so
// that both the reads and the writes are coalesced.
template <typename T, bool kKMajor>
__global__ void PackKMajorKernel(const T* src, int64_t ld_src, int64_t stride_src, T* dst,
                                 int64_t ld_dst, int64_t stride_dst, int outer, int k) {
  __shared__ T tile[32][33];
  src += blockIdx.z * stride_src;
  dst += blockIdx.z * stride_dst;
  const int o0 = blockIdx.y * 32, k0 = blockIdx.x * 32;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    if constexpr (kKMajor) {
      const int o = o0 + r, kk = k0 + threadIdx.x;
      if (o < outer && kk < k) tile[r][threadIdx.x] = src[int64_t(o) * ld_src + kk];
    } else {
      const int kk = k0 + r, o = o0 + threadIdx.x;
      if (o < outer && kk < k) tile[threadIdx.x][r] = src[int64_t(kk) * ld_src + o];
    }
  }
  __syncthreads();
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int o = o0 + r, kk = k0 + threadIdx.x;
    if (o < outer && kk < k) dst[int64_t(o) * ld_dst + kk] = tile[r][threadIdx.x];
  }
}

// With `copy`, copies the operand K-major into `dst` and points *o at the
// copy; nothing without.
template <typename T>
cudaError_t PackOperand(const GemmArgs& a, Operand* o, int64_t outer, bool copy, void* dst,
                        cudaStream_t stream) {
  if (!copy) return cudaSuccess;
  const int64_t ld = PackedLd(a.k, sizeof(T));
  const int64_t stride = o->batched ? outer * ld : 0;
  const dim3 grid(static_cast<unsigned>(CeilDiv(a.k, 32)),
                  static_cast<unsigned>(CeilDiv(outer, 32)),
                  static_cast<unsigned>(o->batched ? a.batch : 1));
  const T* src = static_cast<const T*>(o->ptr);
  T* out = static_cast<T*>(dst);
  if (o->k_major)
    PackKMajorKernel<T, true><<<grid, dim3(32, 8), 0, stream>>>(src, o->ld, o->stride, out, ld,
                                                                stride, int(outer), int(a.k));
  else
    PackKMajorKernel<T, false><<<grid, dim3(32, 8), 0, stream>>>(src, o->ld, o->stride, out, ld,
                                                                 stride, int(outer), int(a.k));
  *o = {dst, ld, stride, true, o->batched};
  return cudaGetLastError();
}

template <typename F>
cudaError_t AllowSmem(F* kernel, int bytes) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                              cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// --- rung 1 ---------------------------------------------------------------------

template <typename T, bool kTA, bool kTB>
cudaError_t LaunchMmaSyncT(const GemmArgs& a, cudaStream_t stream) {
  using Cfg = tc::MmaSyncConfig<T>;
  const TcParams p = MakeParams(a, Cfg::kBM, Cfg::kBN, 8);
  auto* kernel = &tc::MmaSyncKernel<T, kTA, kTB>;
  if (cudaError_t e = AllowSmem(kernel, Cfg::kSmemBytes); e != cudaSuccess) return e;
  const int64_t grid = std::min<int64_t>(p.tiles, INT_MAX);
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMmaSync(const GemmArgs& a, cudaStream_t stream) {
  if (a.trans_a)
    return a.trans_b ? LaunchMmaSyncT<T, true, true>(a, stream)
                     : LaunchMmaSyncT<T, true, false>(a, stream);
  return a.trans_b ? LaunchMmaSyncT<T, false, true>(a, stream)
                   : LaunchMmaSyncT<T, false, false>(a, stream);
}

// --- rungs 2-4 ------------------------------------------------------------------

PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

template <typename T>
constexpr CUtensorMapDataType TmaType() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  else if constexpr (std::is_same_v<T, __half>)
    return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  else
    return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
}

// A 3-D map (inner, outer, batch) over a row-major operand with 128B swizzle
// and zero fill outside the tensor. batch_stride 0: one matrix for all batches.
// Rows on 128 bytes are promoted to 256-byte L2 fetches; rows off 128 bytes
// are not (each 128-byte box row then straddles two lines, and the promotion
// fetched around both: 2000x3000x1000 bf16 on 128 x 192 tiles 35.9 -> 31.9
// us, 3000x5000x2000 on wgmma_ws 138.5 -> 121.8 us on an H100; rows on 128
// bytes ran the same either way).
template <typename T>
bool EncodeOperand(CUtensorMap* map, const void* ptr, int64_t inner, int64_t outer, int64_t ld,
                   int64_t batch, int64_t batch_stride, uint32_t box_inner, uint32_t box_outer) {
  auto encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const uint64_t es = sizeof(T);
  const bool batched = batch > 1 && batch_stride != 0;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer),
                              static_cast<cuuint64_t>(batched ? batch : 1)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld) * es,
                                 batched ? static_cast<cuuint64_t>(batch_stride) * es
                                         : static_cast<cuuint64_t>(ld) * es * outer};
  const cuuint32_t box[3] = {box_inner, box_outer, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, TmaType<T>(), 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                (ld * es) % 128 == 0 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                     : CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// wgmma_ws (one block per tile), wgmma_persistent and the split-K rungs on
// 128 x Cfg::kBN tiles.
template <typename T, bool kTA, bool kTB, typename Cfg>
cudaError_t LaunchWs(const GemmArgs& a, const CUtensorMap& map_a, const CUtensorMap& map_b,
                     Rung rung, void* workspace, cudaStream_t stream, bool c_trans) {
  const bool persistent = rung == Rung::kWgmmaPersistent || IsSplitK(rung);
  TcParams p = MakeParams(a, Cfg::kBM, Cfg::kBN, persistent ? 16 : 1, c_trans);
  bool cluster_split = false;
  if (IsSplitK(rung)) {
    const GemmTilePlan plan = PlanSplitK(a, rung, c_trans);
    if (plan.cluster || workspace != nullptr) {
      p.splits = plan.splits;
      p.kb_per_split = plan.kb_per_split;
      p.partials = static_cast<float*>(workspace);
      cluster_split = plan.cluster && plan.splits > 1;
    }
  }
  const int64_t units = p.tiles * p.splits;
  if (cluster_split) {
    // One CTA per unit, the ranges of a tile as one cluster (the plan made
    // sure that every cluster is resident at once); they add up in the kernel.
    auto* kernel = &tc::WgmmaWsKernel<T, kTA, kTB, 1, Cfg, true>;
    if (cudaError_t e = AllowSmem(kernel, Cfg::kSmemBytes); e != cudaSuccess) return e;
    if (units > INT_MAX) return cudaErrorInvalidValue;
    const ClusterLaunch launch(static_cast<unsigned>(units), static_cast<unsigned>(p.splits),
                               Cfg::kSmemBytes, stream);
    return cudaLaunchKernelEx(&launch.config, kernel, map_a, map_b, p);
  }
  auto* kernel = &tc::WgmmaWsKernel<T, kTA, kTB, 1, Cfg>;
  if (cudaError_t e = AllowSmem(kernel, Cfg::kSmemBytes); e != cudaSuccess) return e;
  const int64_t grid =
      persistent ? std::min<int64_t>(units, SmCount()) : std::min<int64_t>(units, INT_MAX);
  kernel<<<static_cast<unsigned>(grid), 384, Cfg::kSmemBytes, stream>>>(map_a, map_b, p);
  if (p.splits <= 1) return cudaGetLastError();
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const int64_t total = int64_t(p.batch) * p.m * p.n;
  const unsigned blocks =
      static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(total, 256), 1, 8 * int64_t(SmCount())));
  if (p.c_type == 0)
    tc::SplitKReduceKernel<float><<<blocks, 256, 0, stream>>>(p);
  else if constexpr (!std::is_same_v<T, float>)
    tc::SplitKReduceKernel<T><<<blocks, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

// Launches a wgmma rung; *encoded is false when a tensor map was refused by
// the driver (nothing launched then).
template <typename T, bool kTA, bool kTB>
cudaError_t LaunchWgmmaT(const GemmArgs& a, Rung rung, void* workspace, cudaStream_t stream,
                         bool* encoded, bool c_trans = false) {
  constexpr uint32_t kBK = 128 / sizeof(T);
  constexpr bool kTf32 = std::is_same_v<T, float>;
  if constexpr (!kTf32 || !kTA) {  // swapped, tf32 B stays K-major
    if (IsSplitK(rung) && !c_trans && PlanSplitK(a, rung, false).swap)
      return LaunchWgmmaT<T, !kTB, !kTA>(SwapAB(a), rung, workspace, stream, encoded, true);
  }
  const bool single = rung == Rung::kWgmmaTma;
  const bool cluster = rung == Rung::kWgmmaCluster || rung == Rung::kWgmmaClusterPersistent;
  const int bn = IsSplitK(rung) ? PlanSplitK(a, rung, c_trans).bn : 256;
  const uint32_t bm = single ? 64 : 128, bn_box = cluster ? 128 : bn;
  constexpr uint32_t kMBox = kTf32 ? 32 : 64;  // M-major A: 128 bytes of M by BK rows
  CUtensorMap map_a, map_b;
  *encoded =
      (kTA ? EncodeOperand<T>(&map_a, a.a, a.m, a.k, a.lda, a.batch, a.stride_a, kMBox, kMBox)
           : EncodeOperand<T>(&map_a, a.a, a.k, a.m, a.lda, a.batch, a.stride_a, kBK, bm)) &&
      (kTB ? EncodeOperand<T>(&map_b, a.b, a.k, a.n, a.ldb, a.batch, a.stride_b, kBK, bn_box)
           : EncodeOperand<T>(&map_b, a.b, a.n, a.k, a.ldb, a.batch, a.stride_b, 64, 64));
  if (!*encoded) return cudaErrorInvalidValue;

  if (single) {
    using Cfg = tc::WgmmaConfig<1, 5>;
    const TcParams p = MakeParams(a, Cfg::kBM, Cfg::kBN, 1);
    if (p.tiles > INT_MAX) return cudaErrorInvalidValue;
    auto* kernel = &tc::WgmmaTmaKernel<T, kTA, kTB>;
    if (cudaError_t e = AllowSmem(kernel, Cfg::kSmemBytes); e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(p.tiles), 128, Cfg::kSmemBytes, stream>>>(map_a, map_b, p);
    return cudaGetLastError();
  }
  using Cfg = tc::WgmmaConfig<2, 4>;
  if (cluster) {
    // Tiles are CTA pairs: 256 rows of C per cluster tile.
    const TcParams p = MakeParams(a, 2 * Cfg::kBM, Cfg::kBN, 8, c_trans);
    auto* kernel = &tc::WgmmaWsKernel<T, kTA, kTB, 2>;
    if (cudaError_t e = AllowSmem(kernel, Cfg::kSmemBytes); e != cudaSuccess) return e;
    // wgmma_cluster: one cluster per pair tile; the hardware places clusters
    // where pairs of SMs are free. wgmma_cluster_persistent: as many clusters
    // as the occupancy calculator says fit at once, each walking pair tiles.
    if (p.tiles > INT_MAX / 2) return cudaErrorInvalidValue;
    ClusterLaunch launch(static_cast<unsigned>(2 * p.tiles), 2, Cfg::kSmemBytes, stream);
    if (rung == Rung::kWgmmaClusterPersistent) {
      int clusters = 0;
      if (cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config);
          e != cudaSuccess)
        return e;
      if (clusters < 1) return cudaErrorInvalidConfiguration;
      launch.config.gridDim = dim3(static_cast<unsigned>(2 * std::min<int64_t>(p.tiles, clusters)));
    }
    return cudaLaunchKernelEx(&launch.config, kernel, map_a, map_b, p);
  }
  if (IsSplitK(rung)) {
    switch (bn) {
      case 192:
        return LaunchWs<T, kTA, kTB, tc::WgmmaConfig<2, 5, 192>>(a, map_a, map_b, rung, workspace,
                                                                 stream, c_trans);
      case 128:
        return LaunchWs<T, kTA, kTB, tc::WgmmaConfig<2, 6, 128>>(a, map_a, map_b, rung, workspace,
                                                                 stream, c_trans);
      case 64:
        return LaunchWs<T, kTA, kTB, tc::WgmmaConfig<2, 8, 64>>(a, map_a, map_b, rung, workspace,
                                                                stream, c_trans);
      case 32:
        if constexpr (kTB)
          return LaunchWs<T, kTA, kTB, tc::WgmmaConfig<2, 10, 32>>(a, map_a, map_b, rung, workspace,
                                                                   stream, c_trans);
        return cudaErrorInvalidValue;  // the plan gives thin tiles to K-major B only
      case 16:
        if constexpr (kTB)
          return LaunchWs<T, kTA, kTB, tc::WgmmaConfig<2, 11, 16>>(a, map_a, map_b, rung, workspace,
                                                                   stream, c_trans);
        return cudaErrorInvalidValue;
      default:
        break;
    }
  }
  return LaunchWs<T, kTA, kTB, Cfg>(a, map_a, map_b, rung, workspace, stream, c_trans);
}

template <typename T>
cudaError_t LaunchWgmma(const GemmArgs& a, Rung rung, void* ws, cudaStream_t stream,
                        bool* encoded) {
  if constexpr (std::is_same_v<T, float>) {
    // tf32: NT as it lies; TT with A from registers; NN as C^T = B^T A^T
    // (B^T from registers); TN is refused by CheckTma.
    if (a.trans_b)
      return a.trans_a ? LaunchWgmmaT<T, true, true>(a, rung, ws, stream, encoded)
                       : LaunchWgmmaT<T, false, true>(a, rung, ws, stream, encoded);
    return LaunchWgmmaT<T, true, true>(SwapAB(a), rung, ws, stream, encoded, true);
  } else {
    if (a.trans_a)
      return a.trans_b ? LaunchWgmmaT<T, true, true>(a, rung, ws, stream, encoded)
                       : LaunchWgmmaT<T, true, false>(a, rung, ws, stream, encoded);
    return a.trans_b ? LaunchWgmmaT<T, false, true>(a, rung, ws, stream, encoded)
                     : LaunchWgmmaT<T, false, false>(a, rung, ws, stream, encoded);
  }
}

// wgmma_packed: the operands ChoosePacking names copied K-major into the
// workspace, then wgmma_splitk's kernel on the copies and the operands read
// in place (workspace: [A copy][B copy][split-K partials]).
template <typename T>
cudaError_t LaunchPacked(const GemmArgs& a, void* workspace, cudaStream_t stream) {
  const Packing pk = ChoosePacking(a);
  Operand oa = OperandA(a), ob = OperandB(a);
  const size_t bytes_a = PackedBytes(a, oa, a.m, pk.a), bytes_b = PackedBytes(a, ob, a.n, pk.b);
  if ((bytes_a || bytes_b) && workspace == nullptr) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  if (cudaError_t e = PackOperand<T>(a, &oa, a.m, pk.a, ws, stream); e != cudaSuccess) return e;
  if (cudaError_t e = PackOperand<T>(a, &ob, a.n, pk.b, ws + bytes_a, stream); e != cudaSuccess)
    return e;
  GemmArgs packed = a;
  packed.a = oa.ptr;
  packed.lda = oa.ld;
  packed.stride_a = oa.stride;
  packed.trans_a = !oa.k_major;
  packed.b = ob.ptr;
  packed.ldb = ob.ld;
  packed.stride_b = ob.stride;
  packed.trans_b = ob.k_major;
  bool encoded = false;
  void* partials = workspace == nullptr ? nullptr : ws + bytes_a + bytes_b;
  const cudaError_t e = LaunchWgmma<T>(packed, Rung::kWgmmaSplitK, partials, stream, &encoded);
  return encoded ? e : cudaErrorInvalidValue;
}

template <typename T>
cudaError_t LaunchTyped(const GemmArgs& a, Rung rung, bool fallback, void* workspace,
                        cudaStream_t stream) {
  if (rung == Rung::kMmaSync) return LaunchMmaSync<T>(a, stream);
  if (rung == Rung::kWgmmaPacked) return LaunchPacked<T>(a, workspace, stream);
  bool encoded = false;
  const cudaError_t e = LaunchWgmma<T>(a, rung, workspace, stream, &encoded);
  if (!encoded && fallback) return LaunchMmaSync<T>(a, stream);
  return e;
}

// The empty variant's choice, from the H200 measurements in gemm_tc.md: the
// cluster rung wins once there are many waves of long-K tiles (8192^3,
// 16384^3, 4096x14336x4096); with few tiles or short K the single-CTA
// persistent rung is ahead (4096^3, 1024x8192x8192, 8192x8192x1024).
Rung DefaultRung(const GemmArgs& a) {
  if (!CheckTma(a)) return Rung::kMmaSync;
  const int64_t tiles = ((a.m + 127) / 128) * ((a.n + 255) / 256) * a.batch;
  if (tiles >= 8 * int64_t(SmCount()) && a.k >= 2048) return Rung::kWgmmaClusterPersistent;
  return Rung::kWgmmaPersistent;
}

}  // namespace

const std::vector<std::string>& GemmTcVariants() {
  static const std::vector<std::string> names(std::begin(kRungNames), std::end(kRungNames));
  return names;
}

std::string GemmTcDefaultRung(const GemmArgs& args) {
  return kRungNames[static_cast<int>(DefaultRung(args))];
}

Support CanImplementGemmTc(const GemmArgs& args, std::string_view variant) {
  Rung rung = Rung::kMmaSync;
  if (!variant.empty() && !ParseRung(variant, &rung))
    return Support::No("unknown gemm_tc variant '" + std::string(variant) + "'");
  if (Support s = CheckCommon(args); !s) return s;
  if (variant.empty() || rung == Rung::kMmaSync) return Support::Yes();
  if (args.m == 0 || args.n == 0 || args.batch == 0) return Support::Yes();
  if (rung == Rung::kWgmmaPacked) {
    if (args.k < 1) return Support::No("k == 0 leaves no operand tile for TMA");
    if (args.batch > 65535 || CeilDiv(std::max(args.m, args.n), 32) > 65535)
      return Support::No("wgmma_packed copies at most 65535 batch entries and 2^21 rows");
    return Support::Yes();
  }
  if (rung == Rung::kWgmmaTma && Tf32RunsTransposed(args))
    return Support::No("wgmma_tma does not write C^T: tf32 needs trans_a or trans_b");
  if ((rung == Rung::kWgmmaSplitK32 || rung == Rung::kWgmmaSplitK16) &&
      !(Tf32RunsTransposed(args) || args.trans_b))
    return Support::No("thin tiles read B K-major: " + std::string(variant) + " needs trans_b");
  return CheckTma(args);
}

size_t GemmTcWorkspaceBytes(const GemmArgs& args, std::string_view variant) {
  Rung rung = Rung::kMmaSync;
  if (!ParseRung(variant, &rung)) return 0;
  const bool split = IsSplitK(rung);
  const bool packed = rung == Rung::kWgmmaPacked;
  if (!split && !packed) return 0;
  if (!CanImplementGemmTc(args, variant) || args.m == 0 || args.n == 0 || args.batch == 0) return 0;
  // The plan the launch makes: of C^T for tf32 NN (SplitWorkspaceBytes is
  // symmetric in m and n, the plan's splits need not be).
  auto partials = [](const GemmArgs& l, Rung r) {
    const bool t = Tf32RunsTransposed(l);
    return SplitWorkspaceBytes(l, PlanSplitK(t ? SwapAB(l) : l, r, t));
  };
  if (split) return partials(args, rung);
  // wgmma_packed: its copies, then the split-K kernel on the copies' layout.
  return GemmTcPackedCopyBytes(args) + partials(PackedLayout(args), Rung::kWgmmaSplitK);
}

bool GemmTcAddressable(const GemmArgs& args) {
  const size_t es = DTypeSize(args.ab_type);
  return Addressable(OperandA(args), es) && Addressable(OperandB(args), es);
}

size_t GemmTcPackedCopyBytes(const GemmArgs& args) {
  if (!CanImplementGemmTc(args, "wgmma_packed") || args.m == 0 || args.n == 0 || args.batch == 0)
    return 0;
  const Packing pk = ChoosePacking(args);
  return PackedBytes(args, OperandA(args), args.m, pk.a) +
         PackedBytes(args, OperandB(args), args.n, pk.b);
}

cudaError_t LaunchGemmTc(const GemmArgs& args, std::string_view variant, void* workspace,
                         cudaStream_t stream) {
  // wgmma_splitk without its workspace runs a cluster split where its plan
  // has one (no partials to keep), else as one range (wgmma_persistent);
  // wgmma_packed needs its workspace when it copies an operand.
  if (!CanImplementGemmTc(args, variant)) return cudaErrorInvalidValue;
  if (args.m == 0 || args.n == 0 || args.batch == 0) return cudaSuccess;
  Rung rung = Rung::kMmaSync;
  const bool fallback = variant.empty();
  if (fallback)
    rung = DefaultRung(args);
  else
    ParseRung(variant, &rung);
  switch (args.ab_type) {
    case DType::kBF16:
      return LaunchTyped<__nv_bfloat16>(args, rung, fallback, workspace, stream);
    case DType::kF16:
      return LaunchTyped<__half>(args, rung, fallback, workspace, stream);
    default:
      return LaunchTyped<float>(args, rung, fallback, workspace, stream);
  }
}

}  // namespace gpucompute::kernels
