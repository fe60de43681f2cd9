// Tests of the attention ladder: every version x shape x dtype against a
// float64 CPU reference, fresh random inputs each run, outputs poisoned with
// NaN before each launch.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpucompute/kernels/attention.h"
#include "kernels/src/heuristics/attention_heuristics.h"
#include "tests/kernels/gpu_test_util.h"

namespace gpucompute::testing {
namespace {

using kernels::AttentionArgs;

struct Shape {
  int64_t b, hq, hkv, sq, skv, d;
  bool causal;
  bool big_logits = false;  // |scale q.k| up to ~50
  bool misaligned = false;  // base pointers off 16-byte alignment
  bool no_lse = false;
  bool out_f32 = false;     // O written as fp32 (AttentionArgs::out_f32)
  // K's rows scaled up along the keys (x0.25 at the first, x1.25 at the
  // last) on top of big_logits: each row's maximum climbs block after block,
  // by less than the softmax's lag (P past 1) and by more (O rescaled).
  bool ramp_keys = false;
  // A NaN in one element of a key (the last batch's first kv head, key
  // skv / 2) and of a query row (batch 0, the last head, row sq / 3): every
  // row that sees that key, and that query row, is NaN (O and LSE) in
  // float64 and in PyTorch's SDPA; the output is poisoned with finite bytes.
  bool nan_inputs = false;
};

struct Case {
  std::string variant;  // "" runs the default (heuristics' choice)
  Shape s;
  DType dtype;
};

std::string Describe(const Case& c) {
  const Shape& s = c.s;
  std::string n = (c.variant.empty() ? "default" : c.variant) + "_B" + std::to_string(s.b) + "_H" +
                  std::to_string(s.hq) + "x" + std::to_string(s.hkv) + "_Sq" +
                  std::to_string(s.sq) + "_Skv" + std::to_string(s.skv) + "_D" +
                  std::to_string(s.d) + (s.causal ? "_causal" : "") + (s.big_logits ? "_big" : "") +
                  (s.ramp_keys ? "_ramp" : "") + (s.misaligned ? "_misaligned" : "") +
                  (s.no_lse ? "_nolse" : "") + (s.out_f32 ? "_of32" : "") +
                  (s.nan_inputs ? "_nan" : "") + "_" + kernels::DTypeName(c.dtype);
  return n;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return Describe(info.param); }

// Readable parameter in gtest's listings and failure messages.
void PrintTo(const Case& c, std::ostream* os) { *os << Describe(c); }

// Float64 attention of one problem; o [b, hq, sq, d], lse [b, hq, sq].
void CpuAttention(const Shape& s, double scale, const std::vector<double>& q,
                  const std::vector<double>& k, const std::vector<double>& v,
                  std::vector<double>* o, std::vector<double>* lse) {
  const int64_t rows = s.b * s.hq * s.sq;
  o->assign(rows * s.d, 0.0);
  lse->assign(rows, 0.0);
  const int64_t group = s.hq / s.hkv;
  auto work = [&](int64_t row_begin, int64_t row_end) {
    std::vector<double> sc(s.skv);
    for (int64_t row = row_begin; row < row_end; ++row) {
      const int64_t bh = row / s.sq, i = row % s.sq;
      const int64_t bb = bh / s.hq, h = bh % s.hq;
      const int64_t bkv = bb * s.hkv + h / group;
      const double* qr = &q[row * s.d];
      double mx = -std::numeric_limits<double>::infinity();
      bool nan = false;  // a NaN score: the row is NaN
      for (int64_t j = 0; j < s.skv; ++j) {
        if (s.causal && j > i + s.skv - s.sq) {
          sc[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const double* kr = &k[(bkv * s.skv + j) * s.d];
        double acc = 0;
        for (int64_t d = 0; d < s.d; ++d) acc += qr[d] * kr[d];
        sc[j] = acc * scale;
        nan = nan || std::isnan(sc[j]);
        mx = std::max(mx, sc[j]);
      }
      double* orow = &(*o)[row * s.d];
      if (nan) {
        for (int64_t d = 0; d < s.d; ++d) orow[d] = std::numeric_limits<double>::quiet_NaN();
        (*lse)[row] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      if (std::isinf(mx)) {
        (*lse)[row] = -std::numeric_limits<double>::infinity();
        continue;
      }
      double sum = 0;
      for (int64_t j = 0; j < s.skv; ++j) {
        if (std::isinf(sc[j])) continue;
        const double p = std::exp(sc[j] - mx);
        sum += p;
        const double* vr = &v[(bkv * s.skv + j) * s.d];
        for (int64_t d = 0; d < s.d; ++d) orow[d] += p * vr[d];
      }
      for (int64_t d = 0; d < s.d; ++d) orow[d] /= sum;
      (*lse)[row] = mx + std::log(sum);
    }
  };
  const int64_t nt =
      std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), 32));
  std::vector<std::thread> threads;
  const int64_t per = (rows + nt - 1) / nt;
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t a = t * per, e = std::min(rows, a + per);
    if (a < e) threads.emplace_back(work, a, e);
  }
  for (auto& th : threads) th.join();
}

// Tolerances: bf16/fp16 outputs are rounded once and P is rounded to the
// 16-bit type for the second GEMM; the tensor-core versions round fp32 inputs
// to bf16 on load. `ran`: the version that runs (the default resolved).
struct Tol {
  double atol, rtol, lse_atol;
};
Tol TolFor(std::string_view ran, DType dtype) {
  const bool tc = ran != "reference";
  if (dtype == DType::kBF16) return {1.2e-2, 2e-2, 2e-3};
  if (dtype == DType::kF16) return {2.5e-3, 5e-3, 2e-3};
  if (tc) return {1.5e-2, 3e-2, 3e-2};
  return {2e-5, 1e-4, 1e-4};
}

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, MatchesFloat64Reference) {
  GC_REQUIRE_GPU();
  const Case& c = GetParam();
  const Shape& s = c.s;
  const size_t es = kernels::DTypeSize(c.dtype);
  const size_t nq = s.b * s.hq * s.sq * s.d, nkv = s.b * s.hkv * s.skv * s.d;
  const bool big = s.big_logits || s.ramp_keys;
  const double lim = big ? 2.0 : 1.0;
  HostData hq = RandomHost(nq, c.dtype, -lim, lim);
  HostData hk = RandomHost(nkv, c.dtype, -lim, lim);
  if (s.ramp_keys) {
    for (size_t i = 0; i < nkv; ++i) {
      const int64_t key = int64_t(i / s.d) % s.skv;
      StoreHost(hk.bytes.data(), i, c.dtype, hk.values[i] * (0.25 + double(key) / s.skv));
      hk.values[i] = LoadHost(hk.bytes.data(), i, c.dtype);
    }
  }
  if (s.nan_inputs) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const size_t kr = size_t(((s.b - 1) * s.hkv * s.skv + s.skv / 2) * s.d);
    const size_t qr = size_t(((s.hq - 1) * s.sq + s.sq / 3) * s.d);
    StoreHost(hk.bytes.data(), kr + 1, c.dtype, nan);
    hk.values[kr + 1] = LoadHost(hk.bytes.data(), kr + 1, c.dtype);
    StoreHost(hq.bytes.data(), qr, c.dtype, nan);
    hq.values[qr] = LoadHost(hq.bytes.data(), qr, c.dtype);
    ASSERT_TRUE(std::isnan(hk.values[kr + 1]) && std::isnan(hq.values[qr]));
  }
  HostData hv = RandomHost(nkv, c.dtype, -1, 1);
  const size_t off = s.misaligned ? es : 0;
  const DType out_t = s.out_f32 ? DType::kF32 : c.dtype;
  const size_t eo = kernels::DTypeSize(out_t);
  DeviceArray dq(nq * es, off), dk(nkv * es, off), dv(nkv * es, off), dout(nq * eo, off);
  DeviceArray dlse(s.b * s.hq * s.sq * sizeof(float));
  dq.Upload(hq.bytes.data());
  dk.Upload(hk.bytes.data());
  dv.Upload(hv.bytes.data());
  // NaN bytes would hide an unwritten NaN row: 0x3C is finite in every
  // dtype (about 1.06 as fp16, 0.0115 as bf16 and fp32).
  const uint8_t poison = s.nan_inputs ? 0x3C : 0xFF;
  dout.Poison(poison);
  dlse.Poison(poison);

  // A failed allocation (a context broken by an earlier test) is a failure,
  // not a refusal.
  ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok() && dlse.ok())
      << "device allocation failed: " << cudaGetErrorString(cudaGetLastError());

  AttentionArgs a;
  a.q = dq.get();
  a.k = dk.get();
  a.v = dv.get();
  a.o = dout.get();
  a.lse = s.no_lse ? nullptr : dlse.as<float>();
  a.batch = s.b;
  a.heads_q = s.hq;
  a.heads_kv = s.hkv;
  a.seq_q = s.sq;
  a.seq_kv = s.skv;
  a.head_dim = s.d;
  a.dtype = c.dtype;
  a.causal = s.causal;
  a.scale = big ? 1.0f : 0.f;
  a.out_f32 = s.out_f32;
  const kernels::Support ok = kernels::CanImplementAttention(a, c.variant);
  if (!ok) GTEST_SKIP() << "refused: " << ok.reason;
  const std::string ran(kernels::AttentionVariantName(a, c.variant));
  if (c.dtype == DType::kF32 && big && ran != "reference")
    GTEST_SKIP() << "fp32 inputs are rounded to bf16 by the tensor-core versions; logits of "
                    "~50 magnify that rounding beyond an fp32 tolerance";

  const size_t ws = kernels::AttentionWorkspaceBytes(a, c.variant);
  DeviceArray dws(ws);
  dws.Poison();
  GC_ASSERT_CUDA(kernels::LaunchAttention(a, c.variant, ws ? dws.get() : nullptr, nullptr));
  GC_ASSERT_CUDA(cudaDeviceSynchronize());

  std::vector<double> ref_o, ref_lse;
  const double scale = big ? 1.0 : 1.0 / std::sqrt(double(s.d));
  CpuAttention(s, scale, hq.values, hk.values, hv.values, &ref_o, &ref_lse);

  std::vector<uint8_t> got(nq * eo);
  dout.Download(got.data());
  const Tol tol = TolFor(ran, c.dtype);
  EXPECT_TRUE(AllClose(got.data(), out_t, ref_o, tol.atol, tol.rtol)) << "output " << ran;
  if (!s.no_lse) {
    std::vector<float> got_lse(s.b * s.hq * s.sq);
    dlse.Download(got_lse.data());
    EXPECT_TRUE(AllClose(got_lse.data(), DType::kF32, ref_lse, tol.lse_atol, 1e-4)) << "lse";
  }
}

