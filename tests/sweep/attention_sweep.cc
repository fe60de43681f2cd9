// gc_sweep_attention: attention through the server's default path on one GPU.
//
//   gc_sweep_attention [--json=PATH] [--filter=SUBSTR] [--reps=N] [--warmup=N]
//                      [--no-variants] [--cooldown_ms=N] [--gap_us=N]
//                      [--random=N [--seed=S]] [--list]
//
// Each case builds the AttentionSpec as the service does, Q, K and V resident
// in device memory (fresh uniform values) and the result kept there
// (options.keep_output), and runs it through the Engine and the CUDA device:
// planner, admission, every device pass (operand slicing, workspace, the
// kernels, a dtype conversion) and the version the default picks, named as
// the shard timings name it. Its cost is the device busy time of all the GPU
// work the request enqueued, from CUPTI's records (device_timer.h), median of
// --reps requests after --warmup (3 after 1 for cases over 20 ms), the GPU
// left idle --gap_us (default 500) before each timed request, as the
// vendor's timing leaves it idle before each of its runs (a 10^6-cycle sleep
// kernel, ~0.5 ms), so that both are timed the same way. Every
// flash version of ours that takes the case is forced by name and timed the
// same way (what kernels/src/heuristics/attention_heuristics.h is derived
// from). Sampled rows of every default result are checked against a float64
// reference computed here. The vendor (PyTorch SDPA's cuDNN and
// FlashAttention-2 backends) is timed on the same shapes by
// tests/sweep/attention_vendor.py, run on this file's JSON in the same
// command (deploy/gpu/sweep-attention.sh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/engine/engine.h"
#include "tests/sweep/sweep_harness.h"
#include "tests/sweep/sweep_vendor.h"

