// The CPU backend's kernels. Each shard is spread over the device's own
// ThreadPool; nothing here starts threads of its own.
//   GEMM / GEMV  fp32 through CBLAS, one single-threaded call per block of
//                output rows; half inputs converted to fp32 per block (GEMV
//                in cache-sized sub-blocks so A crosses memory once). "naive"
//                runs plain loops instead.
//   reduce       the reduced axis in chunks of kReduceChunk; inside a chunk
//                a fixed pairwise (contiguous) or cascaded (strided) order,
//                chunks combined by CombinePartials: the bits do not depend on
//                the number of threads or devices.
//   transpose    rank padded to 4; 64x64 tiles through a small buffer when
//                the input's contiguous axis is not the output's, row copies
//                otherwise.
//   attention    online softmax over key blocks of 64 for blocks of 32 query
//                rows, fp32 throughout; the two inner products are also
//                compiled for AVX2 and picked at load time.
#include "server/device/cpu_device.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"
#include "server/core/reduce_combine.h"

namespace gpucompute {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Work below this many scalar operations stays on the calling thread: waking
// workers costs more than it saves.
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Pieces to split `work` scalar operations into on a pool of `threads`.
int64_t PiecesFor(int64_t work, int threads) {
  return std::clamp<int64_t>(work / kMinParallelWork, 1, threads);
}

const char* ElementAt(const void* base, DType dtype, int64_t i) {
  return static_cast<const char*>(base) + i * static_cast<int64_t>(DTypeSize(dtype));
}
char* ElementAt(void* base, DType dtype, int64_t i) {
  return static_cast<char*>(base) + i * static_cast<int64_t>(DTypeSize(dtype));
}

// ---------------------------------------------------------------------------
// Typed element access, for loops that convert on the fly.
// ---------------------------------------------------------------------------
template <DType T>
using Storage = std::conditional_t<T == DType::kFloat32, float, uint16_t>;

template <DType T>
inline float LoadF(Storage<T> v) {
  if constexpr (T == DType::kFloat32) {
    return v;
  } else if constexpr (T == DType::kFloat16) {
    return HalfToFloat(v);
  } else {
    return BFloat16ToFloat(v);
  }
}

template <DType T>
inline Storage<T> StoreF(float f) {
  if constexpr (T == DType::kFloat32) {
    return f;
  } else if constexpr (T == DType::kFloat16) {
    return FloatToHalf(f);
  } else {
    return FloatToBFloat16(f);
  }
}

// Calls fn(std::integral_constant<DType, t>{}).
template <typename Fn>
decltype(auto) DispatchDType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kFloat16:
      return fn(std::integral_constant<DType, DType::kFloat16>{});
    case DType::kBFloat16:
      return fn(std::integral_constant<DType, DType::kBFloat16>{});
    case DType::kFloat32:
      break;
  }
  return fn(std::integral_constant<DType, DType::kFloat32>{});
}

// Converts n elements of a `dtype` buffer into floats, in parallel pieces.
void ToFloatParallel(ThreadPool& pool, DType dtype, const void* src, float* dst, int64_t n) {
  pool.ParallelRange(0, n, kMinParallelWork, pool.size(), [&](int64_t b, int64_t e) {
    ToFloat(dtype, ElementAt(src, dtype, b), dst + b, e - b);
  });
}

// ---------------------------------------------------------------------------
// GEMM and GEMV
// ---------------------------------------------------------------------------
bool FitsBlasInt(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) {
    if (d > INT_MAX) return false;
  }
  return true;
}

// C[m, n] = alpha * op(A) op(B) + beta * C with fp32 accumulation, plain loops.
// beta == 0 never reads C.
void NaiveSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  std::vector<float> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    if (!trans_b) {
      for (int64_t p = 0; p < k; ++p) {
        const float aip = trans_a ? a[p * lda + i] : a[i * lda + p];
        const float* brow = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) acc[j] += aip * brow[j];
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const float* bcol = b + j * ldb;
        float s = 0.0f;
        for (int64_t p = 0; p < k; ++p) s += (trans_a ? a[p * lda + i] : a[i * lda + p]) * bcol[p];
        acc[j] = s;
      }
    }
    float* crow = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) {
      crow[j] = beta == 0.0f ? alpha * acc[j] : alpha * acc[j] + beta * crow[j];
    }
  }
}

// C = alpha * op(A) op(B) + beta * C through CBLAS (or the loops when
// `naive`, or when a dimension does not fit CBLAS's int). beta == 0 never
// reads C; k == 0 gives beta * C.
void Sgemm(bool naive, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  if (naive || !FitsBlasInt({m, n, k, lda, ldb, ldc})) {
    NaiveSgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (beta == 0.0f) {
    // OpenBLAS scales C by beta first; clear it so stale NaNs cannot leak.
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, a, int(lda), b,
              int(ldb), beta, c, int(ldc));
}

// y[rows] = alpha * op(A) x + beta * y for one column x (stride incx) and one
// column y (stride incy). A is [rows, k] (lda) or, when trans_a, [k, rows].
void Sgemv(bool naive, bool trans_a, int64_t rows, int64_t k, float alpha, const float* a,
           int64_t lda, const float* x, int64_t incx, float beta, float* y, int64_t incy) {
  if (rows == 0) return;
  if (k == 0 || naive || !FitsBlasInt({rows, k, lda, incx, incy})) {
    if (!trans_a) {
      for (int64_t i = 0; i < rows; ++i) {
        const float* arow = a + i * lda;
        float s = 0.0f;
        for (int64_t p = 0; p < k; ++p) s += arow[p] * x[p * incx];
        y[i * incy] = beta == 0.0f ? alpha * s : alpha * s + beta * y[i * incy];
      }
    } else {
      std::vector<float> acc(size_t(rows), 0.0f);
      for (int64_t p = 0; p < k; ++p) {
        const float xp = x[p * incx];
        const float* arow = a + p * lda;
        for (int64_t i = 0; i < rows; ++i) acc[i] += arow[i] * xp;
      }
      for (int64_t i = 0; i < rows; ++i) {
        y[i * incy] = beta == 0.0f ? alpha * acc[i] : alpha * acc[i] + beta * y[i * incy];
      }
    }
    return;
  }
  if (beta == 0.0f) {
    for (int64_t i = 0; i < rows; ++i) y[i * incy] = 0.0f;
  }
  if (!trans_a) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(rows), int(k), alpha, a, int(lda), x, int(incx),
                beta, y, int(incy));
  } else {
    cblas_sgemv(CblasRowMajor, CblasTrans, int(k), int(rows), alpha, a, int(lda), x, int(incx),
                beta, y, int(incy));
  }
}

