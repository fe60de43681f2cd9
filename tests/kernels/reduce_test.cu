// Tests of the reduce ladder: every version x op x shape x dtype against a
// float64 CPU reference. Inputs are fresh random values each run; outputs (and
// a guard region after them) are poisoned with 0xFF (NaN) before each launch.
// Also: NaN/Inf propagation for MAX/MIN, bitwise determinism and the
// single-pass counter reset across reused workspaces, and refusals.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpucompute/kernels/reduce.h"
#include "tests/kernels/gpu_test_util.h"

namespace gpucompute::testing {
namespace {

using kernels::ReduceArgs;
using kernels::ReduceOp;

constexpr size_t kGuardBytes = 64;

const char* OpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMean: return "mean";
  }
  return "op";
}

// Fresh random values in [-1, 1) stored as `t`; `values` are the stored values.
struct Input {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

Input RandomInput(size_t n, DType t) {
  static std::mt19937_64 rng(std::random_device{}());
  Input in{std::vector<uint8_t>(n * kernels::DTypeSize(t)), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    const double u = double(rng() >> 11) * (1.0 / 9007199254740992.0);
    StoreHost(in.bytes.data(), i, t, 2.0 * u - 1.0);
    in.values[i] = float(LoadHost(in.bytes.data(), i, t));
  }
  return in;
}

void SetValue(Input& in, size_t i, DType t, double v) {
  StoreHost(in.bytes.data(), i, t, v);
  in.values[i] = float(LoadHost(in.bytes.data(), i, t));
}

// Float64 reference and a per-output absolute tolerance for fp32 accumulation.
struct Reference {
  std::vector<double> value;
  std::vector<double> atol;
};

Reference Reduce(const Input& in, int64_t outer, int64_t axis, int64_t inner, ReduceOp op) {
  Reference r{std::vector<double>(size_t(outer * inner)), std::vector<double>(size_t(outer * inner))};
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double acc = op == ReduceOp::kMax   ? -INFINITY
                   : op == ReduceOp::kMin ? INFINITY
                                          : 0.0;
      double abs_sum = 0;
      bool nan = false;
      for (int64_t a = 0; a < axis; ++a) {
        const double x = in.values[size_t((o * axis + a) * inner + i)];
        if (std::isnan(x)) nan = true;
        abs_sum += std::fabs(x);
        if (op == ReduceOp::kMax) acc = std::max(acc, x);
        else if (op == ReduceOp::kMin) acc = std::min(acc, x);
        else acc += x;
      }
      if (nan) acc = std::numeric_limits<double>::quiet_NaN();
      if (op == ReduceOp::kMean) acc /= double(axis);
      const size_t k = size_t(o * inner + i);
      r.value[k] = acc;
      // fp32 accumulation in any order stays well within 1e-5 of sum |x|.
      r.atol[k] = op == ReduceOp::kSum    ? 1e-5 * abs_sum + 1e-6
                  : op == ReduceOp::kMean ? 1e-5 * abs_sum / double(axis) + 1e-6
                                          : 0.0;
    }
  return r;
}

