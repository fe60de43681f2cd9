// gc_sweep_gemm: GEMM through the server's default path on one GPU, against
// cuBLAS in the same run.
//
//   gc_sweep_gemm [--json=PATH] [--filter=SUBSTR] [--reps=N] [--warmup=N]
//                 [--no-variants] [--cooldown_ms=N] [--l2=cold|warm]
//                 [--random=N [--seed=S]] [--list] [--case=SPEC ...]
//
// Each case builds the GemmSpec as the service does, operands resident in
// device memory and the result kept there (options.keep_output), and runs it
// through the Engine and the CUDA device: planner, admission, every device
// pass (C's addend or a dtype conversion, workspace, the kernels) and the
// version the default picks, named as the shard timings name it. Its cost is
// the device busy time of all the GPU work the request enqueued, from
// CUPTI's records (device_timer.h), median of --reps requests after
// --warmup (3 after 1 for cases over 20 ms). Every version of ours that
// takes the case is forced by name and timed the same way (what
// kernels/src/heuristics/gemm_heuristics.h is derived from), and the vendor
// fallbacks "cublaslt" and "cublas" too. The vendor is cublasGemmStridedBatchedEx (the call
// torch.matmul makes), timed the same way in the same process. L2 is
// flushed before every timed run of either (--l2=warm: not). Every default
// result is checked against the vendor's.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gpucompute/kernels/gemm.h"
#include "server/engine/engine.h"
#include "tests/sweep/sweep_harness.h"
#include "tests/sweep/sweep_vendor.h"

namespace gpucompute::sweep {
namespace {

using KDType = kernels::DType;
using D = gpucompute::DType;

KDType K(D t) { return static_cast<KDType>(static_cast<int>(t)); }
const char* Name(D t) { return t == D::kFloat32 ? "f32" : (t == D::kFloat16 ? "f16" : "bf16"); }

using Options = SweepOptions;

// Every version of ours a case may run, and the vendor fallback. The slow
// rungs of the SIMT ladder (naive .. swizzle) and the one-warpgroup wgmma_tma
// are left out: they lose everywhere (gemm_simt.md, gemm_tc.md).
const std::vector<std::string> kTcVariants = {"mma_sync",
                                              "wgmma_ws",
                                              "wgmma_persistent",
                                              "wgmma_cluster",
                                              "wgmma_cluster_persistent",
                                              "wgmma_splitk",
                                              "wgmma_splitk_128x128",
                                              "wgmma_splitk_128x64",
                                              "wgmma_splitk_128x32",
                                              "wgmma_splitk_128x16",
                                              "wgmma_splitk_128x192",
                                              "wgmma_packed",
                                              "cublaslt",
                                              "cublas"};
const std::vector<std::string> kSimtVariants = {"warptile", "splitk", "cublaslt", "cublas"};

struct Case {
  std::string cls;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool ta = false, tb = false;
  D dtype = D::kBFloat16;
  D out = D::kBFloat16;
  bool tf32 = false;
  bool shared_b = false;  // one B for the whole batch
  double beta = 0;        // with C of the output's shape
};

struct Row {
  Case c;
  std::string shape;
  double flops = 0;
  std::string variant;  // what the default ran
  double ours = -1, ours_span = -1;
  std::string clock;  // ClockJson of the default's timing
  std::map<std::string, double> forced;
  std::string vendor;
  double vendor_s = -1;
  double error = 0;
  bool ok = true;
};

std::string Describe(const Case& c) {
  std::string s = absl::StrCat(c.m, "x", c.n, "x", c.k);
  if (c.batch > 1) s = absl::StrCat(c.batch, "*", s, c.shared_b ? " B shared" : "");
  if (c.ta || c.tb) absl::StrAppend(&s, " ", c.ta ? "T" : "N", c.tb ? "T" : "N");
  if (c.beta != 0) absl::StrAppend(&s, " beta");
  return s;
}

const char* Family(const Case& c) {
  if (c.dtype != D::kFloat32) return Name(c.dtype);
  return c.tf32 ? "tf32" : "f32";
}

// What --filter matches: "class shape dtype->out".
std::string FilterName(const Case& c) {
  return absl::StrCat(c.cls, " ", Describe(c), " ", Family(c), "->", Name(c.out));
}

class Sweep {
 public:
  Sweep(Options options, std::unique_ptr<Engine> engine)
      : options_(std::move(options)),
        engine_(std::move(engine)),
        vendor_(options_.warmup, options_.reps) {
    call_.owner = "sweep";
    vendor_.SetColdL2(options_.cold_l2);
  }

