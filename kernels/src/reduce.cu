// Reduce ladder: SUM, MAX, MIN, MEAN over the middle axis of [outer, axis, inner].
//
// What must move: every input element read once plus the outputs written once,
// outer*axis*inner*size(in) + outer*inner*size(out) bytes (2^28 fp32: 1.07 GB);
// FLOPs: one combine per input element (2^28 = 0.27 GFLOP, negligible). Floor
// on the H200: streaming the input once; a pure read stream runs faster than a
// D2D copy (which mixes reads and writes), so the harness's copy ratio (a copy
// of the same byte count) reaches ~1.08 at the floor. CUB: 4510 GB/s.
//
// Versions. MEASURED on the H200, 2^28 fp32 SUM, GB/s and ratio to CUB
// DeviceReduce::Sum in the same run (MAX within 1% of SUM everywhere):
//   tree_divergent   one element per thread into shared memory, tree with the
//                    divergent tid % (2*stride) test; one kernel per level of
//                    256 (2^28 -> 2^20 -> 2^12 -> 16 -> 1): 763 (0.17).
//   tree_sequential  sequential addressing (tid < stride, stride halving): no
//                    divergence inside warps, no bank conflicts: 779 (0.17).
//                    Small step: with one element per thread the loads dominate.
//   warp_shuffle     __shfl_down_sync within each warp, shared memory only for
//                    the 8 warp results: 927 (0.21).
//   vec              16-byte loads, four in flight per thread, several elements
//                    per thread, the grid sized to the machine (each row split
//                    into chunks until 4 blocks per SM are busy); a second small
//                    kernel combines the chunk partials: 4500 (1.00).
//   single_pass      as vec, but each block writes its partial, __threadfence(),
//                    takes an atomic ticket on its segment's counter, and the last
//                    block of the segment combines the partials and resets the
//                    counter: one kernel: 4530 (1.004; MAX 1.007). Row case
//                    [16384, 16384] fp32 SUM: 4602 GB/s, 1.00x CUB segmented,
//                    1.11x copy; column case [16384 along the axis, 16384]: 4482.
// Column case (inner > 1): tree rungs run one thread per output, walking the
// axis (coalesced along inner; 569 GB/s on the column case above); vec and
// single_pass give each block a tile of 32 lanes x 16 bytes along inner and 8
// rows of threads along the axis, and split the axis across blocks when there
// are too few tiles to fill the machine.
//
// Small-shape paths (measured 2026-12-01 through the server's path by
// tests/sweep/memops_sweep.cc: device busy time, us, vendor and every rung in
// the same run; table in kernels/bench/results/sweep-memops.md):
//   row_warp     rows of up to 4096 elements, a warp per row (16-byte loads
//                where the rows allow), no workspace: [100000, 100] fp32
//                single_pass 243.4 -> 15.8 (PyTorch 31.6, copy 10.3);
//                [1000, 37] 3.9 -> 1.3 (CUB segmented 2.1); [4096, 4096]
//                bf16 13.4 -> 5.6 (CUB 8.1, copy 5.6). Its last round's
//                loads all issue before any is used, and a single row runs
//                in a block of one warp: all of [37] 1.31 -> 1.09 (CUB
//                1.02-1.09; 2026-12-02).
//   col_thread   a short reduced axis before the last: a thread per output
//                vector walking the axis, no workspace: [128, 3, 4096] fp32
//                10.3 -> 2.6 (PyTorch 6.4); [1000, 37, 7] 3.8 -> 3.1.
// Longer rows, all elements included, take "vec": a block per SM with 1, 2
// or 4 16-byte loads per thread where that covers the rows, else a round of
// four per thread on up to 4 blocks per SM; its second kernel reads the
// partials with their loads in flight (a warp per row, or a block per row
// past 128 partials). All elements, us (CUB's two kernels in the same run,
// 2026-12-02 16:25 UTC): [10^4] fp32 2.69 (2.66), [10^5] bf16 2.91 (2.81),
// [10^6] bf16 3.42 (2.85), [10^7] bf16 6.30 (6.56); 10^9 bf16 450 (PyTorch
// 472). "single_pass" takes the tickets of up to 64 segments from a
// module-wide pool that the last blocks leave at zero (no memset: [10^4]
// fp32 4.03 -> 2.94), but its last block's fence, ticket and read of the
// partials cost about as much as vec's second launch.
// Tried and dropped: the row split over the CTAs of a thread-block cluster
// of up to 16 (1024 threads each) meeting in distributed shared memory, one
// launch and no workspace: 2.9-3.1 us already on 37 elements (2.4 without
// the cluster attribute), 3.3-3.5 on 10^5, 5-7 on 10^6.
//
// Determinism: every combination order is fixed by the arguments and the SM
// count (block partials in index order, fixed shuffle trees); there are no
// floating-point atomics. MAX/MIN use max.NaN/min.NaN so NaN propagates.
#include "gpucompute/kernels/reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "heuristics/reduce_heuristics.h"
#include "launch_util.h"

