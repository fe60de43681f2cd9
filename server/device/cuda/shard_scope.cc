#include "server/device/cuda/shard_scope.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace gpucompute::cuda {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// A 2-D copy of `rows` rows of `row_bytes` between any two places the
// runtime can address (device memory of any GPU, or pinned host memory).
cudaError_t Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                   size_t rows, cudaStream_t stream) {
  if (rows == 0 || row_bytes == 0) return cudaSuccess;
  if (dst_pitch == 0) dst_pitch = row_bytes;
  if (src_pitch == 0) src_pitch = row_bytes;
  if (rows == 1 || (dst_pitch == row_bytes && src_pitch == row_bytes)) {
    return cudaMemcpyAsync(dst, src, rows * row_bytes, cudaMemcpyDefault, stream);
  }
  return cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDefault,
                           stream);
}

// Whether `p` is page-locked host memory (pinned or registered) that the GPUs
// can copy from directly.
bool IsPinned(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

}  // namespace

ShardScope::ShardScope(CudaDevice* device)
    : device_(device), guard_(device->ordinal()), lane_(device->AcquireLane()) {}

ShardScope::~ShardScope() {
  for (void* p : allocations_) cudaFreeAsync(p, lane_->stream());
  cudaStreamSynchronize(lane_->stream());
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

absl::StatusOr<void*> ShardScope::Workspace(size_t bytes) {
  if (bytes > kMaxLaneScratchBytes) return Alloc(bytes);
  void* p = nullptr;
  cudaError_t err = lane_->Scratch(std::max<size_t>(bytes, 256), device_->pool_, &p);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return device_->Check(err, absl::StrCat("device allocation of a ", bytes, "-byte workspace"));
  }
  return p;
}

