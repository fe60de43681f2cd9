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
#include "gpucompute/kernels/gemm.h"
#include "gpucompute/kernels/gemv.h"
#include "gpucompute/kernels/reduce.h"
#include "gpucompute/kernels/transpose.h"
#include "server/common/status_macros.h"
#include "server/device/cuda/cuda_util.h"
#include "server/device/cuda/shard_scope.h"

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
// - host <-> device staging through a lane's pinned buffers, one memcpy
//   thread per shard: 8.2 GB/s for 1 GiB;
// - device memory: 4530 GB/s for a 2^28 fp32 reduce (reduce.md);
// - tensor cores (fp16/bf16 GEMM and flash attention): 770 TFLOP/s for a
//   16384^3 bf16 GEMM;
// - CUDA cores (fp32, and the memory-bound operations' arithmetic): 47 TFLOP/s
//   for fp32 GEMM (gemm_simt.md).
// Calibration replaces the memory and tensor-core rates where it runs.
constexpr double kShardFixedSeconds = 150e-6;
constexpr double kStagingBytesPerSecond = 8e9;
constexpr double kMemoryBytesPerSecond = 4000e9;
constexpr double kTensorCoreFlopsPerSecond = 700e12;
constexpr double kCudaCoreFlopsPerSecond = 50e12;

// Largest score matrix the fp32 attention path materialises (see Attention).
constexpr int64_t kMaxFp32ScoreBytes = int64_t{2} << 30;

const char* Ptr(const void* p, int64_t byte_offset) {
  return static_cast<const char*>(p) + byte_offset;
}
char* Ptr(void* p, int64_t byte_offset) { return static_cast<char*>(p) + byte_offset; }

// Names of a ladder, fastest first (the kernels list them slowest first).
std::vector<std::string> FastestFirst(const std::vector<std::string>& ladder) {
  return {ladder.rbegin(), ladder.rend()};
}

// Host rows of one dtype converted into another (for output dtypes that a
// kernel cannot write directly).
std::string ConvertHost(DType from, const void* src, DType to, int64_t n) {
  std::vector<float> tmp(n);
  ToFloat(from, src, tmp.data(), n);
  std::string out(size_t(n) * DTypeSize(to), '\0');
  FromFloat(to, tmp.data(), out.data(), n);
  return out;
}

// out[0, n) = beta * src[offset, offset + n) in `out_t`, or zeros when there
// is no source or beta is 0 (the result of a product over an empty K).
void ScaleRowsOnHost(const TensorView* src, DType src_t, int64_t offset, double beta, DType out_t,
                     void* out, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n), 0.f);
  if (src != nullptr && beta != 0) {
    ToFloat(src_t, Ptr(src->data, offset * int64_t(DTypeSize(src_t))), v.data(), n);
    for (float& x : v) x = float(beta * x);
  }
  FromFloat(out_t, v.data(), out, n);
}

// The error for arguments the kernels refuse: it names options.variant when a
// variant was asked for by name (that choice is what the client can change).
absl::Status Refused(absl::string_view op, absl::string_view variant, absl::string_view reason) {
  if (variant.empty()) return absl::InvalidArgumentError(absl::StrCat(op, ": ", reason));
  return absl::InvalidArgumentError(
      absl::StrCat("options.variant: '", variant, "' cannot run this ", op, ": ", reason));
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
  d->description_.memory_bytes = int64_t(prop.totalGlobalMem);
  d->description_.compute_units = prop.multiProcessorCount;
  d->description_.weight = weight;

  RETURN_IF_ERROR(CudaStatus(cudaDeviceGetDefaultMemPool(&d->pool_, ordinal), "memory pool"));
  uint64_t threshold = options.pool_release_threshold_bytes;
  RETURN_IF_ERROR(
      CudaStatus(cudaMemPoolSetAttribute(d->pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
                 "memory pool release threshold"));

  for (int i = 0; i < std::max(1, options.lanes); ++i) {
    ASSIGN_OR_RETURN(auto lane,
                     Lane::Create(ordinal, options.staging_chunk_bytes, options.staging_buffers));
    d->lanes_.push_back(std::move(lane));
  }
  absl::MutexLock lock(&d->mu_);
  for (auto& lane : d->lanes_) d->free_lanes_.push_back(lane.get());
  return d;
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
      return FastestFirst(k::TransposeVariants());
    case OpKind::kAttention:
      return FastestFirst(k::AttentionVariants());
  }
  return {};
}