// Floats of converted A a GEMV task keeps at once (fits in L2).
constexpr int64_t kGemvScratchFloats = int64_t{1} << 16;

// A block of op(A) rows [i0, i1) of one batch entry as fp32: a pointer and a
// leading dimension usable with the trans flag unchanged. fp32 inputs are used
// in place; half inputs are converted into `scratch`.
struct FloatBlock {
  const float* data = nullptr;
  int64_t ld = 0;
};

// op(A) rows [i0, i1) of A = `a` ([m, k], or [k, m] when trans_a).
FloatBlock RowsOfOpA(DType dtype, const void* a, bool trans_a, int64_t m, int64_t k, int64_t i0,
                     int64_t i1, std::vector<float>& scratch) {
  const int64_t rows = i1 - i0;
  if (dtype == DType::kFloat32) {
    const float* af = static_cast<const float*>(a);
    return trans_a ? FloatBlock{af + i0, m} : FloatBlock{af + i0 * k, k};
  }
  scratch.resize(size_t(rows * k));
  if (!trans_a) {
    ToFloat(dtype, ElementAt(a, dtype, i0 * k), scratch.data(), rows * k);
    return {scratch.data(), k};
  }
  for (int64_t p = 0; p < k; ++p) {
    ToFloat(dtype, ElementAt(a, dtype, p * m + i0), scratch.data() + p * rows, rows);
  }
  return {scratch.data(), rows};
}

// ---------------------------------------------------------------------------
// Vector helpers
// ---------------------------------------------------------------------------
// Eight floats as one value (GCC vector extension; two SSE registers on the
// baseline ISA, one AVX register on AVX2).
typedef float Float8 __attribute__((vector_size(32)));
// Four floats and four lane masks: native on every x86-64, so comparisons
// compile to packed instructions (GCC splits wider ones into scalars on the
// baseline ISA).
typedef float Float4 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));

inline void Load4(Float4& v, const float* p) { std::memcpy(&v, p, sizeof(v)); }
inline void Store4(float* p, const Float4& v) { std::memcpy(p, &v, sizeof(v)); }

// By reference: a Float8 passed or returned by value changes the ABI
// between the clones.
inline void Load8(Float8& v, const float* p) { std::memcpy(&v, p, sizeof(v)); }
inline void Store8(float* p, const Float8& v) { std::memcpy(p, &v, sizeof(v)); }

// ---------------------------------------------------------------------------
// Reduce
// ---------------------------------------------------------------------------
// The fixed in-chunk orders. Contiguous runs: pairwise halving down to blocks
// of at most kPairwiseBlock elements, each reduced in 8 interleaved lanes.
constexpr int64_t kPairwiseBlock = 256;
// Strided runs (inner > 1): blocks of kRowBlock rows accumulated in order,
// block results combined by a binary-counter cascade.
constexpr int64_t kRowBlock = 32;
// Inner columns per task in strided runs.
constexpr int64_t kInnerTile = 512;

inline bool IsNan(float x) { return x != x; }

constexpr bool TracksNan(ReduceKind k) { return k == ReduceKind::kMax || k == ReduceKind::kMin; }

// acc (op) x over four lanes at once: sums, or max / min ignoring NaN
// (callers track NaN in `nan`, all ones in a lane that saw one). The select
// is mask arithmetic.
template <ReduceKind K>
inline void Step4(Float4& acc, const Float4& x, Int4& nan) {
  if constexpr (K == ReduceKind::kMax || K == ReduceKind::kMin) {
    const Int4 take = K == ReduceKind::kMax ? x > acc : x < acc;
    acc = reinterpret_cast<Float4>((take & reinterpret_cast<Int4>(x)) |
                                   (~take & reinterpret_cast<Int4>(acc)));
    nan |= x != x;
  } else {
    acc += x;
  }
}

template <ReduceKind K>
inline float Step(float acc, float x) {
  if constexpr (K == ReduceKind::kMax) {
    return x > acc ? x : acc;
  } else if constexpr (K == ReduceKind::kMin) {
    return x < acc ? x : acc;
  } else {
    return acc + x;
  }
}

// At most kPairwiseBlock contiguous floats in 8 lanes (lane l takes elements
// l, l + 8, ...), lanes combined in a fixed tree, then the tail in order.
template <ReduceKind K>
float ReduceBlock(const float* x, int64_t n) {
  const float id = ReduceIdentity(K);
  Float4 lo = {id, id, id, id}, hi = lo;  // lanes 0-3 and 4-7
  Int4 nan = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Float4 a, b;
    Load4(a, x + i);
    Load4(b, x + i + 4);
    Step4<K>(lo, a, nan);
    Step4<K>(hi, b, nan);
  }
  float s = ReduceCombine2(
      K, ReduceCombine2(K, ReduceCombine2(K, lo[0], lo[1]), ReduceCombine2(K, lo[2], lo[3])),
      ReduceCombine2(K, ReduceCombine2(K, hi[0], hi[1]), ReduceCombine2(K, hi[2], hi[3])));
  bool any_nan = false;
  for (; i < n; ++i) {
    s = Step<K>(s, x[i]);
    any_nan = any_nan || IsNan(x[i]);
  }
  if constexpr (TracksNan(K)) {
    for (int l = 0; l < 4; ++l) any_nan = any_nan || nan[l] != 0;
    if (any_nan) return std::numeric_limits<float>::quiet_NaN();
  }
  return s;
}

// n contiguous elements of `dtype` at x (n <= kReduceChunk).
template <ReduceKind K>
float ReduceContiguous(DType dtype, const void* x, int64_t n) {
  if (n <= kPairwiseBlock) {
    if (dtype == DType::kFloat32) return ReduceBlock<K>(static_cast<const float*>(x), n);
    float buf[kPairwiseBlock];
    ToFloat(dtype, x, buf, n);
    return ReduceBlock<K>(buf, n);
  }
  int64_t half = n / 2;
  half -= half % 8;
  return ReduceCombine2(K, ReduceContiguous<K>(dtype, x, half),
                        ReduceContiguous<K>(dtype, ElementAt(x, dtype, half), n - half));
}