std::vector<Case> AllCases() {
  const std::vector<Shape> shapes = {
      {1, 1, 1, 1, 1, 64, false},
      {1, 2, 1, 1, 1, 128, true},
      {2, 2, 2, 17, 17, 64, true},
      {2, 2, 2, 17, 17, 128, false, false, false, true},
      {1, 4, 1, 17, 1000, 64, true},   // GQA 4, short queries against long keys
      {1, 8, 1, 1000, 17, 128, true},  // MQA 8, Sq > Skv: most rows see no key
      {1, 2, 2, 1000, 1000, 128, false},
      {1, 4, 4, 128, 128, 64, true},  // exact tiles
      {1, 2, 1, 300, 555, 128, true},
      {2, 8, 1, 16, 4097, 128, false},  // decode-like, key splits
      {1, 32, 8, 1, 2048, 64, false},   // decode, GQA 4
      {2, 8, 2, 3, 1000, 64, true},     // decode tile, causal, packed heads
      {1, 4, 2, 8, 4097, 128, true},    // decode tile, causal, key splits
      {1, 1, 1, 4097, 4097, 64, true},
      {1, 2, 2, 4097, 1000, 128, true},
      {1, 4, 4, 1000, 4097, 64, false},
      {1, 2, 1, 1000, 1000, 64, true, true},
      {1, 2, 2, 333, 2000, 128, false, true},
      {1, 2, 2, 100, 100, 64, false, false, true},
      // Head dims other than 64 and 128 (tiles padded to 64, 128 or 256).
      {1, 2, 2, 300, 555, 96, true},
      {1, 4, 1, 17, 1000, 40, false},  // short query block, key splits
      {2, 2, 2, 129, 129, 200, true},
      {1, 8, 2, 1, 2048, 96, false},  // decode tile
      {1, 2, 2, 1000, 1000, 256, false},
      {1, 2, 1, 4, 3000, 256, true},  // decode tile, key splits
      {1, 2, 2, 200, 200, 8, true},
      {1, 4, 2, 1000, 300, 160, true},  // Sq > Skv: leading rows see no key
      {1, 2, 2, 700, 700, 136, false},  // flash_wgmma's 192-wide tile
      {2, 4, 2, 300, 1000, 192, true},
      // The last round of a persistent grid dealt out by key blocks (tail
      // pieces merged by LSE; on 132 SMs): 9 tiles of 9 blocks, one piece a
      // block; 29 tiles of 15 176-key blocks, runs of 4 that cross tiles,
      // partial query and key blocks, fp32 O; 11 192-row tiles (three
      // consumers) of 23 blocks, runs of 2; 4 tiles of 4 blocks, most SMs
      // idle. Also {1, 28, 4, 520, 520, 256} below (one Q slot).
      {3, 15, 5, 1100, 1100, 96, false},
      {1, 23, 23, 777, 2500, 128, false, false, false, false, true},
      {1, 13, 13, 2100, 2900, 64, false},
      {7, 19, 19, 512, 512, 64, false, false, false, true},
      // More work tiles than SMs: the persistent grid's blocks take several.
      {4, 16, 4, 600, 600, 64, true},
      {2, 8, 8, 2048, 2048, 64, false},  // three consumer warpgroups
      {2, 16, 4, 1000, 1000, 128, true},
      {1, 28, 4, 520, 520, 256, false},  // head_dim 256 persistent: one Q slot
      {2, 16, 2, 1000, 300, 128, true},  // causal, fed by the counter; 700 rows see no key
      {48, 16, 4, 1, 1024, 64, false},   // decode blocks past one wave: split to fill waves
      // Decode-like: many key splits (merged over 4 warps each, some splits
      // empty under the mask), odd key counts, D 48 (zero-filled columns),
      // 16 and 64 packed rows, rows that see no key.
      {1, 8, 1, 1, 50001, 128, false},
      {3, 12, 4, 1, 3001, 64, false},
      {2, 8, 2, 1, 1500, 48, false},
      {2, 16, 2, 2, 777, 256, true},
      {1, 4, 1, 16, 2000, 128, true},
      {64, 8, 2, 1, 300, 128, false},
      {1, 4, 2, 20, 10, 64, true},  // 10 keys, 20 rows: the first 10 see none
      // Decode tiles as narrow as D allows (multiples of 32: 32, 96, 160, 192
      // and 224 wide, zero-filled past D 16, 24, 80, 184 and 232; the
      // three-stage ring at 32; four or two warps from 224), with key splits,
      // the mask, fp32 O.
      {3, 16, 4, 1, 5000, 32, false},
      {2, 8, 1, 2, 3001, 16, true},
      {1, 4, 2, 3, 777, 24, false, false, false, false, true},
      {2, 8, 2, 1, 3001, 80, false},
      {1, 16, 16, 1, 1500, 96, false},  // no grouping: one row of the 16 used
      {2, 8, 2, 2, 2049, 160, true},
      {1, 8, 1, 1, 4000, 184, false, false, false, false, true},
      {3, 4, 2, 1, 777, 224, false},
      {1, 8, 1, 1, 20000, 256, false},   // many key splits
      {8, 16, 16, 1, 3500, 232, false},  // two-warp blocks: 128 blocks x 3500 keys
      {140, 2, 1, 1, 300, 200, false},   // two-warp blocks: more blocks than SMs
      // Short key runs on many tiles (persistent grids, the producer up to
      // three tiles ahead on four Q slots): 64-key tiles at padded head dims
      // 64 and 128 (D 104 zero-filled, fp32 O); 128-key tiles under the
      // mask, with three consumers, and of 100 and 120 keys.
      {8, 16, 4, 1000, 50, 64, false},
      {4, 14, 7, 700, 16, 128, false},
      {3, 16, 4, 513, 64, 104, false, false, false, false, true},
      {4, 8, 2, 600, 40, 64, true},
      {1, 40, 8, 2100, 100, 64, false},
      {6, 16, 4, 900, 100, 64, false},
      {4, 8, 8, 700, 120, 128, false},
      // Key splits merged a warp per row: 6.5k rows of 2 splits.
      {1, 2, 1, 3248, 512, 80, false},
      // O written as fp32.
      {1, 2, 2, 300, 555, 128, true, false, false, false, true},
      {1, 8, 2, 3, 1000, 64, false, false, false, false, true},
      {2, 2, 1, 1000, 1000, 96, false, false, false, true, true},
      // Maxima that climb along the keys (the softmax's lag both ways): the
      // wgmma tile with and without the mask, key splits, the decode tile.
      {1, 4, 2, 300, 4097, 64, false, false, false, false, false, true},
      {1, 2, 2, 1000, 3000, 128, true, false, false, false, false, true},
      {1, 8, 1, 1, 5000, 128, false, false, false, false, false, true},
      {2, 8, 2, 40, 2000, 96, true, false, false, false, false, true},
      // NaN inputs: the wgmma and mma tiles with and without the mask, a
      // persistent grid's tail pieces, key splits merged by a block and by a
      // warp per row, the decode tile, the 64-key tile.
      {1, 4, 2, 300, 555, 128, true, false, false, false, false, false, true},
      {1, 13, 13, 2100, 2900, 64, false, false, false, false, false, false, true},
      {1, 8, 1, 1, 50001, 128, false, false, false, false, false, false, true},
      {1, 2, 1, 3248, 512, 80, false, false, false, false, false, false, true},
      {2, 8, 2, 3, 1000, 64, true, false, false, false, false, false, true},
      {8, 16, 4, 1000, 50, 64, false, false, false, false, false, false, true},
  };
  std::vector<Case> cases;
  std::vector<std::string> variants = kernels::AttentionVariants();
  variants.push_back("");  // the default, as the service runs it
  for (const std::string& v : variants)
    for (const Shape& s : shapes)
      for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) cases.push_back({v, s, t});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ladder, AttentionTest, ::testing::ValuesIn(AllCases()), CaseName);

