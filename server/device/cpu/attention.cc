// Attention on the CPU: for each block of 32 query rows of one (batch,
// head), an online softmax over the visible keys in blocks of 64, one pass
// over K and V, fp32 throughout. The two inner products are compiled for the
// baseline ISA, AVX2 and AVX-512F and chosen at load time.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "server/device/cpu/elements.h"
#include "server/device/cpu/kernels.h"

namespace gpucompute::cpu {
namespace {

// Eight floats as one value (GCC vector extension; two SSE registers on the
// baseline ISA, one AVX register on AVX2).
typedef float Float8 __attribute__((vector_size(32)));
// By reference: a Float8 passed or returned by value changes the ABI
// between the clones.
inline void Load8(Float8& v, const float* p) { std::memcpy(&v, p, sizeof(v)); }
inline void Store8(float* p, const Float8& v) { std::memcpy(p, &v, sizeof(v)); }

constexpr int64_t kQueryBlock = 32;  // query rows per task
constexpr int64_t kKeyBlock = 64;    // keys per step of the online softmax
// Key blocks between two stop checks: for 32 query rows and head_dim 128,
// 67 MFLOP, a few milliseconds.
constexpr int64_t kStopKeyBlocks = 64;
constexpr int64_t kRowGroup = 4;     // query rows sharing each load in the inner loops
constexpr int64_t kColGroup = 16;    // output columns kept in registers per row
static_assert(kQueryBlock % kRowGroup == 0 && kKeyBlock % kColGroup == 0, "");

// The two inner products of a key block, compiled for the baseline ISA, AVX2
// and AVX-512F (chosen at load time by CPU features; AVX-512F measured 1.12x
// over AVX2 for Sq = Skv = 2048, D = 128, 8 heads on the 2-core dev machine).
// (ThreadSanitizer builds get the baseline only: their instrumented ifunc
// resolvers would run before the sanitizer's runtime is up.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define GC_HOT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GC_HOT_CLONES
#endif

// scores[r, j] = sum_c q[r, c] * kt[c, j] for r < rows (a multiple of
// kRowGroup), j < kKeyBlock. q is [rows, d], kt [d, kKeyBlock].
GC_HOT_CLONES void BlockScores(const float* q, const float* kt, int64_t rows, int64_t d,
                               float* scores) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
    for (int64_t j0 = 0; j0 < kKeyBlock; j0 += kColGroup) {
      Float8 acc[kRowGroup][2] = {};
      for (int64_t c = 0; c < d; ++c) {
        Float8 k0, k1;
        Load8(k0, kt + c * kKeyBlock + j0);
        Load8(k1, kt + c * kKeyBlock + j0 + 8);
        for (int64_t r = 0; r < kRowGroup; ++r) {
          const float qc = q[(r0 + r) * d + c];
          acc[r][0] += qc * k0;
          acc[r][1] += qc * k1;
        }
      }
      for (int64_t r = 0; r < kRowGroup; ++r) {
        Store8(scores + (r0 + r) * kKeyBlock + j0, acc[r][0]);
        Store8(scores + (r0 + r) * kKeyBlock + j0 + 8, acc[r][1]);
      }
    }
  }
}

// o[r, :] = o[r, :] * correction[r] + sum_{j < keys} p[r, j] * v[j, :] for
// r < rows (a multiple of kRowGroup). o is [rows, d] (d a multiple of
// kColGroup), p [rows, kKeyBlock], v [keys, d].
GC_HOT_CLONES void BlockUpdate(float* o, const float* p, const float* v, const float* correction,
                               int64_t rows, int64_t keys, int64_t d) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
    for (int64_t c0 = 0; c0 < d; c0 += kColGroup) {
      Float8 acc[kRowGroup][2];
      for (int64_t r = 0; r < kRowGroup; ++r) {
        Load8(acc[r][0], o + (r0 + r) * d + c0);
        Load8(acc[r][1], o + (r0 + r) * d + c0 + 8);
        acc[r][0] *= correction[r0 + r];
        acc[r][1] *= correction[r0 + r];
      }
      for (int64_t j = 0; j < keys; ++j) {
        Float8 v0, v1;
        Load8(v0, v + j * d + c0);
        Load8(v1, v + j * d + c0 + 8);
        for (int64_t r = 0; r < kRowGroup; ++r) {
          const float pj = p[(r0 + r) * kKeyBlock + j];
          acc[r][0] += pj * v0;
          acc[r][1] += pj * v1;
        }
      }
      for (int64_t r = 0; r < kRowGroup; ++r) {
        Store8(o + (r0 + r) * d + c0, acc[r][0]);
        Store8(o + (r0 + r) * d + c0 + 8, acc[r][1]);
      }
    }
  }
}

// Working buffers of one attention task, reused across its blocks.
struct AttentionScratch {
  std::vector<float> q, o, kt, k, v, scores, m, l, correction;
};

