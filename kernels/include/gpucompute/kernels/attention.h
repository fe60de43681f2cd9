// Attention forward: O = softmax(scale * Q K^T + mask) V, per batch and head.
//
// One ladder in src/attention.cu, from the materialised reference (S written to
// scratch) to FlashAttention with warp-level tensor cores (mma.sync) and to a
// Hopper kernel (TMA + mbarrier ring, wgmma, producer warp + consumer
// warpgroups). Every version takes the same arguments:
//
//   Q [batch, heads_q,  seq_q,  head_dim]   dense, row-major
//   K [batch, heads_kv, seq_kv, head_dim]   dense, row-major
//   V [batch, heads_kv, seq_kv, head_dim]   dense, row-major
//   O [batch, heads_q,  seq_q,  head_dim]   dense, row-major, dtype of the inputs
//                                           (fp32 with out_f32)
//   lse (optional) [batch, heads_q, seq_q] float: natural-log log-sum-exp of the
//       scaled, masked logits of each row.
//
// heads_q must be a multiple of heads_kv (grouped-query / multi-query
// attention: query head h reads key/value head h / (heads_q / heads_kv)).
// The causal mask is aligned to the bottom-right corner: query i sees key j iff
// j <= i + seq_kv - seq_q. A row that sees no key yields O = 0 and lse = -inf;
// a row with a NaN logit among the keys it sees (a NaN or infinite element of
// its Q or of a visible K) yields NaN O and lse, as PyTorch's SDPA does.
// fp32 inputs are converted on load; every version accumulates in fp32. The
// flash versions take head_dim a multiple of 8 up to 256 (their tiles are 64,
// 128 or 256 wide, zero past head_dim); the reference takes any.
#ifndef GPUCOMPUTE_KERNELS_ATTENTION_H_
#define GPUCOMPUTE_KERNELS_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// All pointers are device pointers; the caller owns them.
struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // nullable
  int64_t batch = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t seq_q = 0;
  int64_t seq_kv = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kBF16;
  bool causal = false;
  float scale = 0.f;     // <= 0 means 1 / sqrt(head_dim)
  bool out_f32 = false;  // O written as fp32 instead of the input dtype
};

// Every version, by its stable lower-case name, in ladder order:
// "reference", "flash_mma", "flash_wgmma", "flash_wgmma_pipelined",
// "flash_wgmma_pingpong", "flash_wgmma_overlap".
const std::vector<std::string>& AttentionVariants();

// Whether `variant` (empty: the fastest version for these arguments) can run
// these arguments; the reason when not (shape, dtype, head_dim, alignment).
Support CanImplementAttention(const AttentionArgs& args, std::string_view variant);

// The version that runs for `variant`: itself when named, else the one the
// default picks for these arguments (heuristics/attention_heuristics.h).
std::string_view AttentionVariantName(const AttentionArgs& args, std::string_view variant);

// Scratch bytes `variant` needs for these arguments (0 when none). The
// reference needs batch * heads_q * seq_q * seq_kv floats for S; the flash
// versions need scratch only when they split the keys across blocks (short
// query blocks against long key sequences).
size_t AttentionWorkspaceBytes(const AttentionArgs& args, std::string_view variant);

// Launches `variant` on `stream`. `workspace` must hold
// AttentionWorkspaceBytes(args, variant) bytes (may be null when that is 0).
// Returns cudaErrorInvalidValue for an unknown variant or arguments that
// CanImplementAttention refuses, else the launch status. No allocation, no
// synchronisation.
cudaError_t LaunchAttention(const AttentionArgs& args, std::string_view variant, void* workspace,
                            cudaStream_t stream);

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_ATTENTION_H_
