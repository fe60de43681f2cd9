// Device helpers shared by the attention versions: kernel parameters, dtype
// conversion, the online-softmax step on mma-shaped accumulator fragments, and
// the PTX wrappers (cp.async, ldmatrix, mma.sync) the flash versions use.
#ifndef GPUCOMPUTE_KERNELS_SRC_ATTENTION_COMMON_CUH_
#define GPUCOMPUTE_KERNELS_SRC_ATTENTION_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace gpucompute::kernels::attention {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Kernel arguments of every attention version, by value.
struct AttnParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;       // nullable, [batch, heads_q, seq_q]
  int batch;
  int heads_q;
  int heads_kv;
  int group;        // heads_q / heads_kv
  int seq_q;
  int seq_kv;
  int causal;
  int causal_off;   // seq_kv - seq_q: query i sees keys j <= i + causal_off
  int head_dim;     // D of the tensors (a multiple of 8 <= the kernel's padded kD)
  int o_f32;        // O is written as fp32 (else in the input dtype)
  float scale;      // softmax scale on the logits
  float scale_log2; // scale * log2(e): exp(scale * x) = exp2(scale_log2 * x)
  // Key splitting (flash_mma only): block z of gridDim.z handles keys
  // [z * split_len, (z + 1) * split_len) and writes fp32 partial results.
  int num_splits;   // 1: no split, results go straight to o / lse
  int split_len;    // keys per split, a multiple of the key tile
  float* part_o;    // [num_splits, batch * heads_q, seq_q, head_dim]
  float* part_lse;  // [num_splits, batch * heads_q, seq_q]
  // flash_wgmma's persistent grid: non-null, its blocks take their next work
  // tile from this counter (zeroed before the launch) instead of a fixed
  // stride.
  int* tile_counter;
};
static_assert(sizeof(AttnParams) <= 128, "see TailSplit");

// flash_wgmma's tail split (heuristics' WgmmaTailBlocks; non-causal, one key
// split), a kernel argument of its own (AttnParams stays within 128 bytes:
// at 136 the compiler read its fields from the parameter space where they
// were used instead of into registers at entry, and decode kernels ran 4-12%
// slower, sweep runs 31-32): tiles from `first` on are the last round's. Their key
// blocks (`blocks` per tile) are dealt out `per` to each block of the grid,
// in order; each run of them inside one tile is a piece, written as an fp32
// partial to part_o / part_lse at slot (tile - first) * pieces + i (i: the
// piece's rank in its tile), kBr rows each, and merged by CombineTailKernel.
// per 0: no tail split.
struct TailSplit {
  int first = 0;
  int per = 0;
  int blocks = 0;
  int pieces = 0;
  // The first block of the grid whose run meets tail tile tt (0-based from
  // `first`): a piece's rank in its tile is its block's index minus this.
  __host__ __device__ int FirstBlock(int tt) const { return tt * blocks / per; }
  // The pieces of tail tile tt (blocks of the grid whose runs meet it).
  __host__ __device__ int Pieces(int tt) const {
    return ((tt + 1) * blocks - 1) / per - FirstBlock(tt) + 1;
  }
};

template <typename T>
__device__ __forceinline__ float ToFloat(T x);
template <>
__device__ __forceinline__ float ToFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ float ToFloat<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// The 16-bit type the tensor cores see for storage type T: fp16 stays fp16,
// bf16 stays bf16, fp32 is rounded to bf16 on load (range over precision).
template <typename T>
struct MmaType {
  using type = __nv_bfloat16;
};
template <>
struct MmaType<__half> {
  using type = __half;
};