  // One request warmup + reps times (3 after 1 past 20 ms): the median
  // device busy time, the variant that ran, the last result.
  Timed Time(const std::function<absl::StatusOr<OpResult>()>& run) {
    return TimeRequest(run, options_.warmup, options_.reps, 20e-3, options_.cooldown_ms,
                       /*gap_us=*/0, options_.cold_l2);
  }

  void Gemm(const Case& c) {
    Row row;
    row.c = c;
    row.shape = Describe(c);
    const std::string name = FilterName(c);
    if (!options_.filter.empty() && name.find(options_.filter) == std::string::npos) return;
    row.flops = 2.0 * double(c.batch) * double(c.m) * double(c.n) * double(c.k);
    const size_t es = DTypeSize(c.dtype), eo = DTypeSize(c.out);
    const int64_t batch_b = c.shared_b ? 1 : c.batch;
    DeviceArray a(size_t(c.batch * c.m * c.k) * es), b(size_t(batch_b * c.k * c.n) * es);
    DeviceArray ref(size_t(c.batch * c.m * c.n) * eo);
    std::unique_ptr<DeviceArray> cin;
    Fill(a.get(), c.batch * c.m * c.k, K(c.dtype), Seed());
    Fill(b.get(), batch_b * c.k * c.n, K(c.dtype), Seed());

    GemmSpec spec;
    auto shape3 = [&](int64_t batch, int64_t r, int64_t cols) {
      return batch > 1 ? std::vector<int64_t>{batch, r, cols} : std::vector<int64_t>{r, cols};
    };
    spec.a = View(c.dtype, c.ta ? shape3(c.batch, c.k, c.m) : shape3(c.batch, c.m, c.k), a.get());
    spec.b = View(c.dtype, c.tb ? shape3(batch_b, c.n, c.k) : shape3(batch_b, c.k, c.n), b.get());
    spec.batch = c.batch;
    spec.m = c.m;
    spec.n = c.n;
    spec.k = c.k;
    spec.a_batched = c.batch > 1;
    spec.b_batched = batch_b > 1;
    spec.trans_a = c.ta;
    spec.trans_b = c.tb;
    spec.dtype = c.dtype;
    spec.out_shape = shape3(c.batch, c.m, c.n);
    spec.options.output_dtype = c.out;
    spec.options.keep_output = true;
    spec.options.allow_tf32 = c.tf32;
    if (c.beta != 0) {  // C in the input dtype, batched like the output
      cin = std::make_unique<DeviceArray>(size_t(c.batch * c.m * c.n) * es);
      Fill(cin->get(), c.batch * c.m * c.n, K(c.dtype), Seed());
      spec.beta = c.beta;
      spec.c = View(c.dtype, spec.out_shape, cin->get());
      spec.c_batched = c.batch > 1;
    }
    auto run = [&](const std::string& variant) {
      spec.options.variant = variant;
      return Time([&] { return engine_->Gemm(spec, call_); });
    };
    Timed def = run("");
    if (!def.status.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), def.status.ToString().c_str());
      row.ok = false;
    }
    row.variant = def.variant;
    row.ours = def.seconds;
    row.ours_span = def.span;
    row.clock = ClockJson(def);