absl::StatusOr<ShardRun> CudaDevice::Gemm(const GemmSpec& s, Range rows, void* c_out) {
  const int64_t mr = rows.size();
  if (mr <= 0 || s.n == 0 || s.batch == 0) return ShardRun{};
  if (s.k == 0) {  // an empty product: C = beta * C (the kernels need K >= 1)
    for (int64_t i = 0; i < s.batch; ++i) {
      const int64_t c_batch = s.c_batched ? i : 0;
      ScaleRowsOnHost(
          s.c ? &*s.c : nullptr, s.dtype, (c_batch * s.m + rows.begin) * s.n, s.beta,
          s.options.output_dtype,
          Ptr(c_out, (i * s.m + rows.begin) * s.n * int64_t(DTypeSize(s.options.output_dtype))),
          mr * s.n);
    }
    return ShardRun{};
  }
  ShardScope scope(this);
  const size_t es = DTypeSize(s.dtype);
  const DType out_t = s.options.output_dtype;
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
  args.stride_c = mr * s.n;
  args.ab_type = ToKernel(s.dtype);
  args.c_type = ToKernel(out_t);
  args.alpha = float(s.alpha);
  args.beta = float(s.beta);
  args.allow_tf32 = s.options.allow_tf32;

  // The kernel writes C in out_t, or in fp32 converted here when it cannot.
  ASSIGN_OR_RETURN(void* a, scope.Alloc(size_t(batch_a * mr * s.k) * es));
  ASSIGN_OR_RETURN(void* b, scope.Alloc(size_t(batch_b * s.k * s.n) * es));
  ASSIGN_OR_RETURN(void* c, scope.Alloc(size_t(s.batch * mr * s.n) * 4));
  args.a = a;
  args.b = b;
  args.c = c;
  const std::string& variant = s.options.variant;
  k::Support support = k::CanImplementGemm(args, variant);
  if (!support && out_t != DType::kFloat32) {
    args.c_type = k::DType::kF32;
    support = k::CanImplementGemm(args, variant);
  }
  if (!support) return Refused("gemm", variant, support.reason);
  const DType c_t = FromKernel(args.c_type);
  const size_t ec = DTypeSize(c_t);

  if (s.trans_a) {  // A is [batch_a][K][M]: columns rows.begin.. of every row.
    RETURN_IF_ERROR(scope.Upload(a, Ptr(s.a.data, rows.begin * es), size_t(batch_a * s.k),
                                 size_t(mr) * es, size_t(s.m) * es));
  } else {
    RETURN_IF_ERROR(scope.Upload(a, Ptr(s.a.data, rows.begin * s.k * es), size_t(batch_a),
                                 size_t(mr * s.k) * es, size_t(s.m * s.k) * es));
  }
  RETURN_IF_ERROR(scope.Upload(b, s.b.data, 1, size_t(batch_b * s.k * s.n) * es, 0));
  if (s.beta != 0 && s.c.has_value()) {
    const int64_t batch_c = s.c_batched ? s.batch : 1;
    std::string converted;
    const void* c_src = s.c->data;
    if (c_t != s.dtype) {
      converted = ConvertHost(s.dtype, s.c->data, c_t, batch_c * s.m * s.n);
      c_src = converted.data();
    }
    for (int64_t i = 0; i < s.batch; ++i) {
      const int64_t src_batch = s.c_batched ? i : 0;
      RETURN_IF_ERROR(scope.Upload(Ptr(c, i * mr * s.n * ec),
                                   Ptr(c_src, (src_batch * s.m + rows.begin) * s.n * ec), 1,
                                   size_t(mr * s.n) * ec, 0));
    }
  }
  size_t ws_bytes = k::GemmWorkspaceBytes(args, variant);
  void* ws = nullptr;
  if (ws_bytes) {
    ASSIGN_OR_RETURN(ws, scope.Alloc(ws_bytes));
  }
  RETURN_IF_ERROR(scope.BeginKernels());
  RETURN_IF_ERROR(
      scope.EndKernels(k::LaunchGemm(args, variant, ws, scope.stream()), "gemm launch"));
  const size_t eo = DTypeSize(out_t);
  if (c_t == out_t) {
    RETURN_IF_ERROR(scope.Download(Ptr(c_out, rows.begin * s.n * eo), size_t(s.m * s.n) * eo, c,
                                   size_t(s.batch), size_t(mr * s.n) * eo));
  } else {
    std::vector<float> tmp(size_t(s.batch * mr * s.n));
    RETURN_IF_ERROR(scope.Download(tmp.data(), 0, c, 1, tmp.size() * 4));
    for (int64_t i = 0; i < s.batch; ++i)
      FromFloat(out_t, tmp.data() + i * mr * s.n, Ptr(c_out, (i * s.m + rows.begin) * s.n * eo),
                mr * s.n);
  }
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(variant);
}