TEST(AttentionArgsTest, RefusesBadArguments) {
  AttentionArgs a;
  int dummy[4];
  a.q = a.k = a.v = dummy;
  a.o = dummy;
  a.batch = 1;
  a.heads_q = 3;
  a.heads_kv = 2;
  a.seq_q = a.seq_kv = 8;
  a.head_dim = 64;
  EXPECT_FALSE(kernels::CanImplementAttention(a, "reference"));  // 3 % 2 != 0
  a.heads_q = 4;
  EXPECT_FALSE(kernels::CanImplementAttention(a, "no_such_version"));
  EXPECT_EQ(kernels::LaunchAttention(a, "no_such_version", nullptr, nullptr),
            cudaErrorInvalidValue);
  a.head_dim = 84;  // not a multiple of 8
  EXPECT_FALSE(kernels::CanImplementAttention(a, "flash_mma"));
  a.head_dim = 264;
  EXPECT_FALSE(kernels::CanImplementAttention(a, "flash_mma"));
  EXPECT_TRUE(kernels::CanImplementAttention(a, "reference"));
  a.head_dim = 80;
  EXPECT_TRUE(kernels::CanImplementAttention(a, "flash_mma"));
  EXPECT_EQ(kernels::AttentionVariantName(a, "flash_mma"), "flash_mma");
  EXPECT_FALSE(kernels::AttentionVariantName(a, "").empty());
}

