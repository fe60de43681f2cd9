// GEMM: what the default (an empty variant) runs. Host-only; the dispatcher
// (src/gemm_dispatch.cc) asks it and launches what it names.
//
// Derived from the server-path sweep (tests/sweep/gemm_sweep.cc; table and
// command in kernels/bench/results/sweep-gemm.md), which times every version
// on every shape of its list, our rungs forced one by one and cuBLASLt.
// PROVISIONAL until the first sweep: the vendor fallback wherever it runs.
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