namespace gpucompute::kernels {
namespace {

// ---- Operators ---------------------------------------------------------------
struct SumOp {
  __device__ static float Identity() { return 0.f; }
  __device__ static float Apply(float a, float b) { return a + b; }
};
struct MaxOp {
  __device__ static float Identity() { return __int_as_float(0xff800000u); }  // -inf
  __device__ static float Apply(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
  }
};
struct MinOp {
  __device__ static float Identity() { return __int_as_float(0x7f800000u); }  // +inf
  __device__ static float Apply(float a, float b) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
  }
};

// ---- Element access ------------------------------------------------------------
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ float LoadElem(const T* p) {
  return ToFloat(__ldg(p));
}

// The 16 / sizeof(T) elements of one 16-byte chunk, as floats.
template <typename T>
__device__ __forceinline__ void Unpack(const uint4& u, float* f) {
  if constexpr (sizeof(T) == 4) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  } else {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (std::is_same_v<T, __half>) {
        __half2 h = *reinterpret_cast<const __half2*>(&w[k]);
        float2 g = __half22float2(h);
        f[2 * k] = g.x;
        f[2 * k + 1] = g.y;
      } else {
        __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&w[k]);
        float2 g = __bfloat1622float2(h);
        f[2 * k] = g.x;
        f[2 * k + 1] = g.y;
      }
    }
  }
}

// Final value of output element i: the mean divides by the axis length.
struct OutSpec {
  void* out;
  DType type;
  bool mean;
  float axis_len;
};
__device__ __forceinline__ void StoreOut(const OutSpec& o, int64_t i, float v) {
  if (o.mean) v = v / o.axis_len;
  if (o.type == DType::kF32) static_cast<float*>(o.out)[i] = v;
  else if (o.type == DType::kF16) static_cast<__half*>(o.out)[i] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(o.out)[i] = __float2bfloat16_rn(v);
}

// ---- Block-level combination (fixed order) -----------------------------------
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <class Op>
__device__ __forceinline__ float WarpReduce(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = Op::Apply(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;  // lane 0 holds the warp's result
}

// Result valid in thread 0. Ends with a barrier, so `scratch` may be reused.
template <class Op>
__device__ __forceinline__ float BlockReduce(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpReduce<Op>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? scratch[lane] : Op::Identity();
    v = WarpReduce<Op>(v);
  }
  __syncthreads();
  return v;
}

// ---- Rungs 1-3: one element per thread, one pass per level of 256 -------------
// Pass: rows of `len` elements -> rows of ceil(len / 256) partials (or, when
// that is 1, the outputs).
struct TreePassParams {
  const void* in;
  int64_t rows, len, parts;
  float* partials;  // rows * parts fp32, or null on the final pass
  OutSpec out;
};

enum class TreeKind { kDivergent = 1, kSequential = 2, kShuffle = 3 };

template <class Op, typename T, TreeKind kKind>
__global__ void __launch_bounds__(kThreads) TreePassKernel(TreePassParams p) {
  __shared__ float sdata[kThreads];
  const T* in = static_cast<const T*>(p.in);
  const int tid = threadIdx.x;
  const int64_t blocks = p.rows * p.parts;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t row = b / p.parts, part = b % p.parts;
    const int64_t idx = part * kThreads + tid;
    float v = idx < p.len ? LoadElem(in + row * p.len + idx) : Op::Identity();
    if constexpr (kKind == TreeKind::kDivergent) {
      sdata[tid] = v;
      __syncthreads();
      for (int s = 1; s < kThreads; s *= 2) {
        if (tid % (2 * s) == 0) sdata[tid] = Op::Apply(sdata[tid], sdata[tid + s]);
        __syncthreads();
      }
      v = sdata[0];
    } else if constexpr (kKind == TreeKind::kSequential) {
      sdata[tid] = v;
      __syncthreads();
      for (int s = kThreads / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] = Op::Apply(sdata[tid], sdata[tid + s]);
        __syncthreads();
      }
      v = sdata[0];
    } else {
      v = BlockReduce<Op>(v, sdata);
    }
    if (tid == 0) {
      if (p.partials) p.partials[b] = v;
      else StoreOut(p.out, row, v);
    }
    __syncthreads();
  }
}

// Column case of the tree rungs: one thread per output, walking the axis.
struct ColSimpleParams {
  const void* in;
  int64_t outer, axis, inner;
  OutSpec out;
};

template <class Op, typename T>
__global__ void __launch_bounds__(kThreads) ColSimpleKernel(ColSimpleParams p) {
  const T* in = static_cast<const T*>(p.in);
  const int64_t n = p.outer * p.inner;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t oi = o / p.inner, i = o % p.inner;
    const T* src = in + oi * p.axis * p.inner + i;
    float v = Op::Identity();
#pragma unroll 4
    for (int64_t a = 0; a < p.axis; ++a) v = Op::Apply(v, LoadElem(src + a * p.inner));
    StoreOut(p.out, o, v);
  }
}

// ---- Tickets of single_pass -------------------------------------------------------
// A launch with few segments (all elements, a few rows or column tiles) takes
// its tickets from this module-wide pool instead of the workspace: the pool is
// zero when the module loads, and the last block of each segment puts its
// ticket back to zero, so no clearing pass runs (a memset costs ~1 us of
// device time, as much as the kernel on 10^4..10^6 elements). Consecutive
// launches take consecutive windows of the pool (TakeTicketSlots), so a
// window is handed out again only after kTicketPoolSlots / segments other
// launches (16383 at the most segments a launch takes from it): at most that
// many such launches may be in flight on a device at once. More segments
// than kTicketPoolMaxSegments: counters in the workspace, cleared first.
constexpr int64_t kTicketPoolSlots = int64_t(1) << 20;
constexpr int64_t kTicketPoolMaxSegments = 64;
__device__ unsigned g_ticket_pool[kTicketPoolSlots];