// The default's choice between flash_mma and flash_wgmma_overlap
// (heuristics/attention_heuristics.h), host only: flash_mma while seq_q is at
// most 16, or 24 with 8 or more query heads per kv head.
TEST(AttentionVariant, QueryRowsPerKvHeadPickTheTile) {
  kernels::AttentionShape s;
  s.batch = 8;
  s.heads_q = 32;
  s.heads_kv = 8;  // 4 query heads per kv head: flash_mma up to seq_q 16
  s.seq_kv = 32768;
  s.head_dim = s.wgmma_head_dim = 128;
  s.causal = true;
  s.wgmma_ok = s.mma_ok = true;
  for (int64_t sq : {1, 4, 16}) {
    s.seq_q = sq;
    EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "flash_mma") << sq;
  }
  for (int64_t sq : {17, 24, 32, 64, 127, 128, 4096}) {  // short chunks and prefill
    s.seq_q = sq;
    EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "flash_wgmma_overlap") << sq;
  }
  s.heads_kv = 4;  // 8 per kv head: flash_mma up to 24 (K and V read once for 8 heads)
  for (int64_t sq : {8, 16, 24}) {
    s.seq_q = sq;
    EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "flash_mma") << sq;
  }
  s.seq_q = 25;
  EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "flash_wgmma_overlap");
  s.heads_kv = 32;  // no grouping: flash_mma up to 16 rows
  s.seq_q = 16;
  EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "flash_mma");
  s.seq_q = 17;
  EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "flash_wgmma_overlap");
  s.wgmma_ok = false;  // fp32 inputs, no sm_90: flash_mma at any length
  EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "flash_mma");
  s.mma_ok = false;
  EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "reference");
  s.wgmma_ok = true;  // only flash_wgmma takes them: it runs at any length
  s.seq_q = 1;
  EXPECT_STREQ(kernels::ChooseAttentionVariant(s), "flash_wgmma_overlap");
}