// Reduces rows [0, rows) of a strided run: x[r * stride + c] for c in
// [0, width), into out[0, width). REQUIRES: width <= kInnerTile,
// rows <= kReduceChunk.
template <ReduceKind K>
void ReduceStrided(DType dtype, const void* x, int64_t rows, int64_t stride, int64_t width,
                   float* out) {
  // cascade[l] holds the combination of 2^l blocks while filled[l].
  constexpr int kLevels = 24;
  static_assert(kReduceChunk / kRowBlock < (int64_t{1} << (kLevels - 1)), "cascade depth");
  float cascade[kLevels][kInnerTile];
  bool filled[kLevels] = {};
  float block[kInnerTile];
  float row_buf[kInnerTile];
  int32_t nan[kInnerTile];
  const float id = ReduceIdentity(K);
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t r1 = std::min(rows, r0 + kRowBlock);
    std::fill(block, block + width, id);
    std::fill(nan, nan + width, 0);
    for (int64_t r = r0; r < r1; ++r) {
      const float* row;
      if (dtype == DType::kFloat32) {
        row = static_cast<const float*>(x) + r * stride;
      } else {
        ToFloat(dtype, ElementAt(x, dtype, r * stride), row_buf, width);
        row = row_buf;
      }
      int64_t c = 0;
      for (; c + 4 <= width; c += 4) {
        Float4 acc, v;
        Int4 lane_nan;
        Load4(acc, block + c);
        Load4(v, row + c);
        std::memcpy(&lane_nan, nan + c, sizeof(lane_nan));
        Step4<K>(acc, v, lane_nan);
        Store4(block + c, acc);
        std::memcpy(nan + c, &lane_nan, sizeof(lane_nan));
      }
      for (; c < width; ++c) {
        block[c] = Step<K>(block[c], row[c]);
        if (IsNan(row[c])) nan[c] = -1;
      }
    }
    if constexpr (TracksNan(K)) {
      for (int64_t c = 0; c < width; ++c) {
        if (nan[c]) block[c] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    int level = 0;
    while (filled[level]) {
      for (int64_t c = 0; c < width; ++c) block[c] = ReduceCombine2(K, cascade[level][c], block[c]);
      filled[level] = false;
      ++level;
    }
    std::copy(block, block + width, cascade[level]);
    filled[level] = true;
  }
  // Remaining levels, the oldest (leftmost) first.
  bool any = false;
  for (int level = kLevels - 1; level >= 0; --level) {
    if (!filled[level]) continue;
    if (!any) {
      std::copy(cascade[level], cascade[level] + width, out);
      any = true;
    } else {
      for (int64_t c = 0; c < width; ++c) out[c] = ReduceCombine2(K, out[c], cascade[level][c]);
    }
  }
  if (!any) std::fill(out, out + width, id);
}

// What ReduceShard writes.
enum class ReduceOutput {
  kFinal,          // final values in the output dtype, into the full output
  kPartial,        // one fp32 partial [rows, inner] for the whole axis range
  kChunkPartials,  // one fp32 partial [rows, inner] per chunk, chunk-major
};

template <ReduceKind K>
void ReduceShard(ThreadPool& pool, const ReduceSpec& spec, Range outer, Range axis,
                 ReduceOutput mode, void* out) {
  const DType dtype = spec.input.dtype;
  const void* in = spec.input.data;
  const int64_t inner = spec.inner, axis_len = spec.axis_len;
  const int64_t rows = outer.size();
  if (rows <= 0 || inner <= 0) return;
  // Chunks of the axis range, aligned at multiples of kReduceChunk.
  const int64_t first_chunk = axis.begin / kReduceChunk;
  const int64_t chunks = axis.size() <= 0 ? 0 : (axis.end - 1) / kReduceChunk - first_chunk + 1;
  auto chunk_range = [&](int64_t c) {
    const int64_t b = std::max(axis.begin, (first_chunk + c) * kReduceChunk);
    const int64_t e = std::min(axis.end, (first_chunk + c + 1) * kReduceChunk);
    return Range{b, e};
  };

  // Chunk results: [rows, chunks, inner] here, or [chunks, rows, inner]
  // straight into `out` for kChunkPartials.
  const int64_t tiles = inner == 1 ? 1 : CeilDiv(inner, kInnerTile);
  const bool to_out = mode == ReduceOutput::kChunkPartials;
  std::vector<float> chunk_results(
      to_out ? 0 : static_cast<size_t>(rows * std::max<int64_t>(chunks, 1) * inner));
  auto chunk_result = [&](int64_t r, int64_t c) {
    return to_out ? static_cast<float*>(out) + (c * rows + r) * inner
                  : chunk_results.data() + (r * chunks + c) * inner;
  };
  const int64_t items = rows * chunks * tiles;
  if (items > 0) {
    const int64_t item_work = std::min(axis.size(), kReduceChunk) * std::min(inner, kInnerTile);
    const int64_t per_task =
        std::max<int64_t>(1, kMinParallelWork * 4 / std::max<int64_t>(item_work, 1));
    pool.ParallelFor(CeilDiv(items, per_task), [&](int64_t task) {
      const int64_t end = std::min(items, (task + 1) * per_task);
      for (int64_t item = task * per_task; item < end; ++item) {
        const int64_t tile = item % tiles;
        const int64_t c = (item / tiles) % chunks;
        const int64_t r = item / (tiles * chunks);
        const Range ar = chunk_range(c);
        const int64_t o = outer.begin + r;
        float* dst = chunk_result(r, c);
        if (inner == 1) {
          *dst =
              ReduceContiguous<K>(dtype, ElementAt(in, dtype, o * axis_len + ar.begin), ar.size());
        } else {
          const int64_t c0 = tile * kInnerTile, width = std::min(kInnerTile, inner - c0);
          ReduceStrided<K>(dtype, ElementAt(in, dtype, (o * axis_len + ar.begin) * inner + c0),
                           ar.size(), inner, width, dst + c0);
        }
      }
    });
  }

  if (to_out) return;

  // Combine chunks in the fixed order, finalise, write.
  const bool partial = mode == ReduceOutput::kPartial;
  const int64_t outputs = rows * inner;
  pool.ParallelRange(0, outputs, kMinParallelWork, pool.size(), [&](int64_t b, int64_t e) {
    float buf[256];
    for (int64_t i0 = b; i0 < e; i0 += 256) {
      const int64_t len = std::min<int64_t>(256, e - i0);
      for (int64_t t = 0; t < len; ++t) {
        const int64_t r = (i0 + t) / inner, c = (i0 + t) % inner;
        float v = CombinePartials(K, chunk_results.data() + r * chunks * inner + c, chunks, inner);
        buf[t] = partial ? v : FinalizeReduce(K, v, axis_len);
      }
      if (partial) {
        std::copy(buf, buf + len, static_cast<float*>(out) + i0);
      } else {
        const DType out_dtype = spec.options.output_dtype;
        FromFloat(out_dtype, buf, ElementAt(out, out_dtype, outer.begin * inner + i0), len);
      }
    }
  });
}

// ---------------------------------------------------------------------------
// Transpose
// ---------------------------------------------------------------------------
constexpr int64_t kTransposeTile = 64;

// The transpose padded to rank 4: output dims and, per output axis, the
// input stride of the axis it comes from.
struct TransposeGeometry {
  int64_t dims[4] = {1, 1, 1, 1};
  int64_t in_stride[4] = {0, 0, 0, 0};
  int64_t rows() const { return dims[0] * dims[1] * dims[2]; }
};

TransposeGeometry MakeGeometry(const TransposeSpec& spec) {
  TransposeGeometry g;
  int64_t strides[4];
  int64_t s = 1;
  for (int i = spec.rank - 1; i >= 0; --i) {
    strides[i] = s;
    s *= spec.in_shape[i];
  }
  const int pad = 4 - spec.rank;
  for (int i = 0; i < spec.rank; ++i) {
    g.dims[pad + i] = spec.in_shape[spec.perm[i]];
    g.in_stride[pad + i] = strides[spec.perm[i]];
  }
  return g;
}

// Output rows [r0, r1) (rows of the last output axis), columns [c0, c1).
template <DType In, DType Out>
void TransposeBlock(const TransposeGeometry& g, const Storage<In>* in, Storage<Out>* out,
                    int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  auto cast = [](Storage<In> v) -> Storage<Out> {
    if constexpr (In == Out) {
      return v;
    } else {
      return StoreF<Out>(LoadF<In>(v));
    }
  };
  const int64_t d3 = g.dims[3], is3 = g.in_stride[3];
  const int64_t row_stride[3] = {g.dims[1] * g.dims[2], g.dims[2], 1};
  // The output axis fed by the input's contiguous axis, if it is not the last.
  int q = -1;
  if (is3 != 1 && d3 > 1) {
    for (int a = 0; a < 3; ++a) {
      if (g.in_stride[a] == 1 && g.dims[a] > 1) q = a;
    }
  }
  if (q < 0) {
    // Row by row: contiguous or gathered reads, contiguous writes.
    int64_t x[3] = {r0 / row_stride[0], (r0 / row_stride[1]) % g.dims[1], r0 % g.dims[2]};
    for (int64_t r = r0; r < r1; ++r) {
      const Storage<In>* src =
          in + x[0] * g.in_stride[0] + x[1] * g.in_stride[1] + x[2] * g.in_stride[2];
      Storage<Out>* dst = out + r * d3;
      if (is3 == 1) {
        for (int64_t c = c0; c < c1; ++c) dst[c] = cast(src[c]);
      } else {
        for (int64_t c = c0; c < c1; ++c) dst[c] = cast(src[c * is3]);
      }
      if (++x[2] == g.dims[2]) {
        x[2] = 0;
        if (++x[1] == g.dims[1]) {
          x[1] = 0;
          ++x[0];
        }
      }
    }
    return;
  }
  // Tiles over (axis q, last axis): reads contiguous along q, writes along the
  // last axis. The two other row axes u < v are walked in full; for each of
  // their values the rows in [r0, r1) are a contiguous interval of x_q.
  int u = -1, v = -1;
  for (int a = 0; a < 3; ++a) {
    if (a == q) continue;
    (u < 0 ? u : v) = a;
  }
  const int64_t rs_q = row_stride[q];
  for (int64_t xu = 0; xu < g.dims[u]; ++xu) {
    for (int64_t xv = 0; xv < g.dims[v]; ++xv) {
      const int64_t base_row = xu * row_stride[u] + xv * row_stride[v];
      if (r1 <= base_row) continue;
      const int64_t lo = r0 <= base_row ? 0 : CeilDiv(r0 - base_row, rs_q);
      const int64_t hi = std::min<int64_t>(g.dims[q], CeilDiv(r1 - base_row, rs_q));
      if (lo >= hi) continue;
      const Storage<In>* src = in + xu * g.in_stride[u] + xv * g.in_stride[v];
      Storage<Out>* dst = out + base_row * d3;
      // Each tile goes through a small buffer: read along the input's
      // contiguous axis (q), written along the output's (the last), so both
      // sides move whole cache lines even at power-of-two strides.
      Storage<Out> tile[kTransposeTile][kTransposeTile + 1];
      for (int64_t i0 = lo; i0 < hi; i0 += kTransposeTile) {
        const int64_t ni = std::min(hi - i0, kTransposeTile);
        for (int64_t j0 = c0; j0 < c1; j0 += kTransposeTile) {
          const int64_t nj = std::min(c1 - j0, kTransposeTile);
          for (int64_t j = 0; j < nj; ++j) {
            const Storage<In>* srow = src + (j0 + j) * is3 + i0;
            for (int64_t i = 0; i < ni; ++i) tile[i][j] = cast(srow[i]);
          }
          for (int64_t i = 0; i < ni; ++i) {
            Storage<Out>* drow = dst + (i0 + i) * rs_q * d3 + j0;
            for (int64_t j = 0; j < nj; ++j) drow[j] = tile[i][j];
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------
constexpr int64_t kQueryBlock = 32;  // query rows per task
constexpr int64_t kKeyBlock = 64;    // keys per step of the online softmax
constexpr int64_t kRowGroup = 4;     // query rows sharing each load in the inner loops
constexpr int64_t kColGroup = 16;    // output columns kept in registers per row
static_assert(kQueryBlock % kRowGroup == 0 && kKeyBlock % kColGroup == 0, "");

// The two inner products of a key block, compiled for the baseline ISA, AVX2
// and AVX-512F (chosen at load time by CPU features; AVX-512F measured 1.12x
// over AVX2 for Sq = Skv = 2048, D = 128, 8 heads on the 2-core dev machine).
// (ThreadSanitizer builds get the baseline only: their instrumented ifunc
// resolvers would run before the sanitizer's runtime is up.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define GC_HOT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GC_HOT_CLONES
#endif

// scores[r, j] = sum_c q[r, c] * kt[c, j] for r < rows (a multiple of
// kRowGroup), j < kKeyBlock. q is [rows, d], kt [d, kKeyBlock].
GC_HOT_CLONES void BlockScores(const float* q, const float* kt, int64_t rows, int64_t d,
                               float* scores) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
    for (int64_t j0 = 0; j0 < kKeyBlock; j0 += kColGroup) {
      Float8 acc[kRowGroup][2] = {};
      for (int64_t c = 0; c < d; ++c) {
        Float8 k0, k1;
        Load8(k0, kt + c * kKeyBlock + j0);
        Load8(k1, kt + c * kKeyBlock + j0 + 8);
        for (int64_t r = 0; r < kRowGroup; ++r) {
          const float qc = q[(r0 + r) * d + c];
          acc[r][0] += qc * k0;
          acc[r][1] += qc * k1;
        }
      }
      for (int64_t r = 0; r < kRowGroup; ++r) {
        Store8(scores + (r0 + r) * kKeyBlock + j0, acc[r][0]);
        Store8(scores + (r0 + r) * kKeyBlock + j0 + 8, acc[r][1]);
      }
    }
  }
}

// o[r, :] = o[r, :] * correction[r] + sum_{j < keys} p[r, j] * v[j, :] for
// r < rows (a multiple of kRowGroup). o is [rows, d] (d a multiple of
// kColGroup), p [rows, kKeyBlock], v [keys, d].
GC_HOT_CLONES void BlockUpdate(float* o, const float* p, const float* v, const float* correction,
                               int64_t rows, int64_t keys, int64_t d) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
    for (int64_t c0 = 0; c0 < d; c0 += kColGroup) {
      Float8 acc[kRowGroup][2];
      for (int64_t r = 0; r < kRowGroup; ++r) {
        Load8(acc[r][0], o + (r0 + r) * d + c0);
        Load8(acc[r][1], o + (r0 + r) * d + c0 + 8);
        acc[r][0] *= correction[r0 + r];
        acc[r][1] *= correction[r0 + r];
      }
      for (int64_t j = 0; j < keys; ++j) {
        Float8 v0, v1;
        Load8(v0, v + j * d + c0);
        Load8(v1, v + j * d + c0 + 8);
        for (int64_t r = 0; r < kRowGroup; ++r) {
          const float pj = p[(r0 + r) * kKeyBlock + j];
          acc[r][0] += pj * v0;
          acc[r][1] += pj * v1;
        }
      }
      for (int64_t r = 0; r < kRowGroup; ++r) {
        Store8(o + (r0 + r) * d + c0, acc[r][0]);
        Store8(o + (r0 + r) * d + c0 + 8, acc[r][1]);
      }
    }
  }
}

// Working buffers of one attention task, reused across its blocks.
struct AttentionScratch {
  std::vector<float> q, o, kt, k, v, scores, m, l, correction;
};

// One block of query rows [i0, i1) of one (batch, head): online softmax over
// the visible keys in blocks of kKeyBlock, one pass over K and V.
void AttentionBlock(const AttentionSpec& s, int64_t bh, int64_t i0, int64_t i1, void* o_out,
                    float* lse_out, AttentionScratch& w) {
  const DType dt = s.dtype;
  const int64_t skv = s.seq_kv, sq = s.seq_q;
  const int64_t b = bh / s.heads_q, h = bh % s.heads_q;
  const int64_t hk = h / (s.heads_q / s.heads_kv);
  const int64_t br = i1 - i0;
  const int64_t rows = CeilDiv(br, kRowGroup) * kRowGroup;  // padded
  // Head dim padded to whole column groups (zeros contribute nothing).
  const int64_t d_in = s.head_dim, d = CeilDiv(d_in, kColGroup) * kColGroup;
  const void* q = ElementAt(s.q.data, dt, bh * sq * d_in);
  const void* k = ElementAt(s.k.data, dt, (b * s.heads_kv + hk) * skv * d_in);
  const void* v = ElementAt(s.v.data, dt, (b * s.heads_kv + hk) * skv * d_in);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  w.q.assign(size_t(rows * d), 0.0f);
  w.o.assign(size_t(rows * d), 0.0f);
  w.kt.assign(size_t(d * kKeyBlock), 0.0f);
  w.k.resize(size_t(kKeyBlock * d_in));
  w.v.assign(size_t(kKeyBlock * d), 0.0f);
  w.scores.assign(size_t(rows * kKeyBlock), 0.0f);
  w.m.assign(size_t(rows), kNegInf);
  w.l.assign(size_t(rows), 0.0f);
  w.correction.assign(size_t(rows), 1.0f);
  const float scale = static_cast<float>(s.scale);
  for (int64_t r = 0; r < br; ++r) {
    float* qr = w.q.data() + r * d;
    ToFloat(dt, ElementAt(q, dt, (i0 + r) * d_in), qr, d_in);
    for (int64_t c = 0; c < d_in; ++c) qr[c] *= scale;
  }
  // Keys visible to query row i: [0, end(i)).
  auto visible_end = [&](int64_t i) -> int64_t {
    if (!s.causal) return skv;
    return std::clamp<int64_t>(i + skv - sq + 1, 0, skv);
  };
  const int64_t max_end = visible_end(i1 - 1);
  for (int64_t j0 = 0; j0 < max_end; j0 += kKeyBlock) {
    const int64_t jn = std::min(kKeyBlock, max_end - j0);
    ToFloat(dt, ElementAt(k, dt, j0 * d_in), w.k.data(), jn * d_in);
    for (int64_t j = 0; j < jn; ++j) {
      for (int64_t c = 0; c < d_in; ++c) w.kt[c * kKeyBlock + j] = w.k[j * d_in + c];
      ToFloat(dt, ElementAt(v, dt, (j0 + j) * d_in), w.v.data() + j * d, d_in);
    }
    BlockScores(w.q.data(), w.kt.data(), rows, d, w.scores.data());
    // Scores -> probabilities in place, with the running max and sum.
    for (int64_t r = 0; r < rows; ++r) {
      float* p = w.scores.data() + r * kKeyBlock;
      const int64_t valid = r < br ? std::clamp<int64_t>(visible_end(i0 + r) - j0, 0, jn) : 0;
      float block_max = kNegInf;
      for (int64_t j = 0; j < valid; ++j) block_max = std::max(block_max, p[j]);
      const float m_new = std::max(w.m[r], block_max);
      if (m_new == kNegInf) {
        std::fill(p, p + kKeyBlock, 0.0f);
        w.correction[r] = 1.0f;
        continue;
      }
      const float correction = std::exp(w.m[r] - m_new);
      float sum = 0.0f;
      for (int64_t j = 0; j < valid; ++j) {
        p[j] = std::exp(p[j] - m_new);
        sum += p[j];
      }
      std::fill(p + valid, p + kKeyBlock, 0.0f);
      w.l[r] = w.l[r] * correction + sum;
      w.m[r] = m_new;
      w.correction[r] = correction;
    }
    BlockUpdate(w.o.data(), w.scores.data(), w.v.data(), w.correction.data(), rows, jn, d);
  }
  const DType out_dtype = s.options.output_dtype;
  for (int64_t r = 0; r < br; ++r) {
    float* orow = w.o.data() + r * d;
    const bool has_keys = w.l[r] > 0.0f;
    const float inv = has_keys ? 1.0f / w.l[r] : 0.0f;
    for (int64_t c = 0; c < d_in; ++c) orow[c] = has_keys ? orow[c] * inv : 0.0f;
    FromFloat(out_dtype, orow, ElementAt(o_out, out_dtype, (bh * sq + i0 + r) * d_in), d_in);
    if (lse_out != nullptr) {
      lse_out[bh * sq + i0 + r] = has_keys ? w.m[r] + std::log(w.l[r]) : kNegInf;
    }
  }
}

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return int64_t{pages} * int64_t{page_size};
}

// Runs `body` (which may throw std::bad_alloc from its allocations) and maps
// an allocation failure to RESOURCE_EXHAUSTED.
template <typename Body>
absl::Status Guarded(std::string_view op, Body&& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(std::string(op), ": out of host memory for the shard's working buffers"));
  }
  return absl::OkStatus();
}