    // The vendor writes `out` from inputs of `dtype` (with the addend's copy
    // in `ref` when beta != 0; cuBLAS takes it in the output dtype only).
    const bool vendor_runs = c.beta == 0 || c.dtype == c.out;
    if (vendor_runs && (c.dtype != D::kFloat32 || c.out == D::kFloat32)) {
      if (c.beta != 0) {
        CopyOnDevice(ref.get(), cin->get(), size_t(c.batch * c.m * c.n) * eo);
      } else {
        Poison(ref.get(), c.batch * c.m * c.n, K(c.out));
      }
      const int64_t stride_a = c.batch > 1 ? c.m * c.k : 0;
      const int64_t stride_b = batch_b > 1 ? c.k * c.n : 0;
      if (def.seconds > 20e-3) vendor_.SetReps(1, 3);
      CoolDown(options_.cooldown_ms);
      row.vendor_s = vendor_.TimeGemm(a.get(), b.get(), ref.get(), c.m, c.n, c.k, c.batch, stride_a,
                                      stride_b, c.ta, c.tb, K(c.dtype), K(c.out), c.tf32, 1.f,
                                      float(c.beta), &row.vendor);
      vendor_.SetReps(options_.warmup, options_.reps);
      if (def.output && row.vendor_s > 0) {
        // One rounding of the output, tf32's of the inputs, fp32 sums.
        const double in_eps = c.dtype != D::kFloat32 ? 0 : (c.tf32 ? 1e-3 : 1e-6);
        const double out_eps = c.out == D::kBFloat16 ? 8e-3 : (c.out == D::kFloat16 ? 1e-3 : 1e-6);
        const double scale = std::sqrt(double(c.k));
        row.error = MaxError(def.output->buffer().data(), K(c.out), ref.get(), K(c.out),
                             c.batch * c.m * c.n, 4 * (in_eps + 1e-5) * scale + 2 * out_eps,
                             4 * out_eps + 4 * in_eps);
      }
    }
    row.ok = row.ok && row.error <= 1.0;
    if (options_.variants) {
      const bool simt = c.dtype == D::kFloat32 && !c.tf32;
      for (const std::string& v : simt ? kSimtVariants : kTcVariants) {
        Timed t = run(v);
        if (t.status.ok()) row.forced[v] = t.seconds;
      }
    }
    std::fprintf(stderr, "%-9s %-34s %-9s %-26s %10.2f us  vendor %10.2f us  x%.3f  %s%s\n",
                 row.c.cls.c_str(), row.shape.c_str(),
                 absl::StrCat(Family(c), "->", Name(c.out)).c_str(), row.variant.c_str(),
                 row.ours * 1e6, row.vendor_s * 1e6, row.vendor_s > 0 ? row.vendor_s / row.ours : 0,
                 row.ok ? "ok" : "WRONG", ClockText(def).c_str());
    rows_.push_back(row);
    Write();  // after every case: a run cut short keeps what it measured
  }

  void set_command(std::string command) { command_ = std::move(command); }

  void Write() const {
    FILE* f = OpenResults(options_, command_);
    if (f == nullptr) return;
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      const std::string forced = ForcedJson(r.forced);
      std::fprintf(
          f,
          "  {\"class\": \"%s\", \"shape\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
          "\"batch\": %lld, \"ta\": %s, \"tb\": %s, \"shared_b\": %s, \"beta\": %g, "
          "\"dtype\": \"%s\", \"out\": \"%s\", \"flops\": %.0f, \"variant\": \"%s\", "
          "\"ours_s\": %.9g, \"ours_span_s\": %.9g, \"vendor\": \"%s\", \"vendor_s\": %.9g, "
          "\"error\": %.4g, \"ok\": %s, \"forced\": {%s}%s}%s\n",
          r.c.cls.c_str(), r.shape.c_str(), (long long)r.c.m, (long long)r.c.n, (long long)r.c.k,
          (long long)r.c.batch, r.c.ta ? "true" : "false", r.c.tb ? "true" : "false",
          r.c.shared_b ? "true" : "false", r.c.beta, Family(r.c), Name(r.c.out), r.flops,
          r.variant.c_str(), r.ours, r.ours_span, r.vendor.c_str(), r.vendor_s,
          std::isfinite(r.error) ? r.error : 1e300, r.ok ? "true" : "false", forced.c_str(),
          r.clock.c_str(), i + 1 < rows_.size() ? "," : "");
    }
    std::fprintf(f, " ]}\n");
    std::fclose(f);
  }

  // One line per case, then a summary per class: the default against the
  // vendor, and the best of our own kernels against it.
  void Print() const {
    std::printf("%-9s %-34s %-10s %-26s %10s %10s %7s %7s %s\n", "class", "shape", "dtype",
                "variant", "ours_us", "vendor_us", "x_vend", "x_own", "ok");
    std::map<std::string, std::vector<std::pair<double, double>>> by;  // (default, own) ratios
    for (const Row& r : rows_) {
      double own = -1;
      for (const auto& [name, s] : r.forced)
        if (!kernels::IsGemmVendorVariant(name) && s > 0 && (own < 0 || s < own)) own = s;
      const double xv = r.vendor_s > 0 ? r.vendor_s / r.ours : 0;
      const double xo = r.vendor_s > 0 && own > 0 ? r.vendor_s / own : 0;
      std::printf("%-9s %-34s %-10s %-26s %10.2f %10.2f %7.3f %7.3f %s\n", r.c.cls.c_str(),
                  r.shape.c_str(), absl::StrCat(Family(r.c), "->", Name(r.c.out)).c_str(),
                  r.variant.c_str(), r.ours * 1e6, r.vendor_s * 1e6, xv, xo, r.ok ? "ok" : "WRONG");
      if (xv > 0) {
        by[r.c.cls].push_back({xv, xo});
        by["(all)"].push_back({xv, xo});
      }
    }
    std::printf("\n%-10s %5s %8s %8s %8s %8s %8s\n", "class", "cases", "geo_def", "min_def",
                ">=0.95", "geo_own", ">=0.9");
    for (const auto& [cls, xs] : by) {
      double ld = 0, lo = 0, mn = 1e9;
      int good = 0, own_good = 0, no = 0;
      for (const auto& [xv, xo] : xs) {
        ld += std::log(xv);
        mn = std::min(mn, xv);
        good += xv >= 0.95;
        if (xo > 0) {
          lo += std::log(xo);
          ++no;
          own_good += xo >= 0.9;
        }
      }
      std::printf("%-10s %5zu %8.3f %8.3f %4d/%-3zu %8.3f %4d/%-3d\n", cls.c_str(), xs.size(),
                  std::exp(ld / double(xs.size())), mn, good, xs.size(),
                  no ? std::exp(lo / no) : 0.0, own_good, no);
    }
  }

  int failures() const {
    int n = 0;
    for (const Row& r : rows_) n += !r.ok;
    return n;
  }

 private:
  // Done when it returns (a device-to-device cudaMemcpy returns before).
  static void CopyOnDevice(void* dst, const void* src, size_t bytes) {
    if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      std::exit(1);
    }
  }
  static TensorView View(D dt, std::vector<int64_t> shape, const void* data) {
    return ResidentView(dt, std::move(shape), data);
  }
  static uint64_t Seed() { return NextSeed(); }

  Options options_;
  std::unique_ptr<Engine> engine_;
  Vendor vendor_;
  CallContext call_;
  std::vector<Row> rows_;
  std::string command_;
};

