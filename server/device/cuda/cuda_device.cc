#include "server/device/cuda/cuda_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpucompute/kernels/attention.h"
#include "gpucompute/kernels/convert.h"
#include "gpucompute/kernels/gemm.h"
#include "gpucompute/kernels/gemv.h"
#include "gpucompute/kernels/reduce.h"
#include "gpucompute/kernels/transpose.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/device/cuda/cuda_util.h"
#include "server/device/cuda/shard_scope.h"
#include "server/device/identity.h"

namespace gpucompute::cuda {
namespace {

namespace k = ::gpucompute::kernels;

k::DType ToKernel(DType t) {
  switch (t) {
    case DType::kFloat32:
      return k::DType::kF32;
    case DType::kFloat16:
      return k::DType::kF16;
    case DType::kBFloat16:
      return k::DType::kBF16;
  }
  return k::DType::kF32;
}

DType FromKernel(k::DType t) {
  switch (t) {
    case k::DType::kF32:
      return DType::kFloat32;
    case k::DType::kF16:
      return DType::kFloat16;
    case k::DType::kBF16:
      return DType::kBFloat16;
  }
  return DType::kFloat32;
}

// What one shard costs an H200, for the engine's choice of how many GPUs an
// operation uses (server/core/cost.h). From deploy/gpu/results/cuda-backend.md
// and the kernel results it rests on (kernels/bench/results/), rounded:
// - fixed, per shard whatever its size: lane lease, stream-ordered
//   allocations and frees, event timing, synchronisation (~150 us; an
//   estimate, as the results do not break it out: measure it next time);
// - host <-> device staging through a lane's pinned buffers, the copies
//   spread over the device's copy threads: 32.7 GB/s host to device and
//   37.0 GB/s back (deploy/results/data-path.md, run 2);
// - device memory: 4530 GB/s for a 2^28 fp32 reduce (reduce.md);
// - tensor cores (fp16/bf16 GEMM and flash attention): 770 TFLOP/s for a
//   16384^3 bf16 GEMM;
// - CUDA cores (fp32, and the memory-bound operations' arithmetic): 47 TFLOP/s
//   for fp32 GEMM (gemm_simt.md).
// Calibration replaces the memory and tensor-core rates where it runs.
constexpr double kShardFixedSeconds = 150e-6;
constexpr double kStagingBytesPerSecond = 30e9;
constexpr double kMemoryBytesPerSecond = 4000e9;
constexpr double kTensorCoreFlopsPerSecond = 700e12;
constexpr double kCudaCoreFlopsPerSecond = 50e12;

// Largest score matrix the fp32 attention path materialises (see Attention).
constexpr int64_t kMaxFp32ScoreBytes = int64_t{2} << 30;

char* Ptr(void* p, int64_t byte_offset) { return static_cast<char*>(p) + byte_offset; }

// Names of a ladder, fastest first (the kernels list them slowest first).
std::vector<std::string> FastestFirst(const std::vector<std::string>& ladder) {
  return {ladder.rbegin(), ladder.rend()};
}

// beta * src (n elements of `src_t` on the host; null: zeros) in `out_t`:
// the result of a product over an empty K.
std::string ScaleOnHost(const void* src, DType src_t, double beta, DType out_t, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n), 0.f);
  if (src != nullptr && beta != 0) {
    ToFloat(src_t, src, v.data(), n);
    for (float& x : v) x = float(beta * x);
  }
  std::string out(size_t(n) * DTypeSize(out_t), '\0');
  FromFloat(out_t, v.data(), out.data(), n);
  return out;
}

// A dense device buffer of `n` elements of `from` converted to `to` on the
// device (for output dtypes the kernels cannot write), written into `out` as
// `rows` rows (n / rows elements each) at byte `offset`, row i at offset +
// i * pitch: straight into out's memory when it lives here and the rows are
// dense there, else through a buffer copied out.
absl::Status ConvertOut(ShardScope& scope, const void* src, DType from, DType to, int64_t n,
                        const OutputView& out, int64_t offset, size_t rows, size_t pitch) {
  const size_t row_bytes = size_t(n) * DTypeSize(to) / rows;
  void* dst = scope.InPlace(out, offset);
  const bool direct = dst != nullptr && (rows == 1 || pitch == row_bytes);
  if (!direct) {
    ASSIGN_OR_RETURN(dst, scope.Alloc(size_t(n) * DTypeSize(to)));
  }
  RETURN_IF_ERROR(
      scope.Check(k::LaunchConvert(src, ToKernel(from), dst, ToKernel(to), n, scope.stream()),
                  "result dtype conversion"));
  if (direct) return absl::OkStatus();
  return scope.CopyOut(out, offset, pitch, dst, rows, row_bytes);
}

// The error for arguments the kernels refuse: it names options.variant when a
// variant was asked for by name (that choice is what the client can change).
absl::Status Refused(absl::string_view op, absl::string_view variant, absl::string_view reason) {
  if (variant.empty()) return absl::InvalidArgumentError(absl::StrCat(op, ": ", reason));
  return absl::InvalidArgumentError(
      absl::StrCat("options.variant: ", Quote(variant), " cannot run this ", op, ": ", reason));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal, int index,
                                                               double weight,
                                                               const CudaDeviceOptions& options) {
  std::unique_ptr<CudaDevice> d(new CudaDevice());
  d->ordinal_ = ordinal;
  DeviceGuard guard(ordinal);
  cudaDeviceProp prop{};
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"));
  d->description_.index = index;
  d->description_.kind = "cuda";
  d->description_.name = absl::StrCat(prop.name, " (cuda:", ordinal, ")");
  static_assert(sizeof(prop.uuid.bytes) == 16);
  d->description_.uuid = GpuUuidString(reinterpret_cast<const unsigned char*>(prop.uuid.bytes));
  d->description_.pci_bus_id = PciBusIdString(prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
  d->description_.memory_bytes = int64_t(prop.totalGlobalMem);
  d->description_.compute_units = prop.multiProcessorCount;
  d->description_.weight = weight;

  RETURN_IF_ERROR(CudaStatus(cudaDeviceGetDefaultMemPool(&d->pool_, ordinal), "memory pool"));
  uint64_t threshold = options.pool_release_threshold_bytes;
  RETURN_IF_ERROR(
      CudaStatus(cudaMemPoolSetAttribute(d->pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
                 "memory pool release threshold"));

  d->copier_ =
      std::make_unique<ThreadPool>(std::max(1, options.copy_threads), options.copy_spin_us);
  StagingOptions staging = options.staging;
  staging.copier = d->copier_.get();
  for (int i = 0; i < std::max(1, options.lanes); ++i) {
    ASSIGN_OR_RETURN(auto lane, Lane::Create(ordinal, staging));
    d->lanes_.push_back(std::move(lane));
  }
  absl::MutexLock lock(&d->mu_);
  for (auto& lane : d->lanes_) d->free_lanes_.push_back(lane.get());
  return d;
}

absl::Status CudaDevice::GrantPoolAccess(int peer) {
  cudaMemAccessDesc access{};
  access.location.type = cudaMemLocationTypeDevice;
  access.location.id = peer;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  return CudaStatus(cudaMemPoolSetAccess(pool_, &access, 1),
                    absl::StrCat("memory pool access for device ", peer));
}

CudaDevice::~CudaDevice() {
  DeviceGuard guard(ordinal_);
  lanes_.clear();
  if (pool_) cudaMemPoolTrimTo(pool_, 0);
}

Lane* CudaDevice::AcquireLane() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::vector<Lane*>* free) { return !free->empty(); }, &free_lanes_));
  Lane* lane = free_lanes_.back();
  free_lanes_.pop_back();
  return lane;
}