// One reduction shard on `pool` with its timing and costs.
absl::StatusOr<ShardRun> RunReduce(ThreadPool& pool, std::string variant, const ReduceSpec& spec,
                                   Range outer, Range axis, ReduceOutput mode, void* out) {
  ShardRun run;
  run.variant = std::move(variant);
  const auto start = Clock::now();
  RETURN_IF_ERROR(Guarded("reduce", [&] {
    switch (spec.kind) {
      case ReduceKind::kSum:
        return ReduceShard<ReduceKind::kSum>(pool, spec, outer, axis, mode, out);
      case ReduceKind::kMean:
        return ReduceShard<ReduceKind::kMean>(pool, spec, outer, axis, mode, out);
      case ReduceKind::kMax:
        return ReduceShard<ReduceKind::kMax>(pool, spec, outer, axis, mode, out);
      case ReduceKind::kMin:
        return ReduceShard<ReduceKind::kMin>(pool, spec, outer, axis, mode, out);
    }
  }));
  run.kernel_seconds = SecondsSince(start);
  const double elements = double(outer.size()) * double(axis.size()) * double(spec.inner);
  const double outputs = double(outer.size()) * double(spec.inner);
  const double chunks = double(CeilDiv(std::max<int64_t>(axis.size(), 0), kReduceChunk));
  run.flops = elements;
  run.bytes = elements * double(DTypeSize(spec.input.dtype));
  switch (mode) {
    case ReduceOutput::kFinal:
      run.bytes += outputs * double(DTypeSize(spec.options.output_dtype));
      break;
    case ReduceOutput::kPartial:
      run.bytes += outputs * 4.0;
      break;
    case ReduceOutput::kChunkPartials:
      run.bytes += outputs * 4.0 * chunks;
      break;
  }
  return run;
}

}  // namespace