absl::StatusOr<ShardRun> CudaDevice::Gemv(const GemvSpec& s, Range rows, void* y_out) {
  const int64_t mr = rows.size();
  if (mr <= 0) return ShardRun{};
  if (s.k == 0) {  // an empty product: y = beta * y (the kernels need K >= 1)
    const DType out_t = s.options.output_dtype;
    ScaleRowsOnHost(s.y ? &*s.y : nullptr, s.dtype, rows.begin * s.ncols, s.beta, out_t,
                    Ptr(y_out, rows.begin * s.ncols * int64_t(DTypeSize(out_t))), mr * s.ncols);
    return ShardRun{};
  }
  ShardScope scope(this);
  const size_t es = DTypeSize(s.dtype);
  const DType out_t = s.options.output_dtype;

  k::GemvArgs args;
  args.m = mr;
  args.k = s.k;
  args.trans_a = s.trans_a;
  args.lda = s.trans_a ? mr : s.k;
  args.ncols = int(s.ncols);
  args.dtype = ToKernel(s.dtype);
  args.y_type = ToKernel(out_t);
  args.alpha = float(s.alpha);
  args.beta = float(s.beta);
  ASSIGN_OR_RETURN(void* a, scope.Alloc(size_t(mr * s.k) * es));
  ASSIGN_OR_RETURN(void* x, scope.Alloc(size_t(s.k * s.ncols) * es));
  ASSIGN_OR_RETURN(void* y, scope.Alloc(size_t(mr * s.ncols) * 4));
  args.a = a;
  args.x = x;
  args.y = y;
  const std::string& variant = s.options.variant;
  k::Support support = k::CanImplementGemv(args, variant);
  if (!support && out_t != DType::kFloat32) {
    args.y_type = k::DType::kF32;
    support = k::CanImplementGemv(args, variant);
  }
  if (!support) return Refused("gemv", variant, support.reason);
  const DType y_t = FromKernel(args.y_type);
  const size_t ey = DTypeSize(y_t);

  if (s.trans_a) {
    RETURN_IF_ERROR(scope.Upload(a, Ptr(s.a.data, rows.begin * es), size_t(s.k), size_t(mr) * es,
                                 size_t(s.m) * es));
  } else {
    RETURN_IF_ERROR(
        scope.Upload(a, Ptr(s.a.data, rows.begin * s.k * es), 1, size_t(mr * s.k) * es, 0));
  }
  RETURN_IF_ERROR(scope.Upload(x, s.x.data, 1, size_t(s.k * s.ncols) * es, 0));
  if (s.beta != 0 && s.y.has_value()) {
    std::string converted;
    const void* y_src = Ptr(s.y->data, rows.begin * s.ncols * es);
    if (y_t != s.dtype) {
      converted = ConvertHost(s.dtype, y_src, y_t, mr * s.ncols);
      y_src = converted.data();
    }
    RETURN_IF_ERROR(scope.Upload(y, y_src, 1, size_t(mr * s.ncols) * ey, 0));
  }
  size_t ws_bytes = k::GemvWorkspaceBytes(args, variant);
  void* ws = nullptr;
  if (ws_bytes) {
    ASSIGN_OR_RETURN(ws, scope.Alloc(ws_bytes));
  }
  RETURN_IF_ERROR(scope.BeginKernels());
  RETURN_IF_ERROR(
      scope.EndKernels(k::LaunchGemv(args, variant, ws, scope.stream()), "gemv launch"));
  const size_t eo = DTypeSize(out_t);
  void* dst = Ptr(y_out, rows.begin * s.ncols * eo);
  if (y_t == out_t) {
    RETURN_IF_ERROR(scope.Download(dst, 0, y, 1, size_t(mr * s.ncols) * eo));
  } else {
    std::vector<float> tmp(size_t(mr * s.ncols));
    RETURN_IF_ERROR(scope.Download(tmp.data(), 0, y, 1, tmp.size() * 4));
    FromFloat(out_t, tmp.data(), dst, mr * s.ncols);
  }
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(variant);
}

