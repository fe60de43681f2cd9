// Tests of the tensor-core GEMM ladder (kernels/src/gemm_tc.cu): every rung x
// dtype x transpose x shape against a float64 CPU reference. Large shapes are
// checked on their border rows and columns plus random samples; C is poisoned
// with NaN before each launch (beta == 0 must not read it), and the padding
// between rows of C must stay untouched.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gpucompute/kernels/gemm.h"
#include "kernels/src/heuristics/gemm_heuristics.h"
#include "tests/kernels/gpu_test_util.h"

namespace gpucompute::testing {
namespace {

using kernels::GemmArgs;

struct Case {
  std::string variant;  // "" = the ladder's own choice
  int64_t m, n, k;
  int64_t batch = 1;
  bool ta = false, tb = false;
  DType ab = DType::kBF16, c = DType::kBF16;
  float alpha = 1.f, beta = 0.f;
  int misalign = 0;      // elements added to A's base pointer
  int pad = 0;           // elements added to every leading dimension
  bool share_b = false;  // stride_b = 0: one B for the whole batch
  bool c_apart = false;  // beta * C read from its own buffer (c_in), C poisoned
  bool c_shared = false;  // with c_apart: one c_in for the whole batch (stride_c_in 0)
};

std::string Name(const Case& c) {
  std::string s = c.variant.empty() ? "auto" : c.variant;
  s += "_M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_K" + std::to_string(c.k);
  if (c.batch > 1) s += "_B" + std::to_string(c.batch) + (c.share_b ? "shared" : "");
  s += std::string("_") + (c.ta ? "t" : "n") + (c.tb ? "t" : "n");
  s += std::string("_") + (c.ab == DType::kF32 ? "tf32" : kernels::DTypeName(c.ab));
  s += std::string("_c") + kernels::DTypeName(c.c);
  if (c.beta != 0.f) s += "_beta";
  if (c.c_apart) s += c.c_shared ? "_cinshared" : "_cin";
  if (c.misalign) s += "_misaligned";
  if (c.pad) s += "_pad" + std::to_string(c.pad);
  return s;
}

void PrintTo(const Case& c, std::ostream* os) { *os << Name(c); }

// Everything but the variant: cases differing only in the rung share inputs.
std::string DataKey(const Case& c) {
  Case d = c;
  d.variant = "x";
  return Name(d);
}

uint64_t NextRandom(uint64_t& s) {
  s += 0x9e3779b97f4a7c15ULL;
  uint64_t z = s;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Fills n elements of dtype t with uniform values in [-1, 1); `vals` receives
// the stored (rounded) values.
void FillRandom(void* bytes, std::vector<float>& vals, size_t n, DType t, uint64_t& seed) {
  vals.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double u = double(NextRandom(seed) >> 11) * (1.0 / 9007199254740992.0);
    StoreHost(bytes, i, t, 2 * u - 1);
    vals[i] = float(LoadHost(bytes, i, t));
  }
}

// Inputs, device buffers and reference values of one data key.
struct Data {
  std::string key;
  int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
  std::unique_ptr<DeviceArray> a, b, c, c_in;
  std::vector<uint8_t> c0;   // initial C bytes (random when beta != 0, else 0xFF)
  std::vector<int64_t> idx;  // checked element offsets into C
  std::vector<double> ref, tol;
};

Data& GetData(const Case& cs) {
  static Data d;
  if (d.key == DataKey(cs)) return d;
  d = Data{};
  d.key = DataKey(cs);
  static uint64_t seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();

  const int64_t rows_a = cs.ta ? cs.k : cs.m, cols_a = cs.ta ? cs.m : cs.k;
  const int64_t rows_b = cs.tb ? cs.n : cs.k, cols_b = cs.tb ? cs.k : cs.n;
  d.lda = cols_a + cs.pad;
  d.ldb = cols_b + cs.pad;
  d.ldc = cs.n + cs.pad;
  d.stride_a = cs.batch > 1 ? rows_a * d.lda : 0;
  d.stride_b = cs.batch > 1 && !cs.share_b ? rows_b * d.ldb : 0;
  d.stride_c = cs.batch > 1 ? cs.m * d.ldc : 0;
  const size_t ea = kernels::DTypeSize(cs.ab), ec = kernels::DTypeSize(cs.c);
  const size_t na =
      size_t(std::max<int64_t>(1, cs.batch > 1 ? cs.batch * d.stride_a : rows_a * d.lda));
  const size_t nb =
      size_t(std::max<int64_t>(1, d.stride_b ? cs.batch * d.stride_b : rows_b * d.ldb));
  const size_t nc =
      size_t(std::max<int64_t>(1, cs.batch > 1 ? cs.batch * d.stride_c : cs.m * d.ldc));

  std::vector<uint8_t> ha(na * ea), hb(nb * ea), hc(nc * ec, 0xFF);
  std::vector<float> va, vb, vc;
  FillRandom(ha.data(), va, na, cs.ab, seed);
  FillRandom(hb.data(), vb, nb, cs.ab, seed);
  if (cs.beta != 0.f) {
    std::vector<uint8_t> tmp(nc * ec);
    FillRandom(tmp.data(), vc, nc, cs.c, seed);
    if (cs.c_shared)  // every batch entry adds batch entry 0's C
      for (int64_t bi = 1; bi < cs.batch; ++bi) {
        std::memcpy(tmp.data() + size_t(bi * d.stride_c) * ec, tmp.data(), size_t(d.stride_c) * ec);
        std::copy(vc.begin(), vc.begin() + d.stride_c, vc.begin() + bi * d.stride_c);
      }
    for (int64_t bi = 0; bi < cs.batch; ++bi)
      for (int64_t i = 0; i < cs.m; ++i) {
        const size_t off = size_t(bi * d.stride_c + i * d.ldc) * ec;
        std::memcpy(hc.data() + off, tmp.data() + off, size_t(cs.n) * ec);
      }
  }
  d.c0 = hc;
  d.a = std::make_unique<DeviceArray>(na * ea, size_t(cs.misalign) * ea);
  d.b = std::make_unique<DeviceArray>(nb * ea);
  d.c = std::make_unique<DeviceArray>(nc * ec);
  if (cs.c_apart) {  // C's values go to c_in; C itself starts as NaN
    d.c_in = std::make_unique<DeviceArray>(nc * ec);
    d.c_in->Upload(hc.data());
    d.c0.assign(nc * ec, 0xFF);
  }
  d.a->Upload(ha.data());
  d.b->Upload(hb.data());

  // Which elements to check: all of small problems; border rows and columns
  // plus random samples of large ones.
  const bool full = double(cs.m) * cs.n * cs.k * cs.batch <= double(1 << 25);
  std::vector<std::pair<int64_t, std::pair<int64_t, int64_t>>> pts;  // (batch, (i, j))
  if (full) {
    for (int64_t bi = 0; bi < cs.batch; ++bi)
      for (int64_t i = 0; i < cs.m; ++i)
        for (int64_t j = 0; j < cs.n; ++j) pts.push_back({bi, {i, j}});
  } else {
    for (int64_t bi = 0; bi < cs.batch; ++bi) {
      for (int64_t j = 0; j < cs.n; ++j) {
        pts.push_back({bi, {0, j}});
        pts.push_back({bi, {cs.m - 1, j}});
      }
      for (int64_t i = 0; i < cs.m; ++i) {
        pts.push_back({bi, {i, 0}});
        pts.push_back({bi, {i, cs.n - 1}});
      }
      for (int s = 0; s < 6000; ++s)
        pts.push_back({bi, {int64_t(NextRandom(seed) % cs.m), int64_t(NextRandom(seed) % cs.n)}});
    }
  }
  const double eps_acc = cs.ab == DType::kF32 ? 1.0 / 512 : 2e-4;  // tf32 inputs; fp32 sums
  const double eps_out =
      cs.c == DType::kBF16 ? 1.0 / 256 : (cs.c == DType::kF16 ? 1.0 / 1024 : 1e-6);
  for (const auto& [bi, ij] : pts) {
    const auto [i, j] = ij;
    double s = 0, mag = 0;
    for (int64_t kk = 0; kk < cs.k; ++kk) {
      const double x = va[size_t(bi * d.stride_a + (cs.ta ? kk * d.lda + i : i * d.lda + kk))];
      const double y = vb[size_t(bi * d.stride_b + (cs.tb ? j * d.ldb + kk : kk * d.ldb + j))];
      s += x * y;
      mag += std::fabs(x * y);
    }
    const int64_t off = bi * d.stride_c + i * d.ldc + j;
    double r = double(cs.alpha) * s;
    mag *= std::fabs(cs.alpha);
    if (cs.beta != 0.f) {
      r += double(cs.beta) * vc[size_t(off)];
      mag += std::fabs(double(cs.beta) * vc[size_t(off)]);
    }
    d.idx.push_back(off);
    d.ref.push_back(r);
    d.tol.push_back(eps_acc * mag + eps_out * std::fabs(r) + 1e-6);
  }
  return d;
}

class GemmTcTest : public ::testing::TestWithParam<Case> {};

TEST_P(GemmTcTest, MatchesFloat64Reference) {
  GC_REQUIRE_GPU();
  const Case& cs = GetParam();
  Data& d = GetData(cs);
  GemmArgs args;
  args.m = cs.m;
  args.n = cs.n;
  args.k = cs.k;
  args.batch = cs.batch;
  args.a = d.a->get();
  args.lda = d.lda;
  args.stride_a = d.stride_a;
  args.trans_a = cs.ta;
  args.b = d.b->get();
  args.ldb = d.ldb;
  args.stride_b = d.stride_b;
  args.trans_b = cs.tb;
  args.c = d.c->get();
  args.ldc = d.ldc;
  args.stride_c = d.stride_c;
  args.ab_type = cs.ab;
  args.c_type = cs.c;
  args.alpha = cs.alpha;
  args.beta = cs.beta;
  args.allow_tf32 = cs.ab == DType::kF32;
  if (cs.c_apart) {
    args.c_in = d.c_in->get();
    args.stride_c_in = cs.c_shared ? 0 : d.stride_c;
  }

  // "" is the dispatcher's default (heuristics: a rung or the vendor
  // fallback), "ladder" the ladder's own choice, "cublaslt" and "cublas" the
  // fallbacks.
  const bool ladder = cs.variant != "" && !kernels::IsGemmVendorVariant(cs.variant);
  const std::string_view rung = cs.variant == "ladder" ? std::string_view() : cs.variant;
  const kernels::Support s = ladder ? kernels::CanImplementGemmTc(args, rung)
                                    : kernels::CanImplementGemm(args, cs.variant);
  if (!s) {
    ASSERT_FALSE(cs.variant.empty() || cs.variant == "ladder")
        << "the default must take every shape: " << s.reason;
    GTEST_SKIP() << cs.variant << " refuses: " << s.reason;
  }
  const size_t ws_bytes = ladder ? kernels::GemmTcWorkspaceBytes(args, rung)
                                 : kernels::GemmWorkspaceBytes(args, cs.variant);
  static std::unique_ptr<DeviceArray> ws;
  if (ws_bytes > 0 && (!ws || ws->bytes() < ws_bytes)) ws = std::make_unique<DeviceArray>(ws_bytes);
  void* workspace = ws_bytes > 0 ? ws->get() : nullptr;
  d.c->Upload(d.c0.data());
  GC_ASSERT_CUDA(ladder ? kernels::LaunchGemmTc(args, rung, workspace, nullptr)
                        : kernels::LaunchGemm(args, cs.variant, workspace, nullptr));
  GC_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> out(d.c->bytes());
  d.c->Download(out.data());

  size_t bad = 0;
  std::string msg;
  for (size_t q = 0; q < d.idx.size(); ++q) {
    const double g = LoadHost(out.data(), size_t(d.idx[q]), cs.c);
    if (!(std::fabs(g - d.ref[q]) <= d.tol[q]) && bad++ < 5)
      msg += " [" + std::to_string(d.idx[q]) + "] got " + std::to_string(g) + " want " +
             std::to_string(d.ref[q]) + ";";
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << d.idx.size() << " checked elements wrong:" << msg;

  // Bytes outside the logical C (row padding) must be untouched.
  const size_t ec = kernels::DTypeSize(cs.c);
  size_t touched = 0;
  for (int64_t bi = 0; bi < cs.batch; ++bi)
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = cs.n; j < d.ldc; ++j) {
        const size_t off = size_t(bi * d.stride_c + i * d.ldc + j) * ec;
        if (std::memcmp(out.data() + off, d.c0.data() + off, ec) != 0) ++touched;
      }
  EXPECT_EQ(touched, 0u) << "elements written outside C";
}

std::vector<Case> AllCases() {
  const std::vector<std::string> variants = {"mma_sync",
                                             "wgmma_tma",
                                             "wgmma_ws",
                                             "wgmma_persistent",
                                             "wgmma_cluster",
                                             "wgmma_cluster_persistent",
                                             "wgmma_splitk",
                                             "wgmma_packed",
                                             "wgmma_splitk_128x128",
                                             "wgmma_splitk_128x64",
                                             "wgmma_splitk_128x32",
                                             "wgmma_splitk_128x16",
                                             "wgmma_splitk_128x192",
                                             "ladder",
                                             "cublaslt",
                                             "cublas",
                                             ""};
  const std::vector<std::pair<DType, DType>> types = {{DType::kBF16, DType::kBF16},
                                                      {DType::kBF16, DType::kF32},
                                                      {DType::kF16, DType::kF16},
                                                      {DType::kF16, DType::kF32},
                                                      {DType::kF32, DType::kF32}};
  std::vector<Case> shapes;
  auto add = [&](Case c) { shapes.push_back(c); };
  add({"", 128, 256, 64});      // exactly one wgmma tile
  add({"", 264, 520, 200});     // ragged tiles, K not a multiple of the stage
  add({"", 200, 136, 8});       // K = 8
  add({"", 1, 1000, 512});      // M = 1
  add({"", 300, 1, 136});       // N = 1
  add({"", 1000, 3000, 777});   // odd K: leading dimensions TMA cannot take
  add({"", 2056, 3080, 2072});  // many tiles, ragged edges, TMA-friendly
  add({"", 256, 512, 8192});    // large K, few tiles: split-K (ranges add up in a cluster)
  add({"", 136, 200, 24576});   // longer K on two tiles: 64 ranges, partials and a second kernel
  add({"", 200, 136, 400});     // 3 (16-bit) or 5 (tf32) ranges in a cluster
  add({"", 8, 4096, 4096});     // thin M against a wide B: split-K, swap-AB (C^T)
  add({"", 40, 2056, 1000});    // swap-AB, thin side not a multiple of 8
  {
    Case c{"", 24, 1032, 520};
    c.beta = 0.5f;
    add(c);  // swap-AB with beta
  }
  {
    Case c{"", 100, 300, 3000};
    c.beta = 0.5f;
    add(c);  // split-K with a ragged last range and beta
  }
  {
    Case c{"", 136, 264, 96};
    c.batch = 3;
    add(c);  // strided batch
    c.batch = 2;
    c.share_b = true;
    add(c);  // B shared by the batch
  }
  {
    Case c{"", 192, 264, 136};
    c.alpha = 1.5f;
    c.beta = -0.75f;
    c.pad = 8;
    add(c);  // alpha/beta, padded rows
  }
  {
    Case c{"", 136, 264, 96};
    c.batch = 3;
    c.alpha = 0.5f;
    c.beta = 2.f;
    c.c_apart = true;
    add(c);  // C read from c_in (the addend fused, no copy into C)
    c.batch = 2;
    c.share_b = true;
    add(c);  // ... with B shared by the batch (stride 0)
    c.share_b = false;
    c.c_shared = true;
    add(c);  // ... one c_in for the whole batch (stride_c_in 0)
  }
  {
    Case c{"", 100, 300, 3000};
    c.beta = -1.f;
    c.c_apart = true;
    add(c);  // c_in through split-K (partials or a cluster) and its reduction
    c = Case{"", 24, 1032, 520};
    c.beta = 0.5f;
    c.c_apart = true;
    c.batch = 2;
    c.c_shared = true;
    add(c);  // c_in as C^T (swap-AB, thin tiles), shared by the batch
  }
  {
    Case c{"", 76, 300, 132};
    c.pad = 4;
    c.beta = 0.25f;
    add(c);  // every row on 16 bytes, N not a multiple of 8: a partial vector per row
  }
  {
    Case c{"", 96, 200, 64};
    c.pad = 1;
    add(c);  // odd leading dimensions: element-wise loads and stores
  }
  {
    Case c{"", 128, 128, 64};
    c.misalign = 1;
    add(c);  // A base not 16-byte aligned
  }
  std::vector<Case> all;
  for (const Case& shape : shapes)
    for (const auto& [ab, ct] : types)
      for (int t = 0; t < 4; ++t)
        for (const auto& v : variants) {
          Case c = shape;
          c.ab = ab;
          c.c = ct;
          c.ta = t & 2;
          c.tb = t & 1;
          c.variant = v;
          all.push_back(c);
        }
  // Large odd shapes (leading dimensions TMA cannot take): the fallback rung,
  // the vendor, wgmma_packed's copies, and the default (which picks the
  // copies there).
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{4097, 4095, 4099}, {6001, 3001, 5003}})
    for (const auto& [ab, ct] : types)
      for (int tb = 0; tb < 2; ++tb)
        for (const std::string v : {"mma_sync", "cublaslt", "cublas", "wgmma_packed", ""}) {
          Case c{v, m, n, k};
          c.ab = ab;
          c.c = ct;
          c.tb = tb;
          all.push_back(c);
        }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Ladder, GemmTcTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return Name(info.param);
                         });

