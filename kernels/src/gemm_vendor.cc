// GEMM's vendor fallbacks, for the shape classes where our ladders still lose
// (heuristics/gemm_heuristics.h), both with fp32 accumulation (exact fp32,
// tf32 when allow_tf32, bf16/fp16 inputs) and named as such in the shard
// timings and the kernel metrics:
//   "cublaslt"  cublasLtMatmul (below);
//   "cublas"    cublasGemmStridedBatchedEx, the call torch.matmul makes (at
//               the end of this file), on the caller's stream and workspace
//               through a handle of cublas_handles.h.
//
// Row-major C[m, n] = op(A) op(B) is the column-major C^T[n, m] =
// op(B)^T op(A)^T, so B is cuBLASLt's first operand and A its second, each
// described as stored (a row-major [r, c] matrix with leading dimension ld is
// a column-major [c, r] one with the same ld).
//
// A plan (descriptors and the algorithm cuBLASLt's heuristic ranks first for
// the maximum workspace) is made once per problem (sizes, strides, types,
// transposes, pointer alignments, device) and cached: a request pays for a
// cache lookup, not for the heuristic query. Handles: one per device, shared
// by every thread (a cuBLASLt handle holds no stream or workspace).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>

#include "cublas_handles.h"
#include "gemm_addend.h"
#include "gpucompute/kernels/gemm.h"

namespace gpucompute::kernels {
namespace {

// cuBLASLt's recommended workspace on Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Plans kept; past this the cache starts over (a bound on host memory for
// servers that see endless distinct shapes).
constexpr size_t kMaxPlans = 4096;

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

// fp32 accumulation; tf32 inputs where fp32 ones may run on the tensor cores.
bool Tf32(const GemmArgs& a) { return a.ab_type == DType::kF32 && a.allow_tf32; }
cublasComputeType_t ComputeType(bool tf32) {
  return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// Largest power of two up to 256 that divides the address of every batch
// entry: the base and, with more than one entry, the stride in bytes.
uint32_t Alignment(const void* p, int64_t batch, int64_t stride_bytes) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) v |= static_cast<uintptr_t>(stride_bytes);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// One batched problem as cuBLASLt sees it (every field but the pointers).
struct Key {
  int device = 0;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_c_in = 0;
  int ab = 0, c = 0;
  bool trans_a = false, trans_b = false, tf32 = false;
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_c_in = 0;
  size_t workspace = 0;

