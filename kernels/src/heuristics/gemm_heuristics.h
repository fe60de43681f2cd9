// GEMM: what the default (an empty variant) runs. Host-only; the dispatcher
// (src/gemm_dispatch.cc) asks it and launches what it names.
//
// Derived from the server-path sweep (tests/sweep/gemm_sweep.cc; table and
// command in kernels/bench/results/sweep-gemm.md), which times every version
// on every shape of its list (155 cases, 10 classes), our rungs forced one by
// one and the cuBLASLt fallback, against cuBLAS in the same run. What it
// showed on the H200 (the best of our rungs / cuBLAS, by class):
//   - squares 128-16384: bf16/fp16 0.29-0.35x up to 1024 (every kernel of
//     ours costs >= 7 us where cuBLAS takes 2-5 us), 0.79-0.80x at 2048,
//     0.90-0.92x at 4096-8192, 0.96-1.00x at 16384; tf32 (row-major B, which
//     tf32 wgmma cannot read: mma_sync) 0.19-0.27x; exact fp32 0.52-0.98x;
//   - small K (16-256): 0.32-0.50x (16-bit), 0.34-0.77x (tf32);
//   - large K with small M*N: wgmma_splitk 0.61-0.97x (bf16), tf32 <= 0.1x;
//   - thin M (1-256) against LLM weights: wgmma_splitk / wgmma_ws 0.58-0.99x,
//     one case past 1.0x (M = 64 against a 128256 x 4096 weight: 1.04-1.07x,
//     its neighbours M = 16 and 128 at 0.82x and 0.99x: not a class);
//   - odd sizes (TMA cannot take the leading dimensions: mma_sync) 0.35-0.93x;
//     transposes 0.22-0.98x; batches 0.28-0.97x.
// No class where one of our rungs is ahead of cuBLASLt beyond the run-to-run
// spread (+-3-5%), so the default is the vendor fallback wherever it runs,
// named "cublaslt" in the shard timings and kernel metrics; our ladders run
// where it does not (an output dtype or a size it refuses). The split into
// classes stays here so that a rung that overtakes the fallback on a class
// takes that class (the sweep shows it first).
#ifndef GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMM_HEURISTICS_H_
#define GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMM_HEURISTICS_H_

#include <cstdint>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// What the choice depends on.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;  // op(A) is [m, k], op(B) [k, n]
  DType ab = DType::kF32;
  bool tf32 = false;  // fp32 inputs on the tensor cores
  bool trans_a = false, trans_b = false;
  bool tma_ok = false;    // A and B as TMA takes them (the wgmma rungs run)
  bool vendor_ok = true;  // the cuBLASLt fallback takes these arguments
  int sms = 132;
};

// The variant the default runs: "cublaslt" (the vendor fallback), a rung of
// the dtype's ladder by name, or "" for the ladder's own choice.
inline const char* ChooseGemmVariant(const GemmShape& s) { return s.vendor_ok ? "cublaslt" : ""; }

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMM_HEURISTICS_H_