CpuDevice::CpuDevice(DeviceDescription description, int threads)
    : description_(std::move(description)), pool_(std::make_unique<ThreadPool>(threads)) {
  description_.kind = "cpu";
  description_.compute_units = threads;
  // Every CBLAS call runs single-threaded on the calling thread; parallelism
  // comes from our pools, so virtual devices do not contend for OpenBLAS's.
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

CpuDevice::~CpuDevice() = default;

std::vector<std::string> CpuDevice::Variants(OpKind op) const {
  auto list = [](const auto& names) {
    return std::vector<std::string>(std::begin(names), std::end(names));
  };
  switch (op) {
    case OpKind::kGemm:
      return list(kCpuGemmVariants);
    case OpKind::kGemv:
      return list(kCpuGemvVariants);
    case OpKind::kReduce:
      return list(kCpuReduceVariants);
    case OpKind::kTranspose:
      return list(kCpuTransposeVariants);
    case OpKind::kAttention:
      return list(kCpuAttentionVariants);
  }
  return {};
}

absl::StatusOr<int> CpuDevice::ResolveVariant(OpKind op, const std::string& name) const {
  if (name.empty()) return 0;
  const std::vector<std::string> variants = Variants(op);
  for (size_t i = 0; i < variants.size(); ++i) {
    if (variants[i] == name) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("options.variant: unknown variant '", name,
                                                 "' for ", std::string(OpName(op)),
                                                 "; available: ", absl::StrJoin(variants, ", ")));
}

absl::StatusOr<ShardRun> CpuDevice::Gemm(const GemmSpec& spec, Range rows, void* c_out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kGemm, spec.options.variant));
  const bool naive = variant == 1;
  ShardRun run;
  run.variant = Variants(OpKind::kGemm)[variant];
  const auto start = Clock::now();
  const int64_t m = spec.m, n = spec.n, k = spec.k, batch = spec.batch;
  const int64_t shard_rows = rows.size();
  const DType dt = spec.dtype, out_dtype = spec.options.output_dtype;
  const float alpha = static_cast<float>(spec.alpha), beta = static_cast<float>(spec.beta);
  const bool read_c = spec.beta != 0 && spec.c.has_value();

  RETURN_IF_ERROR(Guarded("gemm", [&] {
    if (shard_rows <= 0 || n <= 0) return;
    // B as fp32, every batch entry it has.
    const int64_t b_entries = spec.b_batched ? batch : 1;
    std::vector<float> b_converted;
    const float* bf = static_cast<const float*>(spec.b.data);
    if (dt != DType::kFloat32) {
      b_converted.resize(size_t(b_entries * k * n));
      ToFloatParallel(*pool_, dt, spec.b.data, b_converted.data(), b_entries * k * n);
      bf = b_converted.data();
    }
    const int64_t ldb = spec.trans_b ? k : n;

    // Tasks: (batch entry, block of rows).
    const int64_t work = 2 * batch * shard_rows * n * std::max<int64_t>(k, 1);
    const int64_t pieces = PiecesFor(work, pool_->size());
    const int64_t blocks_per_entry = std::min(shard_rows, CeilDiv(pieces, batch));
    const int64_t block_rows = CeilDiv(shard_rows, blocks_per_entry);
    const int64_t blocks = CeilDiv(shard_rows, block_rows);
    pool_->ParallelFor(batch * blocks, [&](int64_t task) {
      const int64_t e = task / blocks;
      const int64_t i0 = rows.begin + (task % blocks) * block_rows;
      const int64_t i1 = std::min(rows.end, i0 + block_rows);
      const int64_t block = i1 - i0;
      const void* a_entry = ElementAt(spec.a.data, dt, (spec.a_batched ? e : 0) * m * k);
      std::vector<float> a_scratch, c_scratch;
      const FloatBlock a = RowsOfOpA(dt, a_entry, spec.trans_a, m, k, i0, i1, a_scratch);
      const float* b = bf + (spec.b_batched ? e : 0) * k * n;
      const int64_t out_offset = e * m * n + i0 * n;
      float* c = out_dtype == DType::kFloat32 ? static_cast<float*>(c_out) + out_offset : nullptr;
      if (c == nullptr) {
        c_scratch.resize(size_t(block * n));
        c = c_scratch.data();
      }
      if (read_c) {
        const int64_t c_offset = (spec.c_batched ? e : 0) * m * n + i0 * n;
        ToFloat(dt, ElementAt(spec.c->data, dt, c_offset), c, block * n);
      }
      Sgemm(naive, spec.trans_a, spec.trans_b, block, n, k, alpha, a.data, a.ld, b, ldb,
            read_c ? beta : 0.0f, c, n);
      if (!c_scratch.empty())
        FromFloat(out_dtype, c, ElementAt(c_out, out_dtype, out_offset), block * n);
    });
  }));

  run.kernel_seconds = SecondsSince(start);
  const double es = double(DTypeSize(dt));
  run.flops = 2.0 * double(batch) * double(shard_rows) * double(n) * double(k);
  run.bytes = es * double((spec.a_batched ? batch : 1) * shard_rows * k) +
              es * double((spec.b_batched ? batch : 1) * k * n) +
              (read_c ? es * double((spec.c_batched ? batch : 1) * shard_rows * n) : 0.0) +
              double(DTypeSize(out_dtype)) * double(batch * shard_rows * n);
  return run;
}