// Op over v[first], v[first + stride], ... below n (partials other blocks
// wrote, read through L2): rounds of four loads, each round's loads issued
// before any is used (a serial chain of loads costs one L2 latency each:
// 245 partials read by one warp cost 0.3 us of a 3.8 us reduction).
template <class Op>
__device__ __forceinline__ float StridedValue(const float* v, int64_t n, int64_t first,
                                              int64_t stride) {
  constexpr int kUnroll = 4;
  float acc[kUnroll];
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) acc[j] = Op::Identity();
  for (int64_t k = first; k < n; k += kUnroll * stride) {
    float f[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j)
      f[j] = k + j * stride < n ? __ldcg(v + k + j * stride) : Op::Identity();
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) acc[j] = Op::Apply(acc[j], f[j]);
  }
  return Op::Apply(Op::Apply(acc[0], acc[1]), Op::Apply(acc[2], acc[3]));
}

// ---- Rungs 4-5, row case -------------------------------------------------------
// Work item (row, s): elements [s * chunk, min(axis, (s + 1) * chunk)) of a row.
// A scalar head up to the first 16-byte boundary, 16-byte chunks, a scalar tail.
struct RowVecParams {
  const void* in;
  int64_t outer, axis, split, chunk;
  float* partials;     // outer * split, when split > 1
  unsigned* counters;  // outer tickets, when single_pass and split > 1: in the
                       // workspace, or null for g_ticket_pool + pool_slot
  int64_t pool_slot;
  bool single_pass;
  OutSpec out;
};

// 16-byte loads each thread of a row slice keeps in flight.
constexpr int kRowVecUnroll = 4;

// This thread's share of op over elements [lo, hi) of the row at `base`, for
// a block of kThreads threads: a scalar head up to the first 16-byte boundary,
// 16-byte chunks (kRowVecUnroll in flight per thread), a scalar tail. The
// block's threads' values combined give the slice's result.
template <class Op, typename T>
__device__ __forceinline__ float RowSliceThreadValue(const T* base, int64_t lo, int64_t hi) {
  constexpr int V = 16 / int(sizeof(T));
  constexpr int kUnroll = kRowVecUnroll;
  const int tid = threadIdx.x;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(base + lo);
  const int64_t head = std::min<int64_t>(((16 - addr % 16) % 16) / sizeof(T), hi - lo);
  const int64_t a0 = lo + head;
  const int64_t nvec = (hi - a0) / V;
  const int64_t a1 = a0 + nvec * V;
  const uint4* vp = reinterpret_cast<const uint4*>(base + a0);

  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = Op::Identity();
  int64_t i = tid;
  for (; i + (kUnroll - 1) * kThreads < nvec; i += kUnroll * kThreads) {
    uint4 u[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) u[j] = __ldg(vp + i + j * kThreads);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      float f[V];
      Unpack<T>(u[j], f);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = Op::Apply(acc[k], f[k]);
    }
  }
  // The last round: every load issued before any is used.
  {
    uint4 u[kUnroll - 1] = {};
#pragma unroll
    for (int j = 0; j < kUnroll - 1; ++j)
      if (i + j * kThreads < nvec) u[j] = __ldg(vp + i + j * kThreads);
#pragma unroll
    for (int j = 0; j < kUnroll - 1; ++j)
      if (i + j * kThreads < nvec) {
        float f[V];
        Unpack<T>(u[j], f);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = Op::Apply(acc[k], f[k]);
      }
  }
  if (tid < head) acc[0] = Op::Apply(acc[0], LoadElem(base + lo + tid));
  if (tid < hi - a1) acc[1] = Op::Apply(acc[1], LoadElem(base + a1 + tid));
  float v = acc[0];
#pragma unroll
  for (int k = 1; k < V; ++k) v = Op::Apply(v, acc[k]);
  return v;
}

template <class Op, typename T>
__global__ void __launch_bounds__(kThreads) RowVecKernel(RowVecParams p) {
  __shared__ float scratch[kWarps];
  __shared__ bool is_last;
  const T* in = static_cast<const T*>(p.in);
  const int tid = threadIdx.x;
  const int64_t items = p.outer * p.split;
  for (int64_t b = blockIdx.x; b < items; b += gridDim.x) {
    const int64_t row = b / p.split, s = b % p.split;
    const int64_t lo = s * p.chunk, hi = std::min(p.axis, lo + p.chunk);
    float v = RowSliceThreadValue<Op, T>(in + row * p.axis, lo, hi);
    v = BlockReduce<Op>(v, scratch);

    if (p.split == 1) {
      if (tid == 0) StoreOut(p.out, row, v);
      continue;
    }
    if (tid == 0) p.partials[b] = v;
    if (!p.single_pass) continue;
    unsigned* tickets = p.counters ? p.counters : g_ticket_pool + p.pool_slot;
    if (tid == 0) {
      __threadfence();  // the partial is visible before the ticket is taken
      is_last = atomicAdd(tickets + row, 1u) == unsigned(p.split - 1);
    }
    __syncthreads();
    if (is_last) {
      __threadfence();
      float w = Op::Identity();
      for (int64_t k = tid; k < p.split; k += kThreads)
        w = Op::Apply(w, __ldcg(p.partials + row * p.split + k));
      w = BlockReduce<Op>(w, scratch);
      if (tid == 0) {
        StoreOut(p.out, row, w);
        tickets[row] = 0;  // ready for the next launch
      }
    }
    __syncthreads();
  }
}

// Second kernel of "vec", row case, over each row's `split` partials: a warp
// per row, or (kBlockPerRow, for long splits) a block per row.
struct RowFinalizeParams {
  const float* partials;
  int64_t outer, split;
  OutSpec out;
};

// Splits longer than this are combined by a block per row.
constexpr int64_t kFinalizeWarpMaxSplit = 128;