// flash_mma's decode tile from 224 columns on (heuristics, host only): two
// warps a block where the blocks reach the SMs or the cache is long, else
// four.
TEST(AttentionVariant, WideDecodeTilesTakeTwoWarpsWhereTheWorkFillsTheirBlockSlots) {
  using kernels::DecodeWarps;
  EXPECT_EQ(DecodeWarps(192, 1000, 100000, 132), 4);  // up to 192 wide: four
  EXPECT_EQ(DecodeWarps(224, 336, 1024, 132), 2);     // blocks past the SMs
  EXPECT_EQ(DecodeWarps(224, 72, 8192, 132), 2);      // 590k blocks x keys
  EXPECT_EQ(DecodeWarps(256, 4, 16384, 132), 4);      // 65k: four
  EXPECT_EQ(DecodeWarps(256, 25, 13772, 132), 4);     // 344k: four
  // The merge of key splits: a warp per row from 4 rows per SM.
  EXPECT_TRUE(kernels::MergeByWarps(6496, 132));
  EXPECT_FALSE(kernels::MergeByWarps(16, 132));
  EXPECT_FALSE(kernels::MergeByWarps(527, 132));
  EXPECT_TRUE(kernels::MergeByWarps(528, 132));
}

// The shortest key split of flash_mma's decode tile under one wave
// (heuristics), host only: four key blocks where the grid keeps a block per
// SM with splits that long, else one.
TEST(AttentionVariant, DecodeSplitsRunLongerWhereTheGridStillFillsTheSms) {
  using kernels::DecodeMinSplitBlocks;
  EXPECT_EQ(DecodeMinSplitBlocks(16, 49, 128, 132), 4);  // B2 H64/8 Skv8192 D64: 16 x 32
  EXPECT_EQ(DecodeMinSplitBlocks(5, 158, 128, 132), 4);  // 5 x 32 blocks
  EXPECT_EQ(DecodeMinSplitBlocks(48, 8, 8, 132), 1);     // B12 H32/4 Skv512 D128: 48 x 2
  EXPECT_EQ(DecodeMinSplitBlocks(8, 49, 64, 132), 1);    // 8 x 16 = 128 < 132
  EXPECT_EQ(DecodeMinSplitBlocks(33, 4, 64, 132), 4);    // want bounds it: 33 x 4
  EXPECT_EQ(DecodeMinSplitBlocks(33, 4, 64, 144), 1);    // the same on 144 SMs
  EXPECT_EQ(DecodeMinSplitBlocks(100, 7, 3, 132), 1);    // under four blocks: no long split
}

