#include "server/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <new>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/core/cost.h"
#include "server/core/reduce_combine.h"

namespace gpucompute {
namespace {

absl::Status OutOfMemory(std::string_view what) {
  return absl::ResourceExhaustedError(
      absl::StrCat("out of host memory allocating the ", std::string(what), " of the result"));
}

// Allocates an output tensor; RESOURCE_EXHAUSTED when the host cannot.
absl::StatusOr<HostTensor> AllocateOutput(DType dtype, std::vector<int64_t> shape,
                                          std::string_view what) {
  try {
    return HostTensor::Allocate(dtype, std::move(shape));
  } catch (const std::bad_alloc&) {
    return OutOfMemory(what);
  }
}

// Calls fn(view) for every operand of a spec.
template <typename Fn>
void ForEachOperand(GemmSpec& s, Fn fn) {
  fn(s.a);
  fn(s.b);
  if (s.c) fn(*s.c);
}
template <typename Fn>
void ForEachOperand(GemvSpec& s, Fn fn) {
  fn(s.a);
  fn(s.x);
  if (s.y) fn(*s.y);
}
template <typename Fn>
void ForEachOperand(ReduceSpec& s, Fn fn) {
  fn(s.input);
}
template <typename Fn>
void ForEachOperand(TransposeSpec& s, Fn fn) {
  fn(s.input);
}
template <typename Fn>
void ForEachOperand(AttentionSpec& s, Fn fn) {
  fn(s.q);
  fn(s.k);
  fn(s.v);
}

// Runs `run` on `spec` as `device` sees it: options.cancelled set to the
// call's check, and the resident operands it cannot read in place redirected
// to copies the store makes (once) in its memory. Where the device has no
// room for a copy, the operand stays where it is and the device copies what
// it needs itself. The copies' time counts as peer.
template <typename Spec, typename Run>
absl::StatusOr<ShardRun> RunLocal(TensorStore& store, const Spec& spec, Device& device,
                                  const CallContext& call, Run&& run) {
  double peer_seconds = 0, peer_bytes = 0;
  std::optional<Spec> local;
  if (call.cancelled) {
    local = spec;
    local->options.cancelled = call.cancelled;
  }
  for (const std::shared_ptr<ResidentTensor>& tensor : call.resident) {
    if (device.ReadsInPlace(tensor->device())) continue;
    const double before = peer_seconds;
    ASSIGN_OR_RETURN(const DeviceBuffer* replica,
                     store.Replica(*tensor, device.description().index, &peer_seconds));
    if (replica == nullptr) continue;
    if (peer_seconds > before) peer_bytes += double(tensor->bytes());
    if (!local) local = spec;
    const void* original = tensor->buffer().data();
    ForEachOperand(*local, [&](TensorView& view) {
      if (view.data == original && view.device == tensor->device()) {
        view.data = replica->data();
        view.device = replica->device();
      }
    });
  }
  ASSIGN_OR_RETURN(ShardRun shard, run(local ? *local : spec));
  shard.peer_seconds += peer_seconds;
  shard.peer_bytes += peer_bytes;
  return shard;
}

// The device of a plan's largest shard (the first of equals): where a kept
// result lives, as the most of it is computed there. `fallback` when the
// plan has no shards.
int HomeOf(const ShardPlan& plan, int fallback) {
  int home = fallback;
  int64_t largest = -1;
  for (const Shard& shard : plan.shards) {
    if (shard.range.size() > largest) {
      largest = shard.range.size();
      home = shard.device;
    }
  }
  return home;
}

}  // namespace

Engine::Engine(std::string backend, std::vector<std::unique_ptr<Device>> devices,
               ShardObserver* observer, std::vector<int64_t> device_max_inflight_bytes,
               TensorStoreOptions resident)
    : backend_(std::move(backend)),
      devices_(std::move(devices)),
      observer_(observer),
      inflight_(new std::atomic<int>[devices_.size()]()),
      busy_ns_(new std::atomic<int64_t>[devices_.size()]()) {
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int64_t limit = i < device_max_inflight_bytes.size()
                              ? std::max<int64_t>(0, device_max_inflight_bytes[i])
                              : 0;
    device_admission_.push_back(std::make_unique<Admission>(
        limit, absl::StrCat("--device_max_inflight_bytes of device ", i)));
  }
  std::vector<Device*> borrowed;
  for (const std::unique_ptr<Device>& d : devices_) borrowed.push_back(d.get());
  store_ = std::make_unique<TensorStore>(std::move(borrowed), std::move(resident));
}

