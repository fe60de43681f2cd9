#include "server/core/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

namespace gpucompute {
namespace {

double Size(DType t) { return double(DTypeSize(t)); }
double Count(Range r) { return double(std::max<int64_t>(r.size(), 0)); }

// `bytes` rounded up to a whole byte count, saturated at the int64 maximum.
int64_t RoundUpBytes(double bytes) {
  constexpr double kMax = 9.2e18;  // below 2^63, exactly representable
  if (!(bytes < kMax)) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(std::ceil(bytes));
}

// Keys that query rows `q_rows` see in total: every key, or under the causal
// mask (aligned bottom-right) clamp(i + seq_kv - seq_q + 1, 0, seq_kv) for
// row i. Closed form, as the rows can be as many as an int64 holds.
double VisibleKeys(const AttentionSpec& s, Range q_rows) {
  if (!s.causal) return Count(q_rows) * double(s.seq_kv);
  // x = i + shift over [lo, hi) sees no key below 1, x keys up to seq_kv.
  const int64_t shift = s.seq_kv - s.seq_q + 1;
  const int64_t lo = q_rows.begin + shift, hi = q_rows.end + shift;
  const int64_t first = std::max<int64_t>(lo, 1), last = std::min(hi, s.seq_kv);  // [first, last)
  double keys = 0;
  if (first < last) keys += (double(first) + double(last - 1)) * double(last - first) / 2;
  const int64_t full = std::max(lo, s.seq_kv);
  if (full < hi) keys += double(hi - full) * double(s.seq_kv);
  return keys;
}

// Distinct (batch, kv head) pairs that the flattened (batch, q head) pairs
// `heads` read: q head h reads kv head h / (heads_q / heads_kv).
double KvHeads(const AttentionSpec& s, Range heads) {
  if (heads.size() <= 0 || s.heads_q <= 0 || s.heads_kv <= 0) return 0;
  const int64_t group = std::max<int64_t>(s.heads_q / s.heads_kv, 1);
  auto kv = [&](int64_t x) { return (x / s.heads_q) * s.heads_kv + (x % s.heads_q) / group; };
  return double(kv(heads.end - 1) - kv(heads.begin) + 1);
}

// Bytes that cross between host and device memory: those of operands in host
// memory, and of results unless they are kept resident.
double OnHost(const TensorView& view, double bytes) {
  return view.device == kHostMemory ? bytes : 0.0;
}
double OnHost(const OpOptions& options, double bytes) { return options.keep_output ? 0.0 : bytes; }

}  // namespace

WorkCost GemmWork(const GemmSpec& spec, Range rows) {
  const double es = Size(spec.dtype), m = Count(rows), batch = double(spec.batch);
  const double n = double(spec.n), k = double(spec.k);
  WorkCost w;
  w.flops = 2.0 * batch * m * n * k;
  const double a = es * (spec.a_batched ? batch : 1.0) * m * k;  // A: the shard's rows
  const double b = es * (spec.b_batched ? batch : 1.0) * k * n;  // B: whole, for every shard
  const double c = spec.c.has_value() ? es * (spec.c_batched ? batch : 1.0) * m * n : 0.0;
  const double out = Size(spec.options.output_dtype) * batch * m * n;
  w.bytes = a + b + c + out;
  w.host_bytes = OnHost(spec.a, a) + OnHost(spec.b, b) + (spec.c ? OnHost(*spec.c, c) : 0.0) +
                 OnHost(spec.options, out);
  return w;
}

WorkCost GemvWork(const GemvSpec& spec, Range rows) {
  const double es = Size(spec.dtype), m = Count(rows);
  const double k = double(spec.k), ncols = double(spec.ncols);
  WorkCost w;
  w.flops = 2.0 * m * k * ncols;
  const double a = es * m * k, x = es * k * ncols;  // A's rows; x whole, for every shard
  const double y = spec.y.has_value() ? es * m * ncols : 0.0;
  const double out = Size(spec.options.output_dtype) * m * ncols;
  w.bytes = a + x + y + out;
  w.host_bytes = OnHost(spec.a, a) + OnHost(spec.x, x) + (spec.y ? OnHost(*spec.y, y) : 0.0) +
                 OnHost(spec.options, out);
  return w;
}

WorkCost ReduceWork(const ReduceSpec& spec, Range outer, Range axis, bool partial) {
  const double elements = Count(outer) * Count(axis) * double(spec.inner);
  const double outputs = Count(outer) * double(spec.inner);
  const double chunks =
      double((std::max<int64_t>(axis.size(), 0) + kReduceChunk - 1) / kReduceChunk);
  WorkCost w;
  w.flops = elements;
  const double in = elements * Size(spec.input.dtype);
  const double out = partial ? outputs * 4.0 * chunks : outputs * Size(spec.options.output_dtype);
  w.bytes = in + out;
  // Partials always go to the host, where they are combined.
  w.host_bytes = OnHost(spec.input, in) + (partial ? out : OnHost(spec.options, out));
  return w;
}

WorkCost TransposeWork(const TransposeSpec& spec, int prefix_axes, Range prefix) {
  double elements = Count(prefix);
  for (int i = prefix_axes; i < spec.rank; ++i) elements *= double(spec.in_shape[spec.perm[i]]);
  WorkCost w;
  const double in = elements * Size(spec.input.dtype);
  const double out = elements * Size(spec.options.output_dtype);
  w.bytes = in + out;
  w.host_bytes = OnHost(spec.input, in) + OnHost(spec.options, out);
  return w;
}

WorkCost AttentionWork(const AttentionSpec& spec, Range heads, Range q_rows) {
  const double h = Count(heads), q = Count(q_rows), d = double(spec.head_dim);
  const double es = Size(spec.dtype);
  WorkCost w;
  w.flops = 4.0 * h * VisibleKeys(spec, q_rows) * d;
  const double q_in = h * q * d * es;
  const double kv = KvHeads(spec, heads) * double(spec.seq_kv) * d * es;  // each: every key
  const double out = h * q * d * Size(spec.options.output_dtype) +
                     (spec.return_lse ? h * q * 4.0 : 0.0);  // O and the LSE
  w.bytes = q_in + 2.0 * kv + out;
  w.host_bytes =
      OnHost(spec.q, q_in) + OnHost(spec.k, kv) + OnHost(spec.v, kv) + OnHost(spec.options, out);
  return w;
}

double ShardSeconds(const DeviceCost& cost, const WorkCost& work) {
  double seconds = cost.fixed_seconds;
  if (cost.transfer_bytes_per_second > 0) {
    seconds += work.host_bytes / cost.transfer_bytes_per_second;
  }
  if (cost.memory_bytes_per_second > 0) seconds += work.bytes / cost.memory_bytes_per_second;
  if (cost.flops_per_second > 0) seconds += work.flops / cost.flops_per_second;
  return seconds;
}

int64_t FootprintBytes(const GemmSpec& spec) {
  return RoundUpBytes(GemmWork(spec, {0, spec.m}).host_bytes);
}
int64_t FootprintBytes(const GemvSpec& spec) {
  return RoundUpBytes(GemvWork(spec, {0, spec.m}).host_bytes);
}
int64_t FootprintBytes(const ReduceSpec& spec) {
  return RoundUpBytes(ReduceWork(spec, {0, spec.outer}, {0, spec.axis_len}, false).host_bytes);
}
int64_t FootprintBytes(const TransposeSpec& spec) {
  // The whole output as one prefix unit.
  return RoundUpBytes(TransposeWork(spec, 0, {0, 1}).host_bytes);
}
int64_t FootprintBytes(const AttentionSpec& spec) {
  return RoundUpBytes(
      AttentionWork(spec, {0, spec.batch * spec.heads_q}, {0, spec.seq_q}).host_bytes);
}

ShardPlan PlaceByCost(
    absl::Span<const CostedDevice> candidates,
    const std::function<ShardPlan(absl::Span<const double> weights)>& plan_for,
    const std::function<WorkCost(const ShardPlan& plan, const Shard& shard)>& shard_work) {
  const int n = static_cast<int>(candidates.size());
  // The plan over `chosen` (indices into the candidates), its shards still
  // numbered by position in `chosen`.
  auto plan_over = [&](const std::vector<int>& chosen) {
    std::vector<double> weights;
    weights.reserve(chosen.size());
    for (int c : chosen) weights.push_back(candidates[c].weight);
    return plan_for(weights);
  };
  // Renumbers a plan's shards from positions in `chosen` to device indices.
  auto place = [&](ShardPlan plan, const std::vector<int>& chosen) {
    for (Shard& shard : plan.shards) shard.device = candidates[chosen[shard.device]].device;
    return plan;
  };
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  const bool any_fixed =
      std::any_of(candidates.begin(), candidates.end(),
                  [](const CostedDevice& c) { return c.cost.fixed_seconds > 0; });
  if (n == 1 || !any_fixed) return place(plan_over(all), all);

  std::vector<int> rank = all;
  std::stable_sort(rank.begin(), rank.end(), [&](int a, int b) {
    if (candidates[a].busy_seconds != candidates[b].busy_seconds) {
      return candidates[a].busy_seconds < candidates[b].busy_seconds;
    }
    return candidates[a].weight > candidates[b].weight;
  });
  // Every candidate holds work already: the devices' time is contended, and
  // what a split adds to it (a fixed cost per shard, operands every shard
  // reads) delays the operations queued behind it.
  const bool loaded = std::all_of(candidates.begin(), candidates.end(),
                                  [](const CostedDevice& c) { return c.busy_seconds > 0; });
  std::vector<std::vector<int>> chosen_for;
  std::vector<ShardPlan> plans;
  std::vector<double> seconds;
  double one_device_seconds = 0;  // the k = 1 plan's device time
  for (int k = 1; k <= n; ++k) {
    std::vector<int> chosen(rank.begin(), rank.begin() + k);
    std::sort(chosen.begin(), chosen.end());
    ShardPlan plan = plan_over(chosen);
    double slowest = 0, device_seconds = 0;
    for (const Shard& shard : plan.shards) {
      const CostedDevice& device = candidates[chosen[shard.device]];
      const double own = ShardSeconds(device.cost, shard_work(plan, shard));
      slowest = std::max(slowest, device.busy_seconds + own);
      device_seconds += own;
    }
    if (k == 1) one_device_seconds = device_seconds;
    if (loaded) slowest += std::max(0.0, device_seconds - one_device_seconds);
    chosen_for.push_back(std::move(chosen));
    plans.push_back(std::move(plan));
    seconds.push_back(slowest);
  }
  const double best = *std::min_element(seconds.begin(), seconds.end());
  int k = 0;
  while (seconds[k] > best * (1.0 + kCostTolerance)) ++k;
  return place(std::move(plans[k]), chosen_for[k]);
}

}  // namespace gpucompute
