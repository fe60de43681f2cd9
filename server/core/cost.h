// The cost model: the one definition of the bytes and FLOPs of an operation
// or of the part of it one shard computes (what the responses and metrics
// report, and what admission holds), what a device charges for them, and from
// that how many devices an operation is worth. Plain data and arithmetic,
// unit-tested without devices.
//
// Splitting has a price: every shard pays a device's fixed cost (on a GPU:
// leasing a lane, stream-ordered allocations, events, synchronisation) and
// moves in full what every shard needs (GEMM's B, GEMV's x, attention's K and
// V when the query rows are split). A small operation is done sooner, or no
// later, on one device.
#ifndef GPUCOMPUTE_SERVER_CORE_COST_H_
#define GPUCOMPUTE_SERVER_CORE_COST_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/types/span.h"
#include "server/core/ops.h"
#include "server/core/planner.h"

namespace gpucompute {

// What running one shard costs a device. A rate of 0 means that resource is
// not modelled (costs nothing).
struct DeviceCost {
  double fixed_seconds = 0;              // per shard, whatever its size
  double transfer_bytes_per_second = 0;  // host <-> device staging of a shard's bytes
  double memory_bytes_per_second = 0;    // device memory traffic of a shard's bytes
  double flops_per_second = 0;           // arithmetic
};

// Bytes (inputs read once, outputs written once) and FLOPs of one shard, with
// the arguments the Device methods take (server/device/device.h). The whole
// operation is the full range(s). Attention counts exactly the keys each
// query row sees under the causal mask.
WorkCost GemmWork(const GemmSpec& spec, Range rows);
WorkCost GemvWork(const GemvSpec& spec, Range rows);
// `partial`: one fp32 partial per chunk of `axis` instead of final values.
WorkCost ReduceWork(const ReduceSpec& spec, Range outer, Range axis, bool partial);
WorkCost TransposeWork(const TransposeSpec& spec, int prefix_axes, Range prefix);
WorkCost AttentionWork(const AttentionSpec& spec, Range heads, Range q_rows);

// Estimated seconds of `work` as one shard on a device of cost `cost`:
// fixed + host_bytes / transfer rate + bytes / memory rate + FLOPs / FLOP
// rate (the terms run one after another: upload, kernels, download).
double ShardSeconds(const DeviceCost& cost, const WorkCost& work);

// Host memory a validated operation holds while it runs: its inputs in host
// memory plus its results going there (resident operands and kept results
// live in device memory), i.e. the host_bytes of the whole operation's
// WorkCost, rounded up and saturated at the int64 maximum. The admission
// cost (--max_inflight_bytes).
int64_t FootprintBytes(const GemmSpec& spec);
int64_t FootprintBytes(const GemvSpec& spec);
int64_t FootprintBytes(const ReduceSpec& spec);
int64_t FootprintBytes(const TransposeSpec& spec);
int64_t FootprintBytes(const AttentionSpec& spec);

// A plan with fewer devices is taken when its estimate is within this
// fraction of the best: the estimates are coarse, and a request left on fewer
// devices leaves the others to concurrent requests.
inline constexpr double kCostTolerance = 0.05;

// One device an operation may run on, as the cost model sees it.
struct CostedDevice {
  int device = 0;       // the device's index (DeviceDescription::index)
  double weight = 1.0;  // relative compute weight (DeviceDescription::weight)
  DeviceCost cost;
  // Estimated seconds of the work the device holds already (shards of other
  // operations running there).
  double busy_seconds = 0;
};

// Chooses how many candidates run an operation and returns the plan over
// them, each shard.device a CostedDevice::device. For k = 1..n it takes the k
// least busy candidates (equally busy: the heavier, then the earlier first),
// keeps them in candidate order, plans the operation over their weights with
// `plan_for` (whose shards number devices by position in the weights), and
// estimates the plan as its slowest shard (the device's busy_seconds plus
// ShardSeconds of `shard_work(plan, shard)` there). The result is the
// smallest k whose estimate is within kCostTolerance of the best k's; weights
// alone still divide the work among the chosen. So concurrent small
// operations spread over the devices instead of queueing on one. When every
// candidate is busy, a plan's estimate also counts the device time it adds
// over the k = 1 plan (the extra shards' fixed costs and shared operands):
// under load a split must save more than it takes from the work queued
// behind it, so a stream of operations runs each on one device. When no
// candidate has a fixed cost, splitting costs nothing and every candidate is
// chosen without estimating. REQUIRES: candidates non-empty, every weight > 0.
ShardPlan PlaceByCost(
    absl::Span<const CostedDevice> candidates,
    const std::function<ShardPlan(absl::Span<const double> weights)>& plan_for,
    const std::function<WorkCost(const ShardPlan& plan, const Shard& shard)>& shard_work);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_COST_H_