// The case list: classes of shapes (the and the ones LLM serving
// sends), each class over the dtypes it matters for.
std::vector<Case> ListedCases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& cls, int64_t m, int64_t n, int64_t k, D dt, bool tf32,
                 auto&&... more) {
    Case c;
    c.cls = cls;
    c.m = m;
    c.n = n;
    c.k = k;
    c.dtype = dt;
    c.out = dt;
    c.tf32 = tf32;
    (more(c), ...);
    cases.push_back(c);
  };
  auto tn = [](bool ta, bool tb) { return [=](Case& c) { c.ta = ta, c.tb = tb; }; };
  auto batch = [](int64_t b, bool shared) {
    return [=](Case& c) { c.batch = b, c.shared_b = shared; };
  };
  auto out = [](D o) { return [=](Case& c) { c.out = o; }; };
  auto beta = [](double v) { return [=](Case& c) { c.beta = v; }; };
  struct Ty {
    D dt;
    bool tf32;
  };
  const Ty bf16{D::kBFloat16, false}, f16{D::kFloat16, false}, tf32{D::kFloat32, true},
      f32{D::kFloat32, false};
  const Ty all[] = {bf16, f16, tf32, f32};

  // Squares, 128 .. 16384.
  for (int64_t n : {128, 256, 512, 1024, 2048, 4096, 8192, 16384})
    for (const Ty& t : all) add("square", n, n, n, t.dt, t.tf32);
  // Odd sizes.
  for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1537, 2049, 999},
                                                            {3000, 5000, 2000},
                                                            {1000, 3000, 777},
                                                            {4097, 4095, 4099},
                                                            {999, 999, 999},
                                                            {6001, 3001, 5003}})
    for (const Ty& t : all) add("odd", m, n, k, t.dt, t.tf32);
  // Mid-size problems of one to eight waves of tiles, row pitches on 128
  // bytes and not (the TMA boxes of an operand whose rows start off 128
  // bytes straddle cache lines).
  for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
           {2048, 3072, 1024}, {2000, 3000, 1000}, {3072, 5120, 2048}, {1536, 2560, 1536}})
    add("mid", m, n, k, D::kBFloat16, false);
  // C's rows off 16 bytes (N not a multiple of 8 in 16-bit, of 4 in fp32)
  // while TMA reads A and B (B K-major, as nn.Linear stores weights).
  const auto nt = tn(false, true);
  add("odd_c", 737, 11635, 256, D::kBFloat16, false, nt);
  add("odd_c", 6753, 5542, 512, D::kFloat16, false, nt);
  add("odd_c", 2048, 14725, 32, D::kBFloat16, false, nt);
  add("odd_c", 32, 3687, 8192, D::kBFloat16, false, nt);
  add("odd_c", 256, 425, 16384, D::kBFloat16, false, nt);
  add("odd_c", 256, 943, 512, D::kBFloat16, false, nt, batch(16, false));
  add("odd_c", 1000, 3001, 1024, D::kBFloat16, false, nt, out(D::kFloat32));
  add("odd_c", 4, 1853, 4096, D::kFloat32, true, nt);
  add("odd_c", 1000, 3001, 1024, D::kFloat32, false, nt);
  // Small K.
  for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{4096, 4096, 16},
                                                            {4096, 4096, 32},
                                                            {8192, 8192, 64},
                                                            {2048, 8192, 128},
                                                            {4096, 4096, 256},
                                                            {16384, 16384, 128}})
    for (const Ty& t : {bf16, tf32}) add("small_k", m, n, k, t.dt, t.tf32);
  add("small_k", 4096, 4096, 64, D::kFloat16, false);
  add("small_k", 4096, 4096, 64, D::kFloat32, false);
  // Large K with small M*N.
  for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{256, 256, 65536},
                                                            {128, 128, 16384},
                                                            {512, 512, 32768},
                                                            {1024, 1024, 65536},
                                                            {64, 4096, 16384}})
    for (const Ty& t : {bf16, tf32, f32}) add("large_k", m, n, k, t.dt, t.tf32);
  // Thin M against large N*K: LLM layers (activations [M, K] x weights; the
  // weights of nn.Linear are [N, K], B transposed).
  for (int64_t m : {1, 8, 16, 64, 128, 256})
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
             {4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}}) {
      if (m == 8 && n == 128256) continue;
      add("thin_m", m, n, k, D::kBFloat16, false, tn(false, true));
    }
  for (int64_t m : {16, 128}) {
    add("thin_m", m, 4096, 4096, D::kBFloat16, false);
    add("thin_m", m, 14336, 4096, D::kFloat16, false, tn(false, true));
    add("thin_m", m, 4096, 4096, D::kFloat32, true, tn(false, true));
  }
  // Transposed operands.
  for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{4096, 4096, 4096}, {2000, 3000, 1000}})
    for (const Ty& t : {bf16, tf32, f32})
      for (auto [ta, tb] :
           std::vector<std::pair<bool, bool>>{{false, true}, {true, false}, {true, true}})
        add("trans", m, n, k, t.dt, t.tf32, tn(ta, tb));
  // Batched.
  for (const Ty& t : {bf16, tf32, f32}) {
    add("batched", 512, 512, 64, t.dt, t.tf32, batch(32, false));
    add("batched", 1024, 1024, 1024, t.dt, t.tf32, batch(8, false));
    add("batched", 128, 128, 128, t.dt, t.tf32, batch(64, false));
    add("batched", 256, 4096, 4096, t.dt, t.tf32, batch(16, true));
  }
  add("batched", 2048, 128, 2048, D::kBFloat16, false, batch(16, false), tn(false, true));
  // Output dtypes other than the input's.
  for (int64_t n : {1024, 4096})
    for (const Ty& t : {bf16, f16}) add("out_f32", n, n, n, t.dt, t.tf32, out(D::kFloat32));
  add("out_f32", 3000, 5000, 2000, D::kBFloat16, false, out(D::kFloat32));
  // alpha/beta with C.
  add("beta", 4096, 4096, 4096, D::kBFloat16, false, beta(1.0));
  add("beta", 1000, 3000, 777, D::kBFloat16, false, beta(0.5));
  add("beta", 1000, 3000, 777, D::kFloat32, false, beta(0.5));
  add("beta", 2048, 2048, 2048, D::kFloat32, true, beta(-1.0));
  add("beta", 512, 512, 512, D::kBFloat16, false, beta(1.0), batch(8, false));
  return cases;
}

