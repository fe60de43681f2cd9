// Reduce: which rung the default (an empty variant) runs. Host-only; the
// kernels file asks it and launches what it names.
//
// Derived from the server-path sweep (tests/sweep/memops_sweep.cc; table and
// command in kernels/bench/results/sweep-memops.md), which times every
// applicable rung on every shape of its list:
//   - rows (inner = 1) of up to kReduceRowWarpMaxAxis elements: "row_warp",
//     a warp per row (a block per row leaves most of its threads idle there,
//     and the row split of "single_pass" has nothing to split); a single
//     such row (all elements of a small tensor) too;
//   - columns (inner > 1) with a very short axis and enough outputs to fill
//     the machine, or a short axis and an inner too narrow for a tile of 32
//     lanes: "col_thread", a thread per output vector walking the axis;
//   - longer rows, all elements of a larger tensor included: "vec", block
//     partials and a second kernel that adds them. It is ahead of
//     "single_pass" on every such row of the sweep, whose last block per
//     segment pays a fence, an atomic ticket and a read of the partials in
//     series (about as much as a second launch), and before the module's
//     ticket pool a memset too: all elements, 10^5 fp32, 3.10 against 3.26
//     us (4.29 with the memset, in another run); [8, 10^6] bf16 5.79
//     against 6.11;
//   - everything else (columns, a middle axis): "single_pass" (16-byte
//     loads, the axis split over blocks until the machine is full, the last
//     block of each output segment combining the partials; one launch, no
//     clearing pass where its tickets come from the module's pool).
#ifndef GPUCOMPUTE_KERNELS_SRC_HEURISTICS_REDUCE_HEURISTICS_H_
#define GPUCOMPUTE_KERNELS_SRC_HEURISTICS_REDUCE_HEURISTICS_H_

#include <cstdint>
#include <string_view>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// What the choice depends on: the input viewed as [outer, axis, inner].
struct ReduceShape {
  int64_t outer = 1, axis = 0, inner = 1;
  DType in_type = DType::kF32;
};

// Longest row "row_warp" takes.
inline constexpr int64_t kReduceRowWarpMaxAxis = 4096;
// "col_thread" takes axes of up to kReduceColThreadShortAxis with at least
// kReduceColThreadMinThreads threads, and axes of up to
// kReduceColThreadMaxAxis when inner is too narrow for a tile of 32 lanes.
inline constexpr int64_t kReduceColThreadShortAxis = 8;
inline constexpr int64_t kReduceColThreadMaxAxis = 64;
inline constexpr int64_t kReduceColThreadMinThreads = 2048;

// The name of the rung to run (one of ReduceVariants()).
inline std::string_view ChooseReduce(const ReduceShape& s, int sm_count) {
  (void)sm_count;
  if (s.inner == 1 && s.axis <= kReduceRowWarpMaxAxis) return "row_warp";
  // Longer rows, all elements included: block partials and a second kernel
  // that adds them.
  if (s.inner == 1) return "vec";
  if (s.inner > 1) {
    const int64_t v = 16 / int64_t(DTypeSize(s.in_type));
    const int64_t threads = s.outer * (s.inner % v == 0 ? s.inner / v : s.inner);
    if (s.axis <= kReduceColThreadShortAxis && threads >= kReduceColThreadMinThreads)
      return "col_thread";
    if (s.inner < 32 && s.axis <= kReduceColThreadMaxAxis) return "col_thread";
  }
  return "single_pass";
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_REDUCE_HEURISTICS_H_