template <class Op, bool kBlockPerRow>
__global__ void __launch_bounds__(kThreads) RowFinalizeKernel(RowFinalizeParams p) {
  if constexpr (kBlockPerRow) {
    __shared__ float scratch[kWarps];
    for (int64_t row = blockIdx.x; row < p.outer; row += gridDim.x) {
      float w = StridedValue<Op>(p.partials + row * p.split, p.split, threadIdx.x, kThreads);
      w = BlockReduce<Op>(w, scratch);
      if (threadIdx.x == 0) StoreOut(p.out, row, w);
    }
  } else {
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * kWarps;
    for (int64_t row = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32; row < p.outer;
         row += warps) {
      float w = WarpReduce<Op>(StridedValue<Op>(p.partials + row * p.split, p.split, lane, 32));
      if (lane == 0) StoreOut(p.out, row, w);
    }
  }
}

// ---- Small rows: one warp per row ---------------------------------------------
// Rows short enough that a block per row would leave most of its threads idle
// ([1000, 37] and the like): a warp owns a row, lanes read consecutive elements
// (coalesced, any alignment), four loads in flight per lane, a shuffle tree;
// one launch, no workspace.
struct RowWarpParams {
  const void* in;
  int64_t outer, axis;
  OutSpec out;
};

template <class Op, typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) RowWarpKernel(RowWarpParams p) {
  constexpr int kUnroll = 4;
  constexpr int V = 16 / int(sizeof(T));
  const T* in = static_cast<const T*>(p.in);
  const int lane = threadIdx.x % 32;
  const int64_t block_warps = blockDim.x / 32;
  const int64_t warps = int64_t(gridDim.x) * block_warps;
  for (int64_t row = blockIdx.x * block_warps + threadIdx.x / 32; row < p.outer; row += warps) {
    const T* base = in + row * p.axis;
    float acc[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) acc[k] = Op::Identity();
    if constexpr (kVec) {  // rows of whole, aligned 16-byte vectors
      const uint4* vp = reinterpret_cast<const uint4*>(base);
      const int64_t nvec = p.axis / V;
      int64_t j = lane;
      for (; j + 32 * (kUnroll - 1) < nvec; j += 32 * kUnroll) {
        uint4 u[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) u[k] = __ldg(vp + j + 32 * k);
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          float f[V];
          Unpack<T>(u[k], f);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[k] = Op::Apply(acc[k], f[e]);
        }
      }
      // The last round: its loads all issued before any is used.
      uint4 u[kUnroll - 1] = {};
#pragma unroll
      for (int k = 0; k < kUnroll - 1; ++k)
        if (j + 32 * k < nvec) u[k] = __ldg(vp + j + 32 * k);
#pragma unroll
      for (int k = 0; k < kUnroll - 1; ++k)
        if (j + 32 * k < nvec) {
          float f[V];
          Unpack<T>(u[k], f);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[k] = Op::Apply(acc[k], f[e]);
        }
    } else {
      int64_t j = lane;
      for (; j + 32 * (kUnroll - 1) < p.axis; j += 32 * kUnroll) {
        float f[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) f[k] = LoadElem(base + j + 32 * k);
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) acc[k] = Op::Apply(acc[k], f[k]);
      }
      float f[kUnroll - 1];
#pragma unroll
      for (int k = 0; k < kUnroll - 1; ++k)
        f[k] = j + 32 * k < p.axis ? LoadElem(base + j + 32 * k) : Op::Identity();
#pragma unroll
      for (int k = 0; k < kUnroll - 1; ++k) acc[k] = Op::Apply(acc[k], f[k]);
    }
    float v = Op::Apply(Op::Apply(acc[0], acc[1]), Op::Apply(acc[2], acc[3]));
    v = WarpReduce<Op>(v);
    if (lane == 0) StoreOut(p.out, row, v);
  }
}

// ---- Short axis, columns: one thread per output vector ---------------------------
// Few rows along the axis ([128, 3, 4096], [1000, 37, 7]): a block per tile
// would leave most of its rows of threads idle. A thread owns kV consecutive
// outputs (a 16-byte vector along inner where inner and the pointer allow,
// else one) and walks the axis with four loads in flight; one launch, no
// workspace.
template <class Op, typename T, int kV>
__global__ void __launch_bounds__(kThreads) ColThreadKernel(ColSimpleParams p) {
  constexpr int kUnroll = 4;
  const T* in = static_cast<const T*>(p.in);
  const int64_t per_row = p.inner / kV;
  const int64_t n = p.outer * per_row;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t oi = t / per_row, iv = t - oi * per_row;
    const T* src = in + oi * p.axis * p.inner + iv * kV;
    float acc[kV];
#pragma unroll
    for (int e = 0; e < kV; ++e) acc[e] = Op::Identity();
    int64_t a = 0;
    for (; a + kUnroll - 1 < p.axis; a += kUnroll) {
      if constexpr (kV > 1) {
        uint4 u[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) u[k] = __ldg(reinterpret_cast<const uint4*>(src + (a + k) * p.inner));
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          float f[kV];
          Unpack<T>(u[k], f);
#pragma unroll
          for (int e = 0; e < kV; ++e) acc[e] = Op::Apply(acc[e], f[e]);
        }
      } else {
        float f[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) f[k] = LoadElem(src + (a + k) * p.inner);
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) acc[0] = Op::Apply(acc[0], f[k]);
      }
    }
    for (; a < p.axis; ++a) {
      if constexpr (kV > 1) {
        float f[kV];
        Unpack<T>(__ldg(reinterpret_cast<const uint4*>(src + a * p.inner)), f);
#pragma unroll
        for (int e = 0; e < kV; ++e) acc[e] = Op::Apply(acc[e], f[e]);
      } else {
        acc[0] = Op::Apply(acc[0], LoadElem(src + a * p.inner));
      }
    }
