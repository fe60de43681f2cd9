// The engine: places each operation on the devices (server/core/cost.h),
// runs the shards concurrently, gathers the result, and attributes to every
// shard the bytes and FLOPs the cost model gives its part. No protobuf, no
// gRPC.
#ifndef GPUCOMPUTE_SERVER_ENGINE_ENGINE_H_
#define GPUCOMPUTE_SERVER_ENGINE_ENGINE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/core/cost.h"
#include "server/core/ops.h"
#include "server/core/planner.h"
#include "server/device/device.h"
#include "server/engine/admission.h"
#include "server/engine/tensor_store.h"

namespace gpucompute {

// The call an operation belongs to, beside its spec: how long the operation
// may wait for room on its devices (per-device admission) and whether its
// result is still wanted.
struct CallContext {
  absl::Time deadline = absl::InfiniteFuture();
  // True once the result is no longer wanted (the caller cancelled or
  // passed its deadline, or the server is stopping): shards not started yet
  // are dropped, and the devices see it as OpOptions::cancelled, which CPU
  // kernels ask between blocks. May be empty: never cancelled.
  CancelCheck cancelled;
  // The caller, as owner of the results it keeps (options.keep_output).
  std::string owner;
  // The resident tensors the spec's operands name (held alive by the
  // caller): a shard on a device that cannot read one in place reads a copy
  // the store makes there.
  std::vector<std::shared_ptr<ResidentTensor>> resident;
};

// One shard as reported to clients and metrics.
struct ShardTiming {
  int device = 0;  // the device's index
  SplitAxis axis = SplitAxis::kRows;
  Range range;
  ShardRun run;   // what the device measured
  WorkCost work;  // the bytes and FLOPs of its part (server/core/cost.h)
};

// The result of one operation.
struct OpResult {
  // The result in host memory, or with options.keep_output empty and the
  // result in kept_output (pending: visible once the store publishes it).
  HostTensor output;
  std::optional<HostTensor> lse;  // attention with return_lse
  std::shared_ptr<ResidentTensor> kept_output;
  std::shared_ptr<ResidentTensor> kept_lse;
  std::vector<ShardTiming> shards;
  std::string backend;  // "cpu" or "cuda"
  // Seconds the operation waited for room on its devices
  // (--device_max_inflight_bytes) before its shards started.
  double device_wait_seconds = 0;
};

// Observer of every shard that ran (the metrics layer implements it).
class ShardObserver {
 public:
  virtual ~ShardObserver() = default;
  virtual void OnShard(OpKind op, DType dtype, const DeviceDescription& device,
                       const ShardTiming& shard) = 0;
};

class Engine {
 public:
  // Takes ownership of `devices` (indices 0..n-1, in order). `backend` names
  // them ("cpu" or "cuda"). `observer` may be null; it must outlive the engine.
  // `device_max_inflight_bytes[i]` bounds the bytes (inputs plus outputs) of
  // the shards device i holds at once; missing or <= 0 entries are unbounded.
  // `resident` configures the store of resident tensors.
  // REQUIRES: devices non-empty.
  Engine(std::string backend, std::vector<std::unique_ptr<Device>> devices,
         ShardObserver* observer = nullptr, std::vector<int64_t> device_max_inflight_bytes = {},
         TensorStoreOptions resident = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs one operation. The candidate devices are options.devices (in that
  // order), or every healthy device; the operation runs on the fewest of the
  // least busy candidates (equally busy: the heaviest) whose estimated time
  // is within a few percent of the best (PlaceByCost in server/core/cost.h,
  // from each device's Cost() and the work it holds), and their weights
  // divide it among them. With options.keep_output the result is a pending
  // resident tensor of call.owner (OpResult::kept_output) on the device of
  // the largest shard. A device with a fixed cost per shard
  // (a GPU) keeps a small operation to itself; devices without one (the CPU
  // backend) split every operation over every candidate. An empty output is
  // returned at once, with no shards. REQUIRES: a validated spec
  // (server/service/validate.h; options.devices free of repeats).
  // Errors: INVALID_ARGUMENT for an unknown variant or device index (naming
  // options.variant / options.devices), UNAVAILABLE when no healthy device is
  // left, RESOURCE_EXHAUSTED (naming --device_max_inflight_bytes) when a
  // shard alone exceeds its device's in-flight bound or call.deadline passes
  // while waiting for room, CANCELLED when call.cancelled() turns true while
  // waiting or before every shard is done (shards not started then never
  // start; CPU shards stop between blocks), the store's errors for a kept
  // result (RESOURCE_EXHAUSTED naming the cap or quota), or the first
  // shard's error.
  absl::StatusOr<OpResult> Gemm(const GemmSpec& spec, const CallContext& call = {});
  absl::StatusOr<OpResult> Gemv(const GemvSpec& spec, const CallContext& call = {});
  absl::StatusOr<OpResult> Reduce(const ReduceSpec& spec, const CallContext& call = {});
  absl::StatusOr<OpResult> Transpose(const TransposeSpec& spec, const CallContext& call = {});
  absl::StatusOr<OpResult> Attention(const AttentionSpec& spec, const CallContext& call = {});

  // The resident tensors of every client.
  TensorStore& store() { return *store_; }
  const TensorStore& store() const { return *store_; }

  const std::string& backend() const { return backend_; }
  int num_devices() const { return static_cast<int>(devices_.size()); }
  const Device& device(int i) const { return *devices_[i]; }
  // Shards running on device `i` right now (any operation, any caller).
  // REQUIRES: 0 <= i < num_devices().
  int InflightShards(int i) const { return inflight_[i].load(std::memory_order_relaxed); }
  // Bytes of the shards admitted to device `i` right now, and its bound
  // (0: unbounded). REQUIRES: 0 <= i < num_devices().
  int64_t InflightBytes(int i) const { return device_admission_[i]->inflight_bytes(); }
  int64_t MaxInflightBytes(int i) const { return device_admission_[i]->limit(); }
  // True while at least one device is healthy.
  bool AnyHealthy() const;
  // Union of the devices' variant names for `op`, fastest first.
  std::vector<std::string> Variants(OpKind op) const;

 private:
  using PlanFor = std::function<ShardPlan(absl::Span<const double> weights)>;
  using ShardWork = std::function<WorkCost(const ShardPlan& plan, const Shard& shard)>;
  using RunShard = std::function<absl::StatusOr<ShardRun>(Device& device, const Shard& shard)>;

  // Resolves options.devices (or every healthy device) into the candidate
  // device indices; validates options.variant against them.
  absl::StatusOr<std::vector<int>> SelectDevices(OpKind op, const OpOptions& options) const;
  // The largest Device::RowGranularity(op) of the devices: GEMM and GEMV
  // shards begin at multiples of it on any of them.
  int64_t RowGranularity(OpKind op) const;
  // Chooses the devices among `candidates` that run an operation, by their
  // weights and their costs for `op` on `dtype` (PlaceByCost), and plans it
  // over them: shard.device is a device index.
  ShardPlan Place(OpKind op, DType dtype, const std::vector<int>& candidates,
                  const PlanFor& plan_for, const ShardWork& shard_work) const;
  // The whole of an operation whose shards each write their own part of one
  // output (GEMM, GEMV, transpose): selects and places devices, allocates the
  // output (returned at once when empty) and runs the shards.
  absl::StatusOr<OpResult> RunPartitioned(
      OpKind op, DType dtype, const OpOptions& options, const CallContext& call,
      const std::vector<int64_t>& out_shape, const PlanFor& plan_for, const ShardWork& shard_work,
      const std::function<absl::StatusOr<ShardRun>(Device&, const ShardPlan&, const Shard&,
                                                   OutputView)>& run_shard);
  // Where a result of `dtype` and `shape` goes: a host tensor (`*host`), or
  // with options.keep_output a pending resident tensor of call.owner on
  // device `home` (`*kept`).
  absl::StatusOr<OutputView> MakeOutput(DType dtype, const std::vector<int64_t>& shape,
                                        const OpOptions& options, const CallContext& call, int home,
                                        std::string_view what, HostTensor* host,
                                        std::shared_ptr<ResidentTensor>* kept);
  // Holds room on each device of `plan` for the bytes of its shards
  // (`shard_work(plan, shard).bytes`), taken in device index order so that
  // operations waiting for several devices never wait on one another in a
  // cycle; adds the time waited to `result->device_wait_seconds`. The
  // tickets give the room back when destroyed.
  absl::StatusOr<std::vector<Admission::Ticket>> AdmitShards(const ShardPlan& plan,
                                                             const ShardWork& shard_work,
                                                             const CallContext& call,
                                                             OpResult* result);
  // Runs every shard of `plan` on its device concurrently: the first on the
  // calling thread, each other on a thread of its own; a shard whose call is
  // cancelled by the time it would start is not started (CANCELLED).
  // Attributes to each shard `shard_work(plan, shard)` and reports it to the
  // observer; returns the timings in plan order, or the first failed shard's
  // error.
  absl::StatusOr<std::vector<ShardTiming>> RunShards(OpKind op, DType dtype, const ShardPlan& plan,
                                                     const ShardWork& shard_work,
                                                     const CallContext& call,
                                                     const RunShard& run_shard);

  std::string backend_;
  std::vector<std::unique_ptr<Device>> devices_;
  ShardObserver* observer_;
  std::unique_ptr<std::atomic<int>[]> inflight_;  // shards running, per device
  // Per device: estimated seconds (in ns) of the shards running there.
  std::unique_ptr<std::atomic<int64_t>[]> busy_ns_;
  std::vector<std::unique_ptr<Admission>> device_admission_;  // per device
  std::unique_ptr<TensorStore> store_;  // after devices_: destroyed before them
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_ENGINE_ENGINE_H_
