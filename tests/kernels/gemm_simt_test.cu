// Tests of the gemm_simt ladder: every version x shape x transpose against a
// float64 CPU reference, with fresh random inputs each run.
//
// Each output is checked against |got - ref| <= 16 u (|alpha| S + |beta c0|) with
// u = 2^-24 and S = sum_p |a_ip b_pj| (the scale of fp32 accumulation error;
// a missing or doubled k-tile, a wrong element or a NaN fails it by orders of
// magnitude). beta = 0 cases poison C with NaN first; padding columns of C
// must come back untouched. Large shapes check sampled full rows and columns
// (the first and last included, so every edge tile is seen).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpucompute/kernels/gemm.h"
#include "tests/kernels/gpu_test_util.h"

namespace gpucompute::testing {
namespace {

using kernels::GemmArgs;

struct GemmCase {
  const char* label;  // extra name part ("" for plain cases)
  int64_t m, n, k;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1;
  float alpha = 1.f, beta = 0.f;
  int64_t pad = 0;          // extra elements per row of A, B and C
  size_t offset_bytes = 0;  // base pointers shifted by this many bytes
  bool share_a = false;     // stride_a = 0 (one A for the whole batch)
  bool share_b = false;     // stride_b = 0
  bool c_apart = false;     // beta * C read from its own buffer (c_in), C poisoned
};

std::string CaseName(const GemmCase& c) {
  std::string s = "M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_K" +
                  std::to_string(c.k) + "_" + (c.trans_a ? "T" : "N") + (c.trans_b ? "T" : "N");
  if (c.label[0]) s += std::string("_") + c.label;
  return s + "_f32";
}

std::vector<GemmCase> Cases() {
  std::vector<GemmCase> cases;
  // 4095x4093x67 is where the dispatcher picks the largest (256x128) tile.
  const int64_t shapes[][3] = {{1, 1, 1},         {7, 13, 5},       {127, 129, 31},
                               {1000, 3000, 777}, {4095, 4093, 67}, {4097, 4095, 4099}};
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t) {
      GemmCase c{"", s[0], s[1], s[2]};
      c.trans_a = t & 2;
      c.trans_b = t & 1;
      cases.push_back(c);
    }
  // alpha/beta with padded leading dimensions.
  for (bool t : {false, true}) {
    GemmCase c{"alphabeta_pad", 127, 129, 31, t, t};
    c.alpha = 0.75f, c.beta = -0.5f, c.pad = 3;
    cases.push_back(c);
  }
  // Strided batch; a stride of 0 shares an operand.
  {
    GemmCase c{"batch3_sharedA", 65, 70, 33, false, true, 3};
    c.alpha = 1.25f, c.beta = 0.5f, c.pad = 5, c.share_a = true;
    cases.push_back(c);
    GemmCase d{"batch3_sharedB", 65, 70, 33, true, false, 3};
    d.pad = 2, d.share_b = true;
    cases.push_back(d);
  }
  // Misaligned base pointers (the 16-byte paths must fall back).
  for (bool t : {false, true}) {
    GemmCase c{"offset4", 130, 131, 67, t, false};
    c.beta = 0.5f, c.offset_bytes = 4;
    cases.push_back(c);
  }
  // C read from c_in (the addend fused, no copy into C): strided batch, and
  // the split-K partials' reduction.
  {
    GemmCase c{"cin_batch3", 65, 70, 33, false, true, 3};
    c.alpha = 0.5f, c.beta = 2.f, c.pad = 1, c.c_apart = true;
    cases.push_back(c);
    GemmCase d{"cin_longk", 64, 96, 16384};
    d.beta = -1.f, d.c_apart = true;
    cases.push_back(d);
  }
  // Long K: fp32 accumulation over 16384 terms.
  for (bool t : {false, true}) cases.push_back(GemmCase{"", 64, 96, 16384, t, false});
  // Whole tiles only.
  cases.push_back(GemmCase{"", 256, 256, 64});
  // Rows off 16 bytes in problems large enough to be copied with padded
  // rows first: a strided batch (one copy per entry), a shared operand, an
  // unaligned base.
  for (bool t : {false, true}) {
    GemmCase c{"padcopy_batch3", 515, 517, 519, t, !t, 3};
    c.pad = 3, c.beta = 0.5f, c.share_b = t;
    cases.push_back(c);
  }
  {
    GemmCase c{"padcopy_offset4", 601, 603, 605, true, true};
    c.offset_bytes = 4, c.alpha = -1.5f;
    cases.push_back(c);
  }
  return cases;
}

// Host inputs, cached by (tag, count) so that the large shapes are generated
// once per run (fresh each run) and shared by every variant.
const HostData& CachedRandom(const std::string& tag, size_t count) {
  static std::map<std::pair<std::string, size_t>, std::unique_ptr<HostData>> cache;
  auto& slot = cache[{tag, count}];
  if (!slot) slot = std::make_unique<HostData>(RandomHost(count, DType::kF32));
  return *slot;
}

// Geometry of one case: leading dimensions, strides and element counts.
struct Layout {
  int64_t lda, ldb, ldc, stride_a, stride_b, stride_c, count_a, count_b, count_c;
};

Layout MakeLayout(const GemmCase& c) {
  Layout l;
  l.lda = (c.trans_a ? c.m : c.k) + c.pad;
  l.ldb = (c.trans_b ? c.k : c.n) + c.pad;
  l.ldc = c.n + c.pad;
  const int64_t rows_a = c.trans_a ? c.k : c.m, rows_b = c.trans_b ? c.n : c.k;
  l.stride_a = c.share_a ? 0 : rows_a * l.lda + c.pad;
  l.stride_b = c.share_b ? 0 : rows_b * l.ldb + c.pad;
  l.stride_c = c.m * l.ldc + c.pad;
  l.count_a = (c.batch - 1) * l.stride_a + rows_a * l.lda;
  l.count_b = (c.batch - 1) * l.stride_b + rows_b * l.ldb;
  l.count_c = (c.batch - 1) * l.stride_c + c.m * l.ldc;
  return l;
}

// Expected outputs of one case (independent of the variant), computed once.
struct Reference {
  const HostData* a = nullptr;
  const HostData* b = nullptr;
  const HostData* c0 = nullptr;  // initial C when beta != 0
  std::vector<size_t> index;     // element index in C
  std::vector<double> want, tol;
};

const Reference& GetReference(const GemmCase& c) {
  static std::map<std::string, std::unique_ptr<Reference>> cache;
  auto& slot = cache[CaseName(c)];
  if (slot) return *slot;
  slot = std::make_unique<Reference>();
  Reference& r = *slot;
  const Layout l = MakeLayout(c);
  r.a = &CachedRandom("a", l.count_a);
  r.b = &CachedRandom("b", l.count_b);
  if (c.beta != 0.f) r.c0 = &CachedRandom("c", l.count_c);
  const double* av = r.a->values.data();
  const double* bv = r.b->values.data();
  auto op_a = [&](int64_t bi, int64_t i, int64_t p) {
    return av[bi * l.stride_a + (c.trans_a ? p * l.lda + i : i * l.lda + p)];
  };
  auto op_b = [&](int64_t bi, int64_t p, int64_t j) {
    return bv[bi * l.stride_b + (c.trans_b ? j * l.ldb + p : p * l.ldb + j)];
  };
  auto add = [&](int64_t bi, int64_t i, int64_t j, double sum, double abs_sum) {
    const size_t idx = size_t(bi * l.stride_c + i * l.ldc + j);
    const double c0 = r.c0 ? r.c0->values[idx] : 0.0;
    r.index.push_back(idx);
    r.want.push_back(double(c.alpha) * sum + double(c.beta) * c0);
    r.tol.push_back(16.0 * std::ldexp(1.0, -24) *
                        (std::fabs(c.alpha) * abs_sum + std::fabs(c.beta * c0)) +
                    1e-30);
  };
  const bool full = c.m * c.n * c.k * c.batch <= (int64_t(1) << 27);
  std::vector<int64_t> rows, cols;
  if (full) {
    for (int64_t i = 0; i < c.m; ++i) rows.push_back(i);
  } else {
    std::mt19937_64 rng(std::random_device{}());
    rows = {0, c.m - 1, int64_t(rng() % c.m), int64_t(rng() % c.m), int64_t(rng() % c.m)};
    cols = {0, c.n - 1, int64_t(rng() % c.n), int64_t(rng() % c.n)};
  }
  std::vector<double> sum(c.n), abs_sum(c.n);
  for (int64_t bi = 0; bi < c.batch; ++bi) {
    for (int64_t i : rows) {
      std::fill(sum.begin(), sum.end(), 0.0);
      std::fill(abs_sum.begin(), abs_sum.end(), 0.0);
      for (int64_t p = 0; p < c.k; ++p) {
        const double a = op_a(bi, i, p);
        for (int64_t j = 0; j < c.n; ++j) {
          const double prod = a * op_b(bi, p, j);
          sum[j] += prod;
          abs_sum[j] += std::fabs(prod);
        }
      }
      for (int64_t j = 0; j < c.n; ++j) add(bi, i, j, sum[j], abs_sum[j]);
    }
    for (int64_t j : cols) {
      for (int64_t i = 0; i < c.m; ++i) {
        double s = 0, as = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double prod = op_a(bi, i, p) * op_b(bi, p, j);
          s += prod;
          as += std::fabs(prod);
        }
        add(bi, i, j, s, as);
      }
    }
  }
  return r;
}