// `n` random shapes of five classes (--random): general (M, N, K 16 to 8k),
// thin M (1 to 256 rows against N and K of 1k to 16k), small K (8 to 256
// under M and N of 512 to 16k), large K (4k to 64k under M and N of 16 to
// 1k) and batched (2 to 64 problems of 32 to 2k, B shared one time in
// five). Sizes are log-uniform, half of them not powers of two; bf16 two
// times in five, fp16, tf32 and exact fp32 one each; each operand transposed
// one time in four; an fp32 output for 16-bit inputs and beta with C one
// time in eight.
// The largest dimension is halved until every operand fits 1 GiB and the
// request is at most 2 TFLOP.
std::vector<Case> RandomCases(int n, uint64_t seed) {
  RandomShapes r(seed);
  auto size = [&](int64_t lo, int64_t hi) { return r.Size(lo, hi); };
  std::vector<Case> cases;
  for (int i = 0; i < n; ++i) {
    Case c;
    switch (r.Pick(5)) {
      case 0:
        c.cls = "rnd_general";
        c.m = size(16, 8192), c.n = size(16, 8192), c.k = size(16, 8192);
        break;
      case 1:
        c.cls = "rnd_thin_m";
        c.m = size(1, 256), c.n = size(1024, 16384), c.k = size(1024, 16384);
        break;
      case 2:
        c.cls = "rnd_small_k";
        c.m = size(512, 16384), c.n = size(512, 16384), c.k = size(8, 256);
        break;
      case 3:
        c.cls = "rnd_large_k";
        c.m = size(16, 1024), c.n = size(16, 1024), c.k = size(4096, 65536);
        break;
      default:
        c.cls = "rnd_batched";
        c.batch = size(2, 64);
        c.m = size(32, 2048), c.n = size(32, 2048), c.k = size(32, 2048);
        c.shared_b = r.Pick(5) == 0;
        break;
    }
    switch (r.Pick(5)) {
      case 0:
        c.dtype = D::kFloat16;
        break;
      case 1:
        c.dtype = D::kFloat32, c.tf32 = true;
        break;
      case 2:
        c.dtype = D::kFloat32;
        break;
      default:
        c.dtype = D::kBFloat16;
        break;
    }
    c.out = c.dtype != D::kFloat32 && r.Pick(8) == 0 ? D::kFloat32 : c.dtype;
    c.ta = r.Pick(4) == 0;
    c.tb = r.Pick(4) == 0;
    if (r.Pick(8) == 0) c.beta = 0.5;
    auto too_big = [&] {
      const double kGiB = 1024.0 * 1024 * 1024, es = double(DTypeSize(c.dtype));
      const double b = double(c.batch), bb = c.shared_b ? 1.0 : b;
      return b * c.m * c.k * es > kGiB || bb * c.k * c.n * es > kGiB ||
             b * c.m * c.n * DTypeSize(c.out) > kGiB || 2.0 * b * c.m * c.n * c.k > 2e12;
    };
    while (too_big()) {
      int64_t* largest = &c.m;
      for (int64_t* d : {&c.n, &c.k, &c.batch})
        if (*d > *largest) largest = d;
      *largest = std::max<int64_t>(1, *largest / 2);
    }
    cases.push_back(c);
  }
  return cases;
}

