// A lane of a CUDA device: one stream plus its own pinned staging buffers.
// A shard leases a lane for its whole run, so shards of different requests
// run on different streams and overlap, and staging buffers are never shared.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CUDA_LANE_H_
#define GPUCOMPUTE_SERVER_DEVICE_CUDA_LANE_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/device/device.h"
#include "server/device/thread_pool.h"

namespace gpucompute::cuda {

// How a lane stages copies between pageable host memory and the GPU.
struct StagingOptions {
  // Pinned buffers of the lane, `chunk_bytes` each (at least 2).
  size_t chunk_bytes = size_t{8} << 20;
  int buffers = 3;
  // A transfer smaller than buffers * chunk_bytes goes in `buffers` smaller
  // chunks, of at least min_chunk_bytes, so that its copies and its DMA
  // still overlap (0: whole chunks only).
  size_t min_chunk_bytes = size_t{1} << 20;
  // Copy threads (shared; may be null: the calling thread alone) take pieces
  // of a chunk of at least copy_piece_bytes. They write with non-temporal
  // stores into host memory (downloads) with streaming_to_host, into the
  // pinned buffers (uploads) with streaming_to_device. The defaults (host
  // memory only) are what gc_bench_device_path measured faster: streaming
  // stores into the pinned buffers were slower or equal.
  ThreadPool* copier = nullptr;
  size_t copy_piece_bytes = size_t{256} << 10;
  bool streaming_to_host = true;
  bool streaming_to_device = false;
};

class Lane {
 public:
  // Creates a non-blocking stream on device `ordinal` (which must be current)
  // and the pinned staging buffers of `staging`. Copies between pageable
  // memory and the pinned buffers are spread over the copy threads, as one
  // core's memcpy falls far short of the DMA's 55 GB/s.
  static absl::StatusOr<std::unique_ptr<Lane>> Create(int ordinal, const StagingOptions& staging);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Timing events for the kernels of the shard that holds the lane (made
  // once with the lane rather than per shard).
  cudaEvent_t kernel_begin() const { return kernel_begin_; }
  cudaEvent_t kernel_end() const { return kernel_end_; }

  // Enqueues a copy of `rows` host rows of `row_bytes` each (row i at
  // src + i * src_pitch) into dense device memory at dst. Pageable host
  // memory is gathered into the pinned buffers chunk by chunk; the gather of
  // chunk i+1 overlaps the DMA of chunk i. Returns once every chunk is
  // enqueued: `src` may be reused then, dst is valid in stream order.
  absl::Status Upload(void* dst, const void* src, size_t rows, size_t row_bytes, size_t src_pitch);
  // The same for `n` bytes copied out of `src` (in ranges, on the copy
  // threads) into the pinned buffers.
  absl::Status UploadFrom(void* dst, size_t n, const HostSource& src);

  // Copies dense device memory at src (in stream order after prior work) into
  // `rows` host rows of `row_bytes` each (row i at dst + i * dst_pitch).
  // Returns when the bytes are on the host. The DMA of chunk i+1 overlaps the
  // scatter of chunk i.
  absl::Status Download(void* dst, size_t dst_pitch, const void* src, size_t rows,
                        size_t row_bytes);

  // Waits for everything enqueued on the stream.
  absl::Status Synchronize();

  // Device memory of at least `bytes` from `pool` for the kernels of the
  // shard that holds the lane (a workspace), kept from shard to shard: made
  // on first use and remade larger when a shard needs more, so that a
  // steady stream of requests allocates none. Valid in stream order until
  // the next call. Errors: the allocation's cudaError_t.
  cudaError_t Scratch(size_t bytes, cudaMemPool_t pool, void** out);

 private:
  Lane() = default;

  // The chunk size of a transfer of `total` bytes.
  size_t ChunkFor(size_t total) const;
  // Fills the pinned buffers chunk by chunk (fill(pinned, offset, n)) and
  // enqueues each chunk's DMA to dst + offset; the fill of chunk i+1
  // overlaps the DMA of chunk i.
  absl::Status Stage(void* dst, size_t total,
                     const std::function<void(void*, size_t, size_t)>& fill);
  void Gather(void* dense, const void* rows_base, size_t row_bytes, size_t pitch, size_t offset,
              size_t n);
  void Scatter(void* rows_base, const void* dense, size_t row_bytes, size_t pitch, size_t offset,
               size_t n);

  int ordinal_ = 0;
  StagingOptions staging_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t kernel_begin_ = nullptr;
  cudaEvent_t kernel_end_ = nullptr;
  std::vector<void*> buffers_;      // pinned
  std::vector<cudaEvent_t> ready_;  // buffer i may be reused once ready_[i] completes
  std::vector<bool> pending_;       // ready_[i] was recorded and not yet waited for
  void* scratch_ = nullptr;         // Scratch(), from the device's pool
  size_t scratch_bytes_ = 0;
};

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_DEVICE_CUDA_LANE_H_
