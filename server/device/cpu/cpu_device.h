// The CPU backend: virtual CPU devices that run every operation on the host.
// fp32 GEMM and GEMV go through OpenBLAS's CBLAS (single-threaded calls spread
// over the device's own thread pool); reduce, transpose and attention are our
// own code (kernels.h, one file per operation). Half types are converted to
// fp32 and accumulate in fp32.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CPU_CPU_DEVICE_H_
#define GPUCOMPUTE_SERVER_DEVICE_CPU_CPU_DEVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/device/device.h"
#include "server/device/thread_pool.h"

namespace gpucompute {

// Variant names per operation, fastest first. "naive" GEMM/GEMV are plain
// loops kept as a cross-check of the BLAS path.
inline constexpr const char* kCpuGemmVariants[] = {"openblas", "naive"};
inline constexpr const char* kCpuGemvVariants[] = {"openblas", "naive"};
inline constexpr const char* kCpuReduceVariants[] = {"cpu"};
inline constexpr const char* kCpuTransposeVariants[] = {"cpu_blocked"};
inline constexpr const char* kCpuAttentionVariants[] = {"cpu_online_softmax"};

class CpuDevice : public Device {
 public:
  // A device running on `threads` host threads (the calling thread included).
  // description.kind is set to "cpu" and compute_units to `threads`.
  // REQUIRES: threads >= 1, description.weight > 0.
  CpuDevice(DeviceDescription description, int threads);
  ~CpuDevice() override;
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  const DeviceDescription& description() const override { return description_; }
  bool healthy() const override { return true; }
  std::vector<std::string> Variants(OpKind op) const override;

  // Resident tensors live in host memory, which every CPU device reads in
  // place.
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(int64_t bytes) override;
  absl::Status Write(DeviceBuffer& buffer, int64_t offset, const void* src, int64_t n,
                     double* seconds) override;
  absl::Status WriteFrom(DeviceBuffer& buffer, int64_t offset, int64_t n, const HostSource& src,
                         double* seconds) override;
  absl::Status Read(const DeviceBuffer& buffer, int64_t offset, void* dst, int64_t n,
                    double* seconds) override;
  bool ReadsInPlace(int index) const override { return true; }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Replicate(const DeviceBuffer& source,
                                                          double* seconds) override;

  // Operands and outputs are host memory wherever they are said to live.
  absl::StatusOr<ShardRun> Gemm(const GemmSpec& spec, Range rows, OutputView c_out) override;
  absl::StatusOr<ShardRun> Gemv(const GemvSpec& spec, Range rows, OutputView y_out) override;
  absl::StatusOr<ShardRun> Reduce(const ReduceSpec& spec, Range outer, Range axis, bool partial,
                                  OutputView out) override;
  // All chunks of the shard at once, in parallel over the pool.
  absl::StatusOr<ShardRun> ReduceChunks(const ReduceSpec& spec, Range outer, Range axis,
                                        float* out) override;
  absl::StatusOr<ShardRun> Transpose(const TransposeSpec& spec, int prefix_axes, Range prefix,
                                     OutputView out) override;
  absl::StatusOr<ShardRun> Attention(const AttentionSpec& spec, Range heads, Range q_rows,
                                     OutputView o_out, OutputView lse_out) override;

 private:
  // Index of `name` in Variants(op) (0 for an empty name), or INVALID_ARGUMENT
  // naming options.variant.
  absl::StatusOr<int> ResolveVariant(OpKind op, const std::string& name) const;

  DeviceDescription description_;
  std::unique_ptr<ThreadPool> pool_;
};

// `count` virtual CPU devices sharing the machine's cores: each gets
// max(1, hardware_concurrency / count) threads and an equal share of physical
// memory; weights[i] is device i's compute weight (empty: all 1). Every device
// lists all the others as peers. Names read "cpu:<i> (<threads> threads)".
// REQUIRES: count >= 1; weights empty or of size count, each > 0.
std::vector<std::unique_ptr<Device>> CreateCpuDevices(int count,
                                                      const std::vector<double>& weights);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_DEVICE_CPU_CPU_DEVICE_H_