// One case from --case=SPEC: "[B*]MxNxK" then, comma-separated and in any
// order, a layout (NN, NT, TN, TT), the input dtype (bf16, f16, tf32, f32;
// default bf16), "out=DTYPE" (the output's, default the input's),
// "beta=V" (C of the output's shape read) and "shared_b" (one B for the
// batch); e.g. "8192x5700x32,tf32" or "4*512x150x128,TN,f16,out=f32,beta=0.5".
absl::StatusOr<Case> ParseCase(const std::string& spec) {
  Case c;
  c.cls = "case";
  const std::vector<std::string> parts = absl::StrSplit(spec, ',');
  std::string dims = parts[0];
  if (const size_t star = dims.find('*'); star != std::string::npos) {
    if (!absl::SimpleAtoi(dims.substr(0, star), &c.batch) || c.batch < 1)
      return absl::InvalidArgumentError("the batch before '*' is not a positive integer");
    dims = dims.substr(star + 1);
  }
  const std::vector<std::string> mnk = absl::StrSplit(dims, 'x');
  if (mnk.size() != 3 || !absl::SimpleAtoi(mnk[0], &c.m) || !absl::SimpleAtoi(mnk[1], &c.n) ||
      !absl::SimpleAtoi(mnk[2], &c.k) || c.m < 1 || c.n < 1 || c.k < 1)
    return absl::InvalidArgumentError("the shape is not [B*]MxNxK of positive integers");
  auto dtype = [](const std::string& v, D* dt, bool* tf32) {
    if (v == "bf16")
      *dt = D::kBFloat16, *tf32 = false;
    else if (v == "f16")
      *dt = D::kFloat16, *tf32 = false;
    else if (v == "tf32")
      *dt = D::kFloat32, *tf32 = true;
    else if (v == "f32")
      *dt = D::kFloat32, *tf32 = false;
    else
      return false;
    return true;
  };
  bool out_given = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    bool tf32 = false;
    if (p.size() == 2 && (p[0] == 'N' || p[0] == 'T') && (p[1] == 'N' || p[1] == 'T')) {
      c.ta = p[0] == 'T', c.tb = p[1] == 'T';
    } else if (dtype(p, &c.dtype, &tf32)) {
      c.tf32 = tf32;
    } else if (p.rfind("out=", 0) == 0) {
      if (!dtype(p.substr(4), &c.out, &tf32) || tf32)
        return absl::InvalidArgumentError("out= takes bf16, f16 or f32");
      out_given = true;
    } else if (p.rfind("beta=", 0) == 0) {
      if (!absl::SimpleAtod(p.substr(5), &c.beta))
        return absl::InvalidArgumentError("beta= takes a number");
    } else if (p == "shared_b") {
      c.shared_b = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown part '", p, "'"));
    }
  }
  if (!out_given) c.out = c.dtype;
  if (c.dtype == D::kFloat32 && c.out != D::kFloat32)
    return absl::InvalidArgumentError("fp32 inputs give an fp32 output");
  return c;
}

}  // namespace
}  // namespace gpucompute::sweep