// Uploads `in`, launches, downloads outer*inner outputs of out_type; checks the
// guard after the outputs. Returns the raw output bytes.
std::vector<uint8_t> LaunchAndFetch(const Input& host, ReduceArgs a, const std::string& variant,
                         size_t offset_elems, void* workspace = nullptr,
                         DeviceArray* in_dev = nullptr) {
  const size_t n_out = size_t(a.outer * a.inner);
  const size_t out_bytes = n_out * kernels::DTypeSize(a.out_type);
  DeviceArray local_in(in_dev ? 0 : host.bytes.size(), offset_elems * kernels::DTypeSize(a.in_type));
  DeviceArray* in = in_dev ? in_dev : &local_in;
  if (!in_dev) in->Upload(host.bytes.data());
  DeviceArray out(out_bytes + kGuardBytes, offset_elems * kernels::DTypeSize(a.out_type));
  out.Poison();
  a.in = in->get();
  a.out = out.get();
  const size_t ws_bytes = kernels::ReduceWorkspaceBytes(a, variant);
  DeviceArray local_ws(ws_bytes);
  if (!workspace && ws_bytes) {
    cudaMemset(local_ws.get(), 0, ws_bytes);
    workspace = local_ws.get();
  }
  EXPECT_EQ(kernels::LaunchReduce(a, variant, workspace, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(out_bytes + kGuardBytes);
  out.Download(got.data());
  for (size_t i = out_bytes; i < got.size(); ++i)
    if (got[i] != 0xFF) {
      ADD_FAILURE() << "write past the end of the output at byte " << i - out_bytes;
      break;
    }
  got.resize(out_bytes);
  return got;
}

::testing::AssertionResult Close(const std::vector<uint8_t>& got, DType t, const Reference& ref) {
  size_t bad = 0;
  std::string msg;
  const double rtol = t == DType::kF32 ? 1e-6 : DefaultRtol(t);
  for (size_t i = 0; i < ref.value.size(); ++i) {
    const double g = LoadHost(got.data(), i, t), w = ref.value[i];
    const bool ok = (std::isnan(w) && std::isnan(g)) || (std::isinf(w) && g == w) ||
                    std::fabs(g - w) <= ref.atol[i] + rtol * std::fabs(w);
    if (!ok && bad++ < 5)
      msg += " [" + std::to_string(i) + "] got " + std::to_string(g) + " want " + std::to_string(w) + ";";
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << ref.value.size() << " wrong:" << msg;
}

// ---- The ladder ---------------------------------------------------------------
struct ReduceCase {
  std::string variant;
  ReduceOp op;
  int64_t outer, axis, inner;
  DType in_type, out_type;
  size_t offset_elems;
};

std::string Name(const ::testing::TestParamInfo<ReduceCase>& info) {
  const ReduceCase& c = info.param;
  std::string s = c.variant + "_" + OpName(c.op) + "_O" + std::to_string(c.outer) + "_A" +
                  std::to_string(c.axis) + "_I" + std::to_string(c.inner) + "_" +
                  DTypeName(c.in_type) + "_to_" + DTypeName(c.out_type);
  if (c.offset_elems) s += "_off" + std::to_string(c.offset_elems);
  return s;
}

std::vector<ReduceCase> Cases() {
  struct Shape {
    int64_t outer, axis, inner;
    size_t off;
    bool big;
  };
  const Shape shapes[] = {
      {1, 1, 1, 0, false},       {1, 31, 1, 0, false},      {1, 33, 1, 0, false},
      {1, 1000003, 1, 0, false}, {1, 1000003, 1, 1, false}, {7, 1000, 1, 0, false},
      {300, 33, 1, 0, false},    {5, 999, 1, 1, false},     {4097, 4099, 1, 0, true},
      {3, 1000, 33, 0, false},   {2, 100003, 5, 0, false},  {5, 17, 64, 0, false},
      {1, 3000, 256, 0, false},  {3, 1000, 64, 1, false},   {1, 4099, 4097, 0, true},
      {1000, 37, 1, 0, false},   {3, 7, 1, 1, false},       {513, 1024, 1, 0, false},
      {2, 1025, 1, 0, false},    {128, 3, 4096, 0, false},  {9, 5, 33, 1, false},
      {3, 200001, 1, 1, false},
  };
  std::vector<ReduceCase> v;
  for (const std::string& var : kernels::ReduceVariants())
    for (const Shape& s : shapes)
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kMean})
        // row_warp reduces rows only, col_thread columns only (each refuses
        // the other case: see ReduceRefusals).
        if (!(var == "row_warp" && s.inner > 1) && !(var == "col_thread" && s.inner == 1))
          for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
            // The 16.8M-element shapes: fp32 SUM and bf16 MAX only (host time).
            if (s.big && !(op == ReduceOp::kSum && t == DType::kF32) &&
                !(op == ReduceOp::kMax && t == DType::kBF16))
              continue;
            // MEAN and MIN write the input dtype; SUM and MAX write fp32.
            const DType out = (op == ReduceOp::kMean || op == ReduceOp::kMin) ? t : DType::kF32;
            v.push_back({var, op, s.outer, s.axis, s.inner, t, out, s.off});
          }
  return v;
}

class ReduceTest : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(ReduceTest, MatchesFloat64Reference) {
  GC_REQUIRE_GPU();
  const ReduceCase& c = GetParam();
  const Input in = RandomInput(size_t(c.outer * c.axis * c.inner), c.in_type);
  ReduceArgs a{nullptr, nullptr, c.outer, c.axis, c.inner, c.op, c.in_type, c.out_type};
  const std::vector<uint8_t> got = LaunchAndFetch(in, a, c.variant, c.offset_elems);
  EXPECT_TRUE(Close(got, c.out_type, Reduce(in, c.outer, c.axis, c.inner, c.op)));
}

INSTANTIATE_TEST_SUITE_P(Ladder, ReduceTest, ::testing::ValuesIn(Cases()), Name);

// ---- NaN and Inf ------------------------------------------------------------------
struct SpecialCase {
  std::string variant;
  int64_t outer, axis, inner;
};

