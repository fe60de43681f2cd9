// The shard planner: which device computes which part of an operation.
// Device-agnostic plain data and arithmetic, unit-tested without any device.
#ifndef GPUCOMPUTE_SERVER_CORE_PLANNER_H_
#define GPUCOMPUTE_SERVER_CORE_PLANNER_H_

#include <cstdint>
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

// One shard: `device` computes `range` along the plan's axis. The planner's
// functions number devices by their position in `weights`; a placement
// (server/core/cost.h) renumbers them to the server's device indices.
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

// The axis an operation is split along.
enum class SplitAxis : int {
  kRows = 0,   // GEMM, GEMV: rows of the output
  kOuter,      // reduce: independent output rows
  kAxis,       // reduce: the reduced axis, partial results combined
  kOutBlocks,  // transpose: blocks of the output's leading axes
  kHeads,      // attention: (batch, query head) pairs
  kQueryRows,  // attention: query rows of every head
};

// How an operation is divided.
struct ShardPlan {
  SplitAxis axis = SplitAxis::kRows;
  std::vector<Shard> shards;
  // Transpose: how many leading output axes the range indexes (flattened).
  int prefix_axes = 0;
};

// Reductions cut the reduced axis into chunks of kReduceChunk elements,
// aligned at 0. Each chunk is reduced on its own and chunk results are
// combined in one fixed order (server/core/reduce_combine.h), whichever device
// or thread reduced them, so a result does not depend on the number of
// devices. A kAxis plan's shards are whole chunks (the last may be short).
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
// as many rows as the reduced axis has chunks (kOuter); otherwise splits the
// reduced axis in whole chunks (kAxis) and chunk partials are combined.
ShardPlan PlanReduce(const ReduceSpec& spec, absl::Span<const double> weights);
// Splits the flattened leading output axes: the fewest leading axes whose
// product is at least the number of devices (all but the last axis at most).
ShardPlan PlanTranspose(const TransposeSpec& spec, absl::Span<const double> weights);
// Splits batch x heads_q (kHeads) when there are at least as many as
// devices, otherwise the query rows of every head (kQueryRows).
ShardPlan PlanAttention(const AttentionSpec& spec, absl::Span<const double> weights);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_PLANNER_H_