int main(int argc, char** argv) {
  using namespace gpucompute;
  sweep::SweepOptions options;
  options.json = "sweep-gemm.json";
  options.reps = 10;
  options.warmup = 2;
  // L2 flushed before every run: a request writes a new output tensor each
  // time, which the vendor's one reused C (and beta's addend restored right
  // before its call) would otherwise not pay for while C fits in L2.
  options.cold_l2 = true;
  std::string command;
  std::vector<sweep::Case> given;  // --case
  auto extra = [&](const std::string& arg) -> absl::StatusOr<bool> {
    if (arg.rfind("--case=", 0) != 0) return false;
    absl::StatusOr<sweep::Case> c = sweep::ParseCase(arg.substr(7));
    if (!c.ok()) return c.status();
    given.push_back(*c);
    return true;
  };
  if (std::optional<int> done = sweep::ParseSweepFlags(
          argc, argv, "gc_sweep_gemm",
          "  GEMM through the server's default path on GPU 0, every version of ours and the\n"
          "  cuBLASLt fallback forced too, against cublasGemmStridedBatchedEx in the same run.\n"
          "  --filter keeps the cases whose \"class shape dtype->out\" contains SUBSTR;\n"
          "  --no-variants times the default only. tests/sweep/gemm_table.py writes the\n"
          "  markdown table.\n"
          "  --case=SPEC (repeatable) runs these cases instead of the list (class \"case\"):\n"
          "  [B*]MxNxK, then comma-separated NN|NT|TN|TT, bf16|f16|tf32|f32, out=DTYPE,\n"
          "  beta=V, shared_b; e.g. --case=8192x5700x32,tf32 --case=4*512x150x128,TN,beta=0.5\n",
          &options, &command, extra))
    return *done;
  if (!given.empty() && options.random > 0) {
    std::fprintf(stderr, "--case and --random each replace the list: give one of them\n");
    return 2;
  }
  const std::vector<sweep::Case> cases = !given.empty() ? given
                                         : options.random > 0
                                             ? sweep::RandomCases(options.random, options.seed)
                                             : sweep::ListedCases();
  if (options.list) {
    for (const sweep::Case& c : cases) {
      const std::string name = sweep::FilterName(c);
      if (name.find(options.filter) != std::string::npos) std::printf("%s\n", name.c_str());
    }
    return 0;
  }
  std::unique_ptr<Engine> engine = sweep::MakeGpuEngine();
  if (engine == nullptr) return 1;
  sweep::Sweep s(options, std::move(engine));
  s.set_command(command);
  for (const sweep::Case& c : cases) s.Gemm(c);
  s.Write();
  s.Print();
  std::printf("\nresults: %s; %d wrong\n", options.json.c_str(), s.failures());
  return s.failures() == 0 ? 0 : 1;
}