absl::Status ShardScope::Upload(void* dst, const void* src, size_t rows, size_t row_bytes,
                                size_t pitch) {
  const auto start = std::chrono::steady_clock::now();
  const bool dense = rows <= 1 || pitch == 0 || pitch == row_bytes;
  if (rows * row_bytes >= kDirectMinBytes && (dense || row_bytes >= kDirectMinRowBytes) &&
      IsPinned(src)) {
    // Pinned already (decoded into the server's request arena): one DMA, no
    // staging copy. Waited for, so that its time is the copy's whole time
    // and the source may go when this returns, as after a staged upload.
    RETURN_IF_ERROR(device_->Check(
        Copy2D(dst, row_bytes, src, pitch ? pitch : row_bytes, row_bytes, rows, lane_->stream()),
        "host-to-device copy from pinned memory"));
    RETURN_IF_ERROR(device_->Check(cudaStreamSynchronize(lane_->stream()), "host-to-device copy"));
    h2d_seconds_ += SecondsSince(start);
    h2d_bytes_ += double(rows * row_bytes);
    return absl::OkStatus();
  }
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

absl::Status ShardScope::UploadFrom(void* dst, size_t n, const HostSource& src) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = lane_->UploadFrom(dst, n, src);
  h2d_seconds_ += SecondsSince(start);
  h2d_bytes_ += double(n);
  if (!s.ok()) (void)device_->Check(cudaGetLastError(), s.message());
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

absl::StatusOr<const void*> ShardScope::Input(const TensorView& view, int64_t offset, size_t rows,
                                              size_t row_bytes, size_t pitch) {
  const bool dense = rows <= 1 || pitch == 0 || pitch == row_bytes;
  if (view.device == device_->description().index && dense) {
    return static_cast<const char*>(view.data) + offset;
  }
  ASSIGN_OR_RETURN(void* dst, Alloc(rows * row_bytes));
  RETURN_IF_ERROR(CopyIn(dst, view, offset, rows, row_bytes, pitch));
  return dst;
}

absl::Status ShardScope::CopyIn(void* dst, const TensorView& view, int64_t offset, size_t rows,
                                size_t row_bytes, size_t pitch) {
  const char* src = static_cast<const char*>(view.data) + offset;
  if (view.device == kHostMemory) return Upload(dst, src, rows, row_bytes, pitch);
  if (view.device == device_->description().index) {
    return device_->Check(Copy2D(dst, row_bytes, src, pitch, row_bytes, rows, lane_->stream()),
                          "device copy of an operand");
  }
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(
      device_->Check(Copy2D(dst, row_bytes, src, pitch, row_bytes, rows, lane_->stream()),
                     "peer copy of an operand"));
  RETURN_IF_ERROR(device_->Check(cudaStreamSynchronize(lane_->stream()), "peer copy"));
  peer_seconds_ += SecondsSince(start);
  peer_bytes_ += double(rows * row_bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ShardScope::HostCopy(const TensorView& view, int64_t offset,
                                                 size_t rows, size_t row_bytes, size_t pitch) {
  std::string host(rows * row_bytes, '\0');
  if (view.device == kHostMemory) {
    const char* src = static_cast<const char*>(view.data) + offset;
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(host.data() + r * row_bytes, src + r * (pitch ? pitch : row_bytes), row_bytes);
    }
    return host;
  }
  ASSIGN_OR_RETURN(void* dense, Alloc(rows * row_bytes));
  RETURN_IF_ERROR(CopyIn(dense, view, offset, rows, row_bytes, pitch));
  RETURN_IF_ERROR(Download(host.data(), 0, dense, 1, host.size()));
  return host;
}

void* ShardScope::InPlace(const OutputView& out, int64_t offset) const {
  if (out.device != device_->description().index) return nullptr;
  return static_cast<char*>(out.data) + offset;
}

absl::Status ShardScope::CopyOut(const OutputView& out, int64_t offset, size_t pitch,
                                 const void* src, size_t rows, size_t row_bytes) {
  char* dst = static_cast<char*>(out.data) + offset;
  if (out.device == kHostMemory) return Download(dst, pitch, src, rows, row_bytes);
  if (out.device == device_->description().index) {
    return device_->Check(Copy2D(dst, pitch, src, row_bytes, row_bytes, rows, lane_->stream()),
                          "device copy of a result");
  }
  // To a peer: after the kernels, timed on its own.
  RETURN_IF_ERROR(device_->Check(cudaStreamSynchronize(lane_->stream()), "work before a copy"));
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(
      device_->Check(Copy2D(dst, pitch, src, row_bytes, row_bytes, rows, lane_->stream()),
                     "peer copy of a result"));
  RETURN_IF_ERROR(device_->Check(cudaStreamSynchronize(lane_->stream()), "peer copy"));
  peer_seconds_ += SecondsSince(start);
  peer_bytes_ += double(rows * row_bytes);
  return absl::OkStatus();
}

absl::Status ShardScope::WriteOut(const OutputView& out, int64_t offset, size_t pitch,
                                  const void* src, size_t rows, size_t row_bytes) {
  if (out.device == kHostMemory) {
    char* dst = static_cast<char*>(out.data) + offset;
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(dst + r * (pitch ? pitch : row_bytes),
                  static_cast<const char*>(src) + r * row_bytes, row_bytes);
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(void* staged, Alloc(rows * row_bytes));
  RETURN_IF_ERROR(Upload(staged, src, 1, rows * row_bytes, 0));
  return CopyOut(out, offset, pitch, staged, rows, row_bytes);
}

absl::Status ShardScope::BeginKernels() {
  return device_->Check(cudaEventRecord(lane_->kernel_begin(), lane_->stream()), "cudaEventRecord");
}

absl::Status ShardScope::EndKernels(cudaError_t launch, absl::string_view what) {
  RETURN_IF_ERROR(device_->Check(launch, what));
  return device_->Check(cudaEventRecord(lane_->kernel_end(), lane_->stream()), "cudaEventRecord");
}

absl::Status ShardScope::AddKernelTime() {
  RETURN_IF_ERROR(device_->Check(cudaEventSynchronize(lane_->kernel_end()), "kernel completion"));
  float ms = 0;
  RETURN_IF_ERROR(
      device_->Check(cudaEventElapsedTime(&ms, lane_->kernel_begin(), lane_->kernel_end()),
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
  r.peer_seconds = peer_seconds_;
  r.peer_bytes = peer_bytes_;
  return r;
}

}  // namespace gpucompute::cuda