class GemmSimtTest : public ::testing::TestWithParam<std::tuple<std::string, GemmCase>> {};

TEST_P(GemmSimtTest, MatchesFloat64Reference) {
  GC_REQUIRE_GPU();
  const std::string& variant = std::get<0>(GetParam());
  const GemmCase& c = std::get<1>(GetParam());
  const Layout l = MakeLayout(c);
  const Reference& ref = GetReference(c);

  DeviceArray a(l.count_a * sizeof(float), c.offset_bytes);
  DeviceArray b(l.count_b * sizeof(float), c.offset_bytes);
  DeviceArray out(l.count_c * sizeof(float), c.offset_bytes);
  DeviceArray c_in(c.c_apart ? l.count_c * sizeof(float) : 0, c.offset_bytes);
  ASSERT_NE(a.get(), nullptr);
  ASSERT_NE(b.get(), nullptr);
  ASSERT_NE(out.get(), nullptr);
  a.Upload(ref.a->bytes.data());
  b.Upload(ref.b->bytes.data());
  if (ref.c0 && c.c_apart) {
    c_in.Upload(ref.c0->bytes.data());
    out.Poison();
  } else if (ref.c0) {
    out.Upload(ref.c0->bytes.data());
  } else {
    out.Poison();
  }

  GemmArgs args;
  args.m = c.m, args.n = c.n, args.k = c.k, args.batch = c.batch;
  args.a = a.get(), args.lda = l.lda, args.stride_a = l.stride_a, args.trans_a = c.trans_a;
  args.b = b.get(), args.ldb = l.ldb, args.stride_b = l.stride_b, args.trans_b = c.trans_b;
  args.c = out.get(), args.ldc = l.ldc, args.stride_c = l.stride_c;
  args.alpha = c.alpha, args.beta = c.beta;
  if (c.c_apart) args.c_in = c_in.get(), args.stride_c_in = l.stride_c;
  // "dispatch": the dispatcher's default (heuristics: the ladder or the
  // vendor fallback); "cublaslt", "cublas": the fallbacks themselves; the
  // rest: the ladder.
  const bool dispatch = variant == "dispatch" || kernels::IsGemmVendorVariant(variant);
  const std::string_view named = variant == "dispatch" ? std::string_view() : variant;
  const kernels::Support support = dispatch ? kernels::CanImplementGemm(args, named)
                                            : kernels::CanImplementGemmSimt(args, variant);
  if (!support) {
    ASSERT_NE(variant, "dispatch") << "the default must take every shape: " << support.reason;
    GTEST_SKIP() << support.reason;
  }

  const size_t ws_bytes = dispatch ? kernels::GemmWorkspaceBytes(args, named)
                                   : kernels::GemmSimtWorkspaceBytes(args, variant);
  DeviceArray ws(ws_bytes);
  void* workspace = ws_bytes ? ws.get() : nullptr;
  GC_ASSERT_CUDA(dispatch ? kernels::LaunchGemm(args, named, workspace, nullptr)
                          : kernels::LaunchGemmSimt(args, variant, workspace, nullptr));
  GC_ASSERT_CUDA(cudaDeviceSynchronize());

  std::vector<float> got(l.count_c);
  out.Download(got.data());
  size_t bad = 0;
  std::string msg;
  for (size_t e = 0; e < ref.index.size(); ++e) {
    const double g = got[ref.index[e]];
    if (!(std::fabs(g - ref.want[e]) <= ref.tol[e]) && bad++ < 5)
      msg += " [" + std::to_string(ref.index[e]) + "] got " + std::to_string(g) + " want " +
             std::to_string(ref.want[e]) + " tol " + std::to_string(ref.tol[e]) + ";";
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << ref.index.size() << " checked outputs wrong:" << msg;

  // Columns n..ldc-1 and the gaps between batch entries are never written.
  if (c.pad > 0) {
    size_t touched = 0;
    for (int64_t bi = 0; bi < c.batch; ++bi)
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = c.n; j < l.ldc; ++j) {
          const size_t idx = size_t(bi * l.stride_c + i * l.ldc + j);
          uint32_t want_bits = 0xFFFFFFFFu, got_bits;
          if (ref.c0 && !c.c_apart) std::memcpy(&want_bits, &ref.c0->bytes[idx * 4], 4);
          std::memcpy(&got_bits, &got[idx], 4);
          touched += got_bits != want_bits;
        }
    EXPECT_EQ(touched, 0u) << "padding of C was written";
  }
}