// Two floats packed into one 32-bit register of the 16-bit type M; `lo` lands
// in the low half (the lower column index of an mma fragment).
template <typename M>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t PackPair<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t PackPair<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Stores two adjacent output elements.
template <typename T>
__device__ __forceinline__ void StorePair(T* p, float a, float b);
template <>
__device__ __forceinline__ void StorePair<float>(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
template <>
__device__ __forceinline__ void StorePair<__half>(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}
template <>
__device__ __forceinline__ void StorePair<__nv_bfloat16>(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// Stores two adjacent output elements of O at element offset `off`, in fp32
// when p.o_f32, else in the input type T.
template <typename T>
__device__ __forceinline__ void StoreOutPair(const AttnParams& p, int64_t off, float a, float b) {
  if (p.o_f32) {
    StorePair<float>(static_cast<float*>(p.o) + off, a, b);
  } else {
    StorePair<T>(static_cast<T*>(p.o) + off, a, b);
  }
}

// One output element of O (see StoreOutPair).
template <typename T>
__device__ __forceinline__ void StoreOut(const AttnParams& p, int64_t off, float a) {
  if (p.o_f32) {
    static_cast<float*>(p.o)[off] = a;
  } else {
    static_cast<T*>(p.o)[off] = FromFloat<T>(a);
  }
}

// The kernels' padded head dim for D: 64, 128 or 256 (D a multiple of 8,
// <= 256). Columns past D are zero-filled on load and never stored.
constexpr int PaddedHeadDim(int64_t d) { return d <= 64 ? 64 : (d <= 128 ? 128 : 256); }

// flash_mma's decode tile: D rounded up to a multiple of 32 (its swizzle
// takes rows of whole 32-column groups; a narrower tile leaves room for more
// blocks, each a stream of K and V), 32 to 256.
constexpr int DecodeHeadDim(int64_t d) { return d <= 32 ? 32 : int((d + 31) / 32 * 32); }

// flash_wgmma's: 64, 128, 192 or 256 (its tiles are 64-column panels, all
// of them loaded).
constexpr int WgmmaHeadDim(int64_t d) {
  return d <= 64 ? 64 : (d <= 128 ? 128 : (d <= 192 ? 192 : 256));
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; `src_bytes` 0 zero-fills the destination.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile, fp32 accumulate. Fragments (g = lane / 4,
// t = lane % 4): a = {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)},
// b = {(k 2t.., n g), (k 2t+8.., n g)}, d = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
template <typename M>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<M, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Masks one block of logits held in mma accumulator layout: s[j][2h + e] is
// row `row[h]` (query index i), key column col0 + 8 j + e (col0 already holds
// the thread's 2 t). Keys >= seq_kv, and under the causal mask keys
// > i + causal_off, become -inf.
template <int kNT>
__device__ __forceinline__ void MaskBlock(float (&s)[kNT][4], const int (&row)[2], int col0,
                                          int seq_kv, bool causal, int causal_off) {
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + 8 * j + (e & 1);
      const int lim = causal ? min(seq_kv - 1, row[e >> 1] + causal_off) : seq_kv - 1;
      if (col > lim) s[j][e] = -INFINITY;
    }
  }
}

// 2^x on the special-function unit alone. ex2.approx.ftz flushes results
// below 2^-126 to zero, which a softmax weight cannot tell from zero; exp2f
// (ex2.approx without ftz) wraps the same instruction in a three-instruction
// range fix-up, per element of every score tile.
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// How far (in log2 units of the scaled logits, a factor of 2^8 = 256) a
// row's running maximum may trail the largest logit seen before it is
// raised: a block whose new maximum stays within it keeps the old offset, so
// alpha is exactly 1 and the output is not rescaled (FlashAttention-4's
// conditional rescaling). P then reaches at most 2^8, as exact in a 16-bit
// type as a weight under 1, and the sum and output in fp32 hold it; the
// result and the LSE are those of the maximum kept (exp is shift-invariant).
inline constexpr float kMaxLagLog2 = 8.f;

// One online-softmax step for the two rows a thread holds (values spread over
// the 4 lanes of a quad). On return s holds P = exp(scale (x - m_new)) and
// alpha[h] = exp(scale (m_old - m_new)), the factor the running output and sum
// must take; m_new is the block's maximum where it passes m_old by more than
// kMaxLagLog2, else m_old (alpha then 1). A row that has seen only -inf so
// far keeps m = -inf; it uses 0 as its offset so that no (-inf) - (-inf)
// arises, and its P and alpha are 0.
template <int kNT>
__device__ __forceinline__ void OnlineSoftmax(float (&s)[kNT][4], float (&m)[2], float (&l)[2],
                                              float (&alpha)[2], float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = m[h];
#pragma unroll
    for (int j = 0; j < kNT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // From -inf any finite maximum passes (inf > lag); -inf to -inf is NaN,
    // not taken.
    const float m_new = (mx - m[h]) * scale_log2 > kMaxLagLog2 ? mx : m[h];
    const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
    const float off = m_use * scale_log2;
    alpha[h] = m_new == m[h] ? 1.f : Exp2Ftz(m[h] * scale_log2 - off);
    m[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      s[j][2 * h] = Exp2Ftz(fmaf(s[j][2 * h], scale_log2, -off));
      s[j][2 * h + 1] = Exp2Ftz(fmaf(s[j][2 * h + 1], scale_log2, -off));
      sum += s[j][2 * h] + s[j][2 * h + 1];
    }
    l[h] = l[h] * alpha[h] + sum;
  }
}

// Final per-row normaliser: the quad-wide sum of l, its reciprocal (0 for an
// empty row: every P was 0, the row saw no key) and the natural-log LSE (-inf
// for an empty row). A NaN score (a NaN or infinite Q or K) leaves a NaN sum,
// and the row comes out NaN, as PyTorch's SDPA gives it, not as an empty one.
__device__ __forceinline__ void FinishRows(const float (&m)[2], float (&l)[2], float (&inv)[2],
                                           float (&lse)[2], float scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l[h] = sum;
    const bool empty = sum == 0.f;
    inv[h] = empty ? 0.f : 1.f / sum;
    lse[h] = empty ? -INFINITY : m[h] * scale + logf(sum);
  }
}

}  // namespace gpucompute::kernels::attention

#endif  // GPUCOMPUTE_KERNELS_SRC_ATTENTION_COMMON_CUH_
