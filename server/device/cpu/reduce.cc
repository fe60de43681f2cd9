// Reductions on the CPU in a fixed order: the reduced axis in chunks of
// kReduceChunk (aligned at 0); inside a chunk, contiguous runs are halved
// pairwise down to blocks of 256 reduced in 8 interleaved lanes, strided runs
// (inner > 1) accumulate blocks of 32 rows combined by a binary-counter
// cascade; chunks are combined by CombinePartials. So the bits depend on
// neither the number of threads nor the number of devices.
#include <cstring>
#include <limits>
#include <vector>

#include "server/core/reduce_combine.h"
#include "server/device/cpu/elements.h"
#include "server/device/cpu/kernels.h"

namespace gpucompute::cpu {
namespace {

// Four floats and four lane masks: native on every x86-64, so comparisons
// compile to packed instructions (GCC splits wider ones into scalars on the
// baseline ISA).
typedef float Float4 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));

inline void Load4(Float4& v, const float* p) { std::memcpy(&v, p, sizeof(v)); }
inline void Store4(float* p, const Float4& v) { std::memcpy(p, &v, sizeof(v)); }

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

template <ReduceKind K>
void ReduceShard(ThreadPool& pool, const ReduceSpec& spec, Range outer, Range axis,
                 ReduceOutput mode, void* out, ShardStop& stop) {
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
      if (stop.Stop()) return;
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

  if (to_out || stop.stopped()) return;

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

}  // namespace

void ReduceRows(ThreadPool& pool, const ReduceSpec& spec, Range outer, Range axis,
                ReduceOutput mode, void* out, ShardStop& stop) {
  switch (spec.kind) {
    case ReduceKind::kSum:
      return ReduceShard<ReduceKind::kSum>(pool, spec, outer, axis, mode, out, stop);
    case ReduceKind::kMean:
      return ReduceShard<ReduceKind::kMean>(pool, spec, outer, axis, mode, out, stop);
    case ReduceKind::kMax:
      return ReduceShard<ReduceKind::kMax>(pool, spec, outer, axis, mode, out, stop);
    case ReduceKind::kMin:
      return ReduceShard<ReduceKind::kMin>(pool, spec, outer, axis, mode, out, stop);
  }
}

}  // namespace gpucompute::cpu