// One block of query rows [i0, i1) of one (batch, head): online softmax over
// the visible keys in blocks of kKeyBlock, one pass over K and V. Returns
// without writing once `stop` says so (asked every kStopKeyBlocks).
void AttentionBlock(const AttentionSpec& s, int64_t bh, int64_t i0, int64_t i1, void* o_out,
                    float* lse_out, AttentionScratch& w, ShardStop& stop) {
  const DType dt = s.dtype;
  const int64_t skv = s.seq_kv, sq = s.seq_q;
  const int64_t b = bh / s.heads_q, h = bh % s.heads_q;
  const int64_t hk = h / (s.heads_q / s.heads_kv);
  const int64_t br = i1 - i0;
  const int64_t rows = CeilDiv(br, kRowGroup) * kRowGroup;  // padded
  // Head dim padded to whole column groups (zeros contribute nothing).
  const int64_t d_in = s.head_dim, d = CeilDiv(d_in, kColGroup) * kColGroup;
  const void* q = ElementAt(s.q.data, dt, bh * sq * d_in);
  const void* k = ElementAt(s.k.data, dt, (b * s.heads_kv + hk) * skv * d_in);
  const void* v = ElementAt(s.v.data, dt, (b * s.heads_kv + hk) * skv * d_in);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  w.q.assign(size_t(rows * d), 0.0f);
  w.o.assign(size_t(rows * d), 0.0f);
  w.kt.assign(size_t(d * kKeyBlock), 0.0f);
  w.k.resize(size_t(kKeyBlock * d_in));
  w.v.assign(size_t(kKeyBlock * d), 0.0f);
  w.scores.assign(size_t(rows * kKeyBlock), 0.0f);
  w.m.assign(size_t(rows), kNegInf);
  w.l.assign(size_t(rows), 0.0f);
  w.correction.assign(size_t(rows), 1.0f);
  const float scale = static_cast<float>(s.scale);
  for (int64_t r = 0; r < br; ++r) {
    float* qr = w.q.data() + r * d;
    ToFloat(dt, ElementAt(q, dt, (i0 + r) * d_in), qr, d_in);
    for (int64_t c = 0; c < d_in; ++c) qr[c] *= scale;
  }
  // Keys visible to query row i: [0, end(i)).
  auto visible_end = [&](int64_t i) -> int64_t {
    if (!s.causal) return skv;
    return std::clamp<int64_t>(i + skv - sq + 1, 0, skv);
  };
  const int64_t max_end = visible_end(i1 - 1);
  for (int64_t j0 = 0; j0 < max_end; j0 += kKeyBlock) {
    if (j0 % (kStopKeyBlocks * kKeyBlock) == 0 && stop.Stop()) return;
    const int64_t jn = std::min(kKeyBlock, max_end - j0);
    ToFloat(dt, ElementAt(k, dt, j0 * d_in), w.k.data(), jn * d_in);
    for (int64_t j = 0; j < jn; ++j) {
      for (int64_t c = 0; c < d_in; ++c) w.kt[c * kKeyBlock + j] = w.k[j * d_in + c];
      ToFloat(dt, ElementAt(v, dt, (j0 + j) * d_in), w.v.data() + j * d, d_in);
    }
    BlockScores(w.q.data(), w.kt.data(), rows, d, w.scores.data());
    // Scores -> probabilities in place, with the running max and sum.
    for (int64_t r = 0; r < rows; ++r) {
      float* p = w.scores.data() + r * kKeyBlock;
      const int64_t valid = r < br ? std::clamp<int64_t>(visible_end(i0 + r) - j0, 0, jn) : 0;
      float block_max = kNegInf;
      for (int64_t j = 0; j < valid; ++j) block_max = std::max(block_max, p[j]);
      // std::max passes a NaN score by; exp of it makes the sum NaN, and
      // the row comes out NaN (as PyTorch's SDPA gives it), not empty. A
      // row that has seen only -inf keeps m = -inf and takes 0 as its offset.
      const float m_new = std::max(w.m[r], block_max);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;
      const float correction = std::exp(w.m[r] - m_use);
      float sum = 0.0f;
      for (int64_t j = 0; j < valid; ++j) {
        p[j] = std::exp(p[j] - m_use);
        sum += p[j];
      }
      std::fill(p + valid, p + kKeyBlock, 0.0f);
      w.l[r] = w.l[r] * correction + sum;
      w.m[r] = m_new;
      w.correction[r] = correction;
    }
    BlockUpdate(w.o.data(), w.scores.data(), w.v.data(), w.correction.data(), rows, jn, d);
  }
  const DType out_dtype = s.options.output_dtype;
  for (int64_t r = 0; r < br; ++r) {
    float* orow = w.o.data() + r * d;
    const bool has_keys = w.l[r] != 0.0f;  // 0: no key seen; NaN: a NaN score
    const float inv = has_keys ? 1.0f / w.l[r] : 0.0f;
    for (int64_t c = 0; c < d_in; ++c) orow[c] = has_keys ? orow[c] * inv : 0.0f;
    FromFloat(out_dtype, orow, ElementAt(o_out, out_dtype, (bh * sq + i0 + r) * d_in), d_in);
    if (lse_out != nullptr) {
      const float m = w.m[r] == kNegInf ? 0.0f : w.m[r];
      lse_out[bh * sq + i0 + r] = has_keys ? m + std::log(w.l[r]) : kNegInf;
    }
  }
}

}  // namespace

void AttentionRows(ThreadPool& pool, const AttentionSpec& spec, Range heads, Range q_rows,
                   void* o_out, float* lse_out, ShardStop& stop) {
  if (heads.size() <= 0 || q_rows.size() <= 0 || spec.head_dim <= 0) return;
  const int64_t q_blocks = CeilDiv(q_rows.size(), kQueryBlock);
  pool.ParallelFor(heads.size() * q_blocks, [&](int64_t task) {
    const int64_t bh = heads.begin + task / q_blocks;
    const int64_t i0 = q_rows.begin + (task % q_blocks) * kQueryBlock;
    const int64_t i1 = std::min(q_rows.end, i0 + kQueryBlock);
    thread_local AttentionScratch scratch;
    AttentionBlock(spec, bh, i0, i1, o_out, lse_out, scratch, stop);
  });
}

}  // namespace gpucompute::cpu
