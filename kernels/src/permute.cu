// Permute: numpy.transpose of a dense row-major tensor of rank <= 4 with 2- or
// 4-byte elements, the service's Transpose RPC.
//
// What must move: every element read once and written once, 2 * n * size
// bytes; no FLOPs. Floor on the H200: a D2D copy of the same bytes (~4.2 TB/s
// read + write), measured beside each case.
//
// Routes. Drop size-1 axes, merge axes that stay adjacent, then route:
// identity -> cudaMemcpyAsync; last axis kept -> batched row copy (widest
// vector the row length and pointers allow, 32-bit multiply-shift index
// math); batched 2-D transpose -> the transpose ladder (transpose.cu); other
// patterns -> a 64x64 tile between the two moving axes, or one thread per
// output element for tensors under one tile. The default's choice among the
// routes is src/heuristics/transpose_heuristics.h.
//
// Routes, with what each measured through the server's path
// (tests/sweep/memops_sweep.cc, 2026-12-01 23:08 UTC, device busy time, us;
// table in kernels/bench/results/sweep-memops.md):
//   row_copy_grouped  a thread group per row, vectors along it: [8,512,16,128]
//                     (0,2,1,3) fp32 18.9; short rows leave each thread one
//                     vector per row. A variant.
//   row_copy          one vector per thread, four in flight, the row found by
//                     division: [8,512,16,128] (0,2,1,3) fp32 17.3 (copy of
//                     the same bytes 16.7, PyTorch 29.5), bf16 7.9 (PyTorch
//                     24.2); [96,512,384] (1,0,2) fp32 38.4 (copy 35.8).
//                     Before its index loop had a fixed trip count the
//                     parameter arrays went to a 128-byte stack frame per
//                     thread: 33.5 and 18.5 on the first two.
//   tiled             a 64x64 shared-memory tile between the input's last
//                     axis and the output's, 32x4 threads with 32 elements
//                     each: [96,512,384] (2,1,0) fp32 41.4 (gather 144.2,
//                     PyTorch 136.7, copy 35.6); [16,32,64,128] (3,2,1,0)
//                     fp32 16.9 (gather 28.5). The 32x32 tile with 4
//                     elements per thread it replaced was slower than gather
//                     everywhere (159.6 and 66.0 there).
//   gather            one thread per output element, writes coalesced: the
//                     default under one tile ([2,3,4,5] (3,1,2,0) 1.0 against
//                     tiled 1.9).
#include "gpucompute/kernels/transpose.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "heuristics/transpose_heuristics.h"
#include "launch_util.h"
#include "transpose_common.h"