// --- API contract (no GPU needed) -------------------------------------------------

GemmArgs SmallArgs() {
  GemmArgs a;
  a.m = a.n = a.k = 64;
  a.lda = a.ldb = a.ldc = 64;
  a.a = a.b = reinterpret_cast<void*>(uintptr_t(1) << 20);
  a.c = reinterpret_cast<void*>(uintptr_t(1) << 21);
  a.ab_type = a.c_type = DType::kBF16;
  return a;
}

TEST(GemmTcApi, ListsEveryRung) {
  const auto& v = kernels::GemmTcVariants();
  for (const char* name : {"mma_sync", "wgmma_tma", "wgmma_ws", "wgmma_persistent", "wgmma_cluster",
                           "wgmma_cluster_persistent", "wgmma_splitk", "wgmma_packed",
                           "wgmma_splitk_128x128", "wgmma_splitk_128x64", "wgmma_splitk_128x32",
                           "wgmma_splitk_128x16", "wgmma_splitk_128x192"})
    EXPECT_NE(std::find(v.begin(), v.end(), name), v.end()) << name;
}

TEST(GemmTcApi, RefusesWithReasons) {
  GemmArgs a = SmallArgs();
  EXPECT_TRUE(kernels::CanImplementGemmTc(a, ""));
  EXPECT_FALSE(kernels::CanImplementGemmTc(a, "no_such_rung"));
  EXPECT_EQ(kernels::LaunchGemmTc(a, "no_such_rung", nullptr, nullptr), cudaErrorInvalidValue);

  GemmArgs f = a;
  f.ab_type = f.c_type = DType::kF32;
  EXPECT_FALSE(kernels::CanImplementGemmTc(f, ""));  // exact fp32 is not ours
  f.allow_tf32 = true;
  EXPECT_TRUE(kernels::CanImplementGemmTc(f, "mma_sync"));
  // tf32 wgmma reads B K-major, A K-major or from registers: NN runs as C^T
  // (not on wgmma_tma, which writes C only), NT and TT as they lie, TN not.
  EXPECT_TRUE(kernels::CanImplementGemmTc(f, "wgmma_ws"));
  EXPECT_FALSE(kernels::CanImplementGemmTc(f, "wgmma_tma"));
  f.trans_b = true;
  EXPECT_TRUE(kernels::CanImplementGemmTc(f, "wgmma_ws"));
  EXPECT_TRUE(kernels::CanImplementGemmTc(f, "wgmma_tma"));
  f.trans_a = true;
  EXPECT_TRUE(kernels::CanImplementGemmTc(f, "wgmma_persistent"));
  f.trans_b = false;
  EXPECT_FALSE(kernels::CanImplementGemmTc(f, "wgmma_persistent"));
  EXPECT_TRUE(kernels::CanImplementGemmTc(f, "wgmma_packed"));

  GemmArgs m = a;
  m.lda = 65;  // 130 bytes: not a TMA stride
  EXPECT_TRUE(kernels::CanImplementGemmTc(m, ""));
  EXPECT_TRUE(kernels::CanImplementGemmTc(m, "mma_sync"));
  const kernels::Support s = kernels::CanImplementGemmTc(m, "wgmma_persistent");
  EXPECT_FALSE(s);
  EXPECT_FALSE(s.reason.empty());

  GemmArgs bad = a;
  bad.ldc = 10;
  EXPECT_FALSE(kernels::CanImplementGemmTc(bad, ""));
  EXPECT_EQ(kernels::LaunchGemmTc(bad, "", nullptr, nullptr), cudaErrorInvalidValue);
}