class ReduceSpecialTest : public ::testing::TestWithParam<SpecialCase> {};

TEST_P(ReduceSpecialTest, MaxMinPropagateNanAndKeepInf) {
  GC_REQUIRE_GPU();
  const SpecialCase& c = GetParam();
  const size_t n = size_t(c.outer * c.axis * c.inner);
  static std::mt19937_64 rng(std::random_device{}());
  for (DType t : {DType::kF32, DType::kBF16}) {
    Input in = RandomInput(n, t);
    // One NaN and one +inf and one -inf at random places (the first output
    // also gets a NaN of its own so every shape sees one).
    SetValue(in, rng() % n, t, NAN);
    SetValue(in, 0, t, NAN);
    SetValue(in, rng() % n, t, INFINITY);
    SetValue(in, rng() % n, t, -INFINITY);
    for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kSum}) {
      ReduceArgs a{nullptr, nullptr, c.outer, c.axis, c.inner, op, t, DType::kF32};
      const std::vector<uint8_t> got = LaunchAndFetch(in, a, c.variant, 0);
      EXPECT_TRUE(Close(got, DType::kF32, Reduce(in, c.outer, c.axis, c.inner, op)))
          << OpName(op) << " " << DTypeName(t);
    }
  }
}

std::vector<SpecialCase> SpecialCases() {
  std::vector<SpecialCase> v;
  for (const std::string& var : kernels::ReduceVariants()) {
    if (var != "col_thread") {  // columns only
      v.push_back({var, 1, 100003, 1});
      v.push_back({var, 17, 1000, 1});
    }
    if (var == "row_warp") continue;  // rows only
    v.push_back({var, 3, 500, 33});
    v.push_back({var, 1, 2000, 64});
  }
  return v;
}

std::string SpecialName(const ::testing::TestParamInfo<SpecialCase>& info) {
  const SpecialCase& c = info.param;
  return c.variant + "_O" + std::to_string(c.outer) + "_A" + std::to_string(c.axis) + "_I" +
         std::to_string(c.inner);
}

INSTANTIATE_TEST_SUITE_P(Special, ReduceSpecialTest, ::testing::ValuesIn(SpecialCases()),
                         SpecialName);

// ---- Determinism and the single-pass workspace contract -------------------------
// One workspace, filled with garbage first, serves launches of different
// shapes back to back: each launch clears the counters it uses itself (else
// the last block of a segment is never found and its outputs stay poisoned),
// and repeated launches give bitwise the same output.
TEST(ReduceSinglePass, WorkspaceReusedAcrossShapesAndDeterministic) {
  GC_REQUIRE_GPU();
  struct Shape {
    int64_t outer, axis, inner;
  };
  // The first four take their tickets from the module's pool; 100 rows of
  // 20001 split over blocks are more segments than it serves (workspace
  // counters, cleared by the launch).
  const Shape shapes[] = {
      {1, 2000003, 1}, {3, 70001, 1}, {1, 3000, 256}, {2, 5000, 33}, {100, 20001, 1}};
  size_t ws_bytes = 0;
  for (const Shape& s : shapes) {
    ReduceArgs probe{reinterpret_cast<void*>(256), reinterpret_cast<void*>(256), s.outer, s.axis,
                     s.inner, ReduceOp::kSum, DType::kF32, DType::kF32};
    ws_bytes = std::max(ws_bytes, kernels::ReduceWorkspaceBytes(probe, "single_pass"));
  }
  ASSERT_GT(ws_bytes, 0u) << "these shapes should split across blocks";
  DeviceArray ws(ws_bytes);
  GC_ASSERT_CUDA(cudaMemset(ws.get(), 0xA5, ws_bytes));
  for (int round = 0; round < 2; ++round)
    for (const Shape& s : shapes)
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        const Input in = RandomInput(size_t(s.outer * s.axis * s.inner), DType::kF32);
        DeviceArray d_in(in.bytes.size());
        d_in.Upload(in.bytes.data());
        ReduceArgs a{nullptr, nullptr, s.outer, s.axis, s.inner, op, DType::kF32, DType::kF32};
        const std::vector<uint8_t> first = LaunchAndFetch(in, a, "single_pass", 0, ws.get(), &d_in);
        EXPECT_TRUE(Close(first, DType::kF32, Reduce(in, s.outer, s.axis, s.inner, op)));
        for (int rep = 0; rep < 3; ++rep) {
          const std::vector<uint8_t> again = LaunchAndFetch(in, a, "single_pass", 0, ws.get(), &d_in);
          EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size()), 0)
              << "not bitwise reproducible, shape " << s.outer << "x" << s.axis << "x" << s.inner;
        }
      }
}