#pragma unroll
    for (int e = 0; e < kV; ++e) StoreOut(p.out, oi * p.inner + iv * kV + e, acc[e]);
  }
}

// ---- Rungs 4-5, column case ----------------------------------------------------
// Tile: 32 lanes x V elements along inner (kV = 16 / size when inner and the
// pointer allow 16-byte access, else 1), 8 rows of threads along the axis.
// Work item (outer index, column tile, axis split s).
struct ColVecParams {
  const void* in;
  int64_t outer, axis, inner;
  int64_t col_tiles, split, rows_per_split;
  float* partials;     // split * outer * inner, when split > 1
  unsigned* counters;  // outer * col_tiles tickets, when single_pass and split > 1:
                       // in the workspace, or null for g_ticket_pool + pool_slot
  int64_t pool_slot;
  bool single_pass;
  OutSpec out;
};

template <class Op, typename T, int kV>
__global__ void __launch_bounds__(kThreads) ColVecKernel(ColVecParams p) {
  constexpr int kRowsY = kThreads / 32;  // threads along the axis
  constexpr int kTileW = 32 * kV;        // outputs per tile
  constexpr int kUnroll = 4;
  static_assert(kTileW <= kThreads, "one thread per output in the combine");
  __shared__ float red[kRowsY][kTileW];
  __shared__ bool is_last;
  const T* in = static_cast<const T*>(p.in);
  const int tid = threadIdx.x, lane = tid % 32, y = tid / 32;
  const int64_t n_out = p.outer * p.inner;
  const int64_t items = p.outer * p.col_tiles * p.split;
  for (int64_t b = blockIdx.x; b < items; b += gridDim.x) {
    const int64_t s = b % p.split, tile = b / p.split;
    const int64_t ct = tile % p.col_tiles, oi = tile / p.col_tiles;
    const int64_t col0 = ct * kTileW + lane * kV;
    const int64_t lo = s * p.rows_per_split, hi = std::min(p.axis, lo + p.rows_per_split);
    float acc[kV];
#pragma unroll
    for (int k = 0; k < kV; ++k) acc[k] = Op::Identity();
    if (col0 < p.inner) {
      const T* src = in + oi * p.axis * p.inner + col0;
      int64_t a = lo + y;
      for (; a + (kUnroll - 1) * kRowsY < hi; a += kUnroll * kRowsY) {
        if constexpr (kV > 1) {
          uint4 u[kUnroll];
#pragma unroll
          for (int j = 0; j < kUnroll; ++j)
            u[j] = __ldg(reinterpret_cast<const uint4*>(src + (a + j * kRowsY) * p.inner));
#pragma unroll
          for (int j = 0; j < kUnroll; ++j) {
            float f[kV];
            Unpack<T>(u[j], f);
#pragma unroll
            for (int k = 0; k < kV; ++k) acc[k] = Op::Apply(acc[k], f[k]);
          }
        } else {
          float f[kUnroll];
#pragma unroll
          for (int j = 0; j < kUnroll; ++j) f[j] = LoadElem(src + (a + j * kRowsY) * p.inner);
#pragma unroll
          for (int j = 0; j < kUnroll; ++j) acc[0] = Op::Apply(acc[0], f[j]);
        }
      }
      for (; a < hi; a += kRowsY) {
        if constexpr (kV > 1) {
          float f[kV];
          Unpack<T>(__ldg(reinterpret_cast<const uint4*>(src + a * p.inner)), f);
#pragma unroll
          for (int k = 0; k < kV; ++k) acc[k] = Op::Apply(acc[k], f[k]);
        } else {
          acc[0] = Op::Apply(acc[0], LoadElem(src + a * p.inner));
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kV; ++k) red[y][lane * kV + k] = acc[k];
    __syncthreads();
    const int64_t col = ct * kTileW + tid;
    const bool has_out = tid < kTileW && col < p.inner;
    const int64_t o = oi * p.inner + col;
    if (has_out) {
      float v = red[0][tid];
#pragma unroll
      for (int r = 1; r < kRowsY; ++r) v = Op::Apply(v, red[r][tid]);
      if (p.split == 1) StoreOut(p.out, o, v);
      else p.partials[s * n_out + o] = v;
    }
    if (p.split > 1 && p.single_pass) {
      __threadfence();  // each thread's partial is visible before the ticket
      __syncthreads();
      unsigned* tickets = p.counters ? p.counters : g_ticket_pool + p.pool_slot;
      if (tid == 0) is_last = atomicAdd(tickets + tile, 1u) == unsigned(p.split - 1);
      __syncthreads();
      if (is_last) {
        __threadfence();
        if (has_out) {
          float w = __ldcg(p.partials + o);
          for (int64_t k = 1; k < p.split; ++k) w = Op::Apply(w, __ldcg(p.partials + k * n_out + o));
          StoreOut(p.out, o, w);
        }
        if (tid == 0) tickets[tile] = 0;  // ready for the next launch
      }
    }
    __syncthreads();
  }
}

// Second kernel of "vec", column case: one thread per output over the splits.
struct ColFinalizeParams {
  const float* partials;
  int64_t n_out, split;
  OutSpec out;
};

template <class Op>
__global__ void __launch_bounds__(kThreads) ColFinalizeKernel(ColFinalizeParams p) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < p.n_out;
       o += int64_t(gridDim.x) * blockDim.x) {
    float w = p.partials[o];
    for (int64_t k = 1; k < p.split; ++k) w = Op::Apply(w, p.partials[k * p.n_out + o]);
    StoreOut(p.out, o, w);
  }
}