namespace gpucompute::kernels {
namespace {

// ---- Device side ------------------------------------------------------------
// n / d and n % d for 0 <= n, d < 2^31 with a multiply-high and a shift
// (round-up reciprocal: q = (umulhi(n, m) + n) >> s, s = ceil(log2 d),
// m = floor(2^32 (2^s - d) / d) + 1).
struct FastDivmod {
  uint32_t div = 1, mul = 1, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : div(d) {
    while ((uint64_t(1) << shift) < d) ++shift;
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t Div(uint32_t n) const { return (__umulhi(n, mul) + n) >> shift; }
};

constexpr int64_t kFastLimit = int64_t(1) << 31;

// Batched row copy: output row k (row-major over the first nd output axes) is
// input row sum_d coord_d * stride[d] (in vectors of VT). A group of 2^group_log2
// threads copies one row at a time: the index math is paid once per row.
struct RowCopyParams {
  const void* in;
  void* out;
  int64_t rows;      // output rows
  int64_t row_vecs;  // vectors per row
  int nd;            // output axes before the kept last one (1..3)
  int group_log2;
  int64_t dim[3];     // output extents of those axes
  int64_t stride[3];  // input offset of one step along each, in vectors
  FastDivmod fdim[3];  // dim[] as FastDivmod, used when kFast32
};

// Input offset (in vectors) of output row `row`. The loop has a fixed trip
// count so the parameter arrays are indexed by constants: indexed by p.nd
// itself they were copied to a 128-byte stack frame per thread, whose traffic
// halved the row copy's speed.
template <bool kFast32>
__device__ __forceinline__ int64_t RowOffset(const RowCopyParams& p, int64_t row) {
  int64_t off = 0;
  if constexpr (kFast32) {
    uint32_t rest = uint32_t(row);
#pragma unroll
    for (int d = 2; d >= 0; --d) {
      if (d >= p.nd) continue;
      const uint32_t q = p.fdim[d].Div(rest);
      off += int64_t(rest - q * p.fdim[d].div) * p.stride[d];
      rest = q;
    }
  } else {
    int64_t rest = row;
#pragma unroll
    for (int d = 2; d >= 0; --d) {
      if (d >= p.nd) continue;
      const int64_t q = rest / p.dim[d];
      off += (rest - q * p.dim[d]) * p.stride[d];
      rest = q;
    }
  }
  return off;
}

template <typename VT, bool kFast32>
__global__ void __launch_bounds__(256) RowCopyKernel(RowCopyParams p) {
  const VT* in = static_cast<const VT*>(p.in);
  VT* out = static_cast<VT*>(p.out);
  const int lane = threadIdx.x & ((1 << p.group_log2) - 1);
  const int groups = blockDim.x >> p.group_log2;
  const int64_t first = blockIdx.x * int64_t(groups) + (threadIdx.x >> p.group_log2);
  for (int64_t row = first; row < p.rows; row += int64_t(gridDim.x) * groups) {
    const int64_t off = RowOffset<kFast32>(p, row);
    const VT* src = in + off;
    VT* dst = out + row * p.row_vecs;
    const int g = 1 << p.group_log2;
    int64_t v = lane;
    for (; v + 3 * g < p.row_vecs; v += 4 * g) {  // four loads in flight before the stores
      VT x[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) x[k] = src[v + k * g];
#pragma unroll
      for (int k = 0; k < 4; ++k) dst[v + k * g] = x[k];
    }
    for (; v < p.row_vecs; v += g) dst[v] = src[v];
  }
}

// General permutation: one thread per output element (coalesced writes).
struct GatherParams {
  const void* in;
  void* out;
  int64_t n;
  int rank;
  int64_t dim[4];     // output extents
  int64_t stride[4];  // input stride (elements) of each output axis
  FastDivmod fdim[4];
};

template <typename T, bool kFast32>
__global__ void __launch_bounds__(256) GatherKernel(GatherParams p) {
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off = 0;
    if constexpr (kFast32) {
      uint32_t rest = uint32_t(i);
      for (int d = p.rank - 1; d > 0; --d) {
        const uint32_t q = p.fdim[d].Div(rest);
        off += int64_t(rest - q * p.fdim[d].div) * p.stride[d];
        rest = q;
      }
      off += int64_t(rest) * p.stride[0];
    } else {
      int64_t rest = i;
      for (int d = p.rank - 1; d > 0; --d) {
        const int64_t q = rest / p.dim[d];
        off += (rest - q * p.dim[d]) * p.stride[d];
        rest = q;
      }
      off += rest * p.stride[0];
    }
    out[i] = in[off];
  }
}

// Row copy, flat: output vector i (of VT) is column i % row_vecs of output row
// i / row_vecs; each thread moves kUnroll vectors blockDim apart, loads first.
// Short rows (a head permutation's 128 elements) get every thread busy with
// several independent loads, where a group per row would move one vector each.
template <typename VT, bool kFast32>
__global__ void __launch_bounds__(256) RowCopyFlatKernel(RowCopyParams p, FastDivmod fvecs) {
  constexpr int kUnroll = 4;
  const VT* in = static_cast<const VT*>(p.in);
  VT* out = static_cast<VT*>(p.out);
  const int64_t total = p.rows * p.row_vecs;
  const int64_t step = int64_t(gridDim.x) * blockDim.x * kUnroll;
  for (int64_t base = blockIdx.x * int64_t(blockDim.x) * kUnroll + threadIdx.x; base < total;
       base += step) {
    VT x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + int64_t(k) * blockDim.x;
      if (i >= total) break;
      int64_t row, col;
      if constexpr (kFast32) {
        row = fvecs.Div(uint32_t(i));
        col = int64_t(uint32_t(i) - uint32_t(row) * fvecs.div);
      } else {
        row = i / p.row_vecs;
        col = i - row * p.row_vecs;
      }
      x[k] = in[RowOffset<kFast32>(p, row) + col];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + int64_t(k) * blockDim.x;
      if (i < total) out[i] = x[k];
    }
  }
}

// Tiled permutation: the input's last axis L and the axis A that becomes the
// output's last are tiled 64 x 64 through shared memory (padded by one 32-bit
// word per row: no bank conflicts), so that reads run along L and writes along
// A, both coalesced; the other (up to two) axes index the tile's batch. 32 x 4
// threads, each moving 2 columns x 16 rows per side (the access pattern of the
// transpose ladder's coarsened_64; the 32x32 tile with 4 rows per thread this
// replaced lost to gather on every shape, 0.6-0.9x).
struct TiledParams {
  const void* in;
  void* out;
  int64_t len_a, len_l;    // extents of A and L
  int64_t in_stride_a;     // input stride of A (L's is 1)
  int64_t out_stride_l;    // output stride of L (A's is 1)
  int nb;                  // batch axes (0..2)
  int64_t bdim[2], in_bstride[2], out_bstride[2];
  int64_t tiles_a, tiles_l, tiles;  // tiles = batches * tiles_a * tiles_l
};

struct TiledConfig {
  static constexpr int kTile = 64, kThreadsX = 32, kThreadsY = 4;
  static constexpr int kThreads = kThreadsX * kThreadsY;
  static constexpr int kCols = kTile / kThreadsX, kRows = kTile / kThreadsY;
};

template <typename T>
__global__ void __launch_bounds__(TiledConfig::kThreads) TiledPermuteKernel(TiledParams p) {
  using Cfg = TiledConfig;
  __shared__ T tile[Cfg::kTile][Cfg::kTile + int(4 / sizeof(T))];
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const int tx = threadIdx.x % Cfg::kThreadsX, ty = threadIdx.x / Cfg::kThreadsX;
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const int64_t tl = t % p.tiles_l;
    int64_t rest = t / p.tiles_l;
    const int64_t ta = rest % p.tiles_a;
    rest /= p.tiles_a;
    int64_t in_base = 0, out_base = 0;
#pragma unroll
    for (int d = 1; d >= 0; --d) {  // constant indices: the arrays stay in registers
      if (d >= p.nb) continue;
      const int64_t q = rest / p.bdim[d];
      const int64_t c = rest - q * p.bdim[d];
      in_base += c * p.in_bstride[d];
      out_base += c * p.out_bstride[d];
      rest = q;
    }
    const int64_t a0 = ta * Cfg::kTile, l0 = tl * Cfg::kTile;
    T v[Cfg::kRows][Cfg::kCols];  // every load in flight before the first store
#pragma unroll
    for (int j = 0; j < Cfg::kRows; ++j)
#pragma unroll
      for (int x = 0; x < Cfg::kCols; ++x) {
        const int64_t a = a0 + ty + j * Cfg::kThreadsY, l = l0 + tx + x * Cfg::kThreadsX;
        if (a < p.len_a && l < p.len_l) v[j][x] = in[in_base + a * p.in_stride_a + l];
      }
#pragma unroll
    for (int j = 0; j < Cfg::kRows; ++j)
#pragma unroll
      for (int x = 0; x < Cfg::kCols; ++x)
        tile[ty + j * Cfg::kThreadsY][tx + x * Cfg::kThreadsX] = v[j][x];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < Cfg::kRows; ++j)
#pragma unroll
      for (int x = 0; x < Cfg::kCols; ++x) {
        const int ol = ty + j * Cfg::kThreadsY, oa = tx + x * Cfg::kThreadsX;
        const int64_t l = l0 + ol, a = a0 + oa;
        if (a < p.len_a && l < p.len_l) out[out_base + l * p.out_stride_l + a] = tile[oa][ol];
      }
    __syncthreads();
  }
}