// The split-K kernel's plan (heuristics/gemm_heuristics.h), host only.
TEST(GemmTilePlan, CoversKWithoutEmptyRanges) {
  for (const auto& [m, n, kb, batch] : std::vector<std::array<int64_t, 4>>{{128, 128, 2, 1},
                                                                           {1024, 1024, 16, 1},
                                                                           {256, 256, 1024, 1},
                                                                           {16, 4096, 64, 1},
                                                                           {4096, 4096, 1, 1},
                                                                           {100, 300, 94, 1},
                                                                           {512, 512, 8, 8}}) {
    for (bool swap : {false, true}) {
      const kernels::GemmTilePlan p = kernels::ChooseWgmmaTilePlan(m, n, kb, batch, 132, 0, swap);
      SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + " kb " + std::to_string(kb));
      EXPECT_TRUE(p.bn == 256 || p.bn == 192 || p.bn == 128 || p.bn == 64);
      EXPECT_GE(p.splits, 1);
      EXPECT_GE(int64_t(p.splits) * p.kb_per_split, kb);      // every k-block in a range
      EXPECT_LT(int64_t(p.splits - 1) * p.kb_per_split, kb);  // no empty range
      EXPECT_LE(p.splits, 64);
      if (!swap) EXPECT_FALSE(p.swap);
    }
  }
}