// ---- Host side -------------------------------------------------------------------
enum class Rung {
  kDivergent, kSequential, kShuffle, kVec, kSinglePass, kRowWarp, kColThread, kUnknown
};

Rung ParseRung(std::string_view v) {
  if (v == "single_pass") return Rung::kSinglePass;
  if (v == "row_warp") return Rung::kRowWarp;
  if (v == "col_thread") return Rung::kColThread;
  if (v == "tree_divergent") return Rung::kDivergent;
  if (v == "tree_sequential") return Rung::kSequential;
  if (v == "warp_shuffle") return Rung::kShuffle;
  if (v == "vec") return Rung::kVec;
  return Rung::kUnknown;
}

// Blocks of kThreads the vector rungs aim to keep busy per SM.
constexpr int kBlocksPerSm = 4;
// Fewest elements per split of a row: one round of kRowVecUnroll 16-byte loads
// per thread (4096 fp32, 8192 16-bit elements), so a split row's blocks each
// wait on memory once ([10^5] fp32: 25 blocks of 4096 instead of 13 of 7744
// with a second round of loads: 3.20 -> 3.14 us of device time).
int64_t MinRowChunk(DType t) { return int64_t(kThreads) * kRowVecUnroll * int64_t(16 / DTypeSize(t)); }
// Fewest axis rows per split (column case).
constexpr int64_t kMinColRows = 64;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }
bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
unsigned GridFor(int64_t blocks) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(blocks, INT_MAX)));
}

int TargetBlocks() { return SmCount() * kBlocksPerSm; }

// Everything the launch decides from the arguments, shared by the workspace
// query and the launch so the two always agree.
struct Plan {
  Rung rung = Rung::kUnknown;
  bool column = false;
  // Tree rungs, row case: lengths of the first two partial levels per row.
  int64_t parts1 = 0, parts2 = 0;
  // Vector rungs.
  int vec = 1;  // column case: elements per lane (16 / size or 1)
  int64_t split = 1, chunk = 0, col_tiles = 0;
  int64_t segments = 0;  // counters needed (single_pass, split > 1)
  bool pool_tickets = false;  // they come from g_ticket_pool, not the workspace
  int64_t partial_floats = 0;
  size_t counter_bytes = 0;
  size_t workspace = 0;
};

Plan MakePlan(const ReduceArgs& a, Rung rung) {
  Plan p;
  p.rung = rung;
  p.column = a.inner > 1;
  const int64_t n_out = a.outer * a.inner;
  if (n_out == 0 || rung == Rung::kRowWarp || rung == Rung::kColThread) return p;
  if (rung == Rung::kDivergent || rung == Rung::kSequential || rung == Rung::kShuffle) {
    if (p.column) return p;
    p.parts1 = CeilDiv(a.axis, kThreads);
    if (p.parts1 > 1) {
      const int64_t parts2 = CeilDiv(p.parts1, kThreads);
      p.parts2 = parts2 > 1 ? parts2 : 0;
      p.partial_floats = a.outer * (p.parts1 + p.parts2);
    }
    p.workspace = size_t(p.partial_floats) * sizeof(float);
    return p;
  }
  const int64_t target = TargetBlocks();
  if (!p.column) {
    // As many blocks as fit one per SM, each with the fewest 16-byte loads
    // per thread (1, 2 or kRowVecUnroll) that gets there; past that, a
    // round of kRowVecUnroll per thread, up to `target` blocks. Measured on
    // all elements (us, 1, 2 and 4 loads per thread; CUB in the same run):
    // 10^5 bf16 2.98 (49 blocks) / 3.14 / 3.42 (13), CUB 2.82; 3 x 10^5
    // bf16 3.42 (147) / 3.20 (74) / 3.52 (37), CUB 2.79; 10^6 bf16 4.35
    // (489) / 3.74 / 3.39 (123), CUB 2.88.
    const int64_t per_load = MinRowChunk(a.in_type) / kRowVecUnroll;
    int64_t split = 0;
    for (int64_t loads = 1; loads <= kRowVecUnroll && split == 0; loads *= 2)
      if (a.outer * CeilDiv(a.axis, per_load * loads) <= SmCount())
        split = CeilDiv(a.axis, per_load * loads);
    if (split == 0 && a.outer < target)
      split = std::min(CeilDiv(target, a.outer), CeilDiv(a.axis, MinRowChunk(a.in_type)));
    split = std::max<int64_t>(split, 1);
    p.chunk = CeilDiv(CeilDiv(a.axis, split), 64) * 64;
    p.split = CeilDiv(a.axis, p.chunk);
    p.segments = a.outer;
  } else {
    const size_t es = DTypeSize(a.in_type);
    const int v = int(16 / es);
    p.vec = (a.inner % v == 0 && Aligned(a.in, 16)) ? v : 1;
    p.col_tiles = CeilDiv(a.inner, 32 * p.vec);
    const int64_t tiles = a.outer * p.col_tiles;
    int64_t split = 1;
    if (tiles < target) split = std::min(CeilDiv(target, tiles), CeilDiv(a.axis, kMinColRows));
    split = std::max<int64_t>(split, 1);
    p.chunk = CeilDiv(a.axis, split);
    p.split = CeilDiv(a.axis, p.chunk);
    p.segments = tiles;
  }
  if (p.split > 1) {
    p.partial_floats = n_out * p.split;
    p.pool_tickets = rung == Rung::kSinglePass && p.segments <= kTicketPoolMaxSegments;
    if (rung == Rung::kSinglePass && !p.pool_tickets)
      p.counter_bytes = AlignUp(size_t(p.segments) * sizeof(unsigned));
  }
  p.workspace = p.counter_bytes + size_t(p.partial_floats) * sizeof(float);
  return p;
}