absl::StatusOr<OutputView> Engine::MakeOutput(DType dtype, const std::vector<int64_t>& shape,
                                              const OpOptions& options, const CallContext& call,
                                              int home, std::string_view what, HostTensor* host,
                                              std::shared_ptr<ResidentTensor>* kept) {
  if (!options.keep_output) {
    ASSIGN_OR_RETURN(*host, AllocateOutput(dtype, shape, what));
    return OutputView{host->mutable_data(), kHostMemory};
  }
  ASSIGN_OR_RETURN(*kept, store_->Create(call.owner, dtype, shape, home, "options.devices"));
  return (*kept)->buffer().output();
}

Engine::~Engine() = default;

bool Engine::AnyHealthy() const {
  return std::any_of(devices_.begin(), devices_.end(),
                     [](const std::unique_ptr<Device>& d) { return d->healthy(); });
}

int64_t Engine::RowGranularity(OpKind op) const {
  int64_t rows = 1;
  for (const std::unique_ptr<Device>& d : devices_) rows = std::max(rows, d->RowGranularity(op));
  return rows;
}

std::vector<std::string> Engine::Variants(OpKind op) const {
  std::vector<std::string> all;
  for (const std::unique_ptr<Device>& d : devices_) {
    for (std::string& v : d->Variants(op)) {
      if (std::find(all.begin(), all.end(), v) == all.end()) all.push_back(std::move(v));
    }
  }
  return all;
}

absl::StatusOr<std::vector<int>> Engine::SelectDevices(OpKind op, const OpOptions& options) const {
  const int n = num_devices();
  std::vector<int> selected;
  if (options.devices.empty()) {
    for (int i = 0; i < n; ++i) {
      if (devices_[i]->healthy()) selected.push_back(i);
    }
  } else {
    for (int index : options.devices) {
      if (index < 0 || index >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("options.devices: device ", index, " does not exist; the server has ", n,
                         n == 1 ? " device (index 0)" : " devices (indices 0 to ",
                         n == 1 ? "" : absl::StrCat(n - 1, ")")));
      }
      if (devices_[index]->healthy()) selected.push_back(index);
    }
  }
  if (selected.empty()) {
    return absl::UnavailableError(options.devices.empty()
                                      ? "no healthy device is left"
                                      : "none of the devices in options.devices is healthy");
  }
  if (!options.variant.empty()) {
    for (int index : selected) {
      const std::vector<std::string> variants = devices_[index]->Variants(op);
      if (std::find(variants.begin(), variants.end(), options.variant) == variants.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("options.variant: unknown variant ", Quote(options.variant), " for ",
                         std::string(OpName(op)), "; available: ", absl::StrJoin(variants, ", ")));
      }
    }
  }
  return selected;
}

absl::StatusOr<std::vector<Admission::Ticket>> Engine::AdmitShards(const ShardPlan& plan,
                                                                   const ShardWork& shard_work,
                                                                   const CallContext& call,
                                                                   OpResult* result) {
  std::map<int, int64_t> bytes;  // by device index: taken in this order
  for (const Shard& shard : plan.shards) {
    bytes[shard.device] += static_cast<int64_t>(std::ceil(shard_work(plan, shard).bytes));
  }
  const auto cancelled = [&call] { return call.cancelled && call.cancelled(); };
  std::vector<Admission::Ticket> tickets;
  const absl::Time start = absl::Now();
  for (const auto& [device, held] : bytes) {
    ASSIGN_OR_RETURN(Admission::Ticket ticket,
                     device_admission_[device]->Admit(held, call.deadline, cancelled));
    tickets.push_back(std::move(ticket));
  }
  result->device_wait_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  return tickets;
}

