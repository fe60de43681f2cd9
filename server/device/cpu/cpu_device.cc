// The CPU device: variant names, timing and error mapping around the CPU
// kernels (kernels.h), each shard spread over the device's own ThreadPool.
#include "server/device/cpu/cpu_device.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/host_memory.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/device/cpu/kernels.h"

namespace gpucompute {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return int64_t{pages} * int64_t{page_size};
}

// Runs `kernel(stop)` (which may throw std::bad_alloc from its working
// buffers) as one shard of `op` named `variant`, timed on the host clock,
// its blocks stopping once `options.cancelled` says so. An allocation
// failure is RESOURCE_EXHAUSTED; a shard stopped before its end, CANCELLED.
template <typename Kernel>
absl::StatusOr<ShardRun> Timed(OpKind op, std::string variant, const OpOptions& options,
                               Kernel&& kernel) {
  ShardRun run;
  run.variant = std::move(variant);
  cpu::ShardStop stop(options.cancelled);
  const auto start = Clock::now();
  try {
    kernel(stop);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        std::string(OpName(op)), ": out of host memory for the shard's working buffers"));
  }
  if (stop.stopped()) {
    return absl::CancelledError(
        absl::StrCat(std::string(OpName(op)), ": the call was cancelled; the shard stopped"));
  }
  run.kernel_seconds = SecondsSince(start);
  return run;
}

// Host memory holding a resident tensor of a CPU device. A large one comes
// from LargeStringCache::Default() and goes back to it when freed: with
// several allocator arenas, a fresh block of more than 64 MiB is mapped
// anew and page-faulted in for every upload (development machine, 1 GiB
// uploads on one stream: 0.69-0.86 s with 8 arenas against 0.39-0.51 s with
// one).
class HostBuffer final : public DeviceBuffer {
 public:
  HostBuffer(int device, int64_t bytes)
      : bytes_(bytes),
        data_(LargeStringCache::Default().Take(size_t(std::max<int64_t>(bytes, 1)))),
        device_(device) {
    data_.resize(size_t(std::max<int64_t>(bytes, 1)));
  }
  ~HostBuffer() override { LargeStringCache::Default().Give(std::move(data_)); }
  void* data() const override { return const_cast<char*>(data_.data()); }
  int64_t bytes() const override { return bytes_; }
  int device() const override { return device_; }

 private:
  const int64_t bytes_;
  std::string data_;
  const int device_;
};

// Copies n bytes in parallel pieces on `pool` (one core's memcpy falls well
// short of the memory's bandwidth).
void ParallelCopy(ThreadPool& pool, char* dst, const char* src, int64_t n) {
  constexpr int64_t kPiece = int64_t{4} << 20;
  pool.ParallelRange(0, n, kPiece, pool.size(),
                     [&](int64_t b, int64_t e) { std::memcpy(dst + b, src + b, size_t(e - b)); });
}

}  // namespace

CpuDevice::CpuDevice(DeviceDescription description, int threads)
    : description_(std::move(description)), pool_(std::make_unique<ThreadPool>(threads)) {
  description_.kind = "cpu";
  description_.compute_units = threads;
  // Every CBLAS call runs single-threaded on the calling thread; parallelism
  // comes from our pools, so virtual devices do not contend for OpenBLAS's.
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

CpuDevice::~CpuDevice() = default;

std::vector<std::string> CpuDevice::Variants(OpKind op) const {
  auto list = [](const auto& names) {
    return std::vector<std::string>(std::begin(names), std::end(names));
  };
  switch (op) {
    case OpKind::kGemm:
      return list(kCpuGemmVariants);
    case OpKind::kGemv:
      return list(kCpuGemvVariants);
    case OpKind::kReduce:
      return list(kCpuReduceVariants);
    case OpKind::kTranspose:
      return list(kCpuTransposeVariants);
    case OpKind::kAttention:
      return list(kCpuAttentionVariants);
  }
  return {};
}

absl::StatusOr<int> CpuDevice::ResolveVariant(OpKind op, const std::string& name) const {
  if (name.empty()) return 0;
  const std::vector<std::string> variants = Variants(op);
  for (size_t i = 0; i < variants.size(); ++i) {
    if (variants[i] == name) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("options.variant: unknown variant ", Quote(name),
                                                 " for ", std::string(OpName(op)),
                                                 "; available: ", absl::StrJoin(variants, ", ")));
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuDevice::Allocate(int64_t bytes) {
  try {
    return std::make_unique<HostBuffer>(description_.index, bytes);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(description_.name, ": out of host memory allocating ", bytes, " bytes"));
  }
}

absl::Status CpuDevice::Write(DeviceBuffer& buffer, int64_t offset, const void* src, int64_t n,
                              double* seconds) {
  const auto start = Clock::now();
  ParallelCopy(*pool_, static_cast<char*>(buffer.data()) + offset, static_cast<const char*>(src),
               n);
  if (seconds != nullptr) *seconds += SecondsSince(start);
  return absl::OkStatus();
}

absl::Status CpuDevice::WriteFrom(DeviceBuffer& buffer, int64_t offset, int64_t n,
                                  const HostSource& src, double* seconds) {
  const auto start = Clock::now();
  char* dst = static_cast<char*>(buffer.data()) + offset;
  constexpr int64_t kPiece = int64_t{4} << 20;
  pool_->ParallelRange(0, n, kPiece, pool_->size(),
                       [&](int64_t b, int64_t e) { src(b, e - b, dst + b); });
  if (seconds != nullptr) *seconds += SecondsSince(start);
  return absl::OkStatus();
}

absl::Status CpuDevice::Read(const DeviceBuffer& buffer, int64_t offset, void* dst, int64_t n,
                             double* seconds) {
  const auto start = Clock::now();
  ParallelCopy(*pool_, static_cast<char*>(dst), static_cast<const char*>(buffer.data()) + offset,
               n);
  if (seconds != nullptr) *seconds += SecondsSince(start);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuDevice::Replicate(const DeviceBuffer& source,
                                                                   double* seconds) {
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> copy, Allocate(source.bytes()));
  RETURN_IF_ERROR(Write(*copy, 0, source.data(), source.bytes(), seconds));
  return copy;
}

absl::StatusOr<ShardRun> CpuDevice::Gemm(const GemmSpec& spec, Range rows, OutputView c_out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kGemm, spec.options.variant));
  return Timed(OpKind::kGemm, Variants(OpKind::kGemm)[variant], spec.options,
               [&](cpu::ShardStop& stop) {
                 cpu::GemmRows(*pool_, spec, rows, /*naive=*/variant == 1, c_out.data, stop);
               });
}

