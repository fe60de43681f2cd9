// Hopper (sm_90a) building blocks of the tensor-core GEMM ladder on top of
// sm90_primitives.cuh (mbarriers, TMA loads, wgmma fences, descriptors): the
// GEMM-only pieces, i.e. TMA multicast and descriptor prefetch, 2-CTA cluster
// rank / sync / remote arrive, and the m64nN wgmma instructions (N = 256,
// 192, 128, 64, 32, 16). Included by gemm_tc.cu only.
//
// Shared-memory operand layout used by every wgmma rung: one stage of an
// operand is a stack of 128-byte rows swizzled by TMA's 128B pattern (16-byte
// chunk q of row r lands at chunk q ^ (r % 8) of a 1024-byte-aligned atom).
//   K-major operand (A not transposed, B transposed; tf32 B always): one row
//     per M (or N) index holding 128 bytes of K; 8-row groups are 1024 bytes
//     apart (SBO); a k-step of 32 bytes (16 bf16/fp16 or 8 tf32) moves the
//     descriptor's start address by 32 bytes inside the atom.
//   MN-major operand (A transposed, B not transposed; 16-bit types): blocks of
//     64 M (or N) values; inside a block one 128-byte row per K index; 8-row
//     K groups 1024 bytes apart (SBO), blocks BK*128 bytes apart (LBO); a k-step
//     of 16 rows moves the start address by 2048 bytes.
//   M-major tf32 A (transposed): blocks of 32 M values (128 bytes) by the
//     stage's 32 K rows (4096 bytes each); the consumers read their fragments
//     from there with ld.shared and issue wgmma with A from registers
//     (WgmmaM64NTf32Rs). tf32 B must be K-major: a problem whose B is N-major
//     runs as C^T = B^T A^T when its A is K-major (then B^T is the M-major A).
#ifndef GPUCOMPUTE_KERNELS_SRC_GEMM_TC_SM90_CUH_
#define GPUCOMPUTE_KERNELS_SRC_GEMM_TC_SM90_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "gemm_tc_common.cuh"
#include "sm90_primitives.cuh"

namespace gpucompute::kernels::tc {

// --- TMA ----------------------------------------------------------------------

__device__ __forceinline__ void TmaPrefetchDescriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// sm90::TmaLoad3d's box written to the same shared-memory offset of every CTA
// in `cta_mask` (a 2-CTA cluster: 0b11); each destination's barrier at `bar`'s
// offset receives the transaction bytes.
__device__ __forceinline__ void TmaLoad3dMulticast(uint32_t dst, const CUtensorMap* map, int c0,
                                                   int c1, int c2, uint32_t bar,
                                                   uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask)
      : "memory");
}

// --- clusters -----------------------------------------------------------------

__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA in the cluster.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Arrives on the barrier at `bar`'s offset in CTA `cta` of the cluster. Used to
// hand a stage back after wgmma.wait_group has retired its reads, so the
// default (release, CTA scope) ordering suffices: no cluster-wide fence.
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}" ::"r"(bar),
      "r"(cta)
      : "memory");
}

// The address in CTA `cta`'s shared memory of this CTA's shared address
// `addr` (distributed shared memory).
__device__ __forceinline__ uint32_t MapaShared(uint32_t addr, uint32_t cta) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(cta));
  return r;
}

// Four floats at a cluster shared address (MapaShared), 16-byte aligned.
__device__ __forceinline__ float4 LdSharedCluster4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// --- wgmma --------------------------------------------------------------------

// One m64nN k-step (N = 256, 192, 128, 64, 32 or 16) for the operand type T: D[64 x N]
// (fp32, N / 2 registers a thread) += A[64 x K] * B[K x N], both operands
// read from shared memory through descriptors; K = 16 for bf16 and fp16, 8
// for tf32 (T = float). kTransA = 1: A is M-major; kTransB = 1: B is N-major
// (16-bit types only).
//
// GC_GEMM_WGMMA_16BIT / _TF32 spell one instruction: SHAPE and TYPES, the
// accumulator text D and operand macro ACC (sm90_primitives.cuh; named,
// not called, so that its commas stay inside the last expansion), and the operand
// numbers that follow the N / 2 accumulators: descriptors A and B, the
// scale-d predicate and (16-bit only) the two transpose flags.
#define GC_GEMM_WGMMA_16BIT(SHAPE, TYPES, D, ACC, IA, IB, IP, ITA, ITB)                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP ", 0;\n" GC_WGMMA_OP(SHAPE, TYPES, D) IA \
               ", " IB ", p, 1, 1, " ITA ", " ITB ";\n}\n"                                     \
               : ACC(d)                                                                        \
               : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA), "n"(kTransB))
#define GC_GEMM_WGMMA_TF32(SHAPE, D, ACC, IA, IB, IP)                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP ", 0;\n" GC_WGMMA_OP(SHAPE, "tf32.tf32", D) \
                   IA ", " IB ", p, 1, 1;\n}\n"                                                   \
               : ACC(d)                                                                           \
               : "l"(desc_a), "l"(desc_b), "r"(1))