namespace gpucompute::sweep {
namespace {

using KDType = kernels::DType;
using D = gpucompute::DType;

KDType K(D t) { return static_cast<KDType>(static_cast<int>(t)); }
const char* Name(D t) { return t == D::kFloat32 ? "f32" : (t == D::kFloat16 ? "f16" : "bf16"); }

// Our versions a case may run by name. The reference (it materialises the
// scores) is too slow at these sizes.
const std::vector<std::string> kVariants = {"flash_mma", "flash_wgmma", "flash_wgmma_pingpong",
                                            "flash_wgmma_pipelined", "flash_wgmma_overlap"};

struct Case {
  std::string cls;
  int64_t b = 1, hq = 1, hkv = 1, sq = 1, skv = 1, d = 128;
  bool causal = false;
  bool lse = false;
  D dtype = D::kBFloat16;
};

struct Row {
  Case c;
  std::string shape;
  double flops = 0;
  std::string variant;
  double ours = -1, ours_span = -1;
  std::string clock;  // ClockJson of the default's timing
  std::map<std::string, double> forced;
  double error = 0;
  bool ok = true;
};

std::string Describe(const Case& c) {
  std::string s = absl::StrCat("B", c.b, " H", c.hq);
  if (c.hkv != c.hq) absl::StrAppend(&s, "/", c.hkv);
  absl::StrAppend(&s, " ",
                  c.sq == c.skv ? absl::StrCat("S", c.sq) : absl::StrCat("Sq", c.sq, " Skv", c.skv),
                  " D", c.d);
  if (c.causal) absl::StrAppend(&s, " causal");
  if (c.lse) absl::StrAppend(&s, " lse");
  return s;
}

// What --filter matches: "class shape dtype".
std::string FilterName(const Case& c) {
  return absl::StrCat(c.cls, " ", Describe(c), " ", Name(c.dtype));
}

// Keys query i sees (bottom-right causal alignment), summed over the rows.
double VisiblePairs(const Case& c) {
  if (!c.causal) return double(c.sq) * double(c.skv);
  double n = 0;
  for (int64_t i = 0; i < c.sq; ++i)
    n += double(std::clamp<int64_t>(i + c.skv - c.sq + 1, 0, c.skv));
  return n;
}

// 16-bit device values -> double.
std::vector<double> Download(const void* src, int64_t n, D t) {
  if (t == D::kFloat32) {
    std::vector<float> f(static_cast<size_t>(n));
    if (cudaMemcpy(f.data(), src, size_t(n) * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
      std::fprintf(stderr, "download failed\n");
      std::exit(1);
    }
    return std::vector<double>(f.begin(), f.end());
  }
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  if (cudaMemcpy(raw.data(), src, size_t(n) * 2, cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::fprintf(stderr, "download failed\n");
    std::exit(1);
  }
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = raw[size_t(i)];
    if (t == D::kBFloat16) {
      const uint32_t bits = uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      out[size_t(i)] = f;
    } else {
      // IEEE half -> double.
      const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
      double v;
      if (exp == 0) {
        v = std::ldexp(double(man), -24);
      } else if (exp == 31) {
        v = man ? std::numeric_limits<double>::quiet_NaN()
                : std::numeric_limits<double>::infinity();
      } else {
        v = std::ldexp(double(man + 1024), exp - 25);
      }
      out[size_t(i)] = sign ? -v : v;
    }
  }
  return out;
}

class Sweep {
 public:
  Sweep(SweepOptions options, std::unique_ptr<Engine> engine)
      : options_(std::move(options)), engine_(std::move(engine)) {
    call_.owner = "sweep";
  }

  void Attention(const Case& c) {
    Row row;
    row.c = c;
    row.shape = Describe(c);
    const std::string name = FilterName(c);
    if (!options_.filter.empty() && name.find(options_.filter) == std::string::npos) return;
    row.flops = 4.0 * double(c.b) * double(c.hq) * double(c.d) * VisiblePairs(c);
    const int64_t nq = c.b * c.hq * c.sq * c.d, nkv = c.b * c.hkv * c.skv * c.d;
    const size_t es = c.dtype == D::kFloat32 ? 4 : 2;
    DeviceArray q(size_t(nq) * es), k(size_t(nkv) * es), v(size_t(nkv) * es);
    Fill(q.get(), nq, K(c.dtype), NextSeed());
    Fill(k.get(), nkv, K(c.dtype), NextSeed());
    Fill(v.get(), nkv, K(c.dtype), NextSeed());

    AttentionSpec spec;
    spec.q = ResidentView(c.dtype, {c.b, c.hq, c.sq, c.d}, q.get());
    spec.k = ResidentView(c.dtype, {c.b, c.hkv, c.skv, c.d}, k.get());
    spec.v = ResidentView(c.dtype, {c.b, c.hkv, c.skv, c.d}, v.get());
    spec.batch = c.b;
    spec.heads_q = c.hq;
    spec.heads_kv = c.hkv;
    spec.seq_q = c.sq;
    spec.seq_kv = c.skv;
    spec.head_dim = c.d;
    spec.causal = c.causal;
    spec.scale = 1.0 / std::sqrt(double(c.d));
    spec.return_lse = c.lse;
    spec.dtype = c.dtype;
    spec.out_shape = {c.b, c.hq, c.sq, c.d};
    spec.options.output_dtype = c.dtype;
    spec.options.keep_output = true;
    auto run = [&](const std::string& variant) {
      spec.options.variant = variant;
      return TimeRequest([&] { return engine_->Attention(spec, call_); }, options_.warmup,
                         options_.reps, 20e-3, options_.cooldown_ms, options_.gap_us);
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
    if (def.output) {
      row.error = CheckRows(c, q.get(), k.get(), v.get(), def.output->buffer().data());
      row.ok = row.ok && row.error <= 1.0;
    } else {
      row.ok = false;
    }
    if (options_.variants) {
      for (const std::string& variant : kVariants) {
        Timed t = run(variant);
        if (t.status.ok()) row.forced[variant] = t.seconds;
      }
    }
    std::fprintf(stderr, "%-8s %-36s %-5s %-22s %10.2f us %7.1f TFLOP/s  err %.3f %s%s\n",
                 c.cls.c_str(), row.shape.c_str(), Name(c.dtype), row.variant.c_str(),
                 row.ours * 1e6, row.ours > 0 ? row.flops / row.ours * 1e-12 : 0.0, row.error,
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
          "  {\"class\": \"%s\", \"shape\": \"%s\", \"batch\": %lld, \"heads_q\": %lld, "
          "\"heads_kv\": %lld, \"seq_q\": %lld, \"seq_kv\": %lld, \"head_dim\": %lld, "
          "\"causal\": %s, \"lse\": %s, \"dtype\": \"%s\", \"flops\": %.0f, \"variant\": \"%s\", "
          "\"ours_s\": %.9g, \"ours_span_s\": %.9g, \"error\": %.4g, \"ok\": %s, "
          "\"forced\": {%s}%s}%s\n",
          r.c.cls.c_str(), r.shape.c_str(), (long long)r.c.b, (long long)r.c.hq, (long long)r.c.hkv,
          (long long)r.c.sq, (long long)r.c.skv, (long long)r.c.d, r.c.causal ? "true" : "false",
          r.c.lse ? "true" : "false", Name(r.c.dtype), r.flops, r.variant.c_str(), r.ours,
          r.ours_span, std::isfinite(r.error) ? r.error : 1e300, r.ok ? "true" : "false",
          forced.c_str(), r.clock.c_str(), i + 1 < rows_.size() ? "," : "");
    }
    std::fprintf(f, " ]}\n");
    std::fclose(f);
  }

  int failures() const {
    int n = 0;
    for (const Row& r : rows_) n += !r.ok;
    return n;
  }
  size_t cases() const { return rows_.size(); }

 private:
  using Options = SweepOptions;

  // Four sampled (batch, head, row) of the result against float64 attention
  // on the same inputs: the largest |got - ref| / (atol + rtol |ref|) (one
  // 16-bit rounding of P and of O; fp32 sums; float32 inputs: fp32 through).
  double CheckRows(const Case& c, const void* q, const void* k, const void* v, const void* o) {
    const double atol = c.dtype == D::kBFloat16 ? 1.2e-2 : c.dtype == D::kFloat16 ? 2.5e-3 : 2e-5;
    const double rtol = c.dtype == D::kBFloat16 ? 2e-2 : c.dtype == D::kFloat16 ? 5e-3 : 1e-4;
    const int64_t es = c.dtype == D::kFloat32 ? 4 : 2;
    std::mt19937_64 rng(NextSeed());
    double worst = 0;
    const char* qb = static_cast<const char*>(q);
    const char* kb = static_cast<const char*>(k);
    const char* vb = static_cast<const char*>(v);
    const char* ob = static_cast<const char*>(o);
    for (int sample = 0; sample < 4; ++sample) {
      const int64_t b = int64_t(rng() % uint64_t(c.b)), h = int64_t(rng() % uint64_t(c.hq));
      // The last row always once (it sees every key under the mask).
      const int64_t i = sample == 0 ? c.sq - 1 : int64_t(rng() % uint64_t(c.sq));
      const int64_t kvh = h / (c.hq / c.hkv);
      const int64_t qrow = ((b * c.hq + h) * c.sq + i) * c.d;
      const int64_t kv0 = (b * c.hkv + kvh) * c.skv * c.d;
      const std::vector<double> qr = Download(qb + qrow * es, c.d, c.dtype);
      const std::vector<double> got = Download(ob + qrow * es, c.d, c.dtype);
      const int64_t keys = c.causal ? std::clamp<int64_t>(i + c.skv - c.sq + 1, 0, c.skv) : c.skv;
      std::vector<double> ref(static_cast<size_t>(c.d), 0.0);
      if (keys > 0) {
        const std::vector<double> kr = Download(kb + kv0 * es, keys * c.d, c.dtype);
        const std::vector<double> vr = Download(vb + kv0 * es, keys * c.d, c.dtype);
        std::vector<double> s(static_cast<size_t>(keys));
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          double acc = 0;
          for (int64_t x = 0; x < c.d; ++x) acc += qr[size_t(x)] * kr[size_t(j * c.d + x)];
          s[size_t(j)] = acc / std::sqrt(double(c.d));
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < keys; ++j) {
          const double p = std::exp(s[size_t(j)] - mx);
          sum += p;
          for (int64_t x = 0; x < c.d; ++x) ref[size_t(x)] += p * vr[size_t(j * c.d + x)];
        }
        for (double& x : ref) x /= sum;
      }
      for (int64_t x = 0; x < c.d; ++x) {
        const double g = got[size_t(x)], r = ref[size_t(x)];
        const double e = std::isfinite(g) ? std::abs(g - r) / (atol + rtol * std::abs(r))
                                          : std::numeric_limits<double>::infinity();
        worst = std::max(worst, e);
      }
    }
    return worst;
  }

  Options options_;
  std::unique_ptr<Engine> engine_;
  CallContext call_;
  std::vector<Row> rows_;
  std::string command_;
};

// The case list: classes of shapes that serving and training send.
std::vector<Case> ListedCases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& cls, int64_t b, int64_t hq, int64_t hkv, int64_t sq,
                 int64_t skv, int64_t d, bool causal, D dt = D::kBFloat16, bool lse = false) {
    Case c;
    c.cls = cls;
    c.b = b;
    c.hq = hq;
    c.hkv = hkv;
    c.sq = sq;
    c.skv = skv;
    c.d = d;
    c.causal = causal;
    c.dtype = dt;
    c.lse = lse;
    cases.push_back(c);
  };
  // Prefill squares, 16k tokens, heads * D = 2048.
  for (int64_t d : {64, 128})
    for (int64_t n : {128, 512, 1024, 2048, 4096, 8192, 16384, 32768})
      for (bool causal : {false, true})
        add("square", std::max<int64_t>(1, 16384 / n), 2048 / d, 2048 / d, n, n, d, causal);
  // Head dims, 4 x 16 heads x 2048^2.
  for (int64_t d : {32, 40, 48, 64, 80, 96, 112, 128, 136, 160, 192, 256})
    for (bool causal : {false, true}) add("head_dim", 4, 16, 16, 2048, 2048, d, causal);
  // Grouped-query attention, 32 query heads, ratios 1, 4, 8.
  for (int64_t hkv : {32, 8, 4}) {
    add("gqa", 8, 32, hkv, 1024, 1024, 128, true);
    add("gqa", 2, 32, hkv, 4096, 4096, 128, false);
    add("gqa", 2, 32, hkv, 4096, 4096, 128, true);
  }
  // Decode: a few new tokens against a long cache.
  for (auto [b, skv] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 131072}, {8, 32768}, {16, 8192}, {64, 4096}})
    for (int64_t sq : {1, 4, 16}) add("decode", b, 32, 8, sq, skv, 128, sq > 1);
  add("decode", 8, 32, 32, 1, 32768, 128, false);
  add("decode", 8, 32, 8, 1, 32768, 64, false);
  add("decode", 8, 32, 8, 8, 32768, 64, true);
  // Chunked prefill: a chunk of new tokens against the cache (causal,
  // bottom-right).
  for (int64_t sq : {128, 512, 2048})
    for (int64_t skv : {4096, 16384}) add("chunked", 1, 32, 8, sq, skv, 128, true);
  add("chunked", 4, 32, 8, 128, 32768, 128, false);
  // Batches from 1 to 64.
  add("batch", 64, 16, 16, 512, 512, 128, true);
  add("batch", 1, 16, 16, 8192, 8192, 128, true);
  add("batch", 64, 32, 32, 256, 256, 64, false);
  add("batch", 1, 8, 8, 4096, 4096, 128, false);
  // fp16.
  for (int64_t n : {1024, 4096, 16384})
    add("fp16", 16384 / n, 16, 16, n, n, 128, true, D::kFloat16);
  add("fp16", 4, 32, 32, 4096, 4096, 64, false, D::kFloat16);
  add("fp16", 8, 32, 8, 1, 32768, 128, false, D::kFloat16);
  add("fp16", 4, 16, 16, 2048, 2048, 96, true, D::kFloat16);
  // With the LSE.
  add("lse", 4, 16, 16, 4096, 4096, 128, true, D::kBFloat16, true);
  add("lse", 8, 32, 32, 2048, 2048, 64, false, D::kBFloat16, true);
  add("lse", 8, 32, 8, 1, 32768, 128, false, D::kBFloat16, true);
  add("lse", 1, 32, 8, 512, 8192, 128, true, D::kBFloat16, true);
  // Odd sizes.
  for (int64_t n : {1000, 3000, 8191}) add("odd", 2, 16, 16, n, n, 128, true);
  add("odd", 3, 12, 4, 777, 1999, 64, false);
  add("odd", 8, 16, 16, 333, 333, 128, true);
  // Cross-attention: many queries against a short or odd-length key set
  // (text conditioning, encoder outputs), no mask.
  add("cross", 2, 8, 8, 4096, 77, 64, false);
  add("cross", 8, 8, 8, 1024, 77, 64, false);
  add("cross", 4, 16, 16, 1024, 256, 128, false);
  add("cross", 16, 20, 20, 448, 1500, 64, false);
  add("cross", 1, 16, 16, 2048, 8192, 128, false);
  // Short chunks against a cache (speculative decoding, small prefill
  // chunks): between decode's few rows and a 128-row tile, causal.
  add("spec", 1, 32, 8, 32, 8192, 128, true);
  add("spec", 4, 32, 8, 64, 16384, 128, true);
  add("spec", 8, 32, 32, 64, 4096, 128, true);
  add("spec", 16, 32, 8, 24, 2048, 128, true);
  add("spec", 2, 16, 16, 96, 4096, 64, true);
  add("spec", 8, 32, 4, 16, 8192, 128, true);
  add("spec", 8, 32, 32, 32, 4096, 128, true);
  add("spec", 4, 32, 4, 8, 16384, 128, true);
  // One request under a wave of tiles, and encoders' short sequences.
  add("small", 1, 8, 8, 512, 512, 128, true);
  add("small", 1, 16, 16, 1024, 1024, 64, false);
  add("small", 1, 32, 8, 256, 256, 128, true);
  add("small", 64, 12, 12, 197, 197, 64, false);
  add("small", 32, 12, 12, 128, 128, 64, false);
  // Decode without grouped heads, short caches, other head dims.
  add("decode", 32, 32, 32, 1, 2048, 128, false);
  add("decode", 1, 32, 8, 1, 1024, 128, false);
  add("decode", 1, 32, 8, 1, 4096, 128, false);
  add("decode", 4, 32, 8, 1, 2048, 64, false);
  add("decode", 4, 8, 1, 1, 16384, 256, false);
  add("decode", 16, 32, 8, 1, 8192, 96, false);
  add("decode", 64, 32, 8, 2, 2048, 128, true);
  // Long sequences at head dims other than 64 and 128.
  add("head_dim", 1, 16, 16, 8192, 8192, 256, true);
  add("head_dim", 2, 24, 24, 4096, 4096, 96, false);
  add("head_dim", 1, 32, 32, 4096, 4096, 80, true);
  // float32 inputs: float32 throughout (the score matrix of the last two,
  // 4 and 8.6 GB, goes in blocks of query rows).
  add("fp32", 4, 16, 16, 1024, 1024, 64, true, D::kFloat32);
  add("fp32", 1, 16, 16, 8192, 8192, 64, true, D::kFloat32);
  add("fp32", 2, 16, 16, 8192, 8192, 128, false, D::kFloat32);
  return cases;
}