TEST(GemmTilePlan, FillsTheSmsWithTheCheapestTile) {
  // Few tiles: narrow ones (1024^3 bf16 has 16 k-blocks: 128 tiles of 128 x
  // 64, no split); many tiles: the widest; large K on few tiles: a split.
  kernels::GemmTilePlan p = kernels::ChooseWgmmaTilePlan(1024, 1024, 16, 1, 132);
  EXPECT_EQ(p.bn, 64);
  EXPECT_EQ(p.splits, 1);
  p = kernels::ChooseWgmmaTilePlan(4096, 4096, 64, 1, 132);
  EXPECT_EQ(p.bn, 256);
  EXPECT_EQ(p.splits, 1);
  p = kernels::ChooseWgmmaTilePlan(512, 512, 512, 1, 132);
  EXPECT_GT(p.splits, 1);
  // A named width is kept.
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(4096, 4096, 64, 1, 132, 128).bn, 128);
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(4096, 4096, 64, 1, 132, 192).bn, 192);
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(128, 128, 2, 1, 132, 64).bn, 64);
}

TEST(GemmTilePlan, WholeWavesOfTiles) {
  // 2000x3000x1000 bf16 (16 k-blocks): 192 tiles of 128 x 256 are 1.45
  // waves on 132 SMs, paid as two; 256 tiles of 128 x 192 are 1.94 waves
  // of three quarters the work. 2048x3072: the same.
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(2000, 3000, 16, 1, 132).bn, 192);
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(2048, 3072, 16, 1, 132).bn, 192);
  // Where 128 x 256 tiles fill their waves (2048^2: one; 8192^2: 15.5 of
  // 16) they stay.
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(2048, 2048, 32, 1, 132).bn, 256);
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(8192, 8192, 128, 1, 132).bn, 256);
}