absl::StatusOr<std::vector<ShardTiming>> Engine::RunShards(OpKind op, DType dtype,
                                                           const ShardPlan& plan,
                                                           const ShardWork& shard_work,
                                                           const CallContext& call,
                                                           const RunShard& run_shard) {
  const auto cancelled = [&call] { return call.cancelled && call.cancelled(); };
  if (cancelled()) return absl::CancelledError("the call was cancelled before its shards started");
  const size_t count = plan.shards.size();
  std::vector<absl::StatusOr<ShardRun>> runs(count, absl::UnknownError("shard did not run"));
  auto run_one = [&](size_t s) {
    // A shard that has not started when its call goes is dropped: on a GPU
    // it would be launched and run to its end.
    if (cancelled()) {
      runs[s] = absl::CancelledError("the call was cancelled before the shard started");
      return;
    }
    const int device = plan.shards[s].device;
    // Counted in flight (and its estimated seconds as the device's busy
    // time) for as long as the device holds the shard, also when it throws.
    const int64_t estimate_ns = static_cast<int64_t>(
        1e9 * ShardSeconds(devices_[device]->Cost(op, dtype), shard_work(plan, plan.shards[s])));
    struct InflightScope {
      InflightScope(std::atomic<int>& n, std::atomic<int64_t>& busy, int64_t ns)
          : count(n), busy_ns(busy), estimate(ns) {
        ++count;
        busy_ns += estimate;
      }
      ~InflightScope() {
        --count;
        busy_ns -= estimate;
      }
      std::atomic<int>& count;
      std::atomic<int64_t>& busy_ns;
      const int64_t estimate;
    } inflight(inflight_[device], busy_ns_[device], estimate_ns);
    // An exception escaping a shard thread would end the process: make it an
    // error of this operation instead.
    try {
      runs[s] = run_shard(*devices_[device], plan.shards[s]);
    } catch (const std::bad_alloc&) {
      runs[s] = absl::ResourceExhaustedError("out of host memory running a shard");
    } catch (const std::exception& e) {
      runs[s] = absl::InternalError(absl::StrCat("shard failed: ", e.what()));
    }
  };
  // The first shard runs here, every other on a thread of its own (falling
  // back to this thread when no thread can be started).
  std::vector<std::thread> threads;
  std::vector<size_t> inline_shards = {0};
  for (size_t s = 1; s < count; ++s) {
    try {
      threads.emplace_back(run_one, s);
    } catch (const std::system_error&) {
      inline_shards.push_back(s);
    }
  }
  if (count > 0) {
    for (size_t s : inline_shards) run_one(s);
  }
  for (std::thread& t : threads) t.join();

  // Every shard that ran is reported, even when another failed.
  std::vector<ShardTiming> timings;
  timings.reserve(count);
  absl::Status first_error;
  for (size_t s = 0; s < count; ++s) {
    if (!runs[s].ok()) {
      if (first_error.ok()) first_error = runs[s].status();
      continue;
    }
    const Shard& shard = plan.shards[s];
    ShardTiming timing{shard.device, plan.axis, shard.range, *std::move(runs[s]),
                       shard_work(plan, shard)};
    if (observer_ != nullptr) {
      observer_->OnShard(op, dtype, devices_[shard.device]->description(), timing);
    }
    timings.push_back(std::move(timing));
  }
  if (!first_error.ok()) return first_error;
  return timings;
}

ShardPlan Engine::Place(OpKind op, DType dtype, const std::vector<int>& candidates,
                        const PlanFor& plan_for, const ShardWork& shard_work) const {
  std::vector<CostedDevice> costed;
  costed.reserve(candidates.size());
  for (int index : candidates) {
    costed.push_back({index, devices_[index]->description().weight,
                      devices_[index]->Cost(op, dtype),
                      double(busy_ns_[index].load(std::memory_order_relaxed)) * 1e-9});
  }
  return PlaceByCost(costed, plan_for, shard_work);
}

absl::StatusOr<OpResult> Engine::RunPartitioned(
    OpKind op, DType dtype, const OpOptions& options, const CallContext& call,
    const std::vector<int64_t>& out_shape, const PlanFor& plan_for, const ShardWork& shard_work,
    const std::function<absl::StatusOr<ShardRun>(Device&, const ShardPlan&, const Shard&,
                                                 OutputView)>& run_shard) {
  ASSIGN_OR_RETURN(const std::vector<int> candidates, SelectDevices(op, options));
  const ShardPlan plan = Place(op, dtype, candidates, plan_for, shard_work);
  OpResult result;
  result.backend = backend_;
  ASSIGN_OR_RETURN(const OutputView out, MakeOutput(options.output_dtype, out_shape, options, call,
                                                    HomeOf(plan, candidates.front()), "output",
                                                    &result.output, &result.kept_output));
  if (NumElements(out_shape) == 0) return result;  // nothing to compute: no shards
  ASSIGN_OR_RETURN(const std::vector<Admission::Ticket> room,
                   AdmitShards(plan, shard_work, call, &result));
  ASSIGN_OR_RETURN(result.shards, RunShards(op, dtype, plan, shard_work, call,
                                            [&](Device& device, const Shard& shard) {
                                              return run_shard(device, plan, shard, out);
                                            }));
  return result;
}