void CudaDevice::ReleaseLane(Lane* lane) {
  absl::MutexLock lock(&mu_);
  free_lanes_.push_back(lane);
}

absl::Status CudaDevice::Check(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  if (IsStickyError(err)) healthy_.store(false);
  return CudaStatus(err, absl::StrCat(description_.name, ": ", what));
}

DeviceMemory CudaDevice::MemoryUsage() const {
  DeviceMemory memory;
  DeviceGuard guard(ordinal_);
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    memory.total_bytes = int64_t(total_b);
    memory.used_bytes = int64_t(total_b - free_b);
  } else {
    cudaGetLastError();
    memory.total_bytes = description_.memory_bytes;
  }
  return memory;
}

DeviceCost CudaDevice::Cost(OpKind op, DType dtype) const {
  const bool tensor_cores =
      (op == OpKind::kGemm || op == OpKind::kAttention) && dtype != DType::kFloat32;
  DeviceCost cost;
  cost.fixed_seconds = kShardFixedSeconds;
  cost.transfer_bytes_per_second = kStagingBytesPerSecond;
  cost.memory_bytes_per_second =
      memory_bytes_per_second_ > 0 ? memory_bytes_per_second_ : kMemoryBytesPerSecond;
  if (!tensor_cores) {
    cost.flops_per_second = kCudaCoreFlopsPerSecond;
  } else {
    cost.flops_per_second =
        tensor_flops_per_second_ > 0 ? tensor_flops_per_second_ : kTensorCoreFlopsPerSecond;
  }
  return cost;
}

int64_t CudaDevice::RowGranularity(OpKind op) const {
  return op == OpKind::kGemm || op == OpKind::kGemv ? 8 : 1;
}

std::vector<std::string> CudaDevice::Variants(OpKind op) const {
  switch (op) {
    case OpKind::kGemm:
      return FastestFirst(k::GemmVariants());
    case OpKind::kGemv:
      return FastestFirst(k::GemvVariants());
    case OpKind::kReduce:
      return FastestFirst(k::ReduceVariants());
    case OpKind::kTranspose:
      return FastestFirst(k::PermuteVariants());
    case OpKind::kAttention:
      return FastestFirst(k::AttentionVariants());
  }
  return {};
}

// A resident buffer in one GPU's memory, from the device's pool.
class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(int device, int ordinal, void* data, int64_t bytes)
      : device_(device), ordinal_(ordinal), data_(data), bytes_(bytes) {}
  ~CudaBuffer() override {
    DeviceGuard guard(ordinal_);
    // Nothing uses it any more (every shard waits for its stream before it
    // ends): freed in the per-thread stream's order, without a device-wide
    // synchronisation.
    cudaFreeAsync(data_, cudaStreamPerThread);
    cudaGetLastError();
  }
  void* data() const override { return data_; }
  int64_t bytes() const override { return bytes_; }
  int device() const override { return device_; }
  int ordinal() const { return ordinal_; }

 private:
  const int device_;
  const int ordinal_;
  void* const data_;
  const int64_t bytes_;
};

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaDevice::Allocate(int64_t bytes) {
  // On the calling thread's own stream rather than a lane: a result's
  // allocation neither waits for a lane nor holds one, and the
  // synchronisation makes the memory usable on every stream.
  DeviceGuard guard(ordinal_);
  void* p = nullptr;
  cudaError_t err = cudaMallocFromPoolAsync(&p, size_t(std::max<int64_t>(bytes, 256)), pool_,
                                            cudaStreamPerThread);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Check(err, absl::StrCat("device allocation of ", bytes, " resident bytes"));
  }
  return std::make_unique<CudaBuffer>(description_.index, ordinal_, p, bytes);
}

absl::Status CudaDevice::Write(DeviceBuffer& buffer, int64_t offset, const void* src, int64_t n,
                               double* seconds) {
  ShardScope scope(this);
  RETURN_IF_ERROR(scope.Upload(Ptr(buffer.data(), offset), src, 1, size_t(n), 0));
  RETURN_IF_ERROR(Check(cudaStreamSynchronize(scope.stream()), "resident write"));
  if (seconds != nullptr) *seconds += scope.Run("").h2d_seconds;
  return absl::OkStatus();
}

absl::Status CudaDevice::WriteFrom(DeviceBuffer& buffer, int64_t offset, int64_t n,
                                   const HostSource& src, double* seconds) {
  ShardScope scope(this);
  RETURN_IF_ERROR(scope.UploadFrom(Ptr(buffer.data(), offset), size_t(n), src));
  RETURN_IF_ERROR(Check(cudaStreamSynchronize(scope.stream()), "resident write"));
  if (seconds != nullptr) *seconds += scope.Run("").h2d_seconds;
  return absl::OkStatus();
}