  auto Tie() const {
    return std::tie(device, m, n, k, batch, lda, ldb, ldc, stride_a, stride_b, stride_c,
                    stride_c_in, ab, c, trans_a, trans_b, tf32, align_a, align_b, align_c,
                    align_c_in, workspace);
  }
  bool operator<(const Key& o) const { return Tie() < o.Tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t x = nullptr, y = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (y) cublasLtMatrixLayoutDestroy(y);
    if (x) cublasLtMatrixLayoutDestroy(x);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

cudaError_t ToCuda(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return cudaSuccess;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return cudaErrorInitializationError;
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return cudaErrorLaunchFailure;
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return cudaErrorNotSupported;
    default:
      return cudaErrorInvalidValue;
  }
}

// The current device's handle, created on first use; null when cuBLASLt
// cannot start there.
cublasLtHandle_t Handle(int device) {
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) h = nullptr;
  handles[device] = h;  // a failure is remembered too
  return h;
}

template <typename T>
bool SetLayout(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, T value) {
  return cublasLtMatrixLayoutSetAttribute(layout, attr, &value, sizeof(value)) ==
         CUBLAS_STATUS_SUCCESS;
}

bool MakeLayout(cublasLtMatrixLayout_t* layout, DType t, int64_t rows, int64_t cols, int64_t ld,
                int64_t batch, int64_t stride) {
  if (cublasLtMatrixLayoutCreate(layout, CudaType(t), uint64_t(rows), uint64_t(cols), ld) !=
      CUBLAS_STATUS_SUCCESS)
    return false;
  if (batch <= 1) return true;
  return SetLayout(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(batch)) &&
         SetLayout(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t(stride));
}

// Builds the plan of `key`; plan->ok is false when cuBLASLt offers no
// algorithm for it.
void Build(const Key& key, cublasLtHandle_t handle, Plan* plan) {
  const DType ab = static_cast<DType>(key.ab), ct = static_cast<DType>(key.c);
  if (cublasLtMatmulDescCreate(&plan->op, ComputeType(key.tf32), CUDA_R_32F) !=
      CUBLAS_STATUS_SUCCESS)
    return;
  // cuBLASLt's first operand is B, its second A (see the file comment).
  const cublasOperation_t op_x = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_y = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof(op_x)) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof(op_y)) !=
          CUBLAS_STATUS_SUCCESS)
    return;
  // Stored B: [k, n] row-major = column-major [n, k]; transposed: [k, n] cm.
  const bool x_ok = key.trans_b
                        ? MakeLayout(&plan->x, ab, key.k, key.n, key.ldb, key.batch, key.stride_b)
                        : MakeLayout(&plan->x, ab, key.n, key.k, key.ldb, key.batch, key.stride_b);
  const bool y_ok = key.trans_a
                        ? MakeLayout(&plan->y, ab, key.m, key.k, key.lda, key.batch, key.stride_a)
                        : MakeLayout(&plan->y, ab, key.k, key.m, key.lda, key.batch, key.stride_a);
  if (!x_ok || !y_ok ||
      !MakeLayout(&plan->c, ct, key.n, key.m, key.ldc, key.batch, key.stride_c_in) ||
      !MakeLayout(&plan->d, ct, key.n, key.m, key.ldc, key.batch, key.stride_c))
    return;
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return;
  const uint64_t ws = key.workspace;
  // cuBLASLt's first operand (its "A") is our B.
  const uint32_t align[4] = {key.align_b, key.align_a, key.align_c_in, key.align_c};
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  bool ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof(ws)) == CUBLAS_STATUS_SUCCESS;
  for (int i = 0; i < 4 && ok; ++i)
    ok = cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &align[i], sizeof(uint32_t)) ==
         CUBLAS_STATUS_SUCCESS;
  // Split-K partial sums kept and added in fp32, never rounded to a 16-bit
  // output type first ("in place" reductions accumulate in the output
  // type too): the result's accuracy must not depend on the algorithm the
  // heuristic picks.
  const uint32_t reductions = ct == DType::kF32 ? uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK)
                                                : uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &reductions,
                                                  sizeof(reductions)) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (ok &&
      cublasLtMatmulAlgoGetHeuristic(handle, plan->op, plan->x, plan->y, plan->c, plan->d, pref, 1,
                                     &result, &found) == CUBLAS_STATUS_SUCCESS &&
      found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->ok = true;
  }
  cublasLtMatmulPreferenceDestroy(pref);
}

// The cached plan of `key` (built on first use); null when cuBLASLt cannot
// run it.
std::shared_ptr<const Plan> Find(const Key& key) {
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Plan>>* plans =
      new std::map<Key, std::shared_ptr<const Plan>>();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans->find(key);
    if (it != plans->end()) return it->second->ok ? it->second : nullptr;
  }
  cublasLtHandle_t handle = Handle(key.device);
  if (handle == nullptr) return nullptr;
  auto plan = std::make_shared<Plan>();
  Build(key, handle, plan.get());
  std::lock_guard<std::mutex> lock(mu);
  if (plans->size() >= kMaxPlans) plans->clear();
  plans->emplace(key, plan);
  return plan->ok ? plan : nullptr;
}

// How one request runs: as one cuBLASLt call of `key`, `calls` times with
// the pointers advanced by the batch strides (an operand shared by the batch,
// stride 0, where cuBLASLt offers no algorithm for that stride).
struct Route {
  Key key;
  int64_t calls = 1;
};