absl::StatusOr<OpResult> Engine::Gemm(const GemmSpec& spec, const CallContext& call) {
  return RunPartitioned(
      OpKind::kGemm, spec.dtype, spec.options, call, spec.out_shape,
      [&, rows = RowGranularity(OpKind::kGemm)](absl::Span<const double> weights) {
        return PlanGemm(spec, weights, rows);
      },
      [&](const ShardPlan&, const Shard& shard) { return GemmWork(spec, shard.range); },
      [&](Device& device, const ShardPlan&, const Shard& shard, OutputView out) {
        return RunLocal(*store_, spec, device, call, [&](const GemmSpec& local) {
          return device.Gemm(local, shard.range, out);
        });
      });
}

absl::StatusOr<OpResult> Engine::Gemv(const GemvSpec& spec, const CallContext& call) {
  return RunPartitioned(
      OpKind::kGemv, spec.dtype, spec.options, call, spec.out_shape,
      [&, rows = RowGranularity(OpKind::kGemv)](absl::Span<const double> weights) {
        return PlanGemv(spec, weights, rows);
      },
      [&](const ShardPlan&, const Shard& shard) { return GemvWork(spec, shard.range); },
      [&](Device& device, const ShardPlan&, const Shard& shard, OutputView out) {
        return RunLocal(*store_, spec, device, call, [&](const GemvSpec& local) {
          return device.Gemv(local, shard.range, out);
        });
      });
}

absl::StatusOr<OpResult> Engine::Reduce(const ReduceSpec& spec, const CallContext& call) {
  ASSIGN_OR_RETURN(const std::vector<int> candidates, SelectDevices(OpKind::kReduce, spec.options));
  const Range whole_axis{0, spec.axis_len}, all_outer{0, spec.outer};
  const ShardWork shard_work = [&](const ShardPlan& plan, const Shard& shard) {
    return plan.axis == SplitAxis::kOuter ? ReduceWork(spec, shard.range, whole_axis, false)
                                          : ReduceWork(spec, all_outer, shard.range, true);
  };
  const ShardPlan plan = Place(
      OpKind::kReduce, spec.input.dtype, candidates,
      [&](absl::Span<const double> weights) { return PlanReduce(spec, weights); }, shard_work);
  OpResult result;
  result.backend = backend_;
  const DType out_dtype = spec.options.output_dtype;
  const int home = HomeOf(plan, candidates.front());
  ASSIGN_OR_RETURN(const OutputView out,
                   MakeOutput(out_dtype, spec.out_shape, spec.options, call, home, "output",
                              &result.output, &result.kept_output));
  if (NumElements(spec.out_shape) == 0) return result;  // nothing to compute: no shards
  ASSIGN_OR_RETURN(const std::vector<Admission::Ticket> room,
                   AdmitShards(plan, shard_work, call, &result));
  if (plan.axis == SplitAxis::kOuter) {
    ASSIGN_OR_RETURN(
        result.shards,
        RunShards(OpKind::kReduce, spec.input.dtype, plan, shard_work, call,
                  [&](Device& device, const Shard& shard) {
                    return RunLocal(*store_, spec, device, call, [&](const ReduceSpec& local) {
                      return device.Reduce(local, shard.range, whole_axis, false, out);
                    });
                  }));
    return result;
  }

  // kAxis: one fp32 partial per chunk of the axis ([chunks, outer, inner]),
  // each computed alone, then combined in the fixed order of
  // reduce_combine.h — the order a single device uses for a whole row.
  const int64_t outputs = spec.outer * spec.inner;
  const int64_t chunks = (spec.axis_len + kReduceChunk - 1) / kReduceChunk;
  const size_t out_bytes = size_t(outputs) * DTypeSize(out_dtype);
  std::vector<float> partials;
  std::string combined;  // the result on the host, for a kept one
  try {
    partials.resize(size_t(chunks * outputs));
    if (out.device != kHostMemory) combined.resize(out_bytes);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("partial sums");
  }
  ASSIGN_OR_RETURN(
      result.shards,
      RunShards(OpKind::kReduce, spec.input.dtype, plan, shard_work, call,
                [&](Device& device, const Shard& shard) {
                  const int64_t first_chunk = shard.range.begin / kReduceChunk;
                  return RunLocal(*store_, spec, device, call, [&](const ReduceSpec& local) {
                    return device.ReduceChunks(local, all_outer, shard.range,
                                               partials.data() + first_chunk * outputs);
                  });
                }));
  char* host_out = out.device == kHostMemory ? static_cast<char*>(out.data) : combined.data();
  float buf[256];
  for (int64_t i0 = 0; i0 < outputs; i0 += 256) {
    const int64_t len = std::min<int64_t>(256, outputs - i0);
    for (int64_t t = 0; t < len; ++t) {
      const float v = CombinePartials(spec.kind, partials.data() + i0 + t, chunks, outputs);
      buf[t] = FinalizeReduce(spec.kind, v, spec.axis_len);
    }
    FromFloat(out_dtype, buf, host_out + i0 * int64_t(DTypeSize(out_dtype)), len);
  }
  if (out.device != kHostMemory) {
    RETURN_IF_ERROR(devices_[out.device]->Write(result.kept_output->buffer(), 0, combined.data(),
                                                int64_t(out_bytes)));
  }
  return result;
}

