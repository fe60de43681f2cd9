// The Device interface: one compute device (a CPU worker pool or a GPU) that
// runs one shard of an operation, and holds resident tensors in its memory.
// The engine calls it from several threads at once; implementations are
// thread-safe.
//
// Every operation method computes only its shard and writes only that
// shard's part of the caller's output (the full output, in
// options.output_dtype, row-major), so shards of one operation never overlap.
// Operands are TensorViews in host memory, or in a device's memory
// (resident tensors; view.device says which); outputs are OutputViews
// likewise.
#ifndef GPUCOMPUTE_SERVER_DEVICE_DEVICE_H_
#define GPUCOMPUTE_SERVER_DEVICE_DEVICE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/cost.h"
#include "server/core/ops.h"
#include "server/core/planner.h"

namespace gpucompute {

// Host bytes to copy from, in ranges: copy(at, n, dst) copies the source's
// bytes [at, at + n) to dst. It may be called from several threads at once
// for disjoint ranges.
using HostSource = std::function<void(int64_t at, int64_t n, void* dst)>;

// What a device is; reported by GetServerInfo.
struct DeviceDescription {
  int index = 0;     // position in the server's device list
  std::string kind;  // "cpu" or "cuda"
  std::string name;
  // GPUs: the identity the DCGM exporter labels its series with, so that
  // both can be joined: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" and the
  // PCI address "00000000:19:00.0" (NVML's format). Empty for CPU devices.
  std::string uuid;
  std::string pci_bus_id;
  int64_t memory_bytes = 0;
  int compute_units = 0;   // SMs or worker threads
  double weight = 1.0;     // relative compute weight for sharding
  std::vector<int> peers;  // devices reachable by peer access
};

// What running one shard measured. A device reports only what it measured;
// the bytes and FLOPs an operation implies are the cost model's
// (server/core/cost.h), filled in by the engine.
struct ShardRun {
  std::string variant;        // the variant that ran
  double kernel_seconds = 0;  // compute time
  double h2d_seconds = 0;     // host-to-device copies (0 on the CPU)
  double d2h_seconds = 0;     // device-to-host copies (0 on the CPU)
  double h2d_bytes = 0;       // bytes copied host to device
  double d2h_bytes = 0;       // bytes copied device to host
  double peer_seconds = 0;    // copies between devices (resident operands, results)
  double peer_bytes = 0;      // bytes copied between devices

  // Data movement time: both directions and between devices.
  double transfer_seconds() const { return h2d_seconds + d2h_seconds + peer_seconds; }
  // Adds `other`'s times and bytes; keeps this variant, or takes other's
  // when this has none.
  ShardRun& operator+=(const ShardRun& other) {
    if (variant.empty()) variant = other.variant;
    kernel_seconds += other.kernel_seconds;
    h2d_seconds += other.h2d_seconds;
    d2h_seconds += other.d2h_seconds;
    h2d_bytes += other.h2d_bytes;
    d2h_bytes += other.d2h_bytes;
    peer_seconds += other.peer_seconds;
    peer_bytes += other.peer_bytes;
    return *this;
  }
};

// Memory of one device, in bytes.
struct DeviceMemory {
  int64_t used_bytes = 0;
  int64_t total_bytes = 0;
};

// Memory on one device that outlives requests: the bytes of a resident
// tensor (device memory on a GPU, host memory on the CPU backend). Freed when
// destroyed; REQUIRES: no operation still uses it then.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  // The first byte (a device pointer on a GPU).
  virtual void* data() const = 0;
  virtual int64_t bytes() const = 0;
  // The index of the device whose memory this is.
  virtual int device() const = 0;
  // The buffer as an operand or an output.
  OutputView output() const { return {data(), device()}; }
};

class Device {
 public:
  virtual ~Device() = default;

  virtual const DeviceDescription& description() const = 0;

  // False once the device has failed for good; the engine then skips it.
  virtual bool healthy() const = 0;

  // Device memory in use and in total, as of now. The default reports
  // description().memory_bytes as the total and nothing in use: the CPU
  // backend has no device memory of its own to account.
  virtual DeviceMemory MemoryUsage() const { return {0, description().memory_bytes}; }

  // What one shard of `op` on `dtype` inputs costs this device, for the
  // engine's choice of how many devices an operation uses (server/core/cost.h).
  // The default has no fixed cost, so every operation is split over every
  // candidate device, as the CPU backend does.
  virtual DeviceCost Cost(OpKind op, DType dtype) const { return {}; }

  // Shards of `op` that split rows (GEMM, GEMV) begin at multiples of this
  // many rows: a GPU packs a shard's transposed A with the shard's row count
  // as its leading dimension, and its vector and TMA kernels need that
  // 16-byte aligned. The default, 1, lets a shard begin at any row.
  virtual int64_t RowGranularity(OpKind op) const { return 1; }