absl::Status CudaDevice::Read(const DeviceBuffer& buffer, int64_t offset, void* dst, int64_t n,
                              double* seconds) {
  ShardScope scope(this);
  RETURN_IF_ERROR(scope.Download(dst, 0, Ptr(buffer.data(), offset), 1, size_t(n)));
  if (seconds != nullptr) *seconds += scope.Run("").d2h_seconds;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaDevice::Replicate(const DeviceBuffer& source,
                                                                    double* seconds) {
  const auto* from = dynamic_cast<const CudaBuffer*>(&source);
  if (from == nullptr) return absl::InternalError("Replicate: not a CUDA buffer");
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> copy, Allocate(source.bytes()));
  ShardScope scope(this);
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(Check(cudaMemcpyPeerAsync(copy->data(), ordinal_, from->data(), from->ordinal(),
                                            size_t(source.bytes()), scope.stream()),
                        "peer copy of a resident tensor"));
  RETURN_IF_ERROR(Check(cudaStreamSynchronize(scope.stream()), "peer copy"));
  if (seconds != nullptr) {
    *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return copy;
}

absl::StatusOr<ShardRun> CudaDevice::Gemm(const GemmSpec& s, Range rows, OutputView c_out) {
  const int64_t mr = rows.size();
  if (mr <= 0 || s.n == 0 || s.batch == 0) return ShardRun{};
  const DType out_t = s.options.output_dtype;
  const size_t es = DTypeSize(s.dtype), eo = DTypeSize(out_t);
  ShardScope scope(this);
  if (s.k == 0) {  // an empty product: C = beta * C (the kernels need K >= 1)
    for (int64_t i = 0; i < s.batch; ++i) {
      const int64_t c_batch = s.c_batched ? i : 0;
      std::string c_rows;
      if (s.c && s.beta != 0) {
        ASSIGN_OR_RETURN(c_rows, scope.HostCopy(*s.c, (c_batch * s.m + rows.begin) * s.n * es, 1,
                                                size_t(mr * s.n) * es, 0));
      }
      const std::string scaled =
          ScaleOnHost(c_rows.empty() ? nullptr : c_rows.data(), s.dtype, s.beta, out_t, mr * s.n);
      RETURN_IF_ERROR(scope.WriteOut(c_out, (i * s.m + rows.begin) * s.n * eo, 0, scaled.data(), 1,
                                     scaled.size()));
    }
    return scope.Run("empty_k");
  }
  const int64_t batch_a = s.a_batched ? s.batch : 1;
  const int64_t batch_b = s.b_batched ? s.batch : 1;

  k::GemmArgs args;
  args.m = mr;
  args.n = s.n;
  args.k = s.k;
  args.batch = s.batch;
  args.trans_a = s.trans_a;
  args.trans_b = s.trans_b;
  args.lda = s.trans_a ? mr : s.k;
  args.stride_a = s.a_batched ? mr * s.k : 0;
  args.ldb = s.trans_b ? s.k : s.n;
  args.stride_b = s.b_batched ? s.k * s.n : 0;
  args.ldc = s.n;
  args.ab_type = ToKernel(s.dtype);
  args.alpha = float(s.alpha);
  args.beta = float(s.beta);
  args.allow_tf32 = s.options.allow_tf32;

  // A's rows (dense as [batch_a][K][mr] or [batch_a][mr][K]) and B: in place
  // when they are resident here and dense, else copied here.
  if (s.trans_a) {  // A is [batch_a][K][M]: columns rows.begin.. of every row.
    ASSIGN_OR_RETURN(args.a, scope.Input(s.a, rows.begin * es, size_t(batch_a * s.k),
                                         size_t(mr) * es, size_t(s.m) * es));
  } else {
    ASSIGN_OR_RETURN(args.a, scope.Input(s.a, rows.begin * s.k * es, size_t(batch_a),
                                         size_t(mr * s.k) * es, size_t(s.m * s.k) * es));
  }
  ASSIGN_OR_RETURN(args.b, scope.Input(s.b, 0, 1, size_t(batch_b * s.k * s.n) * es, 0));

  // C: straight into the result when it lives here and the kernel writes its
  // dtype (batch entries s.m * s.n apart), else into a buffer of out_t or,
  // failing that, fp32 converted afterwards. The kernels read beta * C in the
  // dtype they write: when C is read and the output dtype differs from C's
  // own, they work in fp32 (which holds every input dtype exactly), so C is
  // not rounded to the output dtype before it is scaled.
  const std::string& variant = s.options.variant;
  const bool widen = s.beta != 0 && s.c.has_value() && out_t != s.dtype;
  const DType c_first = widen ? DType::kFloat32 : out_t;
  void* in_place =
      c_first == out_t ? scope.InPlace(c_out, rows.begin * s.n * int64_t(eo)) : nullptr;
  k::Support support;
  if (in_place != nullptr) {
    args.c = in_place;
    args.c_type = ToKernel(out_t);
    args.stride_c = s.m * s.n;
    support = k::CanImplementGemm(args, variant);
    if (!support) in_place = nullptr;
  }
  if (in_place == nullptr) {
    ASSIGN_OR_RETURN(void* c, scope.Alloc(size_t(s.batch * mr * s.n) * 4));
    args.c = c;
    args.c_type = ToKernel(c_first);
    args.stride_c = mr * s.n;
    support = k::CanImplementGemm(args, variant);
    if (!support && c_first != DType::kFloat32) {
      args.c_type = k::DType::kF32;
      support = k::CanImplementGemm(args, variant);
    }
  }
  if (!support) return Refused("gemm", variant, support.reason);
  const DType c_t = FromKernel(args.c_type);
  const size_t ec = DTypeSize(c_t);

  if (s.beta != 0 && s.c.has_value()) {
    // This shard's rows of C, [batch_c][mr][n] in the input dtype.
    const int64_t batch_c = s.c_batched ? s.batch : 1;
    const int64_t c_offset = rows.begin * s.n * int64_t(es);
    const size_t c_rows = size_t(mr * s.n) * es, c_pitch = size_t(s.m * s.n) * es;
    bool fused = false;
    if (c_t == s.dtype) {
      // The kernels read beta * C where it lies: no copy into C.
      ASSIGN_OR_RETURN(args.c_in, scope.Input(*s.c, c_offset, size_t(batch_c), c_rows, c_pitch));
      args.stride_c_in = batch_c > 1 ? mr * s.n : 0;
      fused = static_cast<bool>(k::CanImplementGemm(args, variant));
      if (!fused) {
        args.c_in = nullptr;
        args.stride_c_in = 0;
      }
    }
    if (!fused && c_t == s.dtype) {
      for (int64_t i = 0; i < s.batch; ++i) {
        const int64_t src_batch = s.c_batched ? i : 0;
        RETURN_IF_ERROR(scope.CopyIn(Ptr(args.c, i * args.stride_c * int64_t(ec)), *s.c,
                                     c_offset + src_batch * int64_t(c_pitch), 1, c_rows, 0));
      }
    } else if (!fused) {  // converted on the device into the kernel's C dtype
      ASSIGN_OR_RETURN(const void* c_src,
                       scope.Input(*s.c, c_offset, size_t(batch_c), c_rows, c_pitch));
      for (int64_t i = 0; i < s.batch; ++i) {
        const int64_t src_batch = s.c_batched ? i : 0;
        RETURN_IF_ERROR(scope.Check(
            k::LaunchConvert(Ptr(const_cast<void*>(c_src), src_batch * int64_t(c_rows)),
                             ToKernel(s.dtype), Ptr(args.c, i * args.stride_c * int64_t(ec)),
                             args.c_type, mr * s.n, scope.stream()),
            "C dtype conversion"));
      }
    }
  }
  size_t ws_bytes = k::GemmWorkspaceBytes(args, variant);
  void* ws = nullptr;
  if (ws_bytes) {
    ASSIGN_OR_RETURN(ws, scope.Workspace(ws_bytes));
  }
  const std::string ran = k::GemmVariantName(args, variant);
  RETURN_IF_ERROR(scope.BeginKernels());
  RETURN_IF_ERROR(
      scope.EndKernels(k::LaunchGemm(args, variant, ws, scope.stream()), "gemm launch"));
  const int64_t out_offset = rows.begin * s.n * int64_t(eo);
  const size_t out_pitch = size_t(s.m * s.n) * eo;
  if (in_place == nullptr && c_t == out_t) {
    RETURN_IF_ERROR(scope.CopyOut(c_out, out_offset, out_pitch, args.c, size_t(s.batch),
                                  size_t(mr * s.n) * eo));
  } else if (in_place == nullptr) {
    RETURN_IF_ERROR(ConvertOut(scope, args.c, c_t, out_t, s.batch * mr * s.n, c_out, out_offset,
                               size_t(s.batch), out_pitch));
  }
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(ran);
}

absl::StatusOr<ShardRun> CudaDevice::Gemv(const GemvSpec& s, Range rows, OutputView y_out) {
  const int64_t mr = rows.size();
  if (mr <= 0) return ShardRun{};
  const DType out_t = s.options.output_dtype;
  const size_t es = DTypeSize(s.dtype), eo = DTypeSize(out_t);
  ShardScope scope(this);
  if (s.k == 0) {  // an empty product: y = beta * y (the kernels need K >= 1)
    std::string y_rows;
    if (s.y && s.beta != 0) {
      ASSIGN_OR_RETURN(
          y_rows, scope.HostCopy(*s.y, rows.begin * s.ncols * es, 1, size_t(mr * s.ncols) * es, 0));
    }
    const std::string scaled =
        ScaleOnHost(y_rows.empty() ? nullptr : y_rows.data(), s.dtype, s.beta, out_t, mr * s.ncols);
    RETURN_IF_ERROR(
        scope.WriteOut(y_out, rows.begin * s.ncols * eo, 0, scaled.data(), 1, scaled.size()));
    return scope.Run("empty_k");
  }

  k::GemvArgs args;
  args.m = mr;
  args.k = s.k;
  args.trans_a = s.trans_a;
  args.lda = s.trans_a ? mr : s.k;
  args.ncols = int(s.ncols);
  args.dtype = ToKernel(s.dtype);
  args.alpha = float(s.alpha);
  args.beta = float(s.beta);
  if (s.trans_a) {
    ASSIGN_OR_RETURN(
        args.a, scope.Input(s.a, rows.begin * es, size_t(s.k), size_t(mr) * es, size_t(s.m) * es));
  } else {
    ASSIGN_OR_RETURN(args.a, scope.Input(s.a, rows.begin * s.k * es, 1, size_t(mr * s.k) * es, 0));
  }
  ASSIGN_OR_RETURN(args.x, scope.Input(s.x, 0, 1, size_t(s.k * s.ncols) * es, 0));

  const std::string& variant = s.options.variant;
  // The kernels read beta * y in the dtype they write. When y is read and the
  // output dtype differs from y's own, they work in fp32 (which holds every
  // input dtype exactly) and the result is converted once: y is not rounded
  // to the output dtype before it is scaled.
  const bool widen = s.beta != 0 && s.y.has_value() && out_t != s.dtype;
  const DType y_first = widen ? DType::kFloat32 : out_t;
  void* in_place =
      y_first == out_t ? scope.InPlace(y_out, rows.begin * s.ncols * int64_t(eo)) : nullptr;
  k::Support support;
  if (in_place != nullptr) {
    args.y = in_place;
    args.y_type = ToKernel(out_t);
    support = k::CanImplementGemv(args, variant);
    if (!support) in_place = nullptr;
  }
  if (in_place == nullptr) {
    ASSIGN_OR_RETURN(void* y, scope.Alloc(size_t(mr * s.ncols) * 4));
    args.y = y;
    args.y_type = ToKernel(y_first);
    support = k::CanImplementGemv(args, variant);
    if (!support && y_first != DType::kFloat32) {
      args.y_type = k::DType::kF32;
      support = k::CanImplementGemv(args, variant);
    }
  }
  if (!support) return Refused("gemv", variant, support.reason);
  const DType y_t = FromKernel(args.y_type);

  if (s.beta != 0 && s.y.has_value()) {
    const int64_t offset = rows.begin * s.ncols * int64_t(es);
    const size_t y_bytes = size_t(mr * s.ncols) * es;
    if (y_t == s.dtype) {
      RETURN_IF_ERROR(scope.CopyIn(args.y, *s.y, offset, 1, y_bytes, 0));
    } else {  // widened to fp32 on the device (exact)
      ASSIGN_OR_RETURN(const void* y_src, scope.Input(*s.y, offset, 1, y_bytes, 0));
      RETURN_IF_ERROR(scope.Check(k::LaunchConvert(y_src, ToKernel(s.dtype), args.y, args.y_type,
                                                   mr * s.ncols, scope.stream()),
                                  "y dtype conversion"));
    }
  }
  size_t ws_bytes = k::GemvWorkspaceBytes(args, variant);
  void* ws = nullptr;
  if (ws_bytes) {
    ASSIGN_OR_RETURN(ws, scope.Workspace(ws_bytes));
  }
  const std::string ran = k::GemvVariantName(args, variant);
  RETURN_IF_ERROR(scope.BeginKernels());
  RETURN_IF_ERROR(
      scope.EndKernels(k::LaunchGemv(args, variant, ws, scope.stream()), "gemv launch"));
  const int64_t out_offset = rows.begin * s.ncols * int64_t(eo);
  if (in_place == nullptr && y_t == out_t) {
    RETURN_IF_ERROR(scope.CopyOut(y_out, out_offset, 0, args.y, 1, size_t(mr * s.ncols) * eo));
  } else if (in_place == nullptr) {
    RETURN_IF_ERROR(ConvertOut(scope, args.y, y_t, out_t, mr * s.ncols, y_out, out_offset, 1, 0));
  }
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(ran);
}

absl::StatusOr<ShardRun> CudaDevice::Reduce(const ReduceSpec& s, Range outer, Range axis,
                                            bool partial, OutputView out) {
  const int64_t no = outer.size(), na = axis.size();
  if (no <= 0 || s.inner == 0) return ShardRun{};
  const DType out_t = partial ? DType::kFloat32 : s.options.output_dtype;
  const size_t es = DTypeSize(s.input.dtype), eo = DTypeSize(out_t);
  const int64_t n_out = no * s.inner;
  const int64_t out_offset = partial ? 0 : outer.begin * s.inner * int64_t(eo);
  ShardScope scope(this);
  if (na == 0) {  // An empty reduction: the identity (numpy: mean of nothing is NaN).
    std::vector<float> fill(size_t(n_out), (s.kind == ReduceKind::kMean && !partial)
                                               ? std::numeric_limits<float>::quiet_NaN()
                                               : 0.f);
    std::string values(size_t(n_out) * eo, '\0');
    FromFloat(out_t, fill.data(), values.data(), n_out);
    RETURN_IF_ERROR(scope.WriteOut(out, out_offset, 0, values.data(), 1, values.size()));
    return scope.Run("empty_axis");
  }
  k::ReduceArgs args;
  args.outer = no;
  args.axis = na;
  args.inner = s.inner;
  switch (s.kind) {
    case ReduceKind::kSum:
      args.op = k::ReduceOp::kSum;
      break;
    case ReduceKind::kMax:
      args.op = k::ReduceOp::kMax;
      break;
    case ReduceKind::kMin:
      args.op = k::ReduceOp::kMin;
      break;
    case ReduceKind::kMean:
      args.op = partial ? k::ReduceOp::kSum : k::ReduceOp::kMean;
      break;
  }
  args.in_type = ToKernel(s.input.dtype);
  args.out_type = ToKernel(out_t);
  ASSIGN_OR_RETURN(
      args.in,
      scope.Input(s.input, (outer.begin * s.axis_len + axis.begin) * s.inner * int64_t(es),
                  size_t(no), size_t(na * s.inner) * es, size_t(s.axis_len * s.inner) * es));
  void* o = scope.InPlace(out, out_offset);
  if (o == nullptr) {
    ASSIGN_OR_RETURN(o, scope.Alloc(size_t(n_out) * eo));
  }
  args.out = o;
  const std::string& variant = s.options.variant;
  k::Support support = k::CanImplementReduce(args, variant);
  if (!support) return Refused("reduce", variant, support.reason);
  size_t ws_bytes = k::ReduceWorkspaceBytes(args, variant);
  void* ws = nullptr;
  if (ws_bytes) {
    ASSIGN_OR_RETURN(ws, scope.Workspace(ws_bytes));  // the launch clears what it needs cleared
  }
  const std::string ran = k::ReduceVariantName(args, variant);
  RETURN_IF_ERROR(scope.BeginKernels());
  RETURN_IF_ERROR(
      scope.EndKernels(k::LaunchReduce(args, variant, ws, scope.stream()), "reduce launch"));
  if (o != scope.InPlace(out, out_offset)) {
    RETURN_IF_ERROR(scope.CopyOut(out, out_offset, 0, o, 1, size_t(n_out) * eo));
  }
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(ran);
}

absl::StatusOr<ShardRun> CudaDevice::ReduceChunks(const ReduceSpec& s, Range outer, Range axis,
                                                  float* out) {
  const int64_t no = outer.size(), na = axis.size();
  if (no <= 0 || na <= 0 || s.inner == 0) return ShardRun{};
  ShardScope scope(this);
  const size_t es = DTypeSize(s.input.dtype);
  const int64_t full = na / kReduceChunk;  // whole chunks
  const int64_t tail = na - full * kReduceChunk;
  const int64_t chunks = full + (tail ? 1 : 0);

  k::ReduceArgs args;
  args.inner = s.inner;
  args.op = s.kind == ReduceKind::kMax   ? k::ReduceOp::kMax
            : s.kind == ReduceKind::kMin ? k::ReduceOp::kMin
                                         : k::ReduceOp::kSum;
  args.in_type = ToKernel(s.input.dtype);
  args.out_type = k::DType::kF32;
  const std::string& variant = s.options.variant;
  ASSIGN_OR_RETURN(
      const void* in,
      scope.Input(s.input, (outer.begin * s.axis_len + axis.begin) * s.inner * int64_t(es),
                  size_t(no), size_t(na * s.inner) * es, size_t(s.axis_len * s.inner) * es));
  // Device partials as [outer][chunk][inner]; the caller wants [chunk][outer][inner].
  ASSIGN_OR_RETURN(void* part, scope.Alloc(size_t(no * chunks * s.inner) * 4));
  // One workspace serves every launch: they run in stream order. The
  // version the kernels pick (and so the workspace) depends on the pointers,
  // so the query sees real ones.
  args.in = in;
  args.out = part;
  size_t ws_bytes = 0;
  if (full) {
    args.outer = full;
    args.axis = kReduceChunk;
    ws_bytes = k::ReduceWorkspaceBytes(args, variant);
  }
  if (tail) {
    args.outer = 1;
    args.axis = tail;
    ws_bytes = std::max(ws_bytes, k::ReduceWorkspaceBytes(args, variant));
  }
  void* ws = nullptr;
  if (ws_bytes) {
    ASSIGN_OR_RETURN(ws, scope.Workspace(ws_bytes));  // the launches clear what they need cleared
  }
  std::string ran;
  if (full) {
    args.outer = full;
    args.axis = kReduceChunk;
  } else {
    args.outer = 1;
    args.axis = tail;
  }
  ran = k::ReduceVariantName(args, variant);
  RETURN_IF_ERROR(scope.BeginKernels());
  cudaError_t err = cudaSuccess;
  for (int64_t o = 0; o < no && err == cudaSuccess; ++o) {
    const char* row = static_cast<const char*>(in) + o * na * s.inner * es;
    float* row_out = static_cast<float*>(part) + o * chunks * s.inner;
    if (full) {
      args.outer = full;
      args.axis = kReduceChunk;
      args.in = row;
      args.out = row_out;
      k::Support support = k::CanImplementReduce(args, variant);
      if (!support) return Refused("reduce", variant, support.reason);
      err = k::LaunchReduce(args, variant, ws, scope.stream());
    }
    if (tail && err == cudaSuccess) {
      args.outer = 1;
      args.axis = tail;
      args.in = row + full * kReduceChunk * s.inner * es;
      args.out = row_out + full * s.inner;
      k::Support support = k::CanImplementReduce(args, variant);
      if (!support) return Refused("reduce", variant, support.reason);
      err = k::LaunchReduce(args, variant, ws, scope.stream());
    }
  }
  RETURN_IF_ERROR(scope.EndKernels(err, "reduce launch"));
  if (no == 1) {
    RETURN_IF_ERROR(scope.Download(out, 0, part, 1, size_t(chunks * s.inner) * 4));
  } else {
    std::vector<float> tmp(size_t(no * chunks * s.inner));
    RETURN_IF_ERROR(scope.Download(tmp.data(), 0, part, 1, tmp.size() * 4));
    for (int64_t o = 0; o < no; ++o)
      for (int64_t c = 0; c < chunks; ++c)
        std::memcpy(out + (c * no + o) * s.inner, tmp.data() + (o * chunks + c) * s.inner,
                    size_t(s.inner) * 4);
  }
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(ran);
}

absl::StatusOr<ShardRun> CudaDevice::Transpose(const TransposeSpec& s, int prefix_axes,
                                               Range prefix, OutputView out) {
  if (prefix.size() <= 0) return ShardRun{};
  ShardScope scope(this);
  const DType in_t = s.input.dtype, out_t = s.options.output_dtype;
  const size_t es = DTypeSize(in_t), eo = DTypeSize(out_t);
  int64_t out_inner = 1;  // elements per unit of the prefix range
  for (int i = std::max(prefix_axes, 0); i < s.rank; ++i) out_inner *= s.out_shape[i];

  k::PermuteArgs args;
  args.rank = s.rank;
  args.dtype = ToKernel(in_t);
  for (int i = 0; i < s.rank; ++i) {
    args.shape[i] = s.in_shape[i];
    args.perm[i] = s.perm[i];
  }
  int64_t src_offset = 0;
  size_t up_rows = 1, up_row_bytes = s.input.num_bytes(), up_pitch = 0;
  int64_t out_offset_units = 0;  // where the device output starts, in prefix units
  int64_t device_units = 1;      // prefix units the device computes
  if (prefix_axes <= 1) {
    // Output rows [begin, end) read only that range of input axis perm[0]
    // (the whole input when the prefix is empty).
    const int a = s.perm[0];
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < a; ++i) outer *= s.in_shape[i];
    for (int i = a + 1; i < s.rank; ++i) inner *= s.in_shape[i];
    if (prefix_axes == 1) {
      args.shape[a] = prefix.size();
      src_offset = prefix.begin * inner * int64_t(es);
      up_rows = size_t(outer);
      up_row_bytes = size_t(prefix.size() * inner) * es;
      up_pitch = size_t(s.in_shape[a] * inner) * es;
      device_units = prefix.size();
    }
  } else {
    // Several leading axes flattened: the device permutes the whole tensor
    // and returns its part of the output.
    device_units = 1;
    for (int i = 0; i < prefix_axes; ++i) device_units *= s.out_shape[i];
    out_offset_units = prefix.begin;
  }
  const int64_t n_out = prefix.size() * out_inner;
  const int64_t dst_offset = prefix.begin * out_inner * int64_t(eo);
  ASSIGN_OR_RETURN(args.in, scope.Input(s.input, src_offset, up_rows, up_row_bytes, up_pitch));
  // The result straight into the output when it lives here, the device
  // computes only its part, and no dtype changes.
  void* in_place = in_t == out_t && out_offset_units == 0 && device_units == prefix.size()
                       ? scope.InPlace(out, dst_offset)
                       : nullptr;
  if (in_place != nullptr) {
    args.out = in_place;
  } else {
    ASSIGN_OR_RETURN(args.out, scope.Alloc(size_t(device_units * out_inner) * es));
  }
  const std::string& variant = s.options.variant;
  k::Support support = k::CanImplementPermute(args, variant);
  if (!support) return Refused("transpose", variant, support.reason);
  const std::string ran = k::PermuteVariantName(args, variant);
  // Another output dtype: converted on this device, straight into the output
  // when it lives here, else into a buffer that is then copied out.
  void* converted = nullptr;
  void* convert_in_place = nullptr;
  if (in_t != out_t) {
    convert_in_place = out_offset_units == 0 && device_units == prefix.size()
                           ? scope.InPlace(out, dst_offset)
                           : nullptr;
    if (convert_in_place == nullptr) {
      ASSIGN_OR_RETURN(converted, scope.Alloc(size_t(n_out) * eo));
    }
  }
  RETURN_IF_ERROR(scope.BeginKernels());
  cudaError_t err = k::LaunchPermute(args, variant, scope.stream());
  const void* o_part = Ptr(args.out, out_offset_units * out_inner * int64_t(es));
  if (err == cudaSuccess && in_t != out_t) {
    err = k::LaunchConvert(o_part, ToKernel(in_t),
                           convert_in_place != nullptr ? convert_in_place : converted,
                           ToKernel(out_t), n_out, scope.stream());
  }
  RETURN_IF_ERROR(scope.EndKernels(err, "transpose launch"));
  if (in_place == nullptr && in_t == out_t) {
    RETURN_IF_ERROR(scope.CopyOut(out, dst_offset, 0, o_part, 1, size_t(n_out) * eo));
  } else if (converted != nullptr) {
    RETURN_IF_ERROR(scope.CopyOut(out, dst_offset, 0, converted, 1, size_t(n_out) * eo));
  }
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(ran);
}

