#include "server/device/cuda/lane.h"

#include <algorithm>
#include <cstring>

#include "proto/host_memory.h"
#include "server/device/cuda/cuda_util.h"
#include "server/device/host_copy.h"

namespace gpucompute::cuda {
namespace {

// Runs shorter than this (the rows of a pitched copy) go by memcpy even with
// `streaming`: streaming stores to part of a cache line write it to memory
// partially, and each run ends with a fence.
constexpr size_t kMinStreamingBytes = 4096;

// memcpy, or with `streaming` CopyStreaming (host_copy.h).
void Copy(void* dst, const void* src, size_t n, bool streaming) {
  if (streaming && n >= kMinStreamingBytes) {
    CopyStreaming(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

// Walks `rows` rows of `row_bytes` laid out with `pitch` as one byte stream:
// copies the stream bytes [offset, offset + n) to or from a dense buffer.
void GatherRows(void* dense, const void* rows_base, size_t row_bytes, size_t pitch, size_t offset,
                size_t n, bool streaming) {
  auto* out = static_cast<char*>(dense);
  const auto* base = static_cast<const char*>(rows_base);
  if (pitch == row_bytes) {
    Copy(out, base + offset, n, streaming);
    return;
  }
  while (n > 0) {
    size_t row = offset / row_bytes, col = offset % row_bytes;
    size_t take = std::min(n, row_bytes - col);
    Copy(out, base + row * pitch + col, take, streaming);
    out += take;
    offset += take;
    n -= take;
  }
}

void ScatterRows(void* rows_base, const void* dense, size_t row_bytes, size_t pitch, size_t offset,
                 size_t n, bool streaming) {
  const auto* in = static_cast<const char*>(dense);
  auto* base = static_cast<char*>(rows_base);
  if (pitch == row_bytes) {
    Copy(base + offset, in, n, streaming);
    return;
  }
  while (n > 0) {
    size_t row = offset / row_bytes, col = offset % row_bytes;
    size_t take = std::min(n, row_bytes - col);
    Copy(base + row * pitch + col, in, take, streaming);
    in += take;
    offset += take;
    n -= take;
  }
}

}  // namespace

void Lane::Gather(void* dense, const void* rows_base, size_t row_bytes, size_t pitch, size_t offset,
                  size_t n) {
  const StagingOptions& o = staging_;
  if (o.copier == nullptr || n < 2 * o.copy_piece_bytes) {
    GatherRows(dense, rows_base, row_bytes, pitch, offset, n, o.streaming_to_device);
    return;
  }
  o.copier->ParallelRange(0, int64_t(n), int64_t(o.copy_piece_bytes), o.copier->size(),
                          [&](int64_t b, int64_t e) {
                            GatherRows(static_cast<char*>(dense) + b, rows_base, row_bytes, pitch,
                                       offset + size_t(b), size_t(e - b), o.streaming_to_device);
                          });
}

void Lane::Scatter(void* rows_base, const void* dense, size_t row_bytes, size_t pitch,
                   size_t offset, size_t n) {
  const StagingOptions& o = staging_;
  if (o.copier == nullptr || n < 2 * o.copy_piece_bytes) {
    ScatterRows(rows_base, dense, row_bytes, pitch, offset, n, o.streaming_to_host);
    return;
  }
  o.copier->ParallelRange(
      0, int64_t(n), int64_t(o.copy_piece_bytes), o.copier->size(), [&](int64_t b, int64_t e) {
        ScatterRows(rows_base, static_cast<const char*>(dense) + b, row_bytes, pitch,
                    offset + size_t(b), size_t(e - b), o.streaming_to_host);
      });
}

absl::StatusOr<std::unique_ptr<Lane>> Lane::Create(int ordinal, const StagingOptions& staging) {
  std::unique_ptr<Lane> lane(new Lane());
  lane->ordinal_ = ordinal;
  lane->staging_ = staging;
  lane->staging_.buffers = std::max(2, staging.buffers);
  lane->staging_.copy_piece_bytes = std::max<size_t>(staging.copy_piece_bytes, 4096);
  absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&lane->stream_, cudaStreamNonBlocking),
                              "cudaStreamCreate");
  if (!s.ok()) return s;
  for (cudaEvent_t* e : {&lane->kernel_begin_, &lane->kernel_end_}) {
    s = CudaStatus(cudaEventCreate(e), "cudaEventCreate");
    if (!s.ok()) return s;
  }
  for (int i = 0; i < lane->staging_.buffers; ++i) {
    void* p = nullptr;
    s = CudaStatus(cudaHostAlloc(&p, staging.chunk_bytes, cudaHostAllocPortable), "cudaHostAlloc");
    if (!s.ok()) return s;
    lane->buffers_.push_back(p);
    AddForeignResidentBytes(int64_t(staging.chunk_bytes));  // pinned: not for the trimmer
    cudaEvent_t e;
    s = CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    if (!s.ok()) return s;
    lane->ready_.push_back(e);
    lane->pending_.push_back(false);
  }
  return lane;
}

Lane::~Lane() {
  DeviceGuard guard(ordinal_);
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
  if (stream_) cudaStreamSynchronize(stream_);
  for (void* p : buffers_) {
    cudaFreeHost(p);
    AddForeignResidentBytes(-int64_t(staging_.chunk_bytes));
  }
  for (cudaEvent_t e : ready_) cudaEventDestroy(e);
  for (cudaEvent_t e : {kernel_begin_, kernel_end_}) {
    if (e) cudaEventDestroy(e);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

absl::Status Lane::Upload(void* dst, const void* src, size_t rows, size_t row_bytes,
                          size_t src_pitch) {
  return Stage(dst, rows * row_bytes, [&](void* pinned, size_t offset, size_t n) {
    Gather(pinned, src, row_bytes, src_pitch, offset, n);
  });
}

absl::Status Lane::UploadFrom(void* dst, size_t n, const HostSource& src) {
  return Stage(dst, n, [&](void* pinned, size_t offset, size_t len) {
    const StagingOptions& o = staging_;
    if (o.copier == nullptr || len < 2 * o.copy_piece_bytes) {
      src(int64_t(offset), int64_t(len), pinned);
      return;
    }
    o.copier->ParallelRange(0, int64_t(len), int64_t(o.copy_piece_bytes), o.copier->size(),
                            [&](int64_t b, int64_t e) {
                              src(int64_t(offset) + b, e - b, static_cast<char*>(pinned) + b);
                            });
  });
}

size_t Lane::ChunkFor(size_t total) const {
  const size_t full = staging_.chunk_bytes;
  if (staging_.min_chunk_bytes == 0) return full;
  // Spread over every buffer, rounded to 4 KiB, within [min, full].
  const size_t nb = buffers_.size();
  const size_t even = ((total + nb - 1) / nb + 4095) / 4096 * 4096;
  return std::min(full, std::max(std::min(staging_.min_chunk_bytes, full), even));
}

absl::Status Lane::Stage(void* dst, size_t total,
                         const std::function<void(void*, size_t, size_t)>& fill) {
  const size_t nb = buffers_.size();
  const size_t chunk = ChunkFor(total);
  for (size_t off = 0, i = 0; off < total; off += chunk, ++i) {
    const size_t b = i % nb;
    const size_t n = std::min(chunk, total - off);
    if (pending_[b]) {
      if (absl::Status s = CudaStatus(cudaEventSynchronize(ready_[b]), "staging wait"); !s.ok())
        return s;
      pending_[b] = false;
    }
    fill(buffers_[b], off, n);
    if (absl::Status s = CudaStatus(cudaMemcpyAsync(static_cast<char*>(dst) + off, buffers_[b], n,
                                                    cudaMemcpyHostToDevice, stream_),
                                    "host-to-device copy");
        !s.ok())
      return s;
    if (absl::Status s = CudaStatus(cudaEventRecord(ready_[b], stream_), "cudaEventRecord");
        !s.ok())
      return s;
    pending_[b] = true;
  }
  return absl::OkStatus();
}

absl::Status Lane::Download(void* dst, size_t dst_pitch, const void* src, size_t rows,
                            size_t row_bytes) {
  const size_t total = rows * row_bytes;
  if (total == 0) return Synchronize();
  const size_t nb = buffers_.size();
  const size_t chunk = ChunkFor(total);
  const size_t chunks = (total + chunk - 1) / chunk;
  auto issue = [&](size_t i) -> absl::Status {
    const size_t b = i % nb, off = i * chunk;
    const size_t n = std::min(chunk, total - off);
    absl::Status s = CudaStatus(cudaMemcpyAsync(buffers_[b], static_cast<const char*>(src) + off, n,
                                                cudaMemcpyDeviceToHost, stream_),
                                "device-to-host copy");
    if (!s.ok()) return s;
    s = CudaStatus(cudaEventRecord(ready_[b], stream_), "cudaEventRecord");
    pending_[b] = s.ok();
    return s;
  };
  // Earlier uploads may still read these buffers: the DMA queue is in stream
  // order, so issuing after them on the same stream is safe.
  for (size_t i = 0; i < std::min(nb, chunks); ++i)
    if (absl::Status s = issue(i); !s.ok()) return s;
  for (size_t i = 0; i < chunks; ++i) {
    const size_t b = i % nb, off = i * chunk;
    const size_t n = std::min(chunk, total - off);
    if (absl::Status s = CudaStatus(cudaEventSynchronize(ready_[b]), "device-to-host wait");
        !s.ok())
      return s;
    pending_[b] = false;
    Scatter(dst, buffers_[b], row_bytes, dst_pitch, off, n);
    if (i + nb < chunks)
      if (absl::Status s = issue(i + nb); !s.ok()) return s;
  }
  return absl::OkStatus();
}

cudaError_t Lane::Scratch(size_t bytes, cudaMemPool_t pool, void** out) {
  if (bytes > scratch_bytes_) {
    if (scratch_ != nullptr) {
      cudaFreeAsync(scratch_, stream_);  // in stream order: after the work that used it
      scratch_ = nullptr;
      scratch_bytes_ = 0;
    }
    void* p = nullptr;
    if (cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, pool, stream_); err != cudaSuccess)
      return err;
    scratch_ = p;
    scratch_bytes_ = bytes;
  }
  *out = scratch_;
  return cudaSuccess;
}

absl::Status Lane::Synchronize() {
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace gpucompute::cuda