// Key splits of flash_wgmma (heuristics), host only: about one wave up to
// half the SMs; past half, the count whose busiest SM walks the fewest key
// blocks with each split's fixed cost (two blocks) counted.
TEST(AttentionVariant, WgmmaSplitsFillTheSmsTheTilesLeaveIdle) {
  using kernels::WgmmaKeySplits;
  EXPECT_EQ(WgmmaKeySplits(132, 256, 132), 1);  // a tile per SM
  EXPECT_EQ(WgmmaKeySplits(32, 256, 132), 4);   // 128 of 132 SMs in one wave
  EXPECT_EQ(WgmmaKeySplits(48, 64, 132), 2);    // under half: one wave
  EXPECT_EQ(WgmmaKeySplits(1, 1024, 132), 64);  // at most 64
  EXPECT_EQ(WgmmaKeySplits(16, 11, 132), 5);    // two key blocks a split at least
  EXPECT_EQ(WgmmaKeySplits(8, 3, 132), 1);      // under four key blocks: none
  // Past half the SMs (one split a tile was the only wave).
  EXPECT_EQ(WgmmaKeySplits(80, 256, 132), 8);    // five rounds of 32 blocks: 170 against 258
  EXPECT_EQ(WgmmaKeySplits(88, 32, 132), 3);     // two rounds of 11: 26 against 34
  EXPECT_EQ(WgmmaKeySplits(104, 14, 132), 1);    // short splits: their fixed cost outweighs
  EXPECT_EQ(WgmmaKeySplits(131, 1000, 132), 1);  // one SM idle: two rounds cost as much
}