// ---- Host side --------------------------------------------------------------
// A permutation after dropping size-1 axes and merging axes that stay adjacent:
// `shape` is the input's (all > 1), out axis i is input axis perm[i].
struct Canonical {
  int rank = 0;
  int64_t shape[4] = {1, 1, 1, 1};
  int perm[4] = {0, 1, 2, 3};
};

Canonical Canonicalise(const PermuteArgs& a) {
  // Drop size-1 axes.
  int keep_index[4];
  int n = 0;
  int64_t s[4];
  for (int d = 0; d < a.rank; ++d) {
    keep_index[d] = a.shape[d] == 1 ? -1 : n;
    if (a.shape[d] != 1) s[n++] = a.shape[d];
  }
  int p[4];
  int m = 0;
  for (int i = 0; i < a.rank; ++i)
    if (keep_index[a.perm[i]] >= 0) p[m++] = keep_index[a.perm[i]];
  // Group runs of output axes that read consecutive input axes.
  int group_of_in[4] = {0, 0, 0, 0};
  int group_start[4] = {0, 0, 0, 0};
  int groups = 0;
  for (int i = 0; i < m; ++i) {
    if (i == 0 || p[i] != p[i - 1] + 1) group_start[groups++] = p[i];
    group_of_in[p[i]] = groups - 1;
  }
  // Groups in input order get the new input axis numbers.
  Canonical c;
  c.rank = groups;
  int new_index[4] = {0, 0, 0, 0};
  int k = 0;
  for (int d = 0; d < n; ++d) {
    int g = group_of_in[d];
    if (group_start[g] == d) {
      new_index[g] = k;
      c.shape[k] = 1;
      ++k;
    }
    c.shape[new_index[g]] *= s[d];
  }
  for (int g = 0; g < groups; ++g) c.perm[g] = new_index[g];
  return c;
}