Support CheckArgs(const GemmArgs& a) {
  const bool half = a.ab_type == DType::kBF16 || a.ab_type == DType::kF16;
  if (half) {
    if (a.c_type != a.ab_type && a.c_type != DType::kF32)
      return Support::No("C must have the input type or be fp32");
  } else if (a.c_type != DType::kF32) {
    return Support::No("fp32 inputs write fp32 C");
  }
  if (a.m < 1 || a.n < 1 || a.k < 1 || a.batch < 1)
    return Support::No("cublaslt needs m, n, k, batch >= 1");
  if (a.m > INT_MAX || a.n > INT_MAX || a.k > INT_MAX || a.batch > INT_MAX)
    return Support::No("a size exceeds 2^31 - 1");
  if (a.a == nullptr || a.b == nullptr || a.c == nullptr) return Support::No("null matrix pointer");
  if (a.lda < (a.trans_a ? a.m : a.k)) return Support::No("lda too small");
  if (a.ldb < (a.trans_b ? a.k : a.n)) return Support::No("ldb too small");
  if (a.ldc < a.n) return Support::No("ldc too small");
  if (a.stride_a < 0 || a.stride_b < 0 || a.stride_c < 0 || a.stride_c_in < 0)
    return Support::No("negative stride");
  if (a.batch > 1 && a.stride_c == 0)
    return Support::No("stride_c 0 with batch > 1 would write one C from several batch entries");
  return Support::Yes();
}

// The route of a request whose batch shares an operand (stride 0):
//   - B shared, N-major (NN), and A's and C's entries one after another:
//     the batch is more rows of one product (6*512x174x1057 bf16 22.5 us
//     against 43.5 for one batched call, 34*71x206x1180 f32 with beta 44.3
//     against 62.8, 2*313x442x904 tf32 15.6 against 22.3; folded NT ran
//     slower: 16*1075x256x526 bf16 49.6 against 41.0, 2*128x128x64 tf32 4.3
//     against 2.9; H100, sweep-gemm.md runs 21-24);
//   - else one batched call with the stride 0, as cublasGemmStridedBatchedEx
//     takes it (one call per entry ran 51*167x583x128 TN bf16 in 257 us
//     against 29, 4*273x214x254 TN tf32 in 22.4 against 8.5);
//   - with broadcast false, one call per entry (where cuBLASLt offers no
//     algorithm for the stride 0).
Route MakeRoute(const GemmArgs& a, bool with_workspace, bool broadcast = true) {
  Route r;
  Key& k = r.key;
  cudaGetDevice(&k.device);
  k.m = a.m;
  k.n = a.n;
  k.k = a.k;
  k.batch = a.batch;
  k.lda = a.lda;
  k.ldb = a.ldb;
  k.ldc = a.ldc;
  k.stride_a = a.stride_a;
  k.stride_b = a.stride_b;
  k.stride_c = a.stride_c;
  const void* c_in = a.c_in != nullptr ? a.c_in : a.c;
  k.stride_c_in = a.c_in != nullptr ? a.stride_c_in : a.stride_c;
  k.ab = static_cast<int>(a.ab_type);
  k.c = static_cast<int>(a.c_type);
  k.trans_a = a.trans_a;
  k.trans_b = a.trans_b;
  k.tf32 = Tf32(a);
  const int64_t es = static_cast<int64_t>(DTypeSize(a.ab_type));
  const int64_t ec = static_cast<int64_t>(DTypeSize(a.c_type));
  k.align_a = Alignment(a.a, a.batch, a.stride_a * es);
  k.align_b = Alignment(a.b, a.batch, a.stride_b * es);
  k.align_c = Alignment(a.c, a.batch, a.stride_c * ec);
  k.align_c_in = a.beta != 0 ? Alignment(c_in, a.batch, k.stride_c_in * ec) : k.align_c;
  k.workspace = with_workspace ? kWorkspaceBytes : 0;
  const bool shared =
      a.batch > 1 && (a.stride_a == 0 || a.stride_b == 0 || (a.beta != 0 && k.stride_c_in == 0));
  const bool fold = shared && a.stride_b == 0 && !a.trans_a && !a.trans_b &&
                    a.stride_a == a.m * a.lda && a.stride_c == a.m * a.ldc &&
                    (a.beta == 0 || k.stride_c_in == a.m * a.ldc) && a.m * a.batch <= INT_MAX;
  if (fold)
    k.m = a.m * a.batch;
  else if (shared && !broadcast)
    r.calls = a.batch;
  if (fold || r.calls > 1) {  // one product a call
    k.batch = 1;
    k.stride_a = k.stride_b = k.stride_c = k.stride_c_in = 0;
  }
  if (a.beta == 0) k.stride_c_in = k.stride_c;
  return r;
}