TEST(GemmTilePlan, ClusterSplitsFitTheGpu) {
  // With room for clusters, a split of few ranges over a large C adds up
  // inside one cluster (no partials' round trip through HBM): 64 rows against
  // a 7524 x 7392 weight, 2 ranges.
  kernels::GemmClusterFit fit;
  for (int s = 2; s <= kernels::kGemmMaxClusterSplits; ++s) fit.clusters[s] = 132 / s;
  kernels::GemmTilePlan p = kernels::ChooseWgmmaTilePlan(64, 7524, 116, 1, 132, 0, true, &fit);
  EXPECT_TRUE(p.cluster);
  EXPECT_TRUE(p.swap);
  EXPECT_GE(p.splits, 2);
  EXPECT_LE(p.splits, kernels::kGemmMaxClusterSplits);
  EXPECT_GE(int64_t(p.splits) * p.kb_per_split, 116);
  const int64_t tiles = ((7524 + 127) / 128) * ((64 + p.bn - 1) / p.bn);
  EXPECT_LE(tiles, fit.clusters[p.splits]);
  // Over a small C the reduction costs more than the partials' round trip:
  // 16 rows against a 4096 x 4096 weight splits without a cluster.
  p = kernels::ChooseWgmmaTilePlan(16, 4096, 64, 1, 132, 0, true, &fit);
  EXPECT_FALSE(p.cluster);
  EXPECT_GE(p.splits, 2);
  // A handful of tiles over a short K: no 8-range cluster split (640x512x1024
  // bf16 ran 11.6 us so, 6.2 unsplit on 128 x 64 tiles).
  p = kernels::ChooseWgmmaTilePlan(640, 512, 16, 1, 132, 0, true, &fit);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.bn, 64);
  // Only as many ranges as let every tile's cluster be resident at once.
  const kernels::GemmTilePlan q =
      kernels::PlanGemmSplitK(4096, 16, 64, 1, 64, 132, &fit);  // 32 tiles
  EXPECT_TRUE(q.cluster);
  EXPECT_EQ(q.splits, 4);
  kernels::GemmClusterFit tight = fit;
  tight.clusters[4] = 31;
  tight.clusters[3] = 40;
  EXPECT_EQ(kernels::PlanGemmSplitK(4096, 16, 64, 1, 64, 132, &tight).splits, 3);
  // No room (or no fit given): the partials' split or none.
  const kernels::GemmClusterFit none;
  EXPECT_FALSE(kernels::PlanGemmSplitK(4096, 16, 64, 1, 64, 132, &none).cluster);
  EXPECT_EQ(kernels::PlanGemmSplitK(4096, 16, 64, 1, 64, 132, &none).splits, 1);
  EXPECT_FALSE(kernels::ChooseWgmmaTilePlan(16, 4096, 64, 1, 132, 0, true).cluster);
  // A very long K over few outputs keeps the many ranges of the partials'
  // split: a cluster holds at most 8.
  p = kernels::ChooseWgmmaTilePlan(128, 128, 1024, 1, 132, 0, false, &fit);
  EXPECT_FALSE(p.cluster);
  EXPECT_GT(p.splits, kernels::kGemmMaxClusterSplits);
}

TEST(GemmTilePlan, ThinTilesOnlyWhereBIsKMajor) {
  // 16 rows against a 4096 x 4096 weight, swapped: one 16-column tile column
  // where the swapped B (op(A)^T) is K-major, else 64 columns.
  const unsigned both = kernels::kGemmThinUnswapped | kernels::kGemmThinSwapped;
  kernels::GemmTilePlan p =
      kernels::ChooseWgmmaTilePlan(16, 4096, 64, 1, 132, 0, true, nullptr, both);
  EXPECT_TRUE(p.swap);
  EXPECT_EQ(p.bn, 16);
  p = kernels::ChooseWgmmaTilePlan(16, 4096, 64, 1, 132, 0, true, nullptr,
                                   kernels::kGemmThinUnswapped);
  EXPECT_GE(p.bn, 64);
  // 32 rows: 32 columns; 64: the cheaper plan, 64 columns here.
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(32, 4096, 64, 1, 132, 0, true, nullptr, both).bn, 32);
  EXPECT_GE(kernels::ChooseWgmmaTilePlan(64, 4096, 64, 1, 132, 0, true, nullptr, both).bn, 64);
  EXPECT_GE(kernels::ChooseWgmmaTilePlan(4096, 4096, 64, 1, 132, 0, true, nullptr, both).bn, 64);
  EXPECT_EQ(kernels::ChooseWgmmaTilePlan(4096, 4096, 64, 1, 132, 32, false, nullptr, both).bn, 32);
  // Rows that fill the tile's 128: thin tiles where they make the waves
  // (256x63x16384 f16, B K-major: 32 columns ran 1.5x faster than 64 in
  // sweep-gemm.md run 45).
  p = kernels::ChooseWgmmaTilePlan(256, 63, 256, 1, 132, 0, false, nullptr,
                                   kernels::kGemmThinUnswapped);
  EXPECT_EQ(p.bn, 32);
  p = kernels::ChooseWgmmaTilePlan(100, 63, 256, 1, 132, 0, false, nullptr,
                                   kernels::kGemmThinUnswapped);  // rows not full
  EXPECT_EQ(p.bn, 64);
  p = kernels::ChooseWgmmaTilePlan(256, 63, 256, 1, 132, 0, false, nullptr, 0);  // B N-major
  EXPECT_EQ(p.bn, 64);
}

TEST(GemmTilePlan, SwapsThinProblemsOnlyWhenAllowed) {
  // 16 rows against a 4096 x 4096 weight: C^T puts the weight on the rows.
  EXPECT_TRUE(kernels::ChooseWgmmaTilePlan(16, 4096, 64, 1, 132, 0, true).swap);
  EXPECT_FALSE(kernels::ChooseWgmmaTilePlan(16, 4096, 64, 1, 132, 0, false).swap);
  // 128 rows and more fill a tile's rows: never swapped.
  EXPECT_FALSE(kernels::ChooseWgmmaTilePlan(128, 4096, 64, 1, 132, 0, true).swap);
  EXPECT_FALSE(kernels::ChooseWgmmaTilePlan(4096, 16, 64, 1, 132, 0, true).swap);
}