enum class Route { kCopy, kRowCopy, kTranspose, kGeneral };

// The kind of a canonical permutation.
Route RouteOf(const Canonical& c) {
  if (c.rank <= 1) return Route::kCopy;
  if (c.perm[c.rank - 1] == c.rank - 1) return Route::kRowCopy;
  if (c.rank == 2) return Route::kTranspose;
  if (c.rank == 3 && c.perm[0] == 0 && c.perm[1] == 2 && c.perm[2] == 1) return Route::kTranspose;
  return Route::kGeneral;
}

// Names of the permutation's own routes (beside the transpose rungs).
constexpr std::string_view kRowCopyFlat = "row_copy";
constexpr std::string_view kRowCopyGrouped = "row_copy_grouped";
constexpr std::string_view kTiled = "tiled";
constexpr std::string_view kGather = "gather";
constexpr std::string_view kCopyName = "copy";

bool IsRouteName(std::string_view v) {
  return v == kRowCopyFlat || v == kRowCopyGrouped || v == kTiled || v == kGather || v == kCopyName;
}

TransposeArgs AsTranspose(const PermuteArgs& a, const Canonical& c) {
  TransposeArgs t;
  t.in = a.in;
  t.out = a.out;
  t.dtype = a.dtype;
  if (c.rank == 2) {
    t.batch = 1;
    t.rows = c.shape[0];
    t.cols = c.shape[1];
  } else {
    t.batch = c.shape[0];
    t.rows = c.shape[1];
    t.cols = c.shape[2];
  }
  return t;
}