absl::StatusOr<ShardRun> CudaDevice::Reduce(const ReduceSpec& s, Range outer, Range axis,
                                            bool partial, void* out) {
  const int64_t no = outer.size(), na = axis.size();
  if (no <= 0 || s.inner == 0) return ShardRun{};
  const DType out_t = partial ? DType::kFloat32 : s.options.output_dtype;
  const size_t es = DTypeSize(s.input.dtype), eo = DTypeSize(out_t);
  const int64_t n_out = no * s.inner;
  if (na == 0) {  // An empty reduction: the identity (numpy: mean of nothing is NaN).
    std::vector<float> fill(size_t(n_out), (s.kind == ReduceKind::kMean && !partial)
                                               ? std::numeric_limits<float>::quiet_NaN()
                                               : 0.f);
    FromFloat(out_t, fill.data(), partial ? out : Ptr(out, outer.begin * s.inner * eo), n_out);
    return ShardRun{};
  }
  ShardScope scope(this);
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
  ASSIGN_OR_RETURN(void* in, scope.Alloc(size_t(no * na * s.inner) * es));
  ASSIGN_OR_RETURN(void* o, scope.Alloc(size_t(n_out) * eo));
  args.in = in;
  args.out = o;
  const std::string& variant = s.options.variant;
  k::Support support = k::CanImplementReduce(args, variant);
  if (!support) return Refused("reduce", variant, support.reason);
  RETURN_IF_ERROR(
      scope.Upload(in, Ptr(s.input.data, (outer.begin * s.axis_len + axis.begin) * s.inner * es),
                   size_t(no), size_t(na * s.inner) * es, size_t(s.axis_len * s.inner) * es));
  size_t ws_bytes = k::ReduceWorkspaceBytes(args, variant);
  void* ws = nullptr;
  if (ws_bytes) {
    ASSIGN_OR_RETURN(ws, scope.Alloc(ws_bytes));
    RETURN_IF_ERROR(scope.Check(cudaMemsetAsync(ws, 0, ws_bytes, scope.stream()), "memset"));
  }
  RETURN_IF_ERROR(scope.BeginKernels());
  RETURN_IF_ERROR(
      scope.EndKernels(k::LaunchReduce(args, variant, ws, scope.stream()), "reduce launch"));
  RETURN_IF_ERROR(scope.Download(partial ? out : Ptr(out, outer.begin * s.inner * eo), 0, o, 1,
                                 size_t(n_out) * eo));
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(variant);
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
  ASSIGN_OR_RETURN(void* in, scope.Alloc(size_t(no * na * s.inner) * es));
  // Device partials as [outer][chunk][inner]; the caller wants [chunk][outer][inner].
  ASSIGN_OR_RETURN(void* part, scope.Alloc(size_t(no * chunks * s.inner) * 4));
  RETURN_IF_ERROR(
      scope.Upload(in, Ptr(s.input.data, (outer.begin * s.axis_len + axis.begin) * s.inner * es),
                   size_t(no), size_t(na * s.inner) * es, size_t(s.axis_len * s.inner) * es));
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
    ASSIGN_OR_RETURN(ws, scope.Alloc(ws_bytes));
    RETURN_IF_ERROR(scope.Check(cudaMemsetAsync(ws, 0, ws_bytes, scope.stream()), "memset"));
  }
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
  return scope.Run(variant);
}