// The default's choice for tf32 NN (heuristics/gemm_heuristics.h), host only.
TEST(GemmVariant, Tf32NnTakesOursOnlyOnItsClasses) {
  kernels::GemmShape s;
  s.ab = DType::kF32;
  s.tf32 = true;
  s.tma_ok = true;
  s.m = s.n = s.k = 1024;
  s.batch = 8;  // a batch of large problems
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.beta = true;  // C^T read element by element: the vendor
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.beta = false;
  s.batch = 1;  // one square: the vendor
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.m = s.n = 256;
  s.k = 65536;  // long K over few outputs
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.trans_b = true;  // NT: the vendor
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.trans_b = false;
  s.m = s.n = 4096;
  s.k = 16;  // short K over a large C
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.c_sectors = false;  // C's rows off 32 bytes: its writes bind, the vendor's are faster
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.c_sectors = true;
  s.k = 256;  // longer: the vendor
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.m = s.n = 512;
  s.k = 64;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");  // a small C
  s.batch = 32;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");  // 32 of them
  // A small batch: ours where both sides are at least 192, from 2^27.
  s.batch = 3;
  s.m = 535;
  s.n = 1024;
  s.k = 144;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.m = 128;  // a side of 128: the vendor
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.m = 192;  // 4*192x1024x512
  s.k = 512;
  s.batch = 4;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.m = s.n = s.k = 256;
  s.batch = 5;  // 2^26.3: the vendor
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.batch = 8;  // 2^27
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  // Short K with C's rows off 32 bytes (N = 1404): bound by C^T's stores, the
  // vendor, in either batch rule; from K = 129 ours again.
  s.batch = 16;
  s.m = 2048;
  s.n = 1404;
  s.k = 64;
  s.c_sectors = false;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.batch = 2;  // under 2^31
  s.k = 128;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.k = 129;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.c_sectors = true;
  s.k = 64;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
}

// The default on rows TMA cannot read (heuristics/gemm_heuristics.h), host
// only: wgmma_packed where its copies pay, else the vendor.
TEST(GemmVariant, CopiesRowsOnlyWhereTheProductOutweighsTheCopies) {
  kernels::GemmShape s;
  s.ab = DType::kBF16;
  s.aligned = false;
  s.ab_align = 2;  // rows of an odd count of elements (pairs: the next test)
  s.c_bytes = 2;
  auto with = [&](int64_t m, int64_t n, int64_t k, bool copy_a, bool copy_b) {
    s.m = m;
    s.n = n;
    s.k = k;
    s.copy_bytes = 2.0 * ((copy_a ? m * k : 0) + (copy_b ? k * n : 0));
    return std::string(kernels::ChooseGemmVariant(s));
  };
  EXPECT_EQ(with(1000, 3000, 777, true, false), "wgmma_packed");  // odd K, B in place
  EXPECT_EQ(with(999, 999, 999, true, true), "wgmma_packed");     // 500 FLOPs a copied byte
  EXPECT_EQ(with(948, 235, 32768, true, true), "cublaslt");       // 188: the copies dominate
  // Short K: C dominates (2 K / its element size against 64 FLOPs a byte).
  s.c_aligned = false;  // as N = 14530 and 1114 leave 16-bit rows
  EXPECT_EQ(with(16384, 14530, 32, false, true), "cublaslt");
  EXPECT_EQ(with(16384, 14530, 64, false, true), "wgmma_packed");
  EXPECT_EQ(with(1024, 1114, 91, false, true), "cublaslt");  // small: 128 FLOPs a byte
  EXPECT_EQ(with(1024, 1114, 128, false, true), "wgmma_packed");
  // 16-bit C on 16 bytes: short K from 2^27 where the copy is small.
  s.c_aligned = true;
  EXPECT_EQ(with(2048, 16384, 31, true, false), "wgmma_packed");
  EXPECT_EQ(with(12641, 2272, 8, true, false), "wgmma_packed");
  EXPECT_EQ(with(1024, 1024, 29, true, false), "cublaslt");  // under 2^27
  EXPECT_EQ(with(1242, 8192, 26, true, true), "cublaslt");   // both copied: 876 FLOPs a byte
  s.c_bytes = 4;
  EXPECT_EQ(with(2048, 16384, 31, true, false), "cublaslt");  // fp32 C
  s.c_bytes = 2;
  s.c_aligned = false;  // C's rows off 16 bytes: only C read or fp32 goes element by element
  EXPECT_EQ(with(16384, 14530, 64, false, true), "wgmma_packed");
  s.beta = true;  // 16-bit C read two bytes at a time: the vendor at every K
  EXPECT_EQ(with(11119, 2187, 123, true, true), "cublaslt");
  EXPECT_EQ(with(1476, 2653, 256, false, true), "cublaslt");
  EXPECT_EQ(with(11119, 2187, 4096, true, true), "cublaslt");
  s.beta = false;
  s.c_bytes = 4;
  EXPECT_EQ(with(8192, 5341, 204, false, true), "cublaslt");
  EXPECT_EQ(with(8192, 5341, 512, false, true), "wgmma_packed");
  s.beta = true;  // fp32 C read: 2 K over 4 bytes must reach 256
  EXPECT_EQ(with(8192, 5341, 256, false, true), "cublaslt");
  EXPECT_EQ(with(8192, 5341, 512, false, true), "wgmma_packed");
  s.beta = false;
  s.c_aligned = true;  // fp32 C on 16 bytes: 64 FLOPs a byte
  EXPECT_EQ(with(8192, 5341, 127, false, true), "cublaslt");
  EXPECT_EQ(with(8192, 5341, 128, false, true), "wgmma_packed");
  s.c_bytes = 2;
  EXPECT_EQ(with(64, 2048, 853, true, false), "cublaslt");       // thin: 17-127 rows
  EXPECT_EQ(with(66, 4096, 5089, true, false), "wgmma_packed");  // ... from 2^28, A alone copied
  EXPECT_EQ(with(64, 4096, 15290, true, true), "cublaslt");      // ... B copied too
  EXPECT_EQ(with(64, 3360, 1046, true, false), "cublaslt");      // ... under 2^28
  EXPECT_EQ(with(16, 2048, 853, true, false), "wgmma_packed");   // thin tiles take 16
  EXPECT_EQ(with(128, 2048, 853, true, false), "wgmma_packed");  // a whole tile of rows
  EXPECT_EQ(with(94, 8192, 9865, true, false), "wgmma_packed");  // thin but large
  EXPECT_EQ(with(1, 8192, 1448, true, false), "cublaslt");       // one row: cuBLAS's GEMV
  EXPECT_EQ(with(2, 8192, 1448, true, false), "wgmma_packed");
  // Under 2^24 multiply-adds the copy's launch outweighs the product.
  EXPECT_EQ(with(512, 150, 128, false, true), "cublaslt");
  EXPECT_EQ(with(1024, 150, 128, false, true), "wgmma_packed");
  EXPECT_EQ(with(2, 4096, 1753, true, false), "cublaslt");
  s.vendor_ok = false;  // what the vendor refuses goes to the ladder
  EXPECT_EQ(with(948, 235, 32768, true, true), "");
  // tf32 TN (rows on 16 bytes): the smaller operand copied, where that pays.
  s = kernels::GemmShape{};
  s.ab = DType::kF32;
  s.tf32 = true;
  s.trans_a = true;
  s.c_bytes = 4;
  s.m = s.n = s.k = 4096;
  s.copy_bytes = 4.0 * 4096 * 4096;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_packed");
  s.m = 512;
  s.n = 256;
  s.k = 1024;
  s.batch = 64;
  s.copy_bytes = 4.0 * 256 * 1024 * 64;  // 256 FLOPs a copied byte
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.m = 16384;
  s.n = 16007;
  s.k = 16;
  s.batch = 1;
  s.copy_bytes = 4.0 * 16 * (16384 + 16007);
  s.c_aligned = false;  // fp32 rows off 16 bytes over a short K: C dominates
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.k = 512;
  s.copy_bytes = 4.0 * 512 * (16384 + 16007);
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_packed");
  s.c_aligned = true;  // rows on 16 bytes: still at least 128 FLOPs a byte of C (K >= 256)
  s.n = 4096;
  s.k = 131;
  s.copy_bytes = 4.0 * 131 * 4096;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.k = 256;
  s.copy_bytes = 4.0 * 256 * 4096;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_packed");
}