absl::StatusOr<ShardRun> CpuDevice::Gemv(const GemvSpec& spec, Range rows, OutputView y_out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kGemv, spec.options.variant));
  return Timed(OpKind::kGemv, Variants(OpKind::kGemv)[variant], spec.options,
               [&](cpu::ShardStop& stop) {
                 cpu::GemvRows(*pool_, spec, rows, /*naive=*/variant == 1, y_out.data, stop);
               });
}

absl::StatusOr<ShardRun> CpuDevice::Reduce(const ReduceSpec& spec, Range outer, Range axis,
                                           bool partial, OutputView out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kReduce, spec.options.variant));
  const cpu::ReduceOutput mode = partial ? cpu::ReduceOutput::kPartial : cpu::ReduceOutput::kFinal;
  return Timed(OpKind::kReduce, Variants(OpKind::kReduce)[variant], spec.options,
               [&](cpu::ShardStop& stop) {
                 cpu::ReduceRows(*pool_, spec, outer, axis, mode, out.data, stop);
               });
}

absl::StatusOr<ShardRun> CpuDevice::ReduceChunks(const ReduceSpec& spec, Range outer, Range axis,
                                                 float* out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kReduce, spec.options.variant));
  return Timed(
      OpKind::kReduce, Variants(OpKind::kReduce)[variant], spec.options, [&](cpu::ShardStop& stop) {
        cpu::ReduceRows(*pool_, spec, outer, axis, cpu::ReduceOutput::kChunkPartials, out, stop);
      });
}

absl::StatusOr<ShardRun> CpuDevice::Transpose(const TransposeSpec& spec, int prefix_axes,
                                              Range prefix, OutputView out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kTranspose, spec.options.variant));
  return Timed(OpKind::kTranspose, Variants(OpKind::kTranspose)[variant], spec.options,
               [&](cpu::ShardStop& stop) {
                 cpu::TransposePrefix(*pool_, spec, prefix_axes, prefix, out.data, stop);
               });
}

absl::StatusOr<ShardRun> CpuDevice::Attention(const AttentionSpec& spec, Range heads, Range q_rows,
                                              OutputView o_out, OutputView lse_out) {
  ASSIGN_OR_RETURN(const int variant, ResolveVariant(OpKind::kAttention, spec.options.variant));
  return Timed(OpKind::kAttention, Variants(OpKind::kAttention)[variant], spec.options,
               [&](cpu::ShardStop& stop) {
                 cpu::AttentionRows(*pool_, spec, heads, q_rows, o_out.data,
                                    static_cast<float*>(lse_out.data), stop);
               });
}

std::vector<std::unique_ptr<Device>> CreateCpuDevices(int count,
                                                      const std::vector<double>& weights) {
  std::vector<std::unique_ptr<Device>> devices;
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads = std::max(1, hardware / std::max(count, 1));
  const int64_t memory = PhysicalMemoryBytes() / std::max(count, 1);
  for (int i = 0; i < count; ++i) {
    DeviceDescription d;
    d.index = i;
    d.kind = "cpu";
    d.name = absl::StrCat("cpu:", i, " (", threads, threads == 1 ? " thread)" : " threads)");
    d.memory_bytes = memory;
    d.weight = weights.empty() ? 1.0 : weights[i];
    for (int p = 0; p < count; ++p) {
      if (p != i) d.peers.push_back(p);
    }
    devices.push_back(std::make_unique<CpuDevice>(std::move(d), threads));
  }
  return devices;
}

}  // namespace gpucompute
