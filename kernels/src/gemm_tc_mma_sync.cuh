// Rung 1 of the tensor-core GEMM ladder: warp-level mma.sync fed by ldmatrix
// from a multi-stage cp.async ring (the pre-Hopper way). It takes every shape,
// transpose and alignment, so it is also the fallback for what TMA cannot
// address. Included by gemm_tc.cu only.
#ifndef GPUCOMPUTE_KERNELS_SRC_GEMM_TC_MMA_SYNC_CUH_
#define GPUCOMPUTE_KERNELS_SRC_GEMM_TC_MMA_SYNC_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "gemm_tc_common.cuh"

namespace gpucompute::kernels::tc {

// Tile configuration of rung 1. The stage tiles keep the global orientation of
// each operand; MN-major tiles are read with ldmatrix.trans.
template <typename T>
struct MmaSyncConfig {
  static constexpr int kBM = 128;               // (BLOCK_M) rows of C per block
  static constexpr int kBN = 128;               // (BLOCK_N) columns of C per block
  static constexpr int kBK = 64 / sizeof(T);    // (BLOCK_K) 64 bytes of K per stage
  static constexpr int kStages = 4;             // cp.async ring depth
  static constexpr int kThreads = 256;          // 8 warps as 2 (M) x 4 (N)
  static constexpr int kWarpM = 64;             // (WARP_M, WARP_N) = (64, 32)
  static constexpr int kWarpN = 32;
  static constexpr int kVec = 16 / sizeof(T);   // elements per 16-byte copy
  static constexpr int kPadK = 16 / sizeof(T);  // K-major rows padded by 16 bytes
  static constexpr int kPadMN = 8;              // MN-major rows padded by 8 elements
  static constexpr int kLdK = kBK + kPadK;      // row length of a K-major tile
  static constexpr int kLdMN = kBM + kPadMN;    // row length of an MN-major tile
  static constexpr int kTileElems = (kBM * kLdK > kBK * kLdMN) ? kBM * kLdK : kBK * kLdMN;
  static constexpr int kSmemBytes = 2 * kStages * kTileElems * int(sizeof(T));
  static_assert(kBM == kBN, "A and B stage tiles share one size");
  static_assert(kBM == 2 * kWarpM && kBN == 4 * kWarpN, "8 warps cover the block tile");
  static_assert(kBM * kBK % (kVec * kThreads) == 0, "whole 16-byte pieces per thread");
  static_assert((kLdK * sizeof(T)) % 16 == 0 && (kLdMN * sizeof(T)) % 16 == 0,
                "16-byte aligned smem rows");
};

__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a * b for one m16n8 tile (k16 for 16-bit types, k8 for tf32).
template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else if constexpr (std::is_same_v<T, __half>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t ToTf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// Copies a (kRows, kCols) tile whose origin is g (row stride g_ld elements)
// into shared memory rows of s_ld elements; elements outside
// (rows_valid, cols_valid) become zero. `vec`: 16-byte cp.async pieces
// (aligned base and row stride), else element by element through registers.
template <typename T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void LoadTile(T* s, int s_ld, const T* g, int64_t g_ld, int rows_valid,
                                         int cols_valid, bool vec, const T* any_valid) {
  using S = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kPiecesPerRow = kCols / kVec;
  constexpr int kPieces = kRows * kPiecesPerRow;
  static_assert(kPieces % kThreads == 0, "whole pieces per thread");
#pragma unroll
  for (int i = threadIdx.x; i < kPieces; i += kThreads) {
    const int r = i / kPiecesPerRow;
    const int c = (i % kPiecesPerRow) * kVec;
    T* dst = s + r * s_ld + c;
    const T* src = g + r * g_ld + c;
    if (vec) {
      int valid = r < rows_valid ? min(max(cols_valid - c, 0), kVec) : 0;
      CpAsync16(SmemAddr(dst), valid > 0 ? src : any_valid, valid * int(sizeof(T)));
    } else {
      S* d = reinterpret_cast<S*>(dst);
      const S* q = reinterpret_cast<const S*>(src);
#pragma unroll
      for (int e = 0; e < kVec; ++e) d[e] = (r < rows_valid && c + e < cols_valid) ? q[e] : S(0);
    }
  }
}

template <typename T, bool kTransA, bool kTransB>
__global__ void __launch_bounds__(MmaSyncConfig<T>::kThreads)
    MmaSyncKernel(const TcParams p) {
  using Cfg = MmaSyncConfig<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  // Stage s of A at smem + s * kTileElems, of B after all A stages.
  constexpr int kLdA = kTransA ? Cfg::kLdMN : Cfg::kLdK;
  constexpr int kLdB = kTransB ? Cfg::kLdK : Cfg::kLdMN;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 4, wn = warp % 4;
  const int g = lane / 4, t = lane % 4;
  const int kblocks = (p.k + Cfg::kBK - 1) / Cfg::kBK;

  for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
    int bi, tm, tn;
    DecodeTile(p, tile, bi, tm, tn);
    const int m0 = tm * Cfg::kBM, n0 = tn * Cfg::kBN;
    const T* a = static_cast<const T*>(p.a) + static_cast<int64_t>(bi) * p.stride_a;
    const T* b = static_cast<const T*>(p.b) + static_cast<int64_t>(bi) * p.stride_b;

    auto load_stage = [&](int stage, int kb) {
      const int k0 = kb * Cfg::kBK;
      T* sa = smem + stage * Cfg::kTileElems;
      T* sb = smem + (Cfg::kStages + stage) * Cfg::kTileElems;
      if constexpr (kTransA)  // A is [k, m]
        LoadTile<T, Cfg::kBK, Cfg::kBM, Cfg::kThreads>(sa, kLdA, a + k0 * p.lda + m0, p.lda,
                                                       p.k - k0, p.m - m0, p.a_vec, a);
      else  // A is [m, k]
        LoadTile<T, Cfg::kBM, Cfg::kBK, Cfg::kThreads>(sa, kLdA, a + m0 * p.lda + k0, p.lda,
                                                       p.m - m0, p.k - k0, p.a_vec, a);
      if constexpr (kTransB)  // B is [n, k]
        LoadTile<T, Cfg::kBN, Cfg::kBK, Cfg::kThreads>(sb, kLdB, b + n0 * p.ldb + k0, p.ldb,
                                                       p.n - n0, p.k - k0, p.b_vec, b);
      else  // B is [k, n]
        LoadTile<T, Cfg::kBK, Cfg::kBN, Cfg::kThreads>(sb, kLdB, b + k0 * p.ldb + n0, p.ldb,
                                                       p.k - k0, p.n - n0, p.b_vec, b);
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
    for (int s = 0; s < Cfg::kStages - 1; ++s) {
      if (s < kblocks) load_stage(s, s);
      CpAsyncCommit();
    }

    for (int kb = 0; kb < kblocks; ++kb) {
      CpAsyncWait<Cfg::kStages - 2>();
      __syncthreads();  // stage kb landed for all; stage kb-1 is free again
      if (kb + Cfg::kStages - 1 < kblocks)
        load_stage((kb + Cfg::kStages - 1) % Cfg::kStages, kb + Cfg::kStages - 1);
      CpAsyncCommit();

      const int stage = kb % Cfg::kStages;
      const T* sa = smem + stage * Cfg::kTileElems;
      const T* sb = smem + (Cfg::kStages + stage) * Cfg::kTileElems;
      if constexpr (sizeof(T) == 2) {
#pragma unroll
        for (int kk = 0; kk < Cfg::kBK; kk += 16) {
          uint32_t af[4][4], bf[4][2];
#pragma unroll
          for (int mi = 0; mi < 4; ++mi) {
            const int mr = wm * Cfg::kWarpM + mi * 16;
            const T* ptr;
            if constexpr (kTransA)
              ptr = sa + (kk + (lane & 7) + (lane >> 4) * 8) * kLdA + mr + ((lane >> 3) & 1) * 8;
            else
              ptr = sa + (mr + (lane & 15)) * kLdA + kk + (lane >> 4) * 8;
            LdMatrixX4<kTransA>(af[mi], SmemAddr(ptr));
          }
#pragma unroll
          for (int nj = 0; nj < 2; ++nj) {
            const int nc = wn * Cfg::kWarpN + nj * 16;
            const int q = lane >> 3;  // matrix q: n block q >> 1, k half q & 1
            const T* ptr;
            if constexpr (kTransB)
              ptr = sb + (nc + (lane & 7) + (q >> 1) * 8) * kLdB + kk + (q & 1) * 8;
            else
              ptr = sb + (kk + (lane & 7) + (q & 1) * 8) * kLdB + nc + (q >> 1) * 8;
            uint32_t r[4];
            LdMatrixX4<!kTransB>(r, SmemAddr(ptr));
            bf[2 * nj][0] = r[0];
            bf[2 * nj][1] = r[1];
            bf[2 * nj + 1][0] = r[2];
            bf[2 * nj + 1][1] = r[3];
          }
#pragma unroll
          for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) Mma<T>(acc[mi][ni], af[mi], bf[ni]);
        }
      } else {
        auto at = [&](int m, int k) { return kTransA ? sa[k * kLdA + m] : sa[m * kLdA + k]; };
        auto bt = [&](int k, int n) { return kTransB ? sb[n * kLdB + k] : sb[k * kLdB + n]; };
#pragma unroll
        for (int kk = 0; kk < Cfg::kBK; kk += 8) {
          uint32_t af[4][4], bf[4][2];
#pragma unroll
          for (int mi = 0; mi < 4; ++mi) {
            const int mr = wm * Cfg::kWarpM + mi * 16 + g;
            af[mi][0] = ToTf32(at(mr, kk + t));
            af[mi][1] = ToTf32(at(mr + 8, kk + t));
            af[mi][2] = ToTf32(at(mr, kk + t + 4));
            af[mi][3] = ToTf32(at(mr + 8, kk + t + 4));
          }
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {
            const int nc = wn * Cfg::kWarpN + ni * 8 + g;
            bf[ni][0] = ToTf32(bt(kk + t, nc));
            bf[ni][1] = ToTf32(bt(kk + t + 4, nc));
          }
#pragma unroll
          for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) Mma<T>(acc[mi][ni], af[mi], bf[ni]);
        }
      }
    }
    CpAsyncWait<0>();
    __syncthreads();  // the next tile's prologue reuses the stages

    auto store = [&](auto* c) {
      using Tc = std::remove_pointer_t<decltype(c)>;
      const Tc* cs = BatchCSrc<Tc>(p, bi);
      WithBeta(p.beta, [&](auto beta) {
        constexpr bool kBeta = decltype(beta)::value;
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {
            const int row = m0 + wm * Cfg::kWarpM + mi * 16 + g;
            const int col = n0 + wn * Cfg::kWarpN + ni * 8 + 2 * t;
            StoreC2<Tc, kBeta>(p, c, cs, row, col, acc[mi][ni][0], acc[mi][ni][1]);
            StoreC2<Tc, kBeta>(p, c, cs, row + 8, col, acc[mi][ni][2], acc[mi][ni][3]);
          }
      });
    };
    if (p.c_type == 0) store(BatchC<float>(p, bi));
    else if constexpr (std::is_same_v<T, __half>) store(BatchC<__half>(p, bi));
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) store(BatchC<__nv_bfloat16>(p, bi));
  }
}

}  // namespace gpucompute::kernels::tc

#endif  // GPUCOMPUTE_KERNELS_SRC_GEMM_TC_MMA_SYNC_CUH_
