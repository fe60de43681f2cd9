// GEMM: what the default (an empty variant) runs. Host-only; the dispatcher
// (src/gemm_dispatch.cc) asks it and launches what it names.
//
// Derived from the server-path sweep (tests/sweep/gemm_sweep.cc; table and
// command in kernels/bench/results/sweep-gemm.md), which times every version
// on every shape of its list (155 cases, 10 classes), our rungs forced one by
// one and the cuBLASLt fallback, against cuBLAS in the same run. What it
// showed on the H200 (the best of our rungs / cuBLAS, by class; run 7 of
// sweep-gemm.md, runs 1-2 before wgmma_splitk and wgmma_packed):
//   - squares 128-16384: bf16/fp16 0.3-0.4x up to 1024 (every kernel of
//     ours costs >= 7 us where cuBLAS takes 2-5 us), 0.8x at 2048, 0.91-0.93x
//     at 4096-8192, 0.97-0.98x at 16384; tf32 0.85-0.94x from 4096 up
//     (wgmma_packed; mma_sync before: 0.22x); exact fp32 0.52-0.98x;
//   - small K (16-256): 0.32-0.50x (16-bit), up to 1.03x (tf32);
//   - large K with small M*N: wgmma_splitk 0.6-0.97x (bf16);
//   - thin M (1-256) against LLM weights: wgmma_splitk / wgmma_ws 0.58-0.99x,
//     one case past 1.0x (M = 64 against a 128256 x 4096 weight: 1.04-1.07x,
//     its neighbours M = 16 and 128 at 0.82x and 0.99x: not a class);
//   - rows TMA cannot read (odd K or N): wgmma_packed 1.32-3.1x from
//     batch*M*N*K = 2^31 up (999^3: 0.63-0.70x); tf32 TN 1.02-1.16x;
//   - transposes (16-bit) 0.9x; batches 0.36-0.97x.
// Runs 1-2 found no class where one of our rungs is ahead of cuBLASLt beyond
// the run-to-run spread (+-3-5%). Run 4 added wgmma_packed (operands TMA
// cannot read copied K-major first), which is ahead on two classes, large
// enough to pay for the copies (below); everywhere else the default is the
// vendor fallback wherever it runs, named "cublaslt" in the shard timings and
// kernel metrics, and our ladders run where it does not (an output dtype or a
// size it refuses).
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
  bool aligned = true;    // A's and B's bases, rows and batch strides on 16 bytes
  bool vendor_ok = true;  // the cuBLASLt fallback takes these arguments
  int sms = 132;
};

// Problems at least this large (batch * M * N * K) pay for wgmma_packed's
// copies: 1000x3000x777 (2.3e9) ran 1.99x cuBLAS, 999^3 (1.0e9) 0.63-0.70x.
inline constexpr double kGemmPackedMinVolume = 2147483648.0;

// The variant the default runs: "cublaslt" (the vendor fallback), a rung of
// the dtype's ladder by name, or "" for the ladder's own choice.
inline const char* ChooseGemmVariant(const GemmShape& s) {
  if (!s.vendor_ok) return "";
  const double volume = double(s.batch) * double(s.m) * double(s.n) * double(s.k);
  const bool tensor_cores = s.ab != DType::kF32 || s.tf32;
  // Rows not on 16 bytes (odd K or N in 16-bit, K or N not a multiple of 4
  // in tf32): cuBLAS has no TMA kernel for them; ours copies them K-major,
  // then wgmma: 1.32-2.93x (bf16/fp16), 1.32-1.56x (tf32) in run 4.
  if (tensor_cores && !s.aligned && volume >= kGemmPackedMinVolume) return "wgmma_packed";
  // tf32 with A transposed and B not (TN): cuBLAS's tf32 TN kernels ran
  // ~1.6x slower than its NT ones; A copied K-major first: 1.02-1.16x.
  if (s.tf32 && s.trans_a && !s.trans_b && volume >= kGemmPackedMinVolume) return "wgmma_packed";
  return "cublaslt";
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_GEMM_HEURISTICS_H_