absl::StatusOr<ShardRun> CpuDevice::Gemv(const GemvSpec& spec, Range rows, void* y_out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kGemv, spec.options.variant));
  const bool naive = variant == 1;
  ShardRun run;
  run.variant = Variants(OpKind::kGemv)[variant];
  const auto start = Clock::now();
  const int64_t m = spec.m, k = spec.k, ncols = spec.ncols;
  const int64_t shard_rows = rows.size();
  const DType dt = spec.dtype, out_dtype = spec.options.output_dtype;
  const float alpha = static_cast<float>(spec.alpha), beta = static_cast<float>(spec.beta);
  const bool read_y = spec.beta != 0 && spec.y.has_value();

  RETURN_IF_ERROR(Guarded("gemv", [&] {
    if (shard_rows <= 0) return;
    std::vector<float> x_converted;
    const float* x = static_cast<const float*>(spec.x.data);
    if (dt != DType::kFloat32) {
      x_converted.resize(size_t(k * ncols));
      ToFloat(dt, spec.x.data, x_converted.data(), k * ncols);
      x = x_converted.data();
    }
    const int64_t work = 2 * shard_rows * std::max<int64_t>(k, 1) * ncols;
    const int64_t blocks = std::min(shard_rows, PiecesFor(work, pool_->size()));
    const int64_t block_rows = CeilDiv(shard_rows, blocks);
    // Half inputs are converted in sub-blocks of rows that stay in cache,
    // so A crosses memory once, at its own size.
    const int64_t sub_rows =
        dt == DType::kFloat32 ? block_rows
                              : std::max<int64_t>(32, kGemvScratchFloats / std::max<int64_t>(k, 1));
    pool_->ParallelFor(CeilDiv(shard_rows, block_rows), [&](int64_t task) {
      const int64_t task_begin = rows.begin + task * block_rows;
      const int64_t task_end = std::min(rows.end, task_begin + block_rows);
      std::vector<float> a_scratch, y_scratch;
      for (int64_t i0 = task_begin; i0 < task_end; i0 += sub_rows) {
        const int64_t i1 = std::min(task_end, i0 + sub_rows);
        const int64_t block = i1 - i0;
        const FloatBlock a = RowsOfOpA(dt, spec.a.data, spec.trans_a, m, k, i0, i1, a_scratch);
        const int64_t out_offset = i0 * ncols;
        float* y = out_dtype == DType::kFloat32 ? static_cast<float*>(y_out) + out_offset : nullptr;
        if (y == nullptr) {
          y_scratch.resize(static_cast<size_t>(block * ncols));
          y = y_scratch.data();
        }
        if (read_y) ToFloat(dt, ElementAt(spec.y->data, dt, out_offset), y, block * ncols);
        const float b = read_y ? beta : 0.0f;
        if (ncols == 1) {
          Sgemv(naive, spec.trans_a, block, k, alpha, a.data, a.ld, x, 1, b, y, 1);
        } else if (naive) {
          for (int64_t c = 0; c < ncols; ++c) {
            Sgemv(true, spec.trans_a, block, k, alpha, a.data, a.ld, x + c, ncols, b, y + c, ncols);
          }
        } else {
          // Several right-hand sides: one GEMM reads A once instead of ncols times.
          Sgemm(false, spec.trans_a, false, block, ncols, k, alpha, a.data, a.ld, x, ncols, b, y,
                ncols);
        }
        if (out_dtype != DType::kFloat32) {
          FromFloat(out_dtype, y, ElementAt(y_out, out_dtype, out_offset), block * ncols);
        }
      }
    });
  }));

  run.kernel_seconds = SecondsSince(start);
  const double es = double(DTypeSize(dt));
  run.flops = 2.0 * double(shard_rows) * double(k) * double(ncols);
  run.bytes = es * double(shard_rows * k + k * ncols) +
              (read_y ? es * double(shard_rows * ncols) : 0.0) +
              double(DTypeSize(out_dtype)) * double(shard_rows * ncols);
  return run;
}

