// The CUDA device: one GPU behind the Device interface, running our kernels
// (gc_kernels) on streams of its own.
//
// Each shard holds a ShardScope (shard_scope.h): a leased lane (a stream with
// pinned staging buffers), device memory from the device's stream-ordered
// pool (cudaMallocAsync, never cudaMalloc per request), pipelined uploads of
// the inputs it needs, its kernels between CUDA events, and the download of
// its part of the output. Creation, peer access and calibration of the GPUs
// are backend.h's. Out of memory is RESOURCE_EXHAUSTED and leaves nothing allocated;
// an error that poisons the CUDA context marks the device unhealthy so the
// engine stops giving it work.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CUDA_CUDA_DEVICE_H_
#define GPUCOMPUTE_SERVER_DEVICE_CUDA_CUDA_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/device/cuda/lane.h"
#include "server/device/device.h"

namespace gpucompute::cuda {

struct CudaDeviceOptions {
  // Streams (lanes) per device: shards beyond this many wait for a lane.
  int lanes = 8;
  // Threads that copy between pageable host memory and the lanes' pinned
  // buffers (shared by the lanes), and how long each stays awake for the
  // next chunk (ThreadPool's spin). CreateCudaDevices picks the threads
  // when 0; CudaDevice::Create takes at least 1.
  int copy_threads = 0;
  int copy_spin_us = 50;
  // Each lane's staging (lane.h); its copier is the device's copy threads.
  StagingOptions staging;
  // The memory pool keeps up to this many freed bytes for reuse.
  uint64_t pool_release_threshold_bytes = uint64_t{4} << 30;
};

class CudaDevice : public Device {
 public:
  // Sets up device `ordinal` as server device `index`. REQUIRES: a usable GPU.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal, int index, double weight,
                                                            const CudaDeviceOptions& options);
  ~CudaDevice() override;

  const DeviceDescription& description() const override { return description_; }
  bool healthy() const override { return healthy_.load(); }
  // From cudaMemGetInfo: memory in use on the whole GPU (by every process,
  // our pool's cached blocks included). Should the query fail, the total is
  // description().memory_bytes and nothing reads as in use.
  DeviceMemory MemoryUsage() const override;
  // One shard's cost (server/core/cost.h): the H200's fixed cost per shard
  // and host staging rate; device memory and tensor-core rates as calibrated
  // by CreateCudaDevices where it calibrated, else the H200's.
  DeviceCost Cost(OpKind op, DType dtype) const override;
  // 8 rows for GEMM and GEMV: 16 bytes of any dtype, the alignment of a
  // packed transposed A's leading dimension that the vector and TMA kernels
  // need.
  int64_t RowGranularity(OpKind op) const override;
  std::vector<std::string> Variants(OpKind op) const override;

  // Resident tensors live in the GPU's memory (its stream-ordered pool);
  // another GPU's are copied peer to peer.
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(int64_t bytes) override;
  absl::Status Write(DeviceBuffer& buffer, int64_t offset, const void* src, int64_t n,
                     double* seconds) override;
  absl::Status WriteFrom(DeviceBuffer& buffer, int64_t offset, int64_t n, const HostSource& src,
                         double* seconds) override;
  absl::Status Read(const DeviceBuffer& buffer, int64_t offset, void* dst, int64_t n,
                    double* seconds) override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Replicate(const DeviceBuffer& source,
                                                          double* seconds) override;

  // Operands and results in host memory are staged through the lane's pinned
  // buffers; those in this GPU's memory are used in place where the kernels
  // allow (else copied on the device); another GPU's are copied peer to peer.
  absl::StatusOr<ShardRun> Gemm(const GemmSpec& spec, Range rows, OutputView c_out) override;
  absl::StatusOr<ShardRun> Gemv(const GemvSpec& spec, Range rows, OutputView y_out) override;
  absl::StatusOr<ShardRun> Reduce(const ReduceSpec& spec, Range outer, Range axis, bool partial,
                                  OutputView out) override;
  // One upload and one launch per outer row for all the whole chunks (plus
  // one for a short last chunk), rather than a shard per chunk.
  absl::StatusOr<ShardRun> ReduceChunks(const ReduceSpec& spec, Range outer, Range axis,
                                        float* out) override;
  absl::StatusOr<ShardRun> Transpose(const TransposeSpec& spec, int prefix_axes, Range prefix,
                                     OutputView out) override;
  absl::StatusOr<ShardRun> Attention(const AttentionSpec& spec, Range heads, Range q_rows,
                                     OutputView o_out, OutputView lse_out) override;

  int ordinal() const { return ordinal_; }
  void set_peers(std::vector<int> peers) { description_.peers = std::move(peers); }
  // Lets the GPU of ordinal `peer` read and write the allocations of this
  // device's memory pool (resident tensors, scratch), present and future:
  // peer access enabled with cudaDeviceEnablePeerAccess does not reach
  // stream-ordered allocations. REQUIRES: peer access from `peer` to this
  // device is possible.
  absl::Status GrantPoolAccess(int peer);
  void set_weight(double weight) { description_.weight = weight; }
  // Rates measured on this device for Cost(): bf16 GEMM FLOP/s and device
  // memory bytes/s (read + written). Like set_weight, only before the device
  // is shared. REQUIRES: both > 0.
  void set_calibration(double tensor_flops_per_second, double memory_bytes_per_second) {
    tensor_flops_per_second_ = tensor_flops_per_second;
    memory_bytes_per_second_ = memory_bytes_per_second;
  }

 private:
  friend class ShardScope;

  CudaDevice() = default;

  // Takes a free lane, waiting while all are busy.
  Lane* AcquireLane();
  void ReleaseLane(Lane* lane);

  // Converts a CUDA failure into a status, marking the device unhealthy when
  // the error is sticky.
  absl::Status Check(cudaError_t err, absl::string_view what);

  int ordinal_ = 0;
  DeviceDescription description_;
  std::atomic<bool> healthy_{true};
  cudaMemPool_t pool_ = nullptr;
  double tensor_flops_per_second_ = 0;  // calibrated; 0: not calibrated
  double memory_bytes_per_second_ = 0;  // calibrated; 0: not calibrated

  absl::Mutex mu_;
  std::unique_ptr<ThreadPool> copier_;  // before lanes_: they use it
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::vector<Lane*> free_lanes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_DEVICE_CUDA_CUDA_DEVICE_H_
