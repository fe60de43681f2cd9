#include "server/device/cuda/shard_scope.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace gpucompute::cuda {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

ShardScope::ShardScope(CudaDevice* device)
    : device_(device), guard_(device->ordinal()), lane_(device->AcquireLane()) {}

ShardScope::~ShardScope() {
  for (void* p : allocations_) cudaFreeAsync(p, lane_->stream());
  cudaStreamSynchronize(lane_->stream());
  if (kernel_begin_) cudaEventDestroy(kernel_begin_);
  if (kernel_end_) cudaEventDestroy(kernel_end_);
  cudaGetLastError();
  device_->ReleaseLane(lane_);
}

absl::StatusOr<void*> ShardScope::Alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err =
      cudaMallocFromPoolAsync(&p, std::max<size_t>(bytes, 256), device_->pool_, lane_->stream());
  if (err != cudaSuccess) {
    cudaGetLastError();
    return device_->Check(err, absl::StrCat("device allocation of ", bytes, " bytes"));
  }
  allocations_.push_back(p);
  return p;
}

absl::Status ShardScope::Upload(void* dst, const void* src, size_t rows, size_t row_bytes,
                                size_t pitch) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = lane_->Upload(dst, src, rows, row_bytes, pitch);
  h2d_seconds_ += SecondsSince(start);
  h2d_bytes_ += double(rows * row_bytes);
  if (!s.ok()) {
    // Marks the device unhealthy when the error is sticky; the upload's
    // own error is what the caller sees either way.
    (void)device_->Check(cudaGetLastError(), s.message());
  }
  return s;
}

absl::Status ShardScope::Download(void* dst, size_t pitch, const void* src, size_t rows,
                                  size_t row_bytes) {
  RETURN_IF_ERROR(device_->Check(cudaStreamSynchronize(lane_->stream()), "work before a download"));
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = lane_->Download(dst, pitch, src, rows, row_bytes);
  d2h_seconds_ += SecondsSince(start);
  d2h_bytes_ += double(rows * row_bytes);
  if (!s.ok()) {
    cudaError_t err = cudaStreamQuery(lane_->stream());
    return err == cudaSuccess || err == cudaErrorNotReady ? s : device_->Check(err, s.message());
  }
  return s;
}

absl::Status ShardScope::BeginKernels() {
  if (!kernel_begin_) {
    RETURN_IF_ERROR(device_->Check(cudaEventCreate(&kernel_begin_), "cudaEventCreate"));
    RETURN_IF_ERROR(device_->Check(cudaEventCreate(&kernel_end_), "cudaEventCreate"));
  }
  return device_->Check(cudaEventRecord(kernel_begin_, lane_->stream()), "cudaEventRecord");
}

absl::Status ShardScope::EndKernels(cudaError_t launch, absl::string_view what) {
  RETURN_IF_ERROR(device_->Check(launch, what));
  return device_->Check(cudaEventRecord(kernel_end_, lane_->stream()), "cudaEventRecord");
}

absl::Status ShardScope::AddKernelTime() {
  RETURN_IF_ERROR(device_->Check(cudaEventSynchronize(kernel_end_), "kernel completion"));
  float ms = 0;
  RETURN_IF_ERROR(device_->Check(cudaEventElapsedTime(&ms, kernel_begin_, kernel_end_),
                                 "cudaEventElapsedTime"));
  kernel_seconds_ += ms * 1e-3;
  return absl::OkStatus();
}

ShardRun ShardScope::Run(std::string variant) const {
  ShardRun r;
  r.variant = variant.empty() ? "default" : std::move(variant);
  r.kernel_seconds = kernel_seconds_;
  r.h2d_seconds = h2d_seconds_;
  r.d2h_seconds = d2h_seconds_;
  r.h2d_bytes = h2d_bytes_;
  r.d2h_bytes = d2h_bytes_;
  return r;
}

}  // namespace gpucompute::cuda
