// GEMM: C = alpha * op(A) * op(B) + beta * C, row-major, strided batch.
//
// Two ladders implement it, each in one file, and a vendor fallback:
//   src/gemm_simt.cu   exact fp32 on the CUDA cores (FFMA), naive -> warp-tiled;
//   src/gemm_tc.cu     tensor cores: bf16/fp16 (fp32 accumulate) and fp32 inputs
//                      in tf32 mode, mma.sync -> TMA + wgmma, warp-specialised;
//   src/gemm_vendor.cc "cublaslt" (cublasLtMatmul) and "cublas"
//                      (cublasGemmStridedBatchedEx), for the shape classes
//                      where our ladders still lose.
// LaunchGemm (src/gemm_dispatch.cc) routes a request: a variant name to
// whatever owns it; the empty variant to what src/heuristics/gemm_heuristics.h
// picks (the vendor fallback, or the ladder of the dtype: exact fp32
// (allow_tf32 false) to SIMT, everything else to the tensor cores, each with
// its own choice of rung). GemmVariantName says what ran.
#ifndef GPUCOMPUTE_KERNELS_GEMM_H_
#define GPUCOMPUTE_KERNELS_GEMM_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// All pointers are device pointers. Matrices are row-major.
//   op(A) is [m, k]: A is [m, k] with row stride lda >= k, or, when trans_a,
//   A is [k, m] with lda >= m. Likewise op(B) is [k, n]: B is [k, n] (ldb >= n)
//   or, when trans_b, [n, k] (ldb >= k). C is [m, n] with ldc >= n.
//   Batch i uses a + i * stride_a (in elements), etc.; a stride of 0 shares
//   that operand across the batch.
// beta == 0 never reads C (NaN in C does not leak into the result).
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  const void* a = nullptr;
  int64_t lda = 0;
  int64_t stride_a = 0;
  bool trans_a = false;
  const void* b = nullptr;
  int64_t ldb = 0;
  int64_t stride_b = 0;
  bool trans_b = false;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t stride_c = 0;
  // When set and beta != 0, beta * C is read from here (ldc, c_type, batch
  // stride stride_c_in; 0: one C for the whole batch) rather than from c:
  // the addend fused into the epilogue with no copy into c. Every ladder and
  // the vendor fallback take it.
  const void* c_in = nullptr;
  int64_t stride_c_in = 0;
  DType ab_type = DType::kF32;  // type of A and B
  DType c_type = DType::kF32;   // type of C (read when beta != 0, always written)
  float alpha = 1.f;
  float beta = 0.f;
  bool allow_tf32 = false;  // fp32 inputs may run on the tensor cores in tf32
};

// --- SIMT ladder (src/gemm_simt.cu): ab_type == c_type == kF32, FFMA. ---
const std::vector<std::string>& GemmSimtVariants();
Support CanImplementGemmSimt(const GemmArgs& args, std::string_view variant);
size_t GemmSimtWorkspaceBytes(const GemmArgs& args, std::string_view variant);
cudaError_t LaunchGemmSimt(const GemmArgs& args, std::string_view variant, void* workspace,
                           cudaStream_t stream);

// --- Tensor-core ladder (src/gemm_tc.cu): bf16/fp16, or fp32 with allow_tf32. ---
const std::vector<std::string>& GemmTcVariants();
Support CanImplementGemmTc(const GemmArgs& args, std::string_view variant);
size_t GemmTcWorkspaceBytes(const GemmArgs& args, std::string_view variant);
// True when TMA can address A and B as they lie: bases, rows and batch
// strides (of operands not shared by the batch) on 16 bytes.
bool GemmTcAddressable(const GemmArgs& args);
// Bytes of A and B that wgmma_packed copies K-major before its kernel (the
// operands TMA cannot address and, in tf32, those wgmma cannot read as they
// lie); 0 where it copies nothing.
size_t GemmTcPackedCopyBytes(const GemmArgs& args);
cudaError_t LaunchGemmTc(const GemmArgs& args, std::string_view variant, void* workspace,
                         cudaStream_t stream);

// What the empty variant of each ladder runs for `args` (a rung's name).
std::string GemmSimtDefaultRung(const GemmArgs& args);
std::string GemmTcDefaultRung(const GemmArgs& args);

// --- Vendor fallbacks (src/gemm_vendor.cc), for the shape classes where ---
// our ladders still lose; every dtype the ladders take (tf32 when
// allow_tf32), c_in too:
//   "cublaslt"  cublasLtMatmul with a plan cached per problem; any layout
//               cuBLASLt has an algorithm for;
//   "cublas"    cublasGemmStridedBatchedEx itself (the call torch.matmul
//               makes); C's addend, where c_in lies apart, is first copied
//               into C.
// Each needs GemmVendorWorkspaceBytes of workspace for its full choice of
// algorithms (null: only those that need none).
inline constexpr const char* kGemmVendorVariant = "cublaslt";
inline constexpr const char* kGemmCublasVariant = "cublas";
bool IsGemmVendorVariant(std::string_view variant);
Support CanImplementGemmVendor(const GemmArgs& args, std::string_view variant);
size_t GemmVendorWorkspaceBytes(const GemmArgs& args);
cudaError_t LaunchGemmVendor(const GemmArgs& args, std::string_view variant, void* workspace,
                             cudaStream_t stream);

// --- Dispatcher (src/gemm_dispatch.cc). ---
// Every variant name of both ladders, then the vendor fallbacks.
const std::vector<std::string>& GemmVariants();
// Checks the arguments against the ladder that `variant` (or, when empty, the
// dtype and allow_tf32) selects.
Support CanImplementGemm(const GemmArgs& args, std::string_view variant);
// Scratch bytes the chosen version needs (0 for most); the caller provides it.
size_t GemmWorkspaceBytes(const GemmArgs& args, std::string_view variant);
// Launches on `stream`; no allocation, no synchronisation. Returns
// cudaErrorInvalidValue for refused arguments or an unknown variant.
cudaError_t LaunchGemm(const GemmArgs& args, std::string_view variant, void* workspace,
                       cudaStream_t stream);
// The name of what LaunchGemm runs for these arguments: `variant` itself when
// one is named, else the default's choice (a rung's name or a vendor
// fallback's).
std::string GemmVariantName(const GemmArgs& args, std::string_view variant);

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_GEMM_H_