// The rung an empty variant runs: heuristics/reduce_heuristics.h decides.
Rung Resolve(const ReduceArgs& a, std::string_view variant) {
  if (!variant.empty()) return ParseRung(variant);
  ReduceShape shape;
  shape.outer = a.outer;
  shape.axis = a.axis;
  shape.inner = a.inner;
  shape.in_type = a.in_type;
  return ParseRung(ChooseReduce(shape, SmCount()));
}

const char* RungName(Rung r) {
  switch (r) {
    case Rung::kDivergent: return "tree_divergent";
    case Rung::kSequential: return "tree_sequential";
    case Rung::kShuffle: return "warp_shuffle";
    case Rung::kVec: return "vec";
    case Rung::kSinglePass: return "single_pass";
    case Rung::kRowWarp: return "row_warp";
    case Rung::kColThread: return "col_thread";
    case Rung::kUnknown: break;
  }
  return "";
}

Support Check(const ReduceArgs& a, Rung rung) {
  if (rung == Rung::kUnknown) return Support::No("unknown reduce variant");
  if (!ValidDType(a.in_type) || !ValidDType(a.out_type)) return Support::No("unsupported dtype");
  if (a.op != ReduceOp::kSum && a.op != ReduceOp::kMax && a.op != ReduceOp::kMin &&
      a.op != ReduceOp::kMean)
    return Support::No("unknown reduce op");
  if (a.outer < 0 || a.axis < 0 || a.inner < 0) return Support::No("negative extent");
  if (a.outer == 0 || a.inner == 0) return Support::Yes();
  if (a.axis == 0) return Support::No("empty reduction axis");
  if (a.in == nullptr || a.out == nullptr) return Support::No("null pointer");
  if (!Aligned(a.in, DTypeSize(a.in_type)) || !Aligned(a.out, DTypeSize(a.out_type)))
    return Support::No("pointers must be aligned to their element sizes");
  if (rung == Rung::kRowWarp && a.inner != 1)
    return Support::No("row_warp reduces rows only (the last axis)");
  if (rung == Rung::kColThread && a.inner == 1)
    return Support::No("col_thread reduces columns only (an axis before the last)");
  return Support::Yes();
}

// Calls f(Op{}, T{}) with the operator and input element type of `a`.
template <typename F>
cudaError_t Dispatch(const ReduceArgs& a, F&& f) {
  auto by_type = [&](auto op) -> cudaError_t {
    switch (a.in_type) {
      case DType::kF32: return f(op, float{});
      case DType::kF16: return f(op, __half{});
      case DType::kBF16: return f(op, __nv_bfloat16{});
    }
    return cudaErrorInvalidValue;
  };
  switch (a.op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return by_type(SumOp{});
    case ReduceOp::kMax: return by_type(MaxOp{});
    case ReduceOp::kMin: return by_type(MinOp{});
  }
  return cudaErrorInvalidValue;
}

// The first of `n` consecutive slots of g_ticket_pool (n at most
// kTicketPoolMaxSegments) for one launch; see g_ticket_pool.
int64_t TakeTicketSlots(int64_t n) {
  static std::atomic<uint64_t> next{0};
  const uint64_t first = next.fetch_add(uint64_t(n), std::memory_order_relaxed);
  return int64_t(first % uint64_t(kTicketPoolSlots - kTicketPoolMaxSegments));
}

template <class Op, typename T>
cudaError_t LaunchTreePasses(const ReduceArgs& a, const Plan& plan, const OutSpec& out,
                             void* workspace, cudaStream_t s) {
  auto launch = [&](auto t, const TreePassParams& p) {
    using U = decltype(t);
    const unsigned grid = GridFor(p.rows * p.parts);
    switch (plan.rung) {
      case Rung::kDivergent:
        TreePassKernel<Op, U, TreeKind::kDivergent><<<grid, kThreads, 0, s>>>(p);
        break;
      case Rung::kSequential:
        TreePassKernel<Op, U, TreeKind::kSequential><<<grid, kThreads, 0, s>>>(p);
        break;
      default:
        TreePassKernel<Op, U, TreeKind::kShuffle><<<grid, kThreads, 0, s>>>(p);
        break;
    }
    return cudaGetLastError();
  };
  float* buf[2] = {static_cast<float*>(workspace),
                   static_cast<float*>(workspace) + a.outer * plan.parts1};
  TreePassParams p{a.in, a.outer, a.axis, CeilDiv(a.axis, kThreads), nullptr, out};
  p.partials = p.parts > 1 ? buf[0] : nullptr;
  cudaError_t err = launch(T{}, p);
  for (int level = 1; err == cudaSuccess && p.partials != nullptr; ++level) {
    TreePassParams q{p.partials, a.outer, p.parts, CeilDiv(p.parts, kThreads), nullptr, out};
    q.partials = q.parts > 1 ? buf[level % 2] : nullptr;
    err = launch(float{}, q);
    p = q;
  }
  return err;
}

}  // namespace

const std::vector<std::string>& ReduceVariants() {
  static const std::vector<std::string> v = {"tree_divergent", "tree_sequential", "warp_shuffle",
                                             "vec", "single_pass", "row_warp", "col_thread"};
  return v;
}