int64_t NumElements(const PermuteArgs& a) {
  int64_t n = 1;
  for (int d = 0; d < a.rank; ++d) n *= a.shape[d];
  return n;
}

// The widest vector (16, 8, 4 or 2 bytes) that the kept rows' length and both
// pointers allow.
int RowVectorBytes(const PermuteArgs& a, const Canonical& c) {
  const size_t es = DTypeSize(a.dtype);
  const int64_t row_bytes = c.shape[c.rank - 1] * int64_t(es);
  int vb = 16;
  while (vb > int(es) && (row_bytes % vb || !Aligned(a.in, vb) || !Aligned(a.out, vb))) vb /= 2;
  return vb;
}

// The batched row copy's parameters (vectors of `*vec_bytes`).
RowCopyParams MakeRowCopy(const PermuteArgs& a, const Canonical& c, int* vec_bytes) {
  const int vb = RowVectorBytes(a, c);
  const int64_t row_bytes = c.shape[c.rank - 1] * int64_t(DTypeSize(a.dtype));
  *vec_bytes = vb;
  RowCopyParams p{};
  p.in = a.in;
  p.out = a.out;
  p.row_vecs = row_bytes / vb;
  p.nd = c.rank - 1;
  int64_t in_stride[4];  // input strides in rows of the kept axis, per input axis
  in_stride[c.rank - 1] = 1;
  for (int d = c.rank - 2; d >= 0; --d)
    in_stride[d] = (d == c.rank - 2 ? 1 : in_stride[d + 1] * c.shape[d + 1]);
  p.rows = 1;
  for (int i = 0; i < p.nd; ++i) {
    p.dim[i] = c.shape[c.perm[i]];
    p.stride[i] = in_stride[c.perm[i]] * p.row_vecs;
    p.rows *= p.dim[i];
  }
  return p;
}

// Calls go(VT{}) with the unsigned vector type of `vec_bytes` (16, 8, 4 or 2).
template <typename F>
void ByVectorType(int vec_bytes, F&& go) {
  switch (vec_bytes) {
    case 16: go(uint4{}); break;
    case 8: go(uint2{}); break;
    case 4: go(uint32_t{}); break;
    default: go(uint16_t{}); break;
  }
}

cudaError_t LaunchRowCopy(const PermuteArgs& a, const Canonical& c, bool grouped, cudaStream_t s) {
  int vb = 16;
  RowCopyParams p = MakeRowCopy(a, c, &vb);
  const int sms = SmCount();
  if (!grouped) {
    const int64_t total = p.rows * p.row_vecs;
    const bool fast = total < kFastLimit;
    if (fast)
      for (int i = 0; i < p.nd; ++i) p.fdim[i] = FastDivmod(uint32_t(p.dim[i]));
    const FastDivmod fvecs(fast ? uint32_t(p.row_vecs) : 1u);
    const unsigned grid = unsigned(std::min<int64_t>(GridFor(total, 256 * 4), int64_t(sms) * 16));
    auto go = [&](auto vt) {
      using VT = decltype(vt);
      if (fast) RowCopyFlatKernel<VT, true><<<grid, 256, 0, s>>>(p, fvecs);
      else RowCopyFlatKernel<VT, false><<<grid, 256, 0, s>>>(p, fvecs);
    };
    ByVectorType(vb, go);
    return cudaGetLastError();
  }
  const bool fast = p.rows < kFastLimit;
  if (fast)
    for (int i = 0; i < p.nd; ++i) p.fdim[i] = FastDivmod(uint32_t(p.dim[i]));
  p.group_log2 = 0;
  while (p.group_log2 < 8 && (int64_t(1) << p.group_log2) < p.row_vecs) ++p.group_log2;
  // Enough blocks to fill the machine several times over; each loops over rows.
  const unsigned grid =
      unsigned(std::min<int64_t>(GridFor(p.rows, int64_t(256) >> p.group_log2), int64_t(sms) * 32));
  auto go = [&](auto vt) {
    using VT = decltype(vt);
    if (fast) RowCopyKernel<VT, true><<<grid, 256, 0, s>>>(p);
    else RowCopyKernel<VT, false><<<grid, 256, 0, s>>>(p);
  };
  ByVectorType(vb, go);
  return cudaGetLastError();
}