// MakeRoute's route of `a` and its plan; where cuBLASLt offers none for a
// stride 0, one call per batch entry; a null plan when it offers none at all.
std::shared_ptr<const Plan> FindRoute(const GemmArgs& a, bool with_workspace, Route* route) {
  *route = MakeRoute(a, with_workspace);
  std::shared_ptr<const Plan> plan = Find(route->key);
  if (plan != nullptr || route->key.batch <= 1) return plan;
  const Route per_entry = MakeRoute(a, with_workspace, /*broadcast=*/false);
  if (per_entry.calls <= 1) return nullptr;  // no shared operand: nothing else to try
  *route = per_entry;
  return Find(route->key);
}

// --- "cublas": cublasGemmStridedBatchedEx ------------------------------------

Support CheckCublasArgs(const GemmArgs& a) {
  if (Support s = CheckArgs(a); !s) return s;
  if (a.lda > INT_MAX || a.ldb > INT_MAX || a.ldc > INT_MAX)
    return Support::No("a leading dimension exceeds 2^31 - 1");
  return Support::Yes();
}

// The caller's workspace as cuBLAS takes it: from a 256-byte boundary.
cublasStatus_t SetCublasWorkspace(cublasHandle_t h, void* workspace) {
  if (workspace == nullptr) return cublasSetWorkspace(h, nullptr, 0);
  const uintptr_t p = reinterpret_cast<uintptr_t>(workspace);
  const uintptr_t aligned = (p + 255) & ~uintptr_t(255);
  return cublasSetWorkspace(h, reinterpret_cast<void*>(aligned), kWorkspaceBytes - (aligned - p));
}