absl::StatusOr<ShardRun> CpuDevice::Reduce(const ReduceSpec& spec, Range outer, Range axis,
                                           bool partial, void* out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kReduce, spec.options.variant));
  return RunReduce(*pool_, Variants(OpKind::kReduce)[variant], spec, outer, axis,
                   partial ? ReduceOutput::kPartial : ReduceOutput::kFinal, out);
}

absl::StatusOr<ShardRun> CpuDevice::ReduceChunks(const ReduceSpec& spec, Range outer, Range axis,
                                                 float* out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kReduce, spec.options.variant));
  return RunReduce(*pool_, Variants(OpKind::kReduce)[variant], spec, outer, axis,
                   ReduceOutput::kChunkPartials, out);
}

absl::StatusOr<ShardRun> CpuDevice::Transpose(const TransposeSpec& spec, int prefix_axes,
                                              Range prefix, void* out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kTranspose, spec.options.variant));
  ShardRun run;
  run.variant = Variants(OpKind::kTranspose)[variant];
  const auto start = Clock::now();
  const TransposeGeometry g = MakeGeometry(spec);
  // Output rows (of the last axis) per index of the flattened prefix.
  int64_t rows_per_prefix = 1;
  for (int a = prefix_axes; a < spec.rank - 1; ++a) rows_per_prefix *= spec.out_shape[a];
  const int64_t r0 = prefix.begin * rows_per_prefix, r1 = prefix.end * rows_per_prefix;
  const int64_t cols = g.dims[3];
  const DType in_dtype = spec.input.dtype, out_dtype = spec.options.output_dtype;

  RETURN_IF_ERROR(Guarded("transpose", [&] {
    if (r1 <= r0 || cols <= 0) return;
    const int64_t rows = r1 - r0;
    const int64_t pieces = PiecesFor(rows * cols, pool_->size() * 4);
    // Enough rows: split rows; otherwise split columns as well.
    const int64_t row_pieces = std::min(rows, pieces);
    const int64_t col_pieces = std::min(cols, CeilDiv(pieces, row_pieces));
    const int64_t row_step = CeilDiv(rows, row_pieces), col_step = CeilDiv(cols, col_pieces);
    const int64_t row_tasks = CeilDiv(rows, row_step), col_tasks = CeilDiv(cols, col_step);
    DispatchDType(in_dtype, [&](auto in_tag) {
      DispatchDType(out_dtype, [&](auto out_tag) {
        constexpr DType In = decltype(in_tag)::value;
        constexpr DType Out = decltype(out_tag)::value;
        pool_->ParallelFor(row_tasks * col_tasks, [&](int64_t task) {
          const int64_t rb = r0 + (task / col_tasks) * row_step;
          const int64_t cb = (task % col_tasks) * col_step;
          TransposeBlock<In, Out>(g, static_cast<const Storage<In>*>(spec.input.data),
                                  static_cast<Storage<Out>*>(out), rb, std::min(r1, rb + row_step),
                                  cb, std::min(cols, cb + col_step));
        });
      });
    });
  }));
  run.kernel_seconds = SecondsSince(start);
  const double elements = double(r1 - r0) * double(cols);
  run.bytes = elements * double(DTypeSize(in_dtype) + DTypeSize(out_dtype));
  run.flops = 0;
  return run;
}

