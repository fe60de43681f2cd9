// The shard planner: which device computes which part of an operation.
// Device-agnostic plain data and arithmetic, unit-tested without any device.
#ifndef GPUCOMPUTE_SERVER_CORE_PLANNER_H_
#define GPUCOMPUTE_SERVER_CORE_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "server/core/ops.h"

namespace gpucompute {

// A half-open range [begin, end).
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// One shard: `device` (an index into the planner's device list) computes
// `range` along the plan's axis.
struct Shard {
  int device = 0;
  Range range;
  bool operator==(const Shard&) const = default;
};

// Splits [0, extent) into contiguous ranges proportional to `weights`
// (device i gets about extent * w_i / sum(w)), in device order, each a
// multiple of `granularity` except the last non-empty one. Largest-remainder
// rounding, so the sizes sum to `extent` exactly; zero-size shards are
// omitted. REQUIRES: weights non-empty, every weight > 0, granularity >= 1,
// extent >= 0.
std::vector<Shard> SplitByWeight(int64_t extent, absl::Span<const double> weights,
                                 int64_t granularity = 1);

// How an operation is divided.
struct ShardPlan {
  // The axis split, for timings: "rows" (GEMM, GEMV: rows of the output),
  // "outer" or "axis" (reduce: independent output rows, or the reduced axis
  // with partial results combined), "out_blocks" (transpose: blocks of the
  // output's leading axes), "heads" or "query_rows" (attention).
  std::string axis;
  std::vector<Shard> shards;
  // Transpose: how many leading output axes the range indexes (flattened).
  int prefix_axes = 0;
};

// Reductions cut the reduced axis into chunks of kReduceChunk elements,
// aligned at 0. Each chunk is reduced on its own and chunk results are
// combined in one fixed order (server/core/reduce_combine.h), whichever device
// or thread reduced them, so a result does not depend on the number of
// devices. An "axis" plan's shards are whole chunks (the last may be short).
inline constexpr int64_t kReduceChunk = int64_t{1} << 15;

// Per-operation plans. `weights` has one entry per participating device.
// GEMM and GEMV shards begin at multiples of `row_granularity` rows
// (Device::RowGranularity), so that each shard's packed operands keep the
// alignment the devices' kernels need.
ShardPlan PlanGemm(const GemmSpec& spec, absl::Span<const double> weights,
                   int64_t row_granularity = 1);
ShardPlan PlanGemv(const GemvSpec& spec, absl::Span<const double> weights,
                   int64_t row_granularity = 1);
// Splits `outer` when it has at least as many rows as devices, or at least
// as many rows as the reduced axis has chunks ("outer"); otherwise splits the
// reduced axis in whole chunks ("axis") and chunk partials are combined.
ShardPlan PlanReduce(const ReduceSpec& spec, absl::Span<const double> weights);
// Splits the flattened leading output axes: the fewest leading axes whose
// product is at least the number of devices (all but the last axis at most).
ShardPlan PlanTranspose(const TransposeSpec& spec, absl::Span<const double> weights);
// Splits batch x heads_q ("heads") when there are at least as many as
// devices, otherwise the query rows of every head ("query_rows").
ShardPlan PlanAttention(const AttentionSpec& spec, absl::Span<const double> weights);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_PLANNER_H_
