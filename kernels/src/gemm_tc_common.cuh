// Pieces shared by every rung of the tensor-core GEMM ladder: the kernel
// parameter block, tile-order decoding and the alpha/beta epilogue store.
// Included by gemm_tc.cu only.
#ifndef GPUCOMPUTE_KERNELS_SRC_GEMM_TC_COMMON_CUH_
#define GPUCOMPUTE_KERNELS_SRC_GEMM_TC_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace gpucompute::kernels::tc {

__device__ __forceinline__ uint32_t SmemAddr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Everything a kernel needs besides the tensor maps, built on the host.
struct TcParams {
  int m = 0, n = 0, k = 0;
  int batch = 1;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  // Where beta * C is read: c itself, or another array of C's layout (ldc,
  // c_type; batch stride stride_c_src, 0 for one C for the whole batch).
  const void* c_src = nullptr;
  int64_t stride_c_src = 0;
  float alpha = 1.f, beta = 0.f;
  int c_type = 0;     // DType of C as int
  int c_pairs = 0;    // two adjacent C elements may be moved as one aligned vector
  int c_vec = 0;      // C's rows (and batch entries) start on 16 bytes
  // Swap-AB: the kernel computes C^T = op(B)^T op(A)^T (m and n above are
  // C^T's), so its element (i, j) is written to c[j * ldc + i].
  int c_trans = 0;
  int a_vec = 0;      // mma_sync: A rows can be copied in aligned 16-byte pieces
  int b_vec = 0;      // mma_sync: likewise B
  int a_batched = 1;  // wgmma: TMA batch coordinate of A is the batch index (0: shared A)
  int b_batched = 1;
  int tiles_m = 0, tiles_n = 0;
  int group_m = 1;    // tile order: groups of group_m tile rows, column by column inside
  int64_t tiles = 0;  // batch * tiles_m * tiles_n
  // Split-K (wgmma_splitk): K cut into `splits` ranges of kb_per_split
  // k-blocks; range s of every tile writes fp32 sums to partials + s * batch
  // * m * n (dense [batch][m][n]), which SplitKReduceKernel adds up into C.
  int splits = 1;
  int kb_per_split = 0;
  // (With WgmmaWsKernel's kClusterSplit, 2-8 ranges of a tile run as one
  // thread block cluster instead and add up through distributed shared
  // memory: no partials, no second kernel.)
  float* partials = nullptr;
};

// Tile t of the walk -> (batch, tile row, tile column). group_m == 1 is the
// plain row-major order; larger groups keep the blocks resident at one time
// on a compact patch of C, so that their A rows and B columns stay in L2.
__device__ __forceinline__ void DecodeTile(const TcParams& p, int64_t t, int& b, int& tm, int& tn) {
  const int64_t per_batch = static_cast<int64_t>(p.tiles_m) * p.tiles_n;
  b = static_cast<int>(t / per_batch);
  const int64_t r = t - b * per_batch;
  const int64_t group_tiles = static_cast<int64_t>(p.group_m) * p.tiles_n;
  const int group = static_cast<int>(r / group_tiles);
  const int first_m = group * p.group_m;
  const int rows = min(p.tiles_m - first_m, p.group_m);
  const int rr = static_cast<int>(r - group * group_tiles);
  tm = first_m + rr % rows;
  tn = rr / rows;
}

template <typename T>
__device__ __forceinline__ float ToFloat(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return __float2bfloat16_rn(v);
}

template <typename T> struct Pair;
template <> struct Pair<float> { using Type = float2; };
template <> struct Pair<__half> { using Type = __half2; };
template <> struct Pair<__nv_bfloat16> { using Type = __nv_bfloat162; };

// Runs store(std::false_type{}) when beta is 0, else store(std::true_type{}):
// a store loop instantiated once per case, so that the beta == 0 copy has no
// test per store and no loads of C (with them ptxas kept the stores in
// order). The loop takes the case as `constexpr bool kBeta =
// decltype(beta)::value` for StoreC2.
template <typename F>
__device__ __forceinline__ void WithBeta(float beta, F&& store) {
  if (beta == 0.f)
    store(std::false_type{});
  else
    store(std::true_type{});
}

// C[row, col..col+1] = alpha * (v0, v1) + beta * C (C read from `cs` only
// with kBeta, which the caller sets to p.beta != 0 once for all its stores
// through WithBeta). `c` is this batch's C
// and `cs` its BatchCSrc; out-of-range elements are skipped. col is even.
template <typename Tc, bool kBeta>
__device__ __forceinline__ void StoreC2(const TcParams& p, Tc* c, const Tc* cs, int row, int col,
                                        float v0, float v1) {
  if (row >= p.m || col >= p.n) return;
  v0 *= p.alpha;
  v1 *= p.alpha;
  const int64_t at = static_cast<int64_t>(row) * p.ldc + col;
  Tc* dst = c + at;
  if (p.c_pairs && col + 1 < p.n) {
    using P = typename Pair<Tc>::Type;
    P* dp = reinterpret_cast<P*>(dst);
    if constexpr (kBeta) {
      const P old = *reinterpret_cast<const P*>(cs + at);
      v0 = fmaf(p.beta, ToFloat(old.x), v0);
      v1 = fmaf(p.beta, ToFloat(old.y), v1);
    }
    P out;
    out.x = FromFloat<Tc>(v0);
    out.y = FromFloat<Tc>(v1);
    *dp = out;
    return;
  }
  if constexpr (kBeta) v0 = fmaf(p.beta, ToFloat(cs[at]), v0);
  dst[0] = FromFloat<Tc>(v0);
  if (col + 1 < p.n) {
    if constexpr (kBeta) v1 = fmaf(p.beta, ToFloat(cs[at + 1]), v1);
    dst[1] = FromFloat<Tc>(v1);
  }
}

template <typename Tc>
__device__ __forceinline__ Tc* BatchC(const TcParams& p, int b) {
  return static_cast<Tc*>(p.c) + static_cast<int64_t>(b) * p.stride_c;
}

// The C that beta scales for batch entry b (BatchC's layout).
template <typename Tc>
__device__ __forceinline__ const Tc* BatchCSrc(const TcParams& p, int b) {
  return static_cast<const Tc*>(p.c_src) + static_cast<int64_t>(b) * p.stride_c_src;
}

// C = alpha * (sum of the split-K partials) + beta * C, element by element
// (coalesced along rows of C, or of C^T with c_trans; the partials are dense).
template <typename Tc>
__global__ void SplitKReduceKernel(const TcParams p) {
  const int64_t mn = static_cast<int64_t>(p.m) * p.n, total = mn * p.batch;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int sp = 0; sp < p.splits; ++sp) s += p.partials[sp * total + e];
    const int b = static_cast<int>(e / mn);
    const int64_t r = e - b * mn;
    const int i = static_cast<int>(r / p.n), j = static_cast<int>(r - int64_t(i) * p.n);
    const int64_t at =
        p.c_trans ? static_cast<int64_t>(j) * p.ldc + i : static_cast<int64_t>(i) * p.ldc + j;
    float v = p.alpha * s;
    if (p.beta != 0.f) v = fmaf(p.beta, ToFloat(BatchCSrc<Tc>(p, b)[at]), v);
    BatchC<Tc>(p, b)[at] = FromFloat<Tc>(v);
  }
}

}  // namespace gpucompute::kernels::tc

#endif  // GPUCOMPUTE_KERNELS_SRC_GEMM_TC_COMMON_CUH_