absl::StatusOr<ShardRun> CpuDevice::Attention(const AttentionSpec& spec, Range heads, Range q_rows,
                                              void* o_out, float* lse_out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kAttention, spec.options.variant));
  ShardRun run;
  run.variant = Variants(OpKind::kAttention)[variant];
  const auto start = Clock::now();
  RETURN_IF_ERROR(Guarded("attention", [&] {
    if (heads.size() <= 0 || q_rows.size() <= 0 || spec.head_dim <= 0) return;
    const int64_t q_blocks = CeilDiv(q_rows.size(), kQueryBlock);
    pool_->ParallelFor(heads.size() * q_blocks, [&](int64_t task) {
      const int64_t bh = heads.begin + task / q_blocks;
      const int64_t i0 = q_rows.begin + (task % q_blocks) * kQueryBlock;
      const int64_t i1 = std::min(q_rows.end, i0 + kQueryBlock);
      thread_local AttentionScratch scratch;
      AttentionBlock(spec, bh, i0, i1, o_out, lse_out, scratch);
    });
  }));
  run.kernel_seconds = SecondsSince(start);
  // Keys each query row sees, summed over the shard's rows.
  double visible = 0;
  for (int64_t i = q_rows.begin; i < q_rows.end; ++i) {
    visible += spec.causal
                   ? double(std::clamp<int64_t>(i + spec.seq_kv - spec.seq_q + 1, 0, spec.seq_kv))
                   : double(spec.seq_kv);
  }
  const double h = double(heads.size()), d = double(spec.head_dim);
  const double es = double(DTypeSize(spec.dtype));
  run.flops = 4.0 * h * visible * d;
  run.bytes = h * double(q_rows.size()) * d * (es + double(DTypeSize(spec.options.output_dtype))) +
              h * 2.0 * double(spec.seq_kv) * d * es +
              (lse_out != nullptr ? h * double(q_rows.size()) * 4.0 : 0.0);
  return run;
}

std::vector<std::unique_ptr<Device>> CreateCpuDevices(int count,
                                                      const std::vector<double>& weights) {
  std::vector<std::unique_ptr<Device>> devices;
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads = std::max(1, hardware / std::max(count, 1));
  const int64_t memory = PhysicalMemoryBytes() / std::max(count, 1);
  for (int i = 0; i < count; ++i) {
    DeviceDescription d;
    d.index = i;
    d.kind = "cpu";
    d.name = absl::StrCat("cpu:", i, " (", threads, threads == 1 ? " thread)" : " threads)");
    d.memory_bytes = memory;
    d.weight = weights.empty() ? 1.0 : weights[i];
    for (int p = 0; p < count; ++p) {
      if (p != i) d.peers.push_back(p);
    }
    devices.push_back(std::make_unique<CpuDevice>(std::move(d), threads));
  }
  return devices;
}

}  // namespace gpucompute