#define GC_GEMM_WGMMA_WIDTH(K16, K8, D, ACC, IA, IB, IP, ITA, ITB)       \
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {                      \
    GC_GEMM_WGMMA_16BIT(K16, "bf16.bf16", D, ACC, IA, IB, IP, ITA, ITB); \
  } else if constexpr (std::is_same_v<T, __half>) {                      \
    GC_GEMM_WGMMA_16BIT(K16, "f16.f16", D, ACC, IA, IB, IP, ITA, ITB);   \
  } else {                                                               \
    GC_GEMM_WGMMA_TF32(K8, D, ACC, IA, IB, IP);                          \
  }
template <typename T, int kN, int kTransA, int kTransB>
__device__ __forceinline__ void WgmmaM64N(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(std::is_same_v<T, float> ? (kTransA == 0 && kTransB == 0) : true,
                "tf32 wgmma reads both operands K-major");
  if constexpr (kN == 256) {
    GC_GEMM_WGMMA_WIDTH("m64n256k16", "m64n256k8", GC_WGMMA_D128, GC_WGMMA_ACC128, "%128", "%129",
                        "%130", "%131", "%132")
  } else if constexpr (kN == 192) {
    GC_GEMM_WGMMA_WIDTH("m64n192k16", "m64n192k8", GC_WGMMA_D96, GC_WGMMA_ACC96, "%96", "%97",
                        "%98", "%99", "%100")
  } else if constexpr (kN == 128) {
    GC_GEMM_WGMMA_WIDTH("m64n128k16", "m64n128k8", GC_WGMMA_D64, GC_WGMMA_ACC64, "%64", "%65",
                        "%66", "%67", "%68")
  } else if constexpr (kN == 64) {
    GC_GEMM_WGMMA_WIDTH("m64n64k16", "m64n64k8", GC_WGMMA_D32, GC_WGMMA_ACC32, "%32", "%33", "%34",
                        "%35", "%36")
  } else if constexpr (kN == 32) {
    GC_GEMM_WGMMA_WIDTH("m64n32k16", "m64n32k8", GC_WGMMA_D16, GC_WGMMA_ACC16, "%16", "%17", "%18",
                        "%19", "%20")
  } else {
    static_assert(kN == 16, "tile widths of the wgmma rungs: 256, 192, 128, 64, 32, 16");
    GC_GEMM_WGMMA_WIDTH("m64n16k16", "m64n16k8", GC_WGMMA_D8, GC_WGMMA_ACC8X, "%8", "%9", "%10",
                        "%11", "%12")
  }
}
#undef GC_GEMM_WGMMA_WIDTH
#undef GC_GEMM_WGMMA_TF32
#undef GC_GEMM_WGMMA_16BIT

// One tf32 m64nNk8 k-step (N = 256, 192, 128, 64, 32 or 16) with A from registers: D[64 x
// N] += A[64 x 8] * B[8 x N], B K-major in shared memory through `desc_b`.
// Thread l of warp w holds A's (r, c), (r + 8, c), (r, c + 4), (r + 8, c + 4)
// in a[0..3], r = 16 w + l / 4, c = l % 4 (the m16n8k8 tf32 layout per warp;
// the hardware uses the top 19 bits of each fp32 value, as it does reading
// tf32 from shared memory). This is how tf32 takes an M-major A: the
// instruction's shared-memory form reads 32-bit types K-major only.
#define GC_GEMM_WGMMA_TF32_RS(SHAPE, D, ACC, IA, IB, IP)                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP                                        \
               ", 0;\n" GC_WGMMA_OP(SHAPE, "tf32.tf32", D) "{" IA "}, " IB ", p, 1, 1;\n}\n" \
               : ACC(d)                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))
template <int kN>
__device__ __forceinline__ void WgmmaM64NTf32Rs(float (&d)[kN / 2], const uint32_t (&a)[4],
                                                uint64_t desc_b) {
  if constexpr (kN == 256) {
    GC_GEMM_WGMMA_TF32_RS("m64n256k8", GC_WGMMA_D128, GC_WGMMA_ACC128, "%128, %129, %130, %131",
                          "%132", "%133");
  } else if constexpr (kN == 192) {
    GC_GEMM_WGMMA_TF32_RS("m64n192k8", GC_WGMMA_D96, GC_WGMMA_ACC96, "%96, %97, %98, %99", "%100",
                          "%101");
  } else if constexpr (kN == 128) {
    GC_GEMM_WGMMA_TF32_RS("m64n128k8", GC_WGMMA_D64, GC_WGMMA_ACC64, "%64, %65, %66, %67", "%68",
                          "%69");
  } else if constexpr (kN == 64) {
    GC_GEMM_WGMMA_TF32_RS("m64n64k8", GC_WGMMA_D32, GC_WGMMA_ACC32, "%32, %33, %34, %35", "%36",
                          "%37");
  } else if constexpr (kN == 32) {
    GC_GEMM_WGMMA_TF32_RS("m64n32k8", GC_WGMMA_D16, GC_WGMMA_ACC16, "%16, %17, %18, %19", "%20",
                          "%21");
  } else {
    static_assert(kN == 16, "tile widths of the wgmma rungs: 256, 192, 128, 64, 32, 16");
    GC_GEMM_WGMMA_TF32_RS("m64n16k8", GC_WGMMA_D8, GC_WGMMA_ACC8X, "%8, %9, %10, %11", "%12",
                          "%13");
  }
}
#undef GC_GEMM_WGMMA_TF32_RS

}  // namespace gpucompute::kernels::tc

#endif  // GPUCOMPUTE_KERNELS_SRC_GEMM_TC_SM90_CUH_
