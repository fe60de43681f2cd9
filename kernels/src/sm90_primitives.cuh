// Hopper inline-PTX primitives shared by the wgmma GEMM (gemm_tc_sm90.cuh,
// gemm_tc_wgmma.cuh), the wgmma FlashAttention kernel (attention_wgmma.cuh)
// and GEMV's tensor-core versions (gemv.cu): mbarrier init / arrive / wait,
// 3-D TMA tile loads and stores (and the bulk groups that track the stores),
// cp.async, ldmatrix (plain and transposing), the proxy
// and mbarrier-init fences, wgmma fence / commit / wait, the accumulator
// register fence, setmaxnreg and the 128B-swizzle shared-memory matrix
// descriptor.
//
// cp.async and ldmatrix need sm_80, the mbarrier and TMA parts sm_90; the
// wgmma and setmaxnreg parts need sm_90a (the arch-specific target), so only
// kernels compiled for sm_90a may call them. Every function is a
// force-inlined wrapper around one instruction (or one short fixed sequence);
// nothing here allocates or synchronises beyond what its comment says.
#ifndef GPUCOMPUTE_KERNELS_SRC_SM90_PRIMITIVES_CUH_
#define GPUCOMPUTE_KERNELS_SRC_SM90_PRIMITIVES_CUH_

#include <cuda.h>

#include <cstdint>

namespace gpucompute::kernels::sm90 {

// --- mbarrier -----------------------------------------------------------------
// `bar` is always the shared-memory (shared::cta) address of an 8-byte
// aligned 64-bit mbarrier.

// Initialises the barrier at `bar` to expect `count` arrivals per phase. One
// thread only; publish with FenceMbarrierInit() and a block (or cluster)
// barrier before any other thread or the TMA unit uses it.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the preceding mbarrier.init writes of this thread visible to the
// other threads of the cluster (release, cluster scope).
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Orders this thread's generic-proxy shared-memory accesses before later
// async-proxy (TMA, wgmma) accesses to shared memory of this CTA.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Arrives on `bar` (one arrival, release at CTA scope).
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Arrives on `bar` `count` times at once (release at CTA scope): one thread
// standing for several that each would have arrived.
__device__ __forceinline__ void MbarArriveCount(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Arrives on `bar` and raises the phase's expected transaction count by
// `bytes`: the phase completes once every arrival is in and `bytes` bytes of
// asynchronous copies (TmaLoad3d) have landed.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Polls once (with the hardware's bounded suspend): true when the phase of
// parity `parity` has completed, with acquire ordering at CTA scope.
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Spins until the phase of parity `parity` has completed. A freshly
// initialised barrier counts its (virtual) previous phase, parity 1, as done.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  while (!MbarTryWait(bar, parity)) {
  }
}

// MbarWait that gives up: a wait that outlives ~2^25 polls (seconds; a
// healthy one takes microseconds) means a lost transaction, so it traps
// rather than hang the stream.
__device__ __forceinline__ void MbarWaitOrTrap(uint32_t bar, uint32_t parity) {
  uint32_t polls = 0;
  do {
    if (++polls == (1u << 25)) __trap();
  } while (!MbarTryWait(bar, parity));
}

// 32-bit store and load at shared-memory address `addr`, ordered with the
// mbarrier operations around them (a value written before an arrival is read
// after the wait on it).
__device__ __forceinline__ void StShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t LdShared32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// --- TMA ----------------------------------------------------------------------

// Copies one box of the 3-D tensor map `map` (a __grid_constant__ kernel
// parameter or global memory), box origin {c0, c1, c2} innermost first, to
// shared memory at `dst`; completion is signalled as transaction bytes on
// `bar` (see MbarArriveExpectTx). `dst` must be 128-byte aligned (1024 for
// 128B swizzle).
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// Copies one box of shared memory at `src` (laid out as TmaLoad3d would
// have written it: same alignment, same swizzle) to the 3-D tensor map `map`
// at box origin {c0, c1, c2}; elements outside the tensor are not written.
// Joins this thread's current bulk group (BulkCommitGroup); `src` must not be
// written again before BulkWaitGroupRead says the copy has read it. Order the
// threads' shared-memory writes of the box before it with FenceProxyAsync in
// each writer and a barrier.
__device__ __forceinline__ void TmaStore3d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                           int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(src)
      : "memory");
}

// Closes this thread's bulk copies (TmaStore3d) issued since the last commit
// into one bulk group.
__device__ __forceinline__ void BulkCommitGroup() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most kPending of this thread's bulk groups have not yet
// finished reading their shared-memory sources (their global writes may
// still be in flight; they are visible to later kernels on the stream).
template <int kPending>
__device__ __forceinline__ void BulkWaitGroupRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// --- cp.async and ldmatrix (sm_80 and later) ----------------------------------

// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned)
// asynchronously, reading only the first `src_bytes` (0..16) and zero-filling
// the rest; with 0 nothing is read. Completes with the commit group it joins.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// Closes this thread's current group of cp.async copies.
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in
// flight (the copies of other threads need a barrier besides).
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Loads four 8x8 matrices of 16-bit elements from shared memory: lanes
// 8i..8i+7 give the addresses of matrix i's 8 rows (16 bytes each), and r[i]
// of lane l holds matrix i's elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Loads four 8x8 matrices of 16-bit elements from shared memory, transposed:
// lanes 8i..8i+7 give the addresses of matrix i's 8 rows (16 bytes each), and
// r[i] of lane l holds matrix i's elements (2(l%4), l/4) and (2(l%4)+1, l/4).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// --- wgmma (sm_90a) -------------------------------------------------------------

// Shared-memory matrix descriptor for a 128-byte-swizzled operand: start
// address, leading and stride byte offsets (each >> 4 into its 14-bit field)
// and the 128B swizzle mode (1 in bits 62-63). `addr` must lie in the
// 1024-byte-aligned swizzle atoms TMA wrote.
__device__ __forceinline__ uint64_t MakeSmemDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// The descriptor MakeSmemDesc would give for the address `bytes` (a multiple
// of 16) past that of `desc`, with the same offsets and swizzle: one 32-bit
// add, where the address stays below 2^18 (any shared-memory address).
__device__ __forceinline__ uint64_t SmemDescAdvance(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | (uint32_t(desc) + (bytes >> 4));
}

// Accumulator operands of the wgmma wrappers: GC_WGMMA_D<N> is the PTX text
// "{%0, %1, ..., %<N-1>}" of an m64nNk* instruction's fp32 accumulators, and
// GC_WGMMA_ACC<N>(d) the matching read-write operands d[0..N-1] (the asm's
// first N outputs). GC_WGMMA_OP spells the instruction up to its accumulators.
#define GC_WGMMA_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define GC_WGMMA_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define GC_WGMMA_D32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define GC_WGMMA_D40                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39}"
#define GC_WGMMA_D48                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}"
#define GC_WGMMA_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define GC_WGMMA_D88                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87}"
#define GC_WGMMA_D96 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define GC_WGMMA_D128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define GC_WGMMA_ACC8(d, i)                                                                   \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define GC_WGMMA_ACC8X(d) GC_WGMMA_ACC8(d, 0)
#define GC_WGMMA_ACC16(d) GC_WGMMA_ACC8(d, 0), GC_WGMMA_ACC8(d, 8)
#define GC_WGMMA_ACC32(d) \
  GC_WGMMA_ACC8(d, 0), GC_WGMMA_ACC8(d, 8), GC_WGMMA_ACC8(d, 16), GC_WGMMA_ACC8(d, 24)
#define GC_WGMMA_ACC88(d) \
  GC_WGMMA_ACC64(d), GC_WGMMA_ACC8(d, 64), GC_WGMMA_ACC8(d, 72), GC_WGMMA_ACC8(d, 80)
#define GC_WGMMA_ACC96(d) GC_WGMMA_ACC64(d), GC_WGMMA_ACC8(d, 64), GC_WGMMA_ACC8(d, 72), \
      GC_WGMMA_ACC8(d, 80), GC_WGMMA_ACC8(d, 88)
#define GC_WGMMA_ACC40(d) GC_WGMMA_ACC32(d), GC_WGMMA_ACC8(d, 32)
#define GC_WGMMA_ACC48(d) GC_WGMMA_ACC32(d), GC_WGMMA_ACC8(d, 32), GC_WGMMA_ACC8(d, 40)
#define GC_WGMMA_ACC64(d) GC_WGMMA_ACC32(d), GC_WGMMA_ACC8(d, 32), GC_WGMMA_ACC8(d, 40), \
      GC_WGMMA_ACC8(d, 48), GC_WGMMA_ACC8(d, 56)
#define GC_WGMMA_ACC128(d) GC_WGMMA_ACC64(d), GC_WGMMA_ACC8(d, 64), GC_WGMMA_ACC8(d, 72), \
      GC_WGMMA_ACC8(d, 80), GC_WGMMA_ACC8(d, 88), GC_WGMMA_ACC8(d, 96), GC_WGMMA_ACC8(d, 104), \
      GC_WGMMA_ACC8(d, 112), GC_WGMMA_ACC8(d, 120)
// "wgmma.mma_async.sync.aligned.<SHAPE>.f32.<TYPES> <accumulators>, "
#define GC_WGMMA_OP(SHAPE, TYPES, D) "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPES " " D ", "

// Orders this warpgroup's register and shared-memory accesses before the
// wgmma.mma_async instructions that follow. Whole warpgroup.
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

// Closes the wgmma.mma_async instructions issued since the last commit into
// one group. Whole warpgroup.
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most kPending committed wgmma groups are still in flight.
// Follow with FenceRegisters on the accumulators before touching them.
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Pins the accumulator registers `d` at this point of the program, so that
// the compiler moves no read or write of them across an asynchronous wgmma
// (issue or wait). Emits no instruction.
template <int kN>
__device__ __forceinline__ void FenceRegisters(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Raises (Inc) or lowers (Dec) the per-thread register count of this
// warpgroup to kRegs (a multiple of 8 in 24..256). Whole warpgroup.
template <int kRegs>
__device__ __forceinline__ void SetMaxRegistersInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegistersDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace gpucompute::kernels::sm90

#endif  // GPUCOMPUTE_KERNELS_SRC_SM90_PRIMITIVES_CUH_