// cublasGemmStridedBatchedEx writes C over its addend: an addend apart from C
// (c_in) is copied into C first, as one 2-D copy where the batch's entries
// lie one after another in both, else one per entry.
cudaError_t CopyAddendIntoC(const GemmArgs& a, cudaStream_t stream) {
  const GemmAddend add = ChooseGemmAddend(a);
  if (!add.apart || add.ptr == a.c) return cudaSuccess;
  const size_t ec = DTypeSize(a.c_type);
  const size_t pitch = size_t(a.ldc) * ec, row = size_t(a.n) * ec;
  const bool dense = a.batch == 1 || (a.stride_c == a.m * a.ldc && add.stride == a.stride_c);
  const int64_t copies = dense ? 1 : a.batch;
  const int64_t rows = dense ? a.m * a.batch : a.m;
  for (int64_t i = 0; i < copies; ++i) {
    char* dst = static_cast<char*>(a.c) + size_t(i * a.stride_c) * ec;
    const char* src = static_cast<const char*>(add.ptr) + size_t(i * add.stride) * ec;
    const cudaError_t e = cudaMemcpy2DAsync(dst, pitch, src, pitch, row, size_t(rows),
                                            cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchCublas(const GemmArgs& a, void* workspace, cudaStream_t stream) {
  if (!CheckCublasArgs(a)) return cudaErrorInvalidValue;
  static CublasHandles* const handles = new CublasHandles();  // lives as long as the process
  cublasHandle_t h = handles->Get(stream);
  if (h == nullptr) return cudaErrorNotSupported;
  cublasStatus_t s = SetCublasWorkspace(h, workspace);
  if (s != CUBLAS_STATUS_SUCCESS) return ToCuda(s);
  if (const cudaError_t e = CopyAddendIntoC(a, stream); e != cudaSuccess) return e;
  const float alpha = a.alpha, beta = a.beta;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first.
  s = cublasGemmStridedBatchedEx(
      h, a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(a.n),
      int(a.m), int(a.k), &alpha, a.b, CudaType(a.ab_type), int(a.ldb), a.stride_b, a.a,
      CudaType(a.ab_type), int(a.lda), a.stride_a, &beta, a.c, CudaType(a.c_type), int(a.ldc),
      a.stride_c, int(a.batch), ComputeType(Tf32(a)), CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) return ToCuda(s);
  return cudaGetLastError();
}

cudaError_t LaunchCublasLt(const GemmArgs& args, void* workspace, cudaStream_t stream) {
  if (!CheckArgs(args)) return cudaErrorInvalidValue;
  Route route;
  std::shared_ptr<const Plan> plan = FindRoute(args, workspace != nullptr, &route);
  if (plan == nullptr) return cudaErrorNotSupported;
  cublasLtHandle_t handle = Handle(route.key.device);
  const size_t es = DTypeSize(args.ab_type), ec = DTypeSize(args.c_type);
  const void* c_in = args.c_in != nullptr ? args.c_in : args.c;
  const int64_t stride_c_in = args.c_in != nullptr ? args.stride_c_in : args.stride_c;
  const float alpha = args.alpha, beta = args.beta;
  for (int64_t i = 0; i < route.calls; ++i) {
    const char* a =
        static_cast<const char*>(args.a) + (route.calls > 1 ? i * args.stride_a * es : 0);
    const char* b =
        static_cast<const char*>(args.b) + (route.calls > 1 ? i * args.stride_b * es : 0);
    char* c = static_cast<char*>(args.c) + (route.calls > 1 ? i * args.stride_c * ec : 0);
    const char* ci = static_cast<const char*>(c_in) + (route.calls > 1 ? i * stride_c_in * ec : 0);
    const cublasStatus_t s =
        cublasLtMatmul(handle, plan->op, &alpha, b, plan->x, a, plan->y, &beta, beta != 0 ? ci : c,
                       plan->c, c, plan->d, &plan->algo, workspace, route.key.workspace, stream);
    if (s != CUBLAS_STATUS_SUCCESS) return ToCuda(s);
  }
  return cudaGetLastError();
}

}  // namespace

bool IsGemmVendorVariant(std::string_view variant) {
  return variant == kGemmVendorVariant || variant == kGemmCublasVariant;
}

Support CanImplementGemmVendor(const GemmArgs& args, std::string_view variant) {
  if (variant == kGemmCublasVariant) return CheckCublasArgs(args);
  if (variant != kGemmVendorVariant)
    return Support::No("unknown vendor variant '" + std::string(variant) + "'");
  if (Support s = CheckArgs(args); !s) return s;
  Route route;
  if (FindRoute(args, true, &route) == nullptr)
    return Support::No("cuBLASLt offers no algorithm for these arguments");
  return Support::Yes();
}

size_t GemmVendorWorkspaceBytes(const GemmArgs&) { return kWorkspaceBytes; }

cudaError_t LaunchGemmVendor(const GemmArgs& args, std::string_view variant, void* workspace,
                             cudaStream_t stream) {
  if (variant == kGemmCublasVariant) return LaunchCublas(args, workspace, stream);
  if (variant == kGemmVendorVariant) return LaunchCublasLt(args, workspace, stream);
  return cudaErrorInvalidValue;
}

}  // namespace gpucompute::kernels
