// Everything one shard holds on a CUDA device while it runs: the current
// device, a lane (stream and pinned staging) leased for the whole shard,
// device allocations from the device's stream-ordered pool (freed in stream
// order when the scope ends, also on error), and the events around its
// kernels. It accounts the shard's copy and kernel times.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CUDA_SHARD_SCOPE_H_
#define GPUCOMPUTE_SERVER_DEVICE_CUDA_SHARD_SCOPE_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/device/cuda/cuda_device.h"
#include "server/device/cuda/cuda_util.h"
#include "server/device/device.h"

namespace gpucompute::cuda {

class ShardScope {
 public:
  // Makes `device` current and leases one of its lanes, waiting while all
  // are busy. `device` must outlive the scope.
  explicit ShardScope(CudaDevice* device);
  // Frees the allocations in stream order, waits for the lane's stream,
  // returns the lane and clears a non-sticky error so that it does not
  // surface in a later, unrelated call on this thread.
  ~ShardScope();
  ShardScope(const ShardScope&) = delete;
  ShardScope& operator=(const ShardScope&) = delete;

  cudaStream_t stream() const { return lane_->stream(); }

  // Device memory of `bytes` (at least 256) from the device pool, in stream
  // order; RESOURCE_EXHAUSTED when the device is out of memory.
  absl::StatusOr<void*> Alloc(size_t bytes);

  // A kernel workspace of `bytes`: the lane's scratch (kept from shard to
  // shard, no allocation per request) up to kMaxLaneScratchBytes, an Alloc
  // beyond. Valid until the scope ends; RESOURCE_EXHAUSTED when the device
  // is out of memory.
  absl::StatusOr<void*> Workspace(size_t bytes);
  static constexpr size_t kMaxLaneScratchBytes = size_t{64} << 20;

  // Lane::Upload, with its time and bytes accounted as host to device. From
  // pinned host memory (the server's request arena), kDirectMinBytes and
  // more go as one DMA instead, waited for: dense rows, or rows of at least
  // kDirectMinRowBytes (a DMA of many short rows was not measured; those keep
  // the staging copy, which gathers them on the host).
  static constexpr size_t kDirectMinBytes = size_t{64} << 10;
  static constexpr size_t kDirectMinRowBytes = size_t{4} << 10;
  absl::Status Upload(void* dst, const void* src, size_t rows, size_t row_bytes, size_t pitch);
  // Lane::UploadFrom, accounted the same way.
  absl::Status UploadFrom(void* dst, size_t n, const HostSource& src);

  // Lane::Download, with its time and bytes accounted as device to host. The
  // work queued before it (the kernels) finishes first, so that the time is
  // the copy's alone rather than the kernels' too; the download waited for
  // that work anyway.
  absl::Status Download(void* dst, size_t pitch, const void* src, size_t rows, size_t row_bytes);

  // Operands and results wherever they live (host memory, this device's or
  // another's; views say which). Rows: `rows` rows of `row_bytes`, row i at
  // byte offset + i * pitch of the view (pitch 0: dense).
  //
  // The rows as dense memory on this device: the view's own when it lives
  // here and the rows are dense (no copy), else a pool allocation they are
  // copied into (uploaded, copied on the device, or copied from a peer).
  absl::StatusOr<const void*> Input(const TensorView& view, int64_t offset, size_t rows,
                                    size_t row_bytes, size_t pitch);
  // Copies the rows into `dst`, dense memory of this device.
  absl::Status CopyIn(void* dst, const TensorView& view, int64_t offset, size_t rows,
                      size_t row_bytes, size_t pitch);
  // The rows in host memory (for the rare conversions done on the host).
  absl::StatusOr<std::string> HostCopy(const TensorView& view, int64_t offset, size_t rows,
                                       size_t row_bytes, size_t pitch);
  // Where the kernels may write a result at byte `offset` of `out` directly:
  // out's own memory when it lives on this device, else null.
  void* InPlace(const OutputView& out, int64_t offset) const;
  // Copies dense rows at `src` (this device's memory) into `out`, row i at
  // byte offset + i * pitch (downloaded, copied on the device, or copied to
  // a peer).
  absl::Status CopyOut(const OutputView& out, int64_t offset, size_t pitch, const void* src,
                       size_t rows, size_t row_bytes);
  // Copies dense host rows at `src` into `out` likewise.
  absl::Status WriteOut(const OutputView& out, int64_t offset, size_t pitch, const void* src,
                        size_t rows, size_t row_bytes);

  // Bracket kernel launches with events: BeginKernels before the first
  // launch, EndKernels with the last launch's result after it.
  absl::Status BeginKernels();
  absl::Status EndKernels(cudaError_t launch, absl::string_view what);
  // Adds the time between the brackets once the stream has passed the end
  // (after a download).
  absl::Status AddKernelTime();

  // What the shard measured, under the name of `variant` ("default" when
  // empty).
  ShardRun Run(std::string variant) const;

  // The device's Check (marks it unhealthy on a sticky error).
  absl::Status Check(cudaError_t err, absl::string_view what) { return device_->Check(err, what); }

 private:
  CudaDevice* device_;
  DeviceGuard guard_;
  Lane* lane_;
  std::vector<void*> allocations_;
  double kernel_seconds_ = 0;
  double h2d_seconds_ = 0;
  double d2h_seconds_ = 0;
  double h2d_bytes_ = 0;
  double d2h_bytes_ = 0;
  double peer_seconds_ = 0;
  double peer_bytes_ = 0;
};

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_DEVICE_CUDA_SHARD_SCOPE_H_
