// Reduction of a dense row-major tensor viewed as [outer, axis, inner] along
// its middle axis: out[o][i] = op over a of in[o][a][i]. All elements is
// outer = inner = 1; inner = 1 is the row case, inner > 1 the column case.
//
// The ladder (src/reduce.cu), slowest first:
//   "tree_divergent"   one element per thread, shared-memory tree with the
//                      divergent tid % (2 * stride) branch, one pass per level;
//   "tree_sequential"  sequential addressing, stride halving;
//   "warp_shuffle"     __shfl_down_sync inside warps, shared memory across them;
//   "vec"              16-byte loads, several per thread, grid sized to the
//                      machine; a second kernel combines the block partials;
//   "single_pass"      as "vec", but the last block of each output segment
//                      combines the partials (atomic ticket): one kernel.
//   "row_warp"         the small-row path (inner = 1 only): one warp per row,
//                      16-byte loads where the rows allow (else coalesced
//                      element loads), no workspace, one launch.
//   "col_thread"       the short-axis column path (inner > 1 only): a thread
//                      per 16-byte vector of outputs (or per output) walking
//                      the axis, no workspace, one launch.
// An empty variant runs what src/heuristics/reduce_heuristics.h picks.
// The column case (inner > 1) reads coalesced along inner: the tree rungs use
// one thread per output; "vec" and "single_pass" use 16-byte tiles along inner
// with the axis split across blocks when there are too few outputs.
//
// Accumulation is fp32. Results are deterministic: the combination order is
// fixed for a given device and arguments (no floating-point atomics), so the
// same input gives bitwise the same output. MAX and MIN propagate NaN (numpy).
// MEAN is the fp32 sum divided by `axis`.
#ifndef GPUCOMPUTE_KERNELS_REDUCE_H_
#define GPUCOMPUTE_KERNELS_REDUCE_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

enum class ReduceOp : int { kSum = 0, kMax = 1, kMin = 2, kMean = 3 };

// `in` holds outer * axis * inner elements of in_type; `out` receives
// outer * inner elements of out_type. Device pointers aligned to their element
// sizes; `in` and `out` do not overlap.
struct ReduceArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t outer = 1;
  int64_t axis = 0;
  int64_t inner = 1;
  ReduceOp op = ReduceOp::kSum;
  DType in_type = DType::kF32;
  DType out_type = DType::kF32;
};

// Every rung by name, slowest first (see above).
const std::vector<std::string>& ReduceVariants();

// Ok when `variant` (empty = fastest for the arguments) can run `args`;
// otherwise the reason. Refuses axis == 0 (an empty reduction), negative
// extents, null or misaligned pointers.
Support CanImplementReduce(const ReduceArgs& args, std::string_view variant);

// The name of the rung LaunchReduce runs for these arguments: `variant`
// itself, or the default's choice when it is empty. Empty when
// CanImplementReduce refuses.
std::string ReduceVariantName(const ReduceArgs& args, std::string_view variant);

// Bytes of device workspace LaunchReduce needs for these arguments and
// variant (0 when none). Its contents on entry do not matter: where a rung
// needs counters at zero (single_pass split over blocks, with more output
// segments than its module-wide ticket pool serves), the launch clears them
// on `stream` first. Launches that share a workspace must not run
// concurrently; single_pass launches that take pool tickets may, up to 16383
// in flight on a device at once (src/reduce.cu, g_ticket_pool).
size_t ReduceWorkspaceBytes(const ReduceArgs& args, std::string_view variant);

// Enqueues the reduction on `stream`. `workspace` must hold
// ReduceWorkspaceBytes(args, variant) bytes, 256-byte aligned (cudaMalloc
// memory is), and may be null when that is 0. Returns cudaErrorInvalidValue
// when CanImplementReduce refuses or the workspace is missing; otherwise the
// launch status. outer * inner == 0 launches nothing.
cudaError_t LaunchReduce(const ReduceArgs& args, std::string_view variant, void* workspace,
                         cudaStream_t stream);

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_REDUCE_H_