// 16-bit rows off 16 bytes but on 4 (an even count of elements), host only:
// cuBLAS reads them in pairs, so a small problem over a K of 33-400 stays
// with the vendor; rows on 2 bytes (odd) and K up to 32 keep wgmma_packed.
TEST(GemmVariant, LeavesSmallShortKRowsOnFourBytesToTheVendor) {
  kernels::GemmShape s;
  s.ab = DType::kBF16;
  s.aligned = false;
  s.c_bytes = 2;
  auto with = [&](int64_t m, int64_t n, int64_t k, int align, bool copy_a) {
    s.m = m;
    s.n = n;
    s.k = k;
    s.ab_align = align;
    s.copy_bytes = 2.0 * (copy_a ? m * k : k * n);
    return std::string(kernels::ChooseGemmVariant(s));
  };
  EXPECT_EQ(with(588, 512, 158, 4, true), "cublaslt");      // 2^25.5
  EXPECT_EQ(with(588, 512, 158, 2, true), "wgmma_packed");  // odd rows: the vendor is slower
  EXPECT_EQ(with(2048, 512, 148, 8, true), "cublaslt");
  EXPECT_EQ(with(2048, 512, 131, 2, true), "wgmma_packed");
  EXPECT_EQ(with(1024, 300, 400, 4, false), "cublaslt");  // K up to 400 under 1.5 * 2^27
  EXPECT_EQ(with(1024, 300, 401, 4, false), "wgmma_packed");
  EXPECT_EQ(with(1024, 3226, 128, 4, false), "cublaslt");  // 2^28.7 with K up to 160
  EXPECT_EQ(with(1024, 3226, 161, 4, false), "wgmma_packed");
  EXPECT_EQ(with(1024, 8192, 128, 4, false), "wgmma_packed");  // 2^30
  EXPECT_EQ(with(2183, 8192, 14, 4, true), "wgmma_packed");    // K up to 32: the short-K rule
  s.ab = DType::kF16;
  EXPECT_EQ(with(588, 512, 158, 4, true), "cublaslt");
}

// C's rows off 16 bytes with A and B as TMA reads them (heuristics/
// gemm_heuristics.h), host only: ours, but for one row or column and tf32 NN
// with beta.
TEST(GemmVariant, RowsOfCOff16BytesTakeOursWhereTmaReadsAAndB) {
  kernels::GemmShape s;
  s.ab = DType::kBF16;
  s.tma_ok = true;
  s.trans_b = true;
  s.m = 737;
  s.n = 11635;
  s.k = 256;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");  // C on 16 bytes
  s.c_aligned = false;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.m = 1;  // one row: cuBLAS's GEMV
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.m = 737;
  s.beta = true;  // C read, and fp32: 2 K over 4 bytes must reach 256
  s.c_bytes = 4;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.k = 512;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.beta = false;
  s.c_bytes = 2;
  s.m = 2048;
  s.n = 14725;
  s.k = 32;  // 16-bit C under 2^30: 2 K over 2 bytes must reach 128
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.k = 128;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.m = 64;
  s.n = 106;
  s.k = 792;  // under 2^24 multiply-adds: the vendor
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.batch = 4;  // a batch of them: 2^24 and more
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.aligned = false;  // A or B copied first: the packed rule decides
  s.tma_ok = false;
  s.copy_bytes = 2.0 * 4 * 64 * 792;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s = kernels::GemmShape{};
  s.ab = DType::kF32;
  s.tf32 = true;
  s.tma_ok = true;
  s.c_aligned = false;
  s.c_bytes = 4;
  s.m = 4;
  s.n = 1853;
  s.k = 4096;
  s.trans_b = true;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.trans_b = false;
  s.beta = true;  // tf32 NN with beta: C^T read element by element
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  // Beta on 16-bit C off 16 bytes (read two bytes at a time): ours only
  // where 128 x 128 tiles leave SMs idle.
  s = kernels::GemmShape{};
  s.ab = DType::kF16;
  s.tma_ok = true;
  s.trans_b = true;
  s.c_aligned = false;
  s.beta = true;
  s.m = 512;
  s.n = 885;
  s.k = 512;  // 4 x 7 tiles
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.m = 2934;
  s.n = 2726;  // 23 x 22 tiles
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.m = 1308;
  s.n = 724;
  s.k = 256;
  s.batch = 4;  // 264 tiles
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.batch = 2;  // 132 tiles: every SM one
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
  s.sms = 160;  // a GPU with more SMs
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.sms = 132;
  s.beta = false;  // C written from the fragments
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s.beta = true;
  s.c_bytes = 4;  // fp32 C read whole (2 K over 4 bytes must reach 256)
  s.k = 512;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "wgmma_splitk");
  s = kernels::GemmShape{};
  s.ab = DType::kF32;  // exact fp32: the SIMT ladder's rules
  s.tma_ok = true;
  s.c_aligned = false;
  s.m = s.n = s.k = 999;
  EXPECT_STREQ(kernels::ChooseGemmVariant(s), "cublaslt");
}