Support CanImplementReduce(const ReduceArgs& args, std::string_view variant) {
  return Check(args, Resolve(args, variant));
}

std::string ReduceVariantName(const ReduceArgs& args, std::string_view variant) {
  const Rung rung = Resolve(args, variant);
  if (!Check(args, rung)) return {};
  return RungName(rung);
}

size_t ReduceWorkspaceBytes(const ReduceArgs& args, std::string_view variant) {
  const Rung rung = Resolve(args, variant);
  if (!Check(args, rung)) return 0;
  return MakePlan(args, rung).workspace;
}

cudaError_t LaunchReduce(const ReduceArgs& args, std::string_view variant, void* workspace,
                         cudaStream_t stream) {
  const Rung rung = Resolve(args, variant);
  if (!Check(args, rung)) return cudaErrorInvalidValue;
  if (args.outer == 0 || args.inner == 0) return cudaSuccess;
  const Plan plan = MakePlan(args, rung);
  if (plan.workspace > 0 && (workspace == nullptr || !Aligned(workspace, kAlign)))
    return cudaErrorInvalidValue;
  const OutSpec out{args.out, args.out_type, args.op == ReduceOp::kMean, float(args.axis)};
  unsigned* counters = plan.pool_tickets ? nullptr : static_cast<unsigned*>(workspace);
  const int64_t pool_slot = plan.pool_tickets ? TakeTicketSlots(plan.segments) : 0;
  float* partials =
      reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.counter_bytes);
  const bool single = rung == Rung::kSinglePass;
  if (plan.counter_bytes > 0) {
    const cudaError_t err = cudaMemsetAsync(counters, 0, plan.counter_bytes, stream);
    if (err != cudaSuccess) return err;
  }

  return Dispatch(args, [&](auto op, auto t) -> cudaError_t {
    using Op = decltype(op);
    using T = decltype(t);
    if (rung == Rung::kRowWarp) {
      RowWarpParams p{args.in, args.outer, args.axis, out};
      const int64_t blocks = std::min<int64_t>(CeilDiv(args.outer, kWarps), int64_t(SmCount()) * 16);
      // Fewer rows than a block's warps (all elements of a small tensor): a
      // block of just those warps.
      const unsigned threads = unsigned(32 * std::min<int64_t>(args.outer, kWarps));
      const bool vec = Aligned(args.in, 16) && (args.axis * int64_t(sizeof(T))) % 16 == 0;
      if (vec)
        RowWarpKernel<Op, T, true><<<GridFor(blocks), threads, 0, stream>>>(p);
      else
        RowWarpKernel<Op, T, false><<<GridFor(blocks), threads, 0, stream>>>(p);
      return cudaGetLastError();
    }
    if (rung == Rung::kColThread) {
      ColSimpleParams p{args.in, args.outer, args.axis, args.inner, out};
      constexpr int kV = 16 / int(sizeof(T));
      const bool vec = Aligned(args.in, 16) && args.inner % kV == 0;
      const int64_t threads = args.outer * (vec ? args.inner / kV : args.inner);
      const unsigned grid = GridFor(std::min<int64_t>(CeilDiv(threads, kThreads), int64_t(SmCount()) * 16));
      if (vec) ColThreadKernel<Op, T, kV><<<grid, kThreads, 0, stream>>>(p);
      else ColThreadKernel<Op, T, 1><<<grid, kThreads, 0, stream>>>(p);
      return cudaGetLastError();
    }
    if (rung != Rung::kVec && rung != Rung::kSinglePass) {
      if (plan.column) {
        ColSimpleParams p{args.in, args.outer, args.axis, args.inner, out};
        ColSimpleKernel<Op, T><<<GridFor(CeilDiv(args.outer * args.inner, kThreads)), kThreads, 0,
                                 stream>>>(p);
        return cudaGetLastError();
      }
      return LaunchTreePasses<Op, T>(args, plan, out, workspace, stream);
    }
    if (!plan.column) {
      RowVecParams p{args.in,  args.outer, args.axis, plan.split, plan.chunk,
                     partials, counters,   pool_slot, single,     out};
      RowVecKernel<Op, T><<<GridFor(args.outer * plan.split), kThreads, 0, stream>>>(p);
      cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess || single || plan.split == 1) return err;
      RowFinalizeParams f{partials, args.outer, plan.split, out};
      if (plan.split > kFinalizeWarpMaxSplit)
        RowFinalizeKernel<Op, true><<<GridFor(args.outer), kThreads, 0, stream>>>(f);
      else
        RowFinalizeKernel<Op, false>
            <<<GridFor(CeilDiv(args.outer, kWarps)), kThreads, 0, stream>>>(f);
      return cudaGetLastError();
    }
    ColVecParams p{args.in,    args.outer, args.axis, args.inner, plan.col_tiles, plan.split,
                   plan.chunk, partials,   counters,  pool_slot,  single,         out};
    const unsigned grid = GridFor(args.outer * plan.col_tiles * plan.split);
    if (plan.vec > 1) ColVecKernel<Op, T, 16 / sizeof(T)><<<grid, kThreads, 0, stream>>>(p);
    else ColVecKernel<Op, T, 1><<<grid, kThreads, 0, stream>>>(p);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || single || plan.split == 1) return err;
    ColFinalizeParams f{partials, args.outer * args.inner, plan.split, out};
    ColFinalizeKernel<Op><<<GridFor(CeilDiv(f.n_out, kThreads)), kThreads, 0, stream>>>(f);
    return cudaGetLastError();
  });
}

}  // namespace gpucompute::kernels