cudaError_t LaunchTiled(const PermuteArgs& a, const Canonical& c, cudaStream_t s) {
  const int r = c.rank;
  int64_t in_stride[4], out_stride_of_in[4];
  in_stride[r - 1] = 1;
  for (int d = r - 2; d >= 0; --d) in_stride[d] = in_stride[d + 1] * c.shape[d + 1];
  int64_t acc = 1;
  for (int i = r - 1; i >= 0; --i) {
    out_stride_of_in[c.perm[i]] = acc;
    acc *= c.shape[c.perm[i]];
  }
  const int ax_a = c.perm[r - 1], ax_l = r - 1;
  TiledParams p{};
  p.in = a.in;
  p.out = a.out;
  p.len_a = c.shape[ax_a];
  p.len_l = c.shape[ax_l];
  p.in_stride_a = in_stride[ax_a];
  p.out_stride_l = out_stride_of_in[ax_l];
  int64_t batches = 1;
  for (int d = 0; d < r; ++d) {
    if (d == ax_a || d == ax_l) continue;
    p.bdim[p.nb] = c.shape[d];
    p.in_bstride[p.nb] = in_stride[d];
    p.out_bstride[p.nb] = out_stride_of_in[d];
    batches *= c.shape[d];
    ++p.nb;
  }
  p.tiles_a = CeilDiv(p.len_a, TiledConfig::kTile);
  p.tiles_l = CeilDiv(p.len_l, TiledConfig::kTile);
  p.tiles = batches * p.tiles_a * p.tiles_l;
  const unsigned grid = GridFor(p.tiles, 1);
  if (DTypeSize(a.dtype) == 4) TiledPermuteKernel<uint32_t><<<grid, TiledConfig::kThreads, 0, s>>>(p);
  else TiledPermuteKernel<uint16_t><<<grid, TiledConfig::kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchGather(const PermuteArgs& a, const Canonical& c, cudaStream_t s) {
  GatherParams p{};
  p.in = a.in;
  p.out = a.out;
  p.rank = c.rank;
  int64_t in_stride[4];
  in_stride[c.rank - 1] = 1;
  for (int d = c.rank - 2; d >= 0; --d) in_stride[d] = in_stride[d + 1] * c.shape[d + 1];
  p.n = 1;
  for (int i = 0; i < c.rank; ++i) {
    p.dim[i] = c.shape[c.perm[i]];
    p.stride[i] = in_stride[c.perm[i]];
    p.n *= p.dim[i];
  }
  const bool fast = p.n < kFastLimit;
  if (fast)
    for (int i = 0; i < c.rank; ++i) p.fdim[i] = FastDivmod(uint32_t(p.dim[i]));
  const unsigned grid = GridFor(p.n, 256);
  auto go = [&](auto t) {
    using T = decltype(t);
    if (fast) GatherKernel<T, true><<<grid, 256, 0, s>>>(p);
    else GatherKernel<T, false><<<grid, 256, 0, s>>>(p);
  };
  if (DTypeSize(a.dtype) == 4) go(uint32_t{});
  else go(uint16_t{});
  return cudaGetLastError();
}

}  // namespace