TEST(GemmVariant, BothVendorFallbacksAreListedByName) {
  const auto& v = kernels::GemmVariants();
  for (const char* name : {"cublaslt", "cublas"}) {
    EXPECT_NE(std::find(v.begin(), v.end(), name), v.end()) << name;
    EXPECT_TRUE(kernels::IsGemmVendorVariant(name)) << name;
  }
  EXPECT_FALSE(kernels::IsGemmVendorVariant("wgmma_splitk"));
  EXPECT_FALSE(kernels::IsGemmVendorVariant(""));
  EXPECT_FALSE(kernels::CanImplementGemmVendor(SmallArgs(), "cublasxt"));
}

// The same rules through the dispatcher, which counts the bytes to copy ...
TEST(GemmVariant, TheDispatcherCountsTheBytesToCopy) {
  GC_REQUIRE_GPU();  // the dispatcher resolves against the device present
  GemmArgs a = SmallArgs();
  a.m = a.n = a.k = 999;
  a.lda = a.ldb = a.ldc = 999;  // rows of 1998 bytes: TMA cannot read them
  EXPECT_EQ(kernels::GemmVariantName(a, ""), "wgmma_packed");
  a.k = 123;
  a.lda = 123;
  EXPECT_EQ(kernels::GemmVariantName(a, ""), kernels::kGemmVendorVariant);
  a.k = 999;
  a.lda = 1000;  // A's rows on 16 bytes, B's not: B copied, 1000 FLOPs a byte
  a.m = 1000;
  EXPECT_EQ(kernels::GemmVariantName(a, ""), "wgmma_packed");
}

// ... and how A's and B's rows lie: on 4 or 8 bytes, a small short-K problem
// stays with the vendor; on 2 (an odd count, or an odd base), ours.
TEST(GemmVariant, TheDispatcherSeesHowOperandRowsLie) {
  GC_REQUIRE_GPU();
  GemmArgs a = SmallArgs();
  a.m = 2048;
  a.n = a.ldb = a.ldc = 512;
  a.k = a.lda = 148;  // A's rows of 296 bytes: on 8
  EXPECT_EQ(kernels::GemmVariantName(a, ""), kernels::kGemmVendorVariant);
  a.lda = 149;  // on 2
  EXPECT_EQ(kernels::GemmVariantName(a, ""), "wgmma_packed");
  a.lda = 148;
  a.a = reinterpret_cast<const char*>(a.a) + 2;  // A's base on 2
  EXPECT_EQ(kernels::GemmVariantName(a, ""), "wgmma_packed");
  a.a = reinterpret_cast<const char*>(a.a) + 2;  // on 4
  EXPECT_EQ(kernels::GemmVariantName(a, ""), kernels::kGemmVendorVariant);
  a.k = a.lda = 131;
  a.a = SmallArgs().a;
  EXPECT_EQ(kernels::GemmVariantName(a, ""), "wgmma_packed");
}

// ... and C's rows: off 16 bytes with A and B as TMA reads them, ours.
TEST(GemmVariant, TheDispatcherSeesWhereCsRowsLie) {
  GC_REQUIRE_GPU();
  GemmArgs a = SmallArgs();
  a.m = 737;
  a.n = 1163;
  a.k = 256;
  a.trans_b = true;
  a.lda = a.ldb = 256;
  a.ldc = 1168;  // C's rows on 16 bytes: the vendor
  EXPECT_EQ(kernels::GemmVariantName(a, ""), kernels::kGemmVendorVariant);
  a.ldc = 1163;  // off 16 bytes
  EXPECT_EQ(kernels::GemmVariantName(a, ""), "wgmma_splitk");
  a.c_type = DType::kF32;
  a.ldc = 1164;  // fp32 rows on 16 bytes
  EXPECT_EQ(kernels::GemmVariantName(a, ""), kernels::kGemmVendorVariant);
  // tf32 NN over a short K: ours where C's rows lie on 32 bytes.
  a.ab_type = DType::kF32;
  a.allow_tf32 = true;
  a.trans_b = false;
  a.m = 2048;
  a.n = 4100;
  a.k = 32;
  a.lda = 32;
  a.ldb = a.ldc = 4100;  // 16400 bytes: on 16, not on 32
  EXPECT_EQ(kernels::GemmVariantName(a, ""), kernels::kGemmVendorVariant);
  a.ldb = a.ldc = 4104;
  EXPECT_EQ(kernels::GemmVariantName(a, ""), "wgmma_splitk");
  // The named fallbacks are what runs when named.
  EXPECT_EQ(kernels::GemmVariantName(a, "cublas"), "cublas");
  EXPECT_TRUE(kernels::CanImplementGemm(a, "cublas"));
}

TEST(GemmTcApi, EmptyProblemIsANoOp) {
  GemmArgs a = SmallArgs();
  a.m = 0;
  EXPECT_EQ(kernels::LaunchGemmTc(a, "wgmma_ws", nullptr, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace gpucompute::testing