  // Variant names this device accepts for `op`, fastest first.
  virtual std::vector<std::string> Variants(OpKind op) const = 0;

  // Resident memory.
  //
  // `bytes` (>= 0) of this device's memory for a resident tensor, not
  // initialised. RESOURCE_EXHAUSTED when the device has no room.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(int64_t bytes) = 0;
  // Copies `n` host bytes at `src` into `buffer` (one of this device's) at
  // byte `offset`; returns once they are there. Adds the copy's seconds to
  // `*seconds` when not null. REQUIRES: offset + n <= buffer.bytes().
  virtual absl::Status Write(DeviceBuffer& buffer, int64_t offset, const void* src, int64_t n,
                             double* seconds = nullptr) = 0;
  // Write from bytes that are not in one piece (a message's slices): the
  // same as Write, the host bytes copied out of `src` in ranges, possibly
  // from several threads at once. The default gathers them first.
  virtual absl::Status WriteFrom(DeviceBuffer& buffer, int64_t offset, int64_t n,
                                 const HostSource& src, double* seconds = nullptr);
  // Copies `n` bytes of `buffer` (one of this device's) from byte `offset`
  // to host memory at `dst`. REQUIRES: offset + n <= buffer.bytes().
  virtual absl::Status Read(const DeviceBuffer& buffer, int64_t offset, void* dst, int64_t n,
                            double* seconds = nullptr) = 0;
  // True when this device's kernels read the memory of device `index` in
  // place. The default: its own only. (CPU devices all share host memory.)
  virtual bool ReadsInPlace(int index) const { return index == description().index; }
  // A copy in this device's memory of `source` (a buffer of another device
  // of this backend), copied device to device. Adds the copy's seconds to
  // `*seconds` when not null.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Replicate(const DeviceBuffer& source,
                                                                  double* seconds = nullptr) = 0;

  // Operations. Errors: INVALID_ARGUMENT (unknown variant, or a shape the
  // variant refuses), RESOURCE_EXHAUSTED (out of memory), INTERNAL (device
  // failure), CANCELLED when spec.options.cancelled turned true before the
  // shard was done (its output then incomplete). The CPU device asks it
  // between blocks of a few milliseconds; a device may also finish a shard
  // it has launched (a GPU kernel runs to its end).
  //
  // Rows `rows` of C (every batch entry) into `c_out`.
  virtual absl::StatusOr<ShardRun> Gemm(const GemmSpec& spec, Range rows, OutputView c_out) = 0;

  // Rows `rows` of y into `y_out`.
  virtual absl::StatusOr<ShardRun> Gemv(const GemvSpec& spec, Range rows, OutputView y_out) = 0;

  // Reduces input rows `outer` over the reduced-axis range `axis`.
  // partial == false: writes final values (out dtype, MEAN divided by
  //   axis_len) for outer rows `outer` into `out` (the full output).
  // partial == true: writes fp32 partials ([outer.size(), inner]: sums for
  //   SUM and MEAN, maxima, minima) into `out` (host memory of that size).
  virtual absl::StatusOr<ShardRun> Reduce(const ReduceSpec& spec, Range outer, Range axis,
                                          bool partial, OutputView out) = 0;

  // One fp32 partial per chunk of the reduced axis: `axis` spans whole chunks
  // of kReduceChunk (aligned at 0; the last chunk of the axis may be short),
  // and chunk c of it (counted from its first) goes to
  // out + c * outer.size() * inner, exactly as Reduce(partial = true) writes
  // that chunk alone. The default makes one such call per chunk; devices
  // override it to reduce the chunks in parallel.
  virtual absl::StatusOr<ShardRun> ReduceChunks(const ReduceSpec& spec, Range outer, Range axis,
                                                float* out) {
    ShardRun total;
    const int64_t chunk_floats = outer.size() * spec.inner;
    for (int64_t begin = axis.begin; begin < axis.end; begin += kReduceChunk) {
      const Range chunk{begin, std::min(axis.end, begin + kReduceChunk)};
      absl::StatusOr<ShardRun> run = Reduce(spec, outer, chunk, true, OutputView{out});
      if (!run.ok()) return run.status();
      total += *run;
      out += chunk_floats;
    }
    return total;
  }

  // Output elements whose flattened index over the first `prefix_axes`
  // output axes lies in `prefix`, into `out`.
  virtual absl::StatusOr<ShardRun> Transpose(const TransposeSpec& spec, int prefix_axes,
                                             Range prefix, OutputView out) = 0;

  // Query rows `q_rows` of the (batch, head_q) pairs `heads` (flattened
  // b * heads_q + h) into `o_out`, and into `lse_out` (float [B, Hq, Sq])
  // when it is set.
  virtual absl::StatusOr<ShardRun> Attention(const AttentionSpec& spec, Range heads, Range q_rows,
                                             OutputView o_out, OutputView lse_out) = 0;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_DEVICE_DEVICE_H_