absl::StatusOr<OpResult> Engine::Transpose(const TransposeSpec& spec, const CallContext& call) {
  return RunPartitioned(
      OpKind::kTranspose, spec.input.dtype, spec.options, call, spec.out_shape,
      [&](absl::Span<const double> weights) { return PlanTranspose(spec, weights); },
      [&](const ShardPlan& plan, const Shard& shard) {
        return TransposeWork(spec, plan.prefix_axes, shard.range);
      },
      [&](Device& device, const ShardPlan& plan, const Shard& shard, OutputView out) {
        return RunLocal(*store_, spec, device, call, [&](const TransposeSpec& local) {
          return device.Transpose(local, plan.prefix_axes, shard.range, out);
        });
      });
}

absl::StatusOr<OpResult> Engine::Attention(const AttentionSpec& spec, const CallContext& call) {
  ASSIGN_OR_RETURN(const std::vector<int> candidates,
                   SelectDevices(OpKind::kAttention, spec.options));
  const Range all_heads{0, spec.batch * spec.heads_q}, all_rows{0, spec.seq_q};
  const ShardWork shard_work = [&](const ShardPlan& plan, const Shard& shard) {
    return plan.axis == SplitAxis::kHeads ? AttentionWork(spec, shard.range, all_rows)
                                          : AttentionWork(spec, all_heads, shard.range);
  };
  const ShardPlan plan = Place(
      OpKind::kAttention, spec.dtype, candidates,
      [&](absl::Span<const double> weights) { return PlanAttention(spec, weights); }, shard_work);
  OpResult result;
  result.backend = backend_;
  const int home = HomeOf(plan, candidates.front());
  ASSIGN_OR_RETURN(const OutputView out,
                   MakeOutput(spec.options.output_dtype, spec.out_shape, spec.options, call, home,
                              "o", &result.output, &result.kept_output));
  OutputView lse;
  if (spec.return_lse) {
    HostTensor host_lse;
    ASSIGN_OR_RETURN(lse, MakeOutput(DType::kFloat32, {spec.batch, spec.heads_q, spec.seq_q},
                                     spec.options, call, home, "lse", &host_lse, &result.kept_lse));
    if (!spec.options.keep_output) {
      result.lse = std::move(host_lse);
      lse.data = result.lse->mutable_data();  // the string's buffer moved with it
    }
  }
  if (NumElements(spec.out_shape) == 0) return result;  // nothing to compute: no shards
  ASSIGN_OR_RETURN(const std::vector<Admission::Ticket> room,
                   AdmitShards(plan, shard_work, call, &result));
  const bool by_heads = plan.axis == SplitAxis::kHeads;
  ASSIGN_OR_RETURN(
      result.shards,
      RunShards(OpKind::kAttention, spec.dtype, plan, shard_work, call,
                [&](Device& device, const Shard& shard) {
                  return RunLocal(*store_, spec, device, call, [&](const AttentionSpec& local) {
                    return device.Attention(local, by_heads ? shard.range : all_heads,
                                            by_heads ? all_rows : shard.range, out, lse);
                  });
                }));
  return result;
}

}  // namespace gpucompute