// single_pass launches with few segments take tickets from one module-wide
// pool and leave them at zero: many launches in flight on several streams at
// once, of different shapes, each with its own workspace, must all find their
// last blocks and give the bitwise result of a launch alone.
TEST(ReduceSinglePass, PoolTicketsOnConcurrentStreams) {
  GC_REQUIRE_GPU();
  struct Shape {
    int64_t outer, axis, inner;
  };
  const Shape shapes[] = {{1, 1000003, 1}, {5, 100003, 1}, {1, 20000, 64}, {64, 30001, 1}};
  constexpr int kStreams = 8, kRounds = 6;
  struct Job {
    Input in;
    std::unique_ptr<DeviceArray> d_in, d_out, ws;
    ReduceArgs args;
    std::vector<uint8_t> alone;
  };
  std::vector<Job> jobs;
  for (int j = 0; j < kStreams; ++j) {
    const Shape& sh = shapes[j % 4];
    Job job;
    job.in = RandomInput(size_t(sh.outer * sh.axis * sh.inner), DType::kF32);
    job.d_in = std::make_unique<DeviceArray>(job.in.bytes.size());
    job.d_in->Upload(job.in.bytes.data());
    job.args = ReduceArgs{nullptr,     nullptr,    sh.outer,
                          sh.axis,     sh.inner,   j % 2 ? ReduceOp::kMax : ReduceOp::kSum,
                          DType::kF32, DType::kF32};
    job.alone = LaunchAndFetch(job.in, job.args, "single_pass", 0, nullptr, job.d_in.get());
    EXPECT_TRUE(
        Close(job.alone, DType::kF32, Reduce(job.in, sh.outer, sh.axis, sh.inner, job.args.op)));
    job.args.in = job.d_in->get();
    job.d_out = std::make_unique<DeviceArray>(size_t(sh.outer * sh.inner) * 4);
    job.args.out = job.d_out->get();
    const size_t ws_bytes = kernels::ReduceWorkspaceBytes(job.args, "single_pass");
    ASSERT_GT(ws_bytes, 0u) << "each shape should split across blocks";
    job.ws = std::make_unique<DeviceArray>(ws_bytes);
    jobs.push_back(std::move(job));
  }
  std::vector<cudaStream_t> streams(kStreams);
  for (cudaStream_t& st : streams)
    GC_ASSERT_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int round = 0; round < kRounds; ++round) {
    for (int j = 0; j < kStreams; ++j) {
      jobs[j].d_out->Poison();
      GC_ASSERT_CUDA(cudaDeviceSynchronize());
    }
    // Every stream gets several launches back to back; all streams at once.
    for (int rep = 0; rep < 4; ++rep)
      for (int j = 0; j < kStreams; ++j)
        EXPECT_EQ(kernels::LaunchReduce(jobs[j].args, "single_pass", jobs[j].ws->get(), streams[j]),
                  cudaSuccess);
    GC_ASSERT_CUDA(cudaDeviceSynchronize());
    for (int j = 0; j < kStreams; ++j) {
      std::vector<uint8_t> got(jobs[j].alone.size());
      jobs[j].d_out->Download(got.data());
      EXPECT_EQ(std::memcmp(got.data(), jobs[j].alone.data(), got.size()), 0)
          << "round " << round << ", stream " << j;
    }
  }
  for (cudaStream_t st : streams) cudaStreamDestroy(st);
}

TEST(ReduceDeterminism, EveryVariantBitwiseReproducible) {
  GC_REQUIRE_GPU();
  const Input in = RandomInput(1 << 21, DType::kF32);
  DeviceArray d_in(in.bytes.size());
  d_in.Upload(in.bytes.data());
  for (const std::string& v : kernels::ReduceVariants()) {
    for (int64_t inner : {int64_t(1), int64_t(64)}) {
      if (v == "row_warp" && inner > 1) continue;     // rows only
      if (v == "col_thread" && inner == 1) continue;  // columns only
      ReduceArgs a{nullptr, nullptr, 1, (1 << 21) / inner, inner, ReduceOp::kSum, DType::kF32,
                   DType::kF32};
      const std::vector<uint8_t> first = LaunchAndFetch(in, a, v, 0, nullptr, &d_in);
      const std::vector<uint8_t> again = LaunchAndFetch(in, a, v, 0, nullptr, &d_in);
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size()), 0) << v << " inner " << inner;
    }
  }
}

