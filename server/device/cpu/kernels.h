// The CPU backend's kernels, one file per operation; the adapter
// (cpu_device.cc) puts them behind the Device interface. Each runs one shard
// spread over a ThreadPool (nothing here starts threads of its own) and
// writes only that shard's part of the output. They may throw std::bad_alloc
// from their working buffers; the adapter turns that into RESOURCE_EXHAUSTED.
// Each asks its ShardStop before every block of work (a few milliseconds
// or less of one thread's time) and returns early once it says stop, the
// output then partly written.
//   gemm.cc       fp32 through CBLAS (blas.h), single-threaded calls of
//                 bounded work per block of output rows; half inputs
//                 converted to fp32 per block. "naive" runs plain loops
//                 instead.
//   gemv.cc       the same per block of rows, half inputs converted in
//                 cache-sized sub-blocks so A crosses memory once; several
//                 right-hand sides as one GEMM.
//   reduce.cc     the reduced axis in chunks of kReduceChunk; inside a chunk a
//                 fixed pairwise (contiguous) or cascaded (strided) order,
//                 chunks combined by CombinePartials: the bits do not depend
//                 on the number of threads or devices.
//   transpose.cc  rank padded to 4; 64x64 tiles through a small buffer when
//                 the input's contiguous axis is not the output's, row copies
//                 otherwise.
//   attention.cc  online softmax over key blocks of 64 for blocks of 32 query
//                 rows, fp32 throughout; the two inner products are also
//                 compiled for AVX2 and AVX-512F and picked at load time.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CPU_KERNELS_H_
#define GPUCOMPUTE_SERVER_DEVICE_CPU_KERNELS_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "server/core/ops.h"
#include "server/core/planner.h"
#include "server/device/thread_pool.h"

namespace gpucompute::cpu {

// Work below this many scalar operations stays on the calling thread: waking
// workers costs more than it saves.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 15;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Pieces to split `work` scalar operations into on a pool of `threads`.
inline int64_t PiecesFor(int64_t work, int threads) {
  return std::clamp<int64_t>(work / kMinParallelWork, 1, threads);
}

// Whether one shard should stop, asked by its blocks on every thread that
// runs them. Asks the call's check (OpOptions::cancelled) at most once per
// kPollInterval, whichever thread's turn it is, and remembers a true answer,
// so that every block after it is skipped for the price of a load.
class ShardStop {
 public:
  static constexpr std::chrono::nanoseconds kPollInterval = std::chrono::milliseconds(2);

  // `check` may be empty (never stop); it must outlive this.
  explicit ShardStop(const CancelCheck& check) : check_(check) {}
  ShardStop(const ShardStop&) = delete;
  ShardStop& operator=(const ShardStop&) = delete;

  // True when the shard should stop: the caller skips its block.
  bool Stop() {
    if (stopped_.load(std::memory_order_relaxed)) return true;
    if (!check_) return false;
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    int64_t due = next_poll_.load(std::memory_order_relaxed);
    if (now < due || !next_poll_.compare_exchange_strong(
                         due, now + std::chrono::steady_clock::duration(kPollInterval).count(),
                         std::memory_order_relaxed)) {
      return false;  // asked recently, or another thread is asking now
    }
    if (!check_()) return false;
    stopped_.store(true, std::memory_order_relaxed);
    return true;
  }

  // True once Stop() has said so: the shard's output is incomplete.
  bool stopped() const { return stopped_.load(std::memory_order_relaxed); }

 private:
  const CancelCheck& check_;
  std::atomic<int64_t> next_poll_{0};  // steady_clock ticks
  std::atomic<bool> stopped_{false};
};

// Blocks to cut `items` items of `item_work` scalar operations each into, so
// that a block holds about `block_work` operations but at least `min_items`
// items (fewer only when there are fewer): each block then holds between
// one and two times that many items.
inline int64_t BlocksFor(int64_t items, int64_t item_work, int64_t block_work, int64_t min_items) {
  const int64_t per_block =
      std::max<int64_t>({min_items, block_work / std::max<int64_t>(item_work, 1), 1});
  return std::max<int64_t>(1, items / per_block);
}

// Rows `rows` of C, every batch entry, into `c_out` (the full output, in
// options.output_dtype). `naive`: plain loops instead of CBLAS.
void GemmRows(ThreadPool& pool, const GemmSpec& spec, Range rows, bool naive, void* c_out,
              ShardStop& stop);

// Rows `rows` of y into `y_out` (the full output). `naive` as for GEMM.
void GemvRows(ThreadPool& pool, const GemvSpec& spec, Range rows, bool naive, void* y_out,
              ShardStop& stop);

// What ReduceRows writes.
enum class ReduceOutput {
  kFinal,          // final values in the output dtype, into the full output
  kPartial,        // one fp32 partial [rows, inner] for the whole axis range
  kChunkPartials,  // one fp32 partial [rows, inner] per chunk, chunk-major
};

// Reduces input rows `outer` over the reduced-axis range `axis` into `out`
// as `mode` says (Device::Reduce and Device::ReduceChunks give the layouts).
void ReduceRows(ThreadPool& pool, const ReduceSpec& spec, Range outer, Range axis,
                ReduceOutput mode, void* out, ShardStop& stop);

// Output elements whose flattened index over the first `prefix_axes` output
// axes lies in `prefix`, into `out` (the full output).
void TransposePrefix(ThreadPool& pool, const TransposeSpec& spec, int prefix_axes, Range prefix,
                     void* out, ShardStop& stop);

// Query rows `q_rows` of the (batch, head_q) pairs `heads` into `o_out`, and
// into `lse_out` when it is not null (both full outputs).
void AttentionRows(ThreadPool& pool, const AttentionSpec& spec, Range heads, Range q_rows,
                   void* o_out, float* lse_out, ShardStop& stop);

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_DEVICE_CPU_KERNELS_H_