std::vector<std::string> VariantsAndAuto() {
  std::vector<std::string> v = kernels::GemmSimtVariants();
  v.push_back("");
  v.push_back("dispatch");
  v.push_back(kernels::kGemmVendorVariant);
  v.push_back(kernels::kGemmCublasVariant);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ladder, GemmSimtTest,
                         ::testing::Combine(::testing::ValuesIn(VariantsAndAuto()),
                                            ::testing::ValuesIn(Cases())),
                         [](const ::testing::TestParamInfo<GemmSimtTest::ParamType>& info) {
                           const std::string& v = std::get<0>(info.param);
                           return (v.empty() ? std::string("auto") : v) + "_" +
                                  CaseName(std::get<1>(info.param));
                         });

// Argument checks need no device.
TEST(GemmSimtArgs, RefusesNonF32AndUnknownVariants) {
  static float dummy[4];
  GemmArgs args;
  args.m = args.n = args.k = 2;
  args.a = args.b = dummy;
  args.c = dummy;
  args.lda = args.ldb = args.ldc = 2;
  EXPECT_TRUE(kernels::CanImplementGemmSimt(args, "warptile").ok);
  EXPECT_FALSE(kernels::CanImplementGemmSimt(args, "nosuch").ok);
  EXPECT_EQ(kernels::LaunchGemmSimt(args, "nosuch", nullptr, nullptr), cudaErrorInvalidValue);
  GemmArgs half = args;
  half.ab_type = DType::kBF16;
  const kernels::Support s = kernels::CanImplementGemmSimt(half, "");
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("fp32"), std::string::npos);
  EXPECT_EQ(kernels::LaunchGemmSimt(half, "", nullptr, nullptr), cudaErrorInvalidValue);
  GemmArgs bad_ld = args;
  bad_ld.lda = 1;
  EXPECT_FALSE(kernels::CanImplementGemmSimt(bad_ld, "naive").ok);
  GemmArgs batch = args;
  batch.batch = 2;
  batch.stride_c = 0;
  EXPECT_FALSE(kernels::CanImplementGemmSimt(batch, "naive").ok);
  const auto& names = kernels::GemmSimtVariants();
  EXPECT_EQ(names.size(), 8u);
  EXPECT_EQ(names.front(), "naive");
}

}  // namespace
}  // namespace gpucompute::testing
