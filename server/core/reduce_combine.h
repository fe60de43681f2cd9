// The fixed combination order of reduction partials, shared by the engine
// (combining chunk partials from several devices) and the CPU device
// (combining its own chunk results), so that both produce bit-identical
// results for any number of devices and threads.
#ifndef GPUCOMPUTE_SERVER_CORE_REDUCE_COMBINE_H_
#define GPUCOMPUTE_SERVER_CORE_REDUCE_COMBINE_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "server/core/ops.h"

namespace gpucompute {

// The value a reduction of zero elements starts from (before finalisation):
// 0 for SUM and MEAN, -Inf for MAX, +Inf for MIN.
inline float ReduceIdentity(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kMax:
      return -std::numeric_limits<float>::infinity();
    case ReduceKind::kMin:
      return std::numeric_limits<float>::infinity();
    default:
      return 0.0f;
  }
}

// Combines two partials: sum, or max / min with NaN propagating (numpy).
inline float ReduceCombine2(ReduceKind kind, float a, float b) {
  switch (kind) {
    case ReduceKind::kMax:
      return (a > b || a != a) ? a : b;
    case ReduceKind::kMin:
      return (a < b || a != a) ? a : b;
    default:
      return a + b;
  }
}

// Combines n partials p[0], p[stride], ... p[(n-1)*stride] in a balanced
// binary tree split at n/2 (the fixed order). n == 0 gives the identity.
inline float CombinePartials(ReduceKind kind, const float* p, int64_t n, int64_t stride) {
  if (n == 0) return ReduceIdentity(kind);
  if (n == 1) return p[0];
  const int64_t half = n / 2;
  return ReduceCombine2(kind, CombinePartials(kind, p, half, stride),
                        CombinePartials(kind, p + half * stride, n - half, stride));
}

// The final value of a reduction whose combined partial is `acc` over
// `axis_len` elements: MEAN divides (0 / 0 is NaN, as in numpy); the others
// return acc.
inline float FinalizeReduce(ReduceKind kind, float acc, int64_t axis_len) {
  if (kind != ReduceKind::kMean) return acc;
  return static_cast<float>(static_cast<double>(acc) / static_cast<double>(axis_len));
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_REDUCE_COMBINE_H_