// flash_wgmma's key tile (heuristics), host only: 64 keys where the keys fit
// one such tile without the mask at padded head dims 64 and 128 with two
// consumers; 176 for long unmasked rows at 128; else the head dim's default.
TEST(AttentionVariant, ShortKeyRunsTakeTheNarrowKeyTile) {
  using kernels::WgmmaKeyTile;
  auto shape = [](int64_t sq, int64_t skv, int kd, bool causal) {
    kernels::AttentionShape s;
    s.seq_q = sq;
    s.seq_kv = skv;
    s.head_dim = kd;
    s.wgmma_head_dim = kd;
    s.causal = causal;
    return s;
  };
  EXPECT_EQ(WgmmaKeyTile(shape(1172, 64, 64, false)), 64);
  EXPECT_EQ(WgmmaKeyTile(shape(512, 16, 128, false)), 64);
  EXPECT_EQ(WgmmaKeyTile(shape(512, 65, 128, false)), 0);  // two 64-key blocks: the default
  EXPECT_EQ(WgmmaKeyTile(shape(512, 64, 128, true)), 0);   // under the mask
  EXPECT_EQ(WgmmaKeyTile(shape(4096, 16, 64, false)), 0);  // three consumers (192 rows)
  EXPECT_EQ(WgmmaKeyTile(shape(348, 64, 192, false)), 0);  // 96 keys at 192
  EXPECT_EQ(WgmmaKeyTile(shape(2048, 2048, 128, false)), 176);
}

// The tail split of flash_wgmma's persistent grid (heuristics), host only:
// the key blocks each SM takes in the last round where the blocks it saves
// outweigh the tail tiles' rows (450 rows a block, two blocks at least); 0
// where the round is whole or kept.
TEST(AttentionVariant, TheLastRoundIsDealtOutWhereItSavesMoreThanItsMerge) {
  using kernels::WgmmaTailBlocks;
  EXPECT_EQ(WgmmaTailBlocks(4096, 4, 128, 132, false), 1);    // 4 tiles left: 1 block of 4
  EXPECT_EQ(WgmmaTailBlocks(2048, 94, 128, 132, false), 49);  // 68 left: 49 of 94
  EXPECT_EQ(WgmmaTailBlocks(2816, 32, 192, 132, false), 11);  // 44 192-row tiles: 11 of 32
  EXPECT_EQ(WgmmaTailBlocks(2048, 8, 128, 132, false), 0);    // 68 left: 5 of 8, 8.7k rows
  EXPECT_EQ(WgmmaTailBlocks(704, 16, 192, 132, false), 0);    // 44 left: 6 of 16, 8.4k rows
  EXPECT_EQ(WgmmaTailBlocks(144, 3, 128, 132, false), 0);     // 12 left: 1 of 3
  EXPECT_EQ(WgmmaTailBlocks(4096, 1, 128, 132, false), 0);    // one key block a tile
  EXPECT_EQ(WgmmaTailBlocks(264, 8, 128, 132, false), 0);     // two whole rounds
  EXPECT_EQ(WgmmaTailBlocks(100, 8, 128, 132, false), 0);     // one partial round
  EXPECT_EQ(WgmmaTailBlocks(4096, 4, 128, 132, true), 0);     // causal: the counter
  EXPECT_EQ(WgmmaTailBlocks(460, 16, 128, 114, false), 1);    // 114 SMs: 4 left, 1 of 16
}

}  // namespace
}  // namespace gpucompute::testing