absl::StatusOr<ShardRun> CudaDevice::Transpose(const TransposeSpec& s, int prefix_axes,
                                               Range prefix, void* out) {
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
  const void* src = s.input.data;
  size_t up_rows = 1, up_row_bytes = s.input.num_bytes(), up_pitch = 0;
  int64_t out_offset_units = 0;  // where the device output starts, in prefix units
  int64_t device_units = 1;      // prefix units the device computes
  if (prefix_axes == 1) {
    // Output rows [begin, end) read only that range of input axis perm[0].
    const int a = s.perm[0];
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < a; ++i) outer *= s.in_shape[i];
    for (int i = a + 1; i < s.rank; ++i) inner *= s.in_shape[i];
    args.shape[a] = prefix.size();
    src = Ptr(s.input.data, prefix.begin * inner * es);
    up_rows = size_t(outer);
    up_row_bytes = size_t(prefix.size() * inner) * es;
    up_pitch = size_t(s.in_shape[a] * inner) * es;
    out_offset_units = 0;
    device_units = prefix.size();
  } else {
    // Several leading axes flattened: the device permutes the whole tensor
    // and returns its part of the output.
    device_units = 1;
    for (int i = 0; i < prefix_axes; ++i) device_units *= s.out_shape[i];
    out_offset_units = prefix.begin;
  }
  const size_t in_bytes = up_rows * up_row_bytes;
  ASSIGN_OR_RETURN(void* in, scope.Alloc(in_bytes));
  ASSIGN_OR_RETURN(void* o, scope.Alloc(size_t(device_units * out_inner) * es));
  args.in = in;
  args.out = o;
  const std::string& variant = s.options.variant;
  k::Support support = k::CanImplementPermute(args, variant);
  if (!support) return Refused("transpose", variant, support.reason);
  RETURN_IF_ERROR(scope.Upload(in, src, up_rows, up_row_bytes, up_pitch));
  RETURN_IF_ERROR(scope.BeginKernels());
  RETURN_IF_ERROR(
      scope.EndKernels(k::LaunchPermute(args, variant, scope.stream()), "transpose launch"));
  const int64_t n_out = prefix.size() * out_inner;
  const void* o_part = Ptr(o, out_offset_units * out_inner * es);
  void* dst = Ptr(out, prefix.begin * out_inner * eo);
  if (in_t == out_t) {
    RETURN_IF_ERROR(scope.Download(dst, 0, o_part, 1, size_t(n_out) * eo));
  } else {
    std::string tmp(size_t(n_out) * es, '\0');
    RETURN_IF_ERROR(scope.Download(tmp.data(), 0, o_part, 1, tmp.size()));
    std::vector<float> f(static_cast<size_t>(n_out));
    ToFloat(in_t, tmp.data(), f.data(), n_out);
    FromFloat(out_t, f.data(), dst, n_out);
  }
  RETURN_IF_ERROR(scope.AddKernelTime());
  return scope.Run(variant);
}