// `n` random shapes of four classes (--random): prefill (Sq = Skv, 64 to
// 16k, causal or not), decode (Sq 1-16 against 512 to 128k keys), chunks
// (causal, 17 to 2048 rows against a longer cache) and cross-attention (no
// mask, 64 to 8k queries against 16 to 4k keys). Lengths and heads are
// log-uniform, half of them not powers of two; head dims 64 or 128 half the
// time, else any multiple of 8 to 256; 1, 2, 4 or 8 query heads per kv head;
// bf16, fp16 one time in five, the LSE one time in five. The batch (1-64) and
// then the heads and lengths are halved until Q, K and V fit 1 GiB each and
// the request is at most 2 TFLOP.
std::vector<Case> RandomCases(int n, uint64_t seed) {
  RandomShapes r(seed);
  auto size = [&](int64_t lo, int64_t hi) { return r.Size(lo, hi); };
  std::vector<Case> cases;
  for (int i = 0; i < n; ++i) {
    Case c;
    c.d = r.Pick(2) ? (r.Pick(2) ? 64 : 128) : 8 * int64_t(1 + r.Pick(32));
    const int64_t group = int64_t(1) << (r.Pick(4));
    c.hkv = std::min<int64_t>(size(1, 32), 64 / group);
    c.hq = c.hkv * group;
    switch (r.Pick(4)) {
      case 0:
        c.cls = "rnd_prefill";
        c.sq = c.skv = size(64, 16384);
        c.causal = r.Pick(2);
        break;
      case 1:
        c.cls = "rnd_decode";
        c.sq = size(1, 16);
        c.skv = size(512, 131072);
        c.causal = c.sq > 1 && r.Pick(2);
        break;
      case 2:
        c.cls = "rnd_chunk";
        c.skv = size(1024, 32768);
        c.sq = size(17, std::min<int64_t>(2048, c.skv - 1));
        c.causal = true;
        break;
      default:
        c.cls = "rnd_cross";
        c.sq = size(64, 8192);
        c.skv = size(16, 4096);
        break;
    }
    c.b = size(1, 64);
    c.dtype = r.Pick(5) == 0 ? D::kFloat16 : D::kBFloat16;
    c.lse = r.Pick(5) == 0;
    auto too_big = [&] {
      const double kGiB = 1024.0 * 1024 * 1024;
      return 2.0 * c.b * c.hq * c.sq * c.d > kGiB || 2.0 * c.b * c.hkv * c.skv * c.d > kGiB ||
             4.0 * c.b * c.hq * c.d * VisiblePairs(c) > 2e12;
    };
    while (too_big()) {
      if (c.b > 1) {
        c.b /= 2;
      } else if (c.hkv > 1) {
        c.hkv /= 2;
        c.hq = c.hkv * group;
      } else {
        c.sq = std::max<int64_t>(1, c.sq / 2);
        if (c.cls == "rnd_prefill") c.skv = c.sq;
      }
    }
    cases.push_back(c);
  }
  return cases;
}

}  // namespace
}  // namespace gpucompute::sweep

int main(int argc, char** argv) {
  using namespace gpucompute;
  sweep::SweepOptions options;
  options.json = "sweep-attention.json";
  options.reps = 10;
  options.warmup = 2;
  options.gap_us = 500;
  std::string command;
  if (std::optional<int> done = sweep::ParseSweepFlags(
          argc, argv, "gc_sweep_attention",
          "  Attention through the server's default path on GPU 0, every flash version of\n"
          "  ours forced too; sampled rows checked against float64. --filter keeps the cases\n"
          "  whose \"class shape dtype\" contains SUBSTR; --no-variants times the default\n"
          "  only. tests/sweep/attention_vendor.py adds PyTorch SDPA's times.\n",
          &options, &command))
    return *done;
  const std::vector<sweep::Case> cases =
      options.random > 0 ? sweep::RandomCases(options.random, options.seed) : sweep::ListedCases();
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
  for (const sweep::Case& c : cases) s.Attention(c);
  s.Write();
  std::printf("attention sweep: %zu cases, %d wrong; results: %s\n", s.cases(), s.failures(),
              options.json.c_str());
  return s.failures() == 0 ? 0 : 1;
}