absl::StatusOr<ShardRun> CudaDevice::Attention(const AttentionSpec& s, Range heads, Range q_rows,
                                               OutputView o_out, OutputView lse_out) {
  const int64_t qn = q_rows.size();
  if (heads.size() <= 0 || qn <= 0) return ShardRun{};
  const int64_t hq = s.heads_q, group = s.heads_q / s.heads_kv, d = s.head_dim;
  const DType in_t = s.dtype, out_t = s.options.output_dtype;
  const size_t es = DTypeSize(in_t), eo = DTypeSize(out_t);
  // Keys any of these query rows can see (bottom-right causal alignment).
  const int64_t skv = s.causal ? std::min(s.seq_kv, q_rows.end + s.seq_kv - s.seq_q) : s.seq_kv;

  // float32 inputs keep float32 precision unless options.allow_tf32 lets the
  // flash rungs run them (those round Q, K and V to bfloat16 as they load
  // them). Without it the float32 version ("reference") runs, whose scratch
  // holds the whole score matrix of a launch: a shard too large for that runs
  // as several calls over blocks of its query rows (or halves of its heads).
  const bool exact_fp32 = in_t == DType::kFloat32 && !s.options.allow_tf32;
  if (exact_fp32 && !s.options.variant.empty() && s.options.variant != "reference") {
    return Refused("attention", s.options.variant,
                   "it rounds float32 Q, K and V to bfloat16: set options.allow_tf32 to allow "
                   "that, or name \"reference\"");
  }
  if (exact_fp32) {
    const double row_bytes = double(heads.size()) * double(std::max<int64_t>(skv, 1)) * 4;
    if (row_bytes * double(qn) > double(kMaxFp32ScoreBytes)) {
      ShardRun total;
      if (row_bytes > double(kMaxFp32ScoreBytes) && heads.size() > 1) {
        const int64_t mid = heads.begin + heads.size() / 2;
        for (Range half : {Range{heads.begin, mid}, Range{mid, heads.end}}) {
          ASSIGN_OR_RETURN(ShardRun part, Attention(s, half, q_rows, o_out, lse_out));
          total += part;
        }
        return total;
      }
      const int64_t rows = std::max<int64_t>(1, int64_t(double(kMaxFp32ScoreBytes) / row_bytes));
      for (int64_t r = q_rows.begin; r < q_rows.end; r += rows) {
        ASSIGN_OR_RETURN(
            ShardRun part,
            Attention(s, heads, Range{r, std::min(q_rows.end, r + rows)}, o_out, lse_out));
        total += part;
      }
      return total;
    }
  }

  // Pieces: (batch, first head, head count) with whole kv groups, or part of
  // one group. Whole batches in a row go as one launch.
  struct Piece {
    int64_t b0, nb, h0, nh;
  };
  std::vector<Piece> pieces;
  for (int64_t u = heads.begin; u < heads.end;) {
    const int64_t b = u / hq, h = u % hq;
    if (h == 0 && heads.end - u >= hq) {
      const int64_t nb = (heads.end - u) / hq;
      pieces.push_back({b, nb, 0, hq});
      u += nb * hq;
      continue;
    }
    const int64_t batch_end = (b + 1) * hq;
    int64_t end = std::min(heads.end, batch_end);
    const int64_t group_end = (h / group + 1) * group + b * hq;
    if (h % group != 0) {
      end = std::min(end, group_end);  // the rest of a partial group
    } else {
      end = u + (end - u) / group * group;  // whole groups
      if (end == u) end = std::min(heads.end, group_end);
    }
    pieces.push_back({b, 1, h, end - u});
    u = end;
  }

  ShardScope scope(this);
  // float32 inputs: the float32 version, unless allow_tf32 (above) and its
  // scratch would be large; then the fastest flash rung.
  std::string variant = s.options.variant;
  if (variant.empty() && in_t == DType::kFloat32 &&
      (exact_fp32 || double(s.batch * s.heads_q) * qn * std::max<int64_t>(skv, 1) * 4 <=
                         double(kMaxFp32ScoreBytes))) {
    variant = "reference";
  }
  const size_t q_row = size_t(qn * d) * es, kv_row = size_t(skv * d) * es;
  // O in another dtype than the inputs': the kernels write fp32 (into the
  // result when it is fp32 and lives here), converted on the device after.
  const bool o_f32 = out_t != in_t;
  const size_t o_es = o_f32 ? 4 : es;
  std::vector<std::string> ran;  // the versions that ran, in piece order
  for (const Piece& p : pieces) {
    if (skv <= 0) {  // no query row sees a key: zeros, and -inf LSE
      const std::string zeros(size_t(qn * d) * eo, '\0');
      const std::vector<float> ninf(size_t(qn), -std::numeric_limits<float>::infinity());
      for (int64_t b = p.b0; b < p.b0 + p.nb; ++b)
        for (int64_t h = p.h0; h < p.h0 + p.nh; ++h) {
          const int64_t row0 = (b * hq + h) * s.seq_q + q_rows.begin;
          RETURN_IF_ERROR(
              scope.WriteOut(o_out, row0 * d * int64_t(eo), 0, zeros.data(), 1, zeros.size()));
          if (lse_out) {
            RETURN_IF_ERROR(scope.WriteOut(lse_out, row0 * 4, 0, ninf.data(), 1, ninf.size() * 4));
          }
        }
      continue;
    }
    const int64_t nkv = p.nh < group ? 1 : p.nh / group;
    const int64_t kv0 = p.h0 / group;
    k::AttentionArgs args;
    args.batch = p.nb;
    args.heads_q = p.nh;
    args.heads_kv = nkv;
    args.seq_q = qn;
    args.seq_kv = skv;
    args.head_dim = d;
    args.dtype = ToKernel(in_t);
    args.causal = s.causal;
    args.scale = float(s.scale);
    // Q rows of each head; K and V: the first skv keys of each kv head. The
    // whole tensors in place when the piece is all of them and they live
    // here.
    const bool all_q = p.nb == s.batch && p.nh == hq && qn == s.seq_q;
    const bool all_kv = p.nb == s.batch && nkv == s.heads_kv && skv == s.seq_kv;
    const size_t q_bytes = size_t(p.nb * p.nh) * q_row;
    const size_t kv_bytes = size_t(p.nb * nkv) * kv_row;
    if (all_q) {
      ASSIGN_OR_RETURN(args.q, scope.Input(s.q, 0, 1, q_bytes, 0));
    } else {
      ASSIGN_OR_RETURN(void* q, scope.Alloc(q_bytes));
      for (int64_t b = p.b0; b < p.b0 + p.nb; ++b) {
        RETURN_IF_ERROR(scope.CopyIn(Ptr(q, (b - p.b0) * p.nh * int64_t(q_row)), s.q,
                                     ((b * hq + p.h0) * s.seq_q + q_rows.begin) * d * int64_t(es),
                                     size_t(p.nh), q_row, size_t(s.seq_q * d) * es));
      }
      args.q = q;
    }
    if (all_kv) {
      ASSIGN_OR_RETURN(args.k, scope.Input(s.k, 0, 1, kv_bytes, 0));
      ASSIGN_OR_RETURN(args.v, scope.Input(s.v, 0, 1, kv_bytes, 0));
    } else {
      ASSIGN_OR_RETURN(void* kk, scope.Alloc(kv_bytes));
      ASSIGN_OR_RETURN(void* v, scope.Alloc(kv_bytes));
      for (int64_t b = p.b0; b < p.b0 + p.nb; ++b) {
        const int64_t kv_off = (b * s.heads_kv + kv0) * s.seq_kv * d * int64_t(es);
        const int64_t dst = (b - p.b0) * nkv * int64_t(kv_row);
        RETURN_IF_ERROR(scope.CopyIn(Ptr(kk, dst), s.k, kv_off, size_t(nkv), kv_row,
                                     size_t(s.seq_kv * d) * es));
        RETURN_IF_ERROR(
            scope.CopyIn(Ptr(v, dst), s.v, kv_off, size_t(nkv), kv_row, size_t(s.seq_kv * d) * es));
      }
      args.k = kk;
      args.v = v;
    }
    // O (and the LSE) straight into the result when the piece is all of it,
    // it lives here and the kernel writes its dtype.
    args.out_f32 = o_f32;
    const bool o_direct = !o_f32 || out_t == DType::kFloat32;
    void* o_in_place = all_q && o_direct ? scope.InPlace(o_out, 0) : nullptr;
    if (o_in_place != nullptr) {
      args.o = o_in_place;
    } else {
      ASSIGN_OR_RETURN(args.o, scope.Alloc(size_t(p.nb * p.nh * qn * d) * o_es));
    }
    float* lse_in_place = nullptr;
    if (lse_out) {
      lse_in_place = all_q ? static_cast<float*>(scope.InPlace(lse_out, 0)) : nullptr;
      if (lse_in_place != nullptr) {
        args.lse = lse_in_place;
      } else {
        ASSIGN_OR_RETURN(void* l, scope.Alloc(size_t(p.nb * p.nh * qn) * 4));
        args.lse = static_cast<float*>(l);
      }
    }
    k::Support support = k::CanImplementAttention(args, variant);
    if (!support) return Refused("attention", variant, support.reason);
    size_t ws_bytes = k::AttentionWorkspaceBytes(args, variant);
    void* ws = nullptr;
    if (ws_bytes) {
      ASSIGN_OR_RETURN(ws, scope.Workspace(ws_bytes));
    }
    const std::string name(k::AttentionVariantName(args, variant));
    if (ran.empty() || ran.back() != name) ran.push_back(name);
    RETURN_IF_ERROR(scope.BeginKernels());
    RETURN_IF_ERROR(scope.EndKernels(k::LaunchAttention(args, variant, ws, scope.stream()),
                                     "attention launch"));
    const size_t o_row = size_t(qn * d) * o_es;  // one head's rows as the kernel wrote them
    for (int64_t b = p.b0; b < p.b0 + p.nb; ++b) {
      const int64_t i = b - p.b0;
      const int64_t row0 = (b * hq + p.h0) * s.seq_q + q_rows.begin;
      const void* o_src = Ptr(args.o, i * p.nh * int64_t(o_row));
      if (o_in_place == nullptr && o_direct) {
        RETURN_IF_ERROR(scope.CopyOut(o_out, row0 * d * int64_t(eo), size_t(s.seq_q * d) * eo,
                                      o_src, size_t(p.nh), o_row));
      } else if (o_in_place == nullptr) {
        RETURN_IF_ERROR(ConvertOut(scope, o_src, DType::kFloat32, out_t, p.nh * qn * d, o_out,
                                   row0 * d * int64_t(eo), size_t(p.nh), size_t(s.seq_q * d) * eo));
      }
      if (lse_out && lse_in_place == nullptr) {
        RETURN_IF_ERROR(scope.CopyOut(lse_out, row0 * 4, size_t(s.seq_q) * 4,
                                      args.lse + i * p.nh * qn, size_t(p.nh), size_t(qn) * 4));
      }
    }
    RETURN_IF_ERROR(scope.AddKernelTime());
  }
  if (ran.empty()) return scope.Run(variant.empty() ? "no_keys" : variant);
  return scope.Run(absl::StrJoin(ran, "+"));
}

}  // namespace gpucompute::cuda