absl::StatusOr<ShardRun> CudaDevice::Attention(const AttentionSpec& s, Range heads, Range q_rows,
                                               void* o_out, float* lse_out) {
  const int64_t qn = q_rows.size();
  if (heads.size() <= 0 || qn <= 0) return ShardRun{};
  const int64_t hq = s.heads_q, group = s.heads_q / s.heads_kv, d = s.head_dim;
  const DType in_t = s.dtype, out_t = s.options.output_dtype;
  const size_t es = DTypeSize(in_t), eo = DTypeSize(out_t);
  // Keys any of these query rows can see (bottom-right causal alignment).
  const int64_t skv = s.causal ? std::min(s.seq_kv, q_rows.end + s.seq_kv - s.seq_q) : s.seq_kv;

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

  auto write_empty_rows = [&](const Piece& p) {
    for (int64_t b = p.b0; b < p.b0 + p.nb; ++b)
      for (int64_t h = p.h0; h < p.h0 + p.nh; ++h) {
        const int64_t row0 = (b * hq + h) * s.seq_q + q_rows.begin;
        std::memset(Ptr(o_out, row0 * d * eo), 0, size_t(qn * d) * eo);
        if (lse_out)
          std::fill(lse_out + row0, lse_out + row0 + qn, -std::numeric_limits<float>::infinity());
      }
  };

  ShardScope scope(this);
  // The flash kernels round fp32 inputs to bf16 on load; fp32 requests get
  // the fp32 reference version unless they name one, while its scratch (the
  // whole score matrix of a piece) stays modest.
  std::string variant = s.options.variant;
  if (variant.empty() && in_t == DType::kFloat32 &&
      double(s.batch * s.heads_q) * qn * std::max<int64_t>(skv, 1) * 4 <=
          double(kMaxFp32ScoreBytes)) {
    variant = "reference";
  }
  for (const Piece& p : pieces) {
    if (skv <= 0) {
      write_empty_rows(p);
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
    const size_t q_bytes = size_t(p.nb * p.nh * qn * d) * es;
    const size_t kv_bytes = size_t(p.nb * nkv * skv * d) * es;
    ASSIGN_OR_RETURN(void* q, scope.Alloc(q_bytes));
    ASSIGN_OR_RETURN(void* kk, scope.Alloc(kv_bytes));
    ASSIGN_OR_RETURN(void* v, scope.Alloc(kv_bytes));
    ASSIGN_OR_RETURN(void* o, scope.Alloc(size_t(p.nb * p.nh * qn * d) * es));
    float* lse = nullptr;
    if (lse_out) {
      ASSIGN_OR_RETURN(void* l, scope.Alloc(size_t(p.nb * p.nh * qn) * 4));
      lse = static_cast<float*>(l);
    }
    args.q = q;
    args.k = kk;
    args.v = v;
    args.o = o;
    args.lse = lse;
    k::Support support = k::CanImplementAttention(args, variant);
    if (!support) return Refused("attention", variant, support.reason);
    // Q rows of each head; K and V: the first skv keys of each kv head.
    const size_t q_row = size_t(qn * d) * es, kv_row = size_t(skv * d) * es;
    for (int64_t b = p.b0; b < p.b0 + p.nb; ++b) {
      const int64_t i = b - p.b0;
      RETURN_IF_ERROR(
          scope.Upload(Ptr(q, i * p.nh * qn * d * es),
                       Ptr(s.q.data, ((b * hq + p.h0) * s.seq_q + q_rows.begin) * d * es),
                       size_t(p.nh), q_row, size_t(s.seq_q * d) * es));
      const int64_t kv_off = (b * s.heads_kv + kv0) * s.seq_kv * d * es;
      RETURN_IF_ERROR(scope.Upload(Ptr(kk, i * nkv * skv * d * es), Ptr(s.k.data, kv_off),
                                   size_t(nkv), kv_row, size_t(s.seq_kv * d) * es));
      RETURN_IF_ERROR(scope.Upload(Ptr(v, i * nkv * skv * d * es), Ptr(s.v.data, kv_off),
                                   size_t(nkv), kv_row, size_t(s.seq_kv * d) * es));
    }
    size_t ws_bytes = k::AttentionWorkspaceBytes(args, variant);
    void* ws = nullptr;
    if (ws_bytes) {
      ASSIGN_OR_RETURN(ws, scope.Alloc(ws_bytes));
    }
    RETURN_IF_ERROR(scope.BeginKernels());
    RETURN_IF_ERROR(scope.EndKernels(k::LaunchAttention(args, variant, ws, scope.stream()),
                                     "attention launch"));
    for (int64_t b = p.b0; b < p.b0 + p.nb; ++b) {
      const int64_t i = b - p.b0;
      const int64_t row0 = (b * hq + p.h0) * s.seq_q + q_rows.begin;
      const void* o_src = Ptr(o, i * p.nh * qn * d * es);
      if (in_t == out_t) {
        RETURN_IF_ERROR(scope.Download(Ptr(o_out, row0 * d * eo), size_t(s.seq_q * d) * eo, o_src,
                                       size_t(p.nh), q_row));
      } else {
        std::string tmp(size_t(p.nh) * q_row, '\0');
        RETURN_IF_ERROR(scope.Download(tmp.data(), 0, o_src, 1, tmp.size()));
        for (int64_t h = 0; h < p.nh; ++h) {
          std::string conv = ConvertHost(in_t, tmp.data() + h * q_row, out_t, qn * d);
          std::memcpy(Ptr(o_out, (row0 + h * s.seq_q) * d * eo), conv.data(), conv.size());
        }
      }
      if (lse_out) {
        RETURN_IF_ERROR(scope.Download(lse_out + row0, size_t(s.seq_q) * 4, lse + i * p.nh * qn,
                                       size_t(p.nh), size_t(qn) * 4));
      }
    }
    RETURN_IF_ERROR(scope.AddKernelTime());
  }
  return scope.Run(variant);
}

}  // namespace gpucompute::cuda
