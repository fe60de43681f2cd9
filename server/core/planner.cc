#include "server/core/planner.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace gpucompute {
namespace {

ShardPlan MakePlan(SplitAxis axis, int64_t extent, absl::Span<const double> weights,
                   int64_t granularity = 1) {
  ShardPlan plan;
  plan.axis = axis;
  plan.shards = SplitByWeight(extent, weights, granularity);
  return plan;
}

}  // namespace

std::vector<Shard> SplitByWeight(int64_t extent, absl::Span<const double> weights,
                                 int64_t granularity) {
  std::vector<Shard> shards;
  if (extent <= 0 || weights.empty()) return shards;
  const int n = static_cast<int>(weights.size());
  const int64_t units = (extent + granularity - 1) / granularity;
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);

  // Largest remainder: floor of every quota, then one more unit to the largest
  // fractional parts (ties to the lower device index) until the sum is exact.
  std::vector<int64_t> count(n);
  std::vector<double> fraction(n);
  int64_t assigned = 0;
  for (int i = 0; i < n; ++i) {
    const double quota = static_cast<double>(units) * weights[i] / total;
    count[i] = std::min<int64_t>(static_cast<int64_t>(quota), units);
    fraction[i] = quota - static_cast<double>(count[i]);
    assigned += count[i];
  }
  // Rounding in the quotas can overshoot by a unit or so: take it back from
  // the smallest fractions.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return fraction[a] > fraction[b]; });
  for (int j = 0; assigned < units; j = (j + 1) % n) {
    ++count[order[j]];
    ++assigned;
  }
  for (int j = n - 1; assigned > units; j = (j + n - 1) % n) {
    if (count[order[j]] > 0) {
      --count[order[j]];
      --assigned;
    }
  }

  int64_t unit_begin = 0;
  for (int i = 0; i < n; ++i) {
    if (count[i] == 0) continue;
    const int64_t begin = unit_begin * granularity;
    unit_begin += count[i];
    const int64_t end = std::min(extent, unit_begin * granularity);
    shards.push_back({i, {begin, end}});
  }
  return shards;
}

ShardPlan PlanGemm(const GemmSpec& spec, absl::Span<const double> weights,
                   int64_t row_granularity) {
  return MakePlan(SplitAxis::kRows, spec.m, weights, row_granularity);
}

ShardPlan PlanGemv(const GemvSpec& spec, absl::Span<const double> weights,
                   int64_t row_granularity) {
  return MakePlan(SplitAxis::kRows, spec.m, weights, row_granularity);
}

ShardPlan PlanReduce(const ReduceSpec& spec, absl::Span<const double> weights) {
  const int64_t devices = static_cast<int64_t>(weights.size());
  const int64_t chunks = (spec.axis_len + kReduceChunk - 1) / kReduceChunk;
  const bool empty_output = spec.outer == 0 || spec.inner == 0;
  if (empty_output || spec.outer >= devices || spec.outer >= chunks) {
    return MakePlan(SplitAxis::kOuter, spec.outer, weights);
  }
  return MakePlan(SplitAxis::kAxis, spec.axis_len, weights, kReduceChunk);
}

ShardPlan PlanTranspose(const TransposeSpec& spec, absl::Span<const double> weights) {
  const int64_t devices = static_cast<int64_t>(weights.size());
  int prefix_axes = 0;
  int64_t extent = 1;
  while (prefix_axes < spec.rank - 1 && extent < devices) {
    extent *= spec.in_shape[spec.perm[prefix_axes]];
    ++prefix_axes;
  }
  ShardPlan plan = MakePlan(SplitAxis::kOutBlocks, extent, weights);
  plan.prefix_axes = prefix_axes;
  return plan;
}

ShardPlan PlanAttention(const AttentionSpec& spec, absl::Span<const double> weights) {
  const int64_t devices = static_cast<int64_t>(weights.size());
  const int64_t heads = spec.batch * spec.heads_q;
  if (heads >= devices) return MakePlan(SplitAxis::kHeads, heads, weights);
  return MakePlan(SplitAxis::kQueryRows, spec.seq_q, weights);
}

}  // namespace gpucompute