Support CanImplementPermute(const PermuteArgs& args, std::string_view variant) {
  const std::vector<std::string>& variants = TransposeVariants();
  if (!variant.empty() && !IsRouteName(variant) &&
      std::find(variants.begin(), variants.end(), variant) == variants.end())
    return Support::No("unknown transpose variant");
  if (args.rank < 1 || args.rank > 4) return Support::No("rank must be 1..4");
  if (!ValidDType(args.dtype)) return Support::No("unsupported dtype");
  bool seen[4] = {false, false, false, false};
  for (int i = 0; i < args.rank; ++i) {
    if (args.perm[i] < 0 || args.perm[i] >= args.rank || seen[args.perm[i]])
      return Support::No("perm is not a permutation of 0..rank-1");
    seen[args.perm[i]] = true;
    if (args.shape[i] < 0) return Support::No("negative extent");
  }
  if (NumElements(args) == 0) return Support::Yes();
  if (args.in == nullptr || args.out == nullptr) return Support::No("null pointer");
  const size_t es = DTypeSize(args.dtype);
  if (!Aligned(args.in, es) || !Aligned(args.out, es))
    return Support::No("pointers must be aligned to the element size");
  const Canonical c = Canonicalise(args);
  const Route route = RouteOf(c);
  if (variant.empty() || variant == kGather) return Support::Yes();
  if (variant == kCopyName && route != Route::kCopy)
    return Support::No("copy runs only permutations that move no element");
  if ((variant == kRowCopyFlat || variant == kRowCopyGrouped) && route != Route::kRowCopy)
    return Support::No(std::string(variant) + " runs only permutations that keep the last axis");
  if (variant == kTiled && (route == Route::kCopy || route == Route::kRowCopy))
    return Support::No("tiled runs only permutations that move the last axis");
  if (IsRouteName(variant)) return Support::Yes();
  // A transpose rung applies to batched 2-D transposes; other permutations
  // take their default route.
  if (route == Route::kTranspose) return CanImplementTranspose(AsTranspose(args, c), variant);
  return Support::Yes();
}

const std::vector<std::string>& PermuteVariants() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> names = {std::string(kGather), std::string(kRowCopyGrouped),
                                      std::string(kCopyName)};
    const std::vector<std::string>& rungs = TransposeVariants();
    names.insert(names.end(), rungs.begin(), rungs.end());
    names.push_back(std::string(kRowCopyFlat));
    names.push_back(std::string(kTiled));
    return names;
  }();
  return v;
}

std::string PermuteVariantName(const PermuteArgs& args, std::string_view variant) {
  if (!CanImplementPermute(args, variant)) return {};
  if (NumElements(args) == 0) return "empty";
  const Canonical c = Canonicalise(args);
  if (IsRouteName(variant)) return std::string(variant);
  switch (RouteOf(c)) {
    case Route::kCopy:
      return std::string(kCopyName);
    case Route::kRowCopy:
      return std::string(ChooseRowCopy(RowVectorBytes(args, c)));
    case Route::kTranspose:
      return TransposeVariantName(AsTranspose(args, c), variant);
    case Route::kGeneral:
      return std::string(ChooseGeneral(NumElements(args)));
  }
  return {};
}

cudaError_t LaunchPermute(const PermuteArgs& args, std::string_view variant,
                          cudaStream_t stream) {
  if (!CanImplementPermute(args, variant)) return cudaErrorInvalidValue;
  const int64_t n = NumElements(args);
  if (n == 0) return cudaSuccess;
  const Canonical c = Canonicalise(args);
  const std::string name = PermuteVariantName(args, variant);
  if (name == kGather) return LaunchGather(args, c, stream);
  if (name == kTiled) return LaunchTiled(args, c, stream);
  if (name == kRowCopyFlat || name == kRowCopyGrouped)
    return LaunchRowCopy(args, c, name == kRowCopyGrouped, stream);
  if (name == kCopyName)
    return cudaMemcpyAsync(args.out, args.in, size_t(n) * DTypeSize(args.dtype),
                           cudaMemcpyDeviceToDevice, stream);
  return LaunchTranspose(AsTranspose(args, c), name, stream);
}

}  // namespace gpucompute::kernels
