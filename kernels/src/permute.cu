// Permute: numpy.transpose of a dense row-major tensor of rank <= 4 with 2- or
// 4-byte elements, the service's Transpose RPC.
//
// What must move: every element read once and written once, 2 * n * size
// bytes; no FLOPs. Floor on the H200: a D2D copy of the same bytes (~4.2 TB/s
// read + write), measured beside each case.
//
// Routes. Drop size-1 axes, merge axes that stay adjacent, then route:
// identity -> cudaMemcpyAsync; last axis kept -> batched row copy (widest
// vector the row length and pointers allow, a thread group per row, 32-bit
// multiply-shift index math; [64,512,2048]->(1,0,2) fp32 2996 GB/s, 0.72 of
// copy); batched 2-D transpose -> the transpose ladder (transpose.cu); other
// patterns -> one thread per output element, writes coalesced, reads gathered
// ([256,512,512]->(2,1,0) fp32 893 GB/s, 0.21).
#include "gpucompute/kernels/transpose.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

template <typename VT, bool kFast32>
__global__ void __launch_bounds__(256) RowCopyKernel(RowCopyParams p) {
  const VT* in = static_cast<const VT*>(p.in);
  VT* out = static_cast<VT*>(p.out);
  const int lane = threadIdx.x & ((1 << p.group_log2) - 1);
  const int groups = blockDim.x >> p.group_log2;
  const int64_t first = blockIdx.x * int64_t(groups) + (threadIdx.x >> p.group_log2);
  for (int64_t row = first; row < p.rows; row += int64_t(gridDim.x) * groups) {
    int64_t off = 0;
    if constexpr (kFast32) {
      uint32_t rest = uint32_t(row);
      for (int d = p.nd - 1; d >= 0; --d) {
        const uint32_t q = p.fdim[d].Div(rest);
        off += int64_t(rest - q * p.fdim[d].div) * p.stride[d];
        rest = q;
      }
    } else {
      int64_t rest = row;
      for (int d = p.nd - 1; d >= 0; --d) {
        const int64_t q = rest / p.dim[d];
        off += (rest - q * p.dim[d]) * p.stride[d];
        rest = q;
      }
    }
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

enum class Route { kCopy, kRowCopy, kTranspose, kGather };

Route RouteOf(const Canonical& c) {
  if (c.rank <= 1) return Route::kCopy;
  if (c.perm[c.rank - 1] == c.rank - 1) return Route::kRowCopy;
  if (c.rank == 2) return Route::kTranspose;
  if (c.rank == 3 && c.perm[0] == 0 && c.perm[1] == 2 && c.perm[2] == 1) return Route::kTranspose;
  return Route::kGather;
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

cudaError_t LaunchRowCopy(const PermuteArgs& a, const Canonical& c, cudaStream_t s) {
  const size_t es = DTypeSize(a.dtype);
  const int64_t row_bytes = c.shape[c.rank - 1] * int64_t(es);
  int vb = 16;
  while (vb > int(es) && (row_bytes % vb || !Aligned(a.in, vb) || !Aligned(a.out, vb))) vb /= 2;
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
  const bool fast = p.rows < kFastLimit;
  if (fast)
    for (int i = 0; i < p.nd; ++i) p.fdim[i] = FastDivmod(uint32_t(p.dim[i]));
  p.group_log2 = 0;
  while (p.group_log2 < 8 && (int64_t(1) << p.group_log2) < p.row_vecs) ++p.group_log2;
  // Enough blocks to fill the machine several times over; each loops over rows.
  const int sms = SmCount();
  const unsigned grid =
      unsigned(std::min<int64_t>(GridFor(p.rows, int64_t(256) >> p.group_log2), int64_t(sms) * 32));
  auto go = [&](auto vt) {
    using VT = decltype(vt);
    if (fast) RowCopyKernel<VT, true><<<grid, 256, 0, s>>>(p);
    else RowCopyKernel<VT, false><<<grid, 256, 0, s>>>(p);
  };
  switch (vb) {
    case 16: go(uint4{}); break;
    case 8: go(uint2{}); break;
    case 4: go(uint32_t{}); break;
    default: go(uint16_t{}); break;
  }
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
  if (!variant.empty() && std::find(variants.begin(), variants.end(), variant) == variants.end())
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
  if (RouteOf(c) == Route::kTranspose) return CanImplementTranspose(AsTranspose(args, c), variant);
  return Support::Yes();
}

cudaError_t LaunchPermute(const PermuteArgs& args, std::string_view variant,
                          cudaStream_t stream) {
  if (!CanImplementPermute(args, variant)) return cudaErrorInvalidValue;
  const int64_t n = NumElements(args);
  if (n == 0) return cudaSuccess;
  const Canonical c = Canonicalise(args);
  switch (RouteOf(c)) {
    case Route::kCopy:
      return cudaMemcpyAsync(args.out, args.in, size_t(n) * DTypeSize(args.dtype),
                             cudaMemcpyDeviceToDevice, stream);
    case Route::kRowCopy:
      return LaunchRowCopy(args, c, stream);
    case Route::kTranspose:
      return LaunchTranspose(AsTranspose(args, c), variant, stream);
    case Route::kGather:
      return LaunchGather(args, c, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpucompute::kernels