// ---- Refusals (host-side checks; no device needed) ------------------------------
TEST(ReduceRefusals, RejectsBadArguments) {
  void* p = reinterpret_cast<void*>(0x10000);
  const ReduceArgs good{p, p, 4, 100, 1, ReduceOp::kSum, DType::kF32, DType::kF32};
  EXPECT_TRUE(kernels::CanImplementReduce(good, "").ok);
  for (const std::string& v : kernels::ReduceVariants())
    EXPECT_EQ(kernels::CanImplementReduce(good, v).ok, v != "col_thread") << v;
  EXPECT_FALSE(kernels::CanImplementReduce(good, "atomic_float").ok);
  ReduceArgs columns = good;
  columns.inner = 8;
  EXPECT_FALSE(kernels::CanImplementReduce(columns, "row_warp").ok);
  EXPECT_EQ(kernels::ReduceVariantName(columns, "row_warp"), "");
  EXPECT_EQ(kernels::ReduceVariantName(columns, ""), "single_pass");
  ReduceArgs short_rows = good;  // 4 rows of 100: the small-row path
  EXPECT_EQ(kernels::ReduceVariantName(short_rows, ""), "row_warp");
  ReduceArgs all_small{p, p, 1, 37, 1, ReduceOp::kSum, DType::kF32, DType::kF32};
  EXPECT_EQ(kernels::ReduceVariantName(all_small, ""), "row_warp");
  ReduceArgs all_large{p, p, 1, 1000000, 1, ReduceOp::kSum, DType::kF32, DType::kF32};
  EXPECT_EQ(kernels::ReduceVariantName(all_large, ""), "vec");
  ReduceArgs few_long_rows{p, p, 8, 1000000, 1, ReduceOp::kSum, DType::kF32, DType::kF32};
  EXPECT_EQ(kernels::ReduceVariantName(few_long_rows, ""), "vec");
  ReduceArgs short_axis{p, p, 128, 3, 4096, ReduceOp::kSum, DType::kF32, DType::kF32};
  EXPECT_EQ(kernels::ReduceVariantName(short_axis, ""), "col_thread");
  EXPECT_TRUE(kernels::CanImplementReduce(short_axis, "col_thread").ok);
  EXPECT_EQ(kernels::LaunchReduce(good, "atomic_float", nullptr, nullptr), cudaErrorInvalidValue);

  ReduceArgs empty_axis = good;
  empty_axis.axis = 0;
  kernels::Support s = kernels::CanImplementReduce(empty_axis, "");
  EXPECT_FALSE(s.ok);
  EXPECT_FALSE(s.reason.empty());

  ReduceArgs null_in = good;
  null_in.in = nullptr;
  EXPECT_FALSE(kernels::CanImplementReduce(null_in, "vec").ok);
  EXPECT_EQ(kernels::LaunchReduce(null_in, "vec", nullptr, nullptr), cudaErrorInvalidValue);

  ReduceArgs misaligned = good;
  misaligned.in = reinterpret_cast<void*>(0x10002);  // not 4-byte aligned for fp32
  EXPECT_FALSE(kernels::CanImplementReduce(misaligned, "").ok);

  ReduceArgs neg = good;
  neg.inner = -1;
  EXPECT_FALSE(kernels::CanImplementReduce(neg, "").ok);

  ReduceArgs bad_op = good;
  bad_op.op = static_cast<ReduceOp>(7);
  EXPECT_FALSE(kernels::CanImplementReduce(bad_op, "").ok);

  // Nothing to produce: accepted, nothing launched.
  ReduceArgs no_out{nullptr, nullptr, 0, 100, 1, ReduceOp::kMax, DType::kF32, DType::kF32};
  EXPECT_TRUE(kernels::CanImplementReduce(no_out, "").ok);
  EXPECT_EQ(kernels::LaunchReduce(no_out, "", nullptr, nullptr), cudaSuccess);
}

TEST(ReduceRefusals, MissingWorkspaceIsRefused) {
  GC_REQUIRE_GPU();  // the split depends on the device's SM count
  void* p = reinterpret_cast<void*>(0x10000);
  const ReduceArgs all{p, p, 1, 1 << 24, 1, ReduceOp::kSum, DType::kF32, DType::kF32};
  for (const char* v : {"tree_divergent", "vec", "single_pass"}) {
    ASSERT_GT(kernels::ReduceWorkspaceBytes(all, v), 0u) << v;
    EXPECT_EQ(kernels::LaunchReduce(all, v, nullptr, nullptr), cudaErrorInvalidValue) << v;
  }
}

}  // namespace
}  // namespace gpucompute::testing
