// gc_sweep_memops: GEMV, transpose and reduce through the server's default
// path on one GPU, against the vendor in the same run.
//
//   gc_sweep_memops [--json=PATH] [--filter=SUBSTR] [--reps=N] [--warmup=N]
//                   [--no-variants] [--cooldown_ms=N]
//
// Each case builds the operation's spec as the service does, with operands
// resident in device memory and the result kept there (options.keep_output),
// and runs it through the Engine and the CUDA device: the planner, the
// admission, the device's passes and the kernels the default picks. What a
// request costs on the device is the busy time of every GPU activity the
// call enqueued (workspace clears, the kernels, a dtype conversion, copies),
// from CUPTI's records (device_timer.h; their span is recorded beside it).
// The shard timings the server reports put CUDA events around its kernels
// and so also count the host's launch latency, which activity tracing
// inflates: they are not used here. The median of --reps calls is
// reported, with the name of the version that ran. Every other version that
// can run the case is timed the same way (the forced variants: what the heuristics
// tables are derived from). The vendor (cuBLAS gemv/GemmEx, CUB, cuBLASLt
// MatrixTransform / cublasSgeam) and a D2D copy of the same bytes (the
// floor) are timed in the same process the same way; permutations and
// reductions no vendor library runs are compared with PyTorch by
// tests/sweep/torch_vendor.py.
//
// Every default result is checked: GEMV and reductions against the vendor's,
// permutations bit for bit against the plain gather route.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/engine.h"
#include "tests/sweep/sweep_harness.h"
#include "tests/sweep/sweep_vendor.h"

namespace gpucompute::sweep {
namespace {

using KDType = kernels::DType;

KDType K(gpucompute::DType t) { return static_cast<KDType>(static_cast<int>(t)); }
const char* Name(gpucompute::DType t) {
  return t == gpucompute::DType::kFloat32 ? "f32"
                                          : (t == gpucompute::DType::kFloat16 ? "f16" : "bf16");
}
double Eps(gpucompute::DType t) {
  return t == gpucompute::DType::kFloat32 ? 2e-6 : (t == gpucompute::DType::kFloat16 ? 1e-3 : 8e-3);
}

using Options = SweepOptions;

// One row of the results.
struct Row {
  std::string op, cls, shape;
  gpucompute::DType dtype = gpucompute::DType::kFloat32;
  double bytes = 0;                      // what must move: inputs read once, output written once
  std::string variant;                   // what the default ran
  double ours = -1;                      // busy seconds on the device per request (default path)
  double ours_span = -1;                 // their span
  std::map<std::string, double> forced;  // every version that runs the case
  std::string vendor;
  double vendor_s = -1;
  double copy_s = -1;
  double error = 0;
  bool ok = true;
};

const std::vector<std::string> kGemvVariants = {
    "warp_row",   "vec16",     "batched",      "batched_w2",    "batched_w4",  "batched_w8",
    "scalar",     "scalar_w2", "scalar_w4",    "scalar_w8",     "mma",         "mma_w2",
    "mma_w4",     "mma_w8",    "mma_ring",     "mma_ring_16",   "mma_ring_32", "trans_split",
    "trans_wide", "trans_mma", "trans_mma_64", "trans_mma_128", "cublas"};
const std::vector<std::string> kReduceVariants = {"vec", "single_pass", "row_warp", "col_thread"};
const std::vector<std::string> kPermuteRoutes = {"row_copy", "row_copy_grouped", "tiled", "gather"};
const std::vector<std::string> kTransposeRungs = {
    "coarsened", "coarsened_vec",     "coarsened_vec_grouped",
    "pipelined", "pipelined_grouped", "coarsened_64",
    "pairs",     "pairs_64",          "tiled"};

class Sweep {
 public:
  Sweep(Options options, std::unique_ptr<Engine> engine)
      : options_(std::move(options)),
        engine_(std::move(engine)),
        vendor_(options_.warmup, options_.reps) {
    call_.owner = "sweep";
  }

  // One request warmup + reps times: the median device busy time, the
  // variant that ran and the last result (kept for checks).
  Timed Time(const std::function<absl::StatusOr<OpResult>()>& run) {
    return TimeRequest(run, options_.warmup, options_.reps, 0, options_.cooldown_ms);
  }

  // The row of a case; false when --filter leaves the case out.
  bool Start(const char* op, const std::string& cls, std::string shape, gpucompute::DType dt,
             Row* row) const {
    row->op = op;
    row->cls = cls;
    row->dtype = dt;
    row->shape = std::move(shape);
    const std::string name = absl::StrCat(op, " ", cls, " ", row->shape, " ", Name(dt));
    return options_.filter.empty() || name.find(options_.filter) != std::string::npos;
  }

  void Gemv(const std::string& cls, int64_t m, int64_t k, int ncols, bool trans,
            gpucompute::DType dt) {
    Row row;
    if (!Start("gemv", cls, absl::StrCat(trans ? "A^T " : "A ", m, "x", k, " n=", ncols), dt, &row))
      return;
    const size_t es = DTypeSize(dt);
    DeviceArray a(size_t(m * k) * es), x(size_t(k * ncols) * es), y(size_t(m * ncols) * es);
    Fill(a.get(), m * k, K(dt), Seed());
    Fill(x.get(), k * ncols, K(dt), Seed());
    row.bytes = double((m * k + k * ncols + m * ncols) * int64_t(es));
    GemvSpec spec;
    spec.a = View(dt, trans ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, a.get());
    spec.x =
        View(dt, ncols == 1 ? std::vector<int64_t>{k} : std::vector<int64_t>{k, ncols}, x.get());
    spec.m = m;
    spec.k = k;
    spec.ncols = ncols;
    spec.trans_a = trans;
    spec.dtype = dt;
    spec.out_shape = ncols == 1 ? std::vector<int64_t>{m} : std::vector<int64_t>{m, ncols};
    spec.options = Kept(dt);
    auto run = [&](const std::string& variant) {
      spec.options.variant = variant;
      return Time([&] { return engine_->Gemv(spec, call_); });
    };
    Timed def = run("");
    Poison(y.get(), m * ncols, K(dt));
    CoolDown(options_.cooldown_ms);
    row.vendor_s =
        vendor_.TimeGemv(a.get(), x.get(), y.get(), m, k, ncols, trans, K(dt), &row.vendor);
    if (def.output) {
      row.error = MaxError(def.output->buffer().data(), K(dt), y.get(), K(dt), m * ncols,
                           4 * Eps(dt) * std::sqrt(double(k)), 4 * Eps(dt));
    }
    Finish(&row, def, run, kGemvVariants, a.get(), row.bytes);
  }

  void Reduce(const std::string& cls, int64_t outer, int64_t axis, int64_t inner, bool max,
              gpucompute::DType dt) {
    Row row;
    if (!Start("reduce", cls,
               absl::StrCat(max ? "max " : "sum ", "[", outer, ",", axis, ",", inner, "]"), dt,
               &row))
      return;
    const size_t es = DTypeSize(dt);
    const int64_t n = outer * axis * inner;
    DeviceArray in(size_t(n) * es), ref(size_t(outer * inner) * 4);
    Fill(in.get(), n, K(dt), Seed());
    row.bytes = double(n * int64_t(es) + outer * inner * int64_t(es));
    ReduceSpec spec;
    spec.input = View(dt, {outer, axis, inner}, in.get());
    spec.kind = max ? ReduceKind::kMax : ReduceKind::kSum;
    spec.outer = outer;
    spec.axis_len = axis;
    spec.inner = inner;
    spec.out_shape = {outer, inner};
    spec.options = Kept(dt);
    auto run = [&](const std::string& variant) {
      spec.options.variant = variant;
      return Time([&] { return engine_->Reduce(spec, call_); });
    };
    Timed def = run("");
    if (inner == 1) {
      CoolDown(options_.cooldown_ms);
      row.vendor_s = vendor_.TimeReduce(in.get(), static_cast<float*>(ref.get()), outer, axis, max,
                                        K(dt), &row.vendor);
      if (def.output) {
        const double scale = max ? 0 : std::sqrt(double(axis));
        row.error = MaxError(def.output->buffer().data(), K(dt), ref.get(), KDType::kF32,
                             outer * inner, 4 * Eps(dt) * (1 + scale), 4 * Eps(dt));
      }
    }
    Finish(&row, def, run, kReduceVariants, in.get(), row.bytes);
  }

  void Permute(const std::string& cls, std::vector<int64_t> shape, std::vector<int> perm,
               gpucompute::DType dt) {
    Row row;
    if (!Start("transpose", cls,
               absl::StrCat("[", absl::StrJoin(shape, ","), "] (", absl::StrJoin(perm, ","), ")"),
               dt, &row))
      return;
    const size_t es = DTypeSize(dt);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    DeviceArray in(size_t(n) * es), out(size_t(n) * es);
    Fill(in.get(), n, K(dt), Seed());
    row.bytes = double(2 * n * int64_t(es));
    TransposeSpec spec;
    spec.input = View(dt, shape, in.get());
    spec.rank = int(shape.size());
    for (int i = 0; i < spec.rank; ++i) {
      spec.in_shape[size_t(i)] = shape[size_t(i)];
      spec.perm[size_t(i)] = perm[size_t(i)];
      spec.out_shape.push_back(shape[size_t(perm[size_t(i)])]);
    }
    spec.options = Kept(dt);
    auto run = [&](const std::string& variant) {
      spec.options.variant = variant;
      return Time([&] { return engine_->Transpose(spec, call_); });
    };
    Timed def = run("");
    Timed reference = run("gather");
    // A batched 2-D transpose after merging axes: the vendor can run it.
    int64_t b = 1, r = 1, c = 1;
    if (AsBatchedTranspose(shape, perm, &b, &r, &c)) {
      Poison(out.get(), n, K(dt));
      CoolDown(options_.cooldown_ms);
      row.vendor_s = vendor_.TimeTranspose(in.get(), out.get(), b, r, c, K(dt), &row.vendor);
    }
    if (def.output && reference.output) {
      row.error = MaxError(def.output->buffer().data(), K(dt), reference.output->buffer().data(),
                           K(dt), n, 0, 0);
    } else {
      row.error = INFINITY;
    }
    const bool rung = std::find(kTransposeRungs.begin(), kTransposeRungs.end(), def.variant) !=
                          kTransposeRungs.end() &&
                      def.variant != "tiled";
    Finish(&row, def, run, rung ? kTransposeRungs : kPermuteRoutes, in.get(), row.bytes);
  }

  void Write(const std::string& command) const {
    FILE* f = OpenResults(options_, command);
    if (f == nullptr) return;
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      const std::string forced = ForcedJson(r.forced);
      std::fprintf(f,
                   "  {\"op\": \"%s\", \"class\": \"%s\", \"shape\": \"%s\", \"dtype\": \"%s\", "
                   "\"bytes\": %.0f, \"variant\": \"%s\", \"ours_s\": %.9g, \"ours_span_s\": %.9g, "
                   "\"vendor\": \"%s\", "
                   "\"vendor_s\": %.9g, \"copy_s\": %.9g, \"error\": %.4g, \"ok\": %s, "
                   "\"forced\": {%s}}%s\n",
                   r.op.c_str(), r.cls.c_str(), r.shape.c_str(), Name(r.dtype), r.bytes,
                   r.variant.c_str(), r.ours, r.ours_span, r.vendor.c_str(), r.vendor_s, r.copy_s,
                   std::isfinite(r.error) ? r.error : 1e300, r.ok ? "true" : "false",
                   forced.c_str(), i + 1 < rows_.size() ? "," : "");
    }
    std::fprintf(f, " ]}\n");
    std::fclose(f);
  }

  // The table: one line per case, then a summary per operation and class.
  void Print() const {
    std::printf("%-10s %-14s %-34s %-5s %-22s %10s %10s %7s %7s %s\n", "op", "class", "shape",
                "dtype", "variant", "ours_us", "vendor_us", "x_vend", "x_copy", "ok");
    for (const Row& r : rows_) {
      std::printf("%-10s %-14s %-34s %-5s %-22s %10.2f %10.2f %7.3f %7.3f %s\n", r.op.c_str(),
                  r.cls.c_str(), r.shape.c_str(), Name(r.dtype), r.variant.c_str(), r.ours * 1e6,
                  r.vendor_s * 1e6, r.vendor_s > 0 ? r.vendor_s / r.ours : 0, r.copy_s / r.ours,
                  r.ok ? "ok" : "WRONG");
    }
    std::map<std::string, std::vector<const Row*>> by;
    for (const Row& r : rows_) by[r.op + " " + r.cls].push_back(&r);
    std::printf("\n%-28s %5s %8s %8s %8s %8s\n", "op class", "cases", "geo_vend", "min_vend",
                ">=0.95", "geo_copy");
    for (const auto& [key, rows] : by) {
      double lv = 0, lc = 0, mn = 1e9;
      int nv = 0, good = 0;
      for (const Row* r : rows) {
        lc += std::log(r->copy_s / r->ours);
        if (r->vendor_s > 0) {
          const double x = r->vendor_s / r->ours;
          lv += std::log(x);
          mn = std::min(mn, x);
          good += x >= 0.95;
          ++nv;
        }
      }
      std::printf("%-28s %5zu %8.3f %8.3f %5d/%-3d %8.3f\n", key.c_str(), rows.size(),
                  nv ? std::exp(lv / nv) : 0.0, nv ? mn : 0.0, good, nv,
                  std::exp(lc / double(rows.size())));
    }
  }

  int failures() const {
    int n = 0;
    for (const Row& r : rows_) n += !r.ok;
    return n;
  }

 private:
  static TensorView View(gpucompute::DType dt, std::vector<int64_t> shape, const void* data) {
    return ResidentView(dt, std::move(shape), data);
  }
  static OpOptions Kept(gpucompute::DType dt) {
    OpOptions o;
    o.output_dtype = dt;
    o.keep_output = true;
    return o;
  }
  static uint64_t Seed() { return NextSeed(); }

  // The permutation as [b, r, c] -> [b, c, r] after dropping size-1 axes and
  // merging runs that stay together; false when it is not one.
  static bool AsBatchedTranspose(const std::vector<int64_t>& shape, const std::vector<int>& perm,
                                 int64_t* b, int64_t* r, int64_t* c) {
    const int n = int(shape.size());
    // Find the split: output = in[0..i) (kept), then in[j..n), then in[i..j).
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) {
        std::vector<int> want;
        for (int d = 0; d < i; ++d) want.push_back(d);
        for (int d = j; d < n; ++d) want.push_back(d);
        for (int d = i; d < j; ++d) want.push_back(d);
        if (want != perm) continue;
        *b = *r = *c = 1;
        for (int d = 0; d < i; ++d) *b *= shape[size_t(d)];
        for (int d = i; d < j; ++d) *r *= shape[size_t(d)];
        for (int d = j; d < n; ++d) *c *= shape[size_t(d)];
        return true;
      }
    return false;
  }

  void Finish(Row* row, const Timed& def, const std::function<Timed(const std::string&)>& run,
              const std::vector<std::string>& variants, void* scratch_src, double bytes) {
    if (!def.status.ok()) {
      std::fprintf(stderr, "%s %s: %s\n", row->op.c_str(), row->shape.c_str(),
                   def.status.ToString().c_str());
      row->ok = false;
    }
    row->variant = def.variant;
    row->ours = def.seconds;
    row->ours_span = def.span;
    row->ok = row->ok && row->error <= 1.0;
    {
      DeviceArray dst(size_t(bytes / 2) + 256);
      CoolDown(options_.cooldown_ms);
      row->copy_s = vendor_.TimeCopy(dst.get(), scratch_src, size_t(bytes / 2));
    }
    if (options_.variants) {
      for (const std::string& v : variants) {
        Timed t = run(v);
        if (t.status.ok()) row->forced[v] = t.seconds;
      }
    }
    std::fprintf(stderr, "%-9s %-12s %-34s %-5s %-22s %9.2f us  vendor %9.2f us  %s\n",
                 row->op.c_str(), row->cls.c_str(), row->shape.c_str(), Name(row->dtype),
                 row->variant.c_str(), row->ours * 1e6, row->vendor_s * 1e6,
                 row->ok ? "ok" : "WRONG");
    rows_.push_back(*row);
  }

  Options options_;
  std::unique_ptr<Engine> engine_;
  Vendor vendor_;
  CallContext call_;
  std::vector<Row> rows_;
};

// The case list: classes of shapes, not single shapes. Sizes avoid powers of
// two where a class is about odd sizes.
void RunAll(Sweep& s) {
  using D = gpucompute::DType;
  const D kAll[] = {D::kFloat32, D::kBFloat16, D::kFloat16};
  // GEMV, A x: square, tall (many short rows), wide (few long rows), odd.
  struct MK {
    const char* cls;
    int64_t m, k;
  };
  const MK ax[] = {{"square", 1024, 1024}, {"square", 4096, 4096}, {"square", 16384, 16384},
                   {"wide", 1024, 50000},  {"wide", 2000, 100000}, {"wide", 1000, 16384},
                   {"tall", 50000, 1024},  {"tall", 100000, 1000}, {"odd", 3001, 2000},
                   {"odd", 12345, 777},    {"odd", 777, 12345}};
  for (const MK& c : ax)
    for (D dt : kAll)
      for (int n : {1, 2, 4, 8}) {
        if (n == 2 && c.m != 4096 && c.m != 1024) continue;
        s.Gemv(c.cls, c.m, c.k, n, false, dt);
      }
  const MK at[] = {{"t_square", 4096, 4096}, {"t_square", 16384, 16384}, {"t_wide", 1024, 50000},
                   {"t_tall", 50000, 1024},  {"t_odd", 3001, 2000},      {"t_odd", 1000, 100000}};
  for (const MK& c : at)
    for (D dt : kAll)
      for (int n : {1, 4, 8}) s.Gemv(c.cls, c.m, c.k, n, true, dt);

  // Reduce: all elements, rows, columns, a middle axis; tiny to 10^9.
  struct R {
    const char* cls;
    int64_t outer, axis, inner;
  };
  const R red[] = {{"all", 1, 37, 1},         {"all", 1, 1000, 1},       {"all", 1, 10000, 1},
                   {"all", 1, 30000, 1},      {"all", 1, 100000, 1},     {"all", 1, 300000, 1},
                   {"all", 1, 1000000, 1},    {"all", 1, 3000000, 1},    {"all", 1, 10000000, 1},
                   {"all", 1, 1000000000, 1}, {"rows", 4, 100000, 1},    {"rows", 8, 1000000, 1},
                   {"rows", 1000, 37, 1},     {"rows", 4096, 4096, 1},   {"rows", 100000, 100, 1},
                   {"rows", 16, 1000000, 1},  {"rows", 16384, 16384, 1}, {"rows", 65536, 1000, 1},
                   {"rows", 3, 7, 1},         {"cols", 1, 37, 1000},     {"cols", 1, 4096, 4096},
                   {"cols", 1, 100000, 64},   {"cols", 1, 64, 100000},   {"cols", 1, 16384, 16384},
                   {"middle", 64, 1024, 64},  {"middle", 8, 4096, 512},  {"middle", 1000, 37, 7},
                   {"middle", 2, 100000, 32}, {"middle", 128, 3, 4096}};
  for (const R& c : red)
    for (D dt : kAll) {
      if (c.axis * c.outer * c.inner >= 1000000000 && dt == D::kFloat16) continue;
      s.Reduce(c.cls, c.outer, c.axis, c.inner, false, dt);
    }
  for (const R& c : red)
    if (std::string(c.cls) != "middle")
      s.Reduce(c.cls, c.outer, c.axis, c.inner, true, D::kBFloat16);

  // Transpose: odd 2-D shapes and every rank-3 and rank-4 permutation class.
  struct P {
    const char* cls;
    std::vector<int64_t> shape;
    std::vector<int> perm;
  };
  const std::vector<P> perms = {{"2d", {16384, 16384}, {1, 0}},
                                {"2d", {4096, 4096}, {1, 0}},
                                {"2d", {1000, 37}, {1, 0}},
                                {"2d", {3001, 2000}, {1, 0}},
                                {"2d", {37, 100000}, {1, 0}},
                                {"2d", {8192, 1024}, {1, 0}},
                                {"2d", {256, 256}, {1, 0}},
                                {"r3", {96, 512, 384}, {0, 2, 1}},
                                {"r3", {96, 512, 384}, {1, 0, 2}},
                                {"r3", {96, 512, 384}, {1, 2, 0}},
                                {"r3", {96, 512, 384}, {2, 0, 1}},
                                {"r3", {96, 512, 384}, {2, 1, 0}},
                                {"r3", {33, 257, 129}, {2, 1, 0}},
                                {"r3", {33, 257, 129}, {1, 0, 2}},
                                {"r3", {33, 257, 129}, {0, 2, 1}},
                                {"r4", {8, 512, 16, 128}, {0, 2, 1, 3}},
                                {"r4", {8, 16, 512, 128}, {0, 2, 1, 3}},
                                {"r4", {8, 16, 512, 128}, {0, 1, 3, 2}},
                                {"r4", {32, 64, 56, 56}, {0, 2, 3, 1}},
                                {"r4", {32, 56, 56, 64}, {0, 3, 1, 2}},
                                {"r4", {16, 32, 64, 128}, {3, 2, 1, 0}},
                                {"r4", {16, 32, 64, 128}, {1, 0, 3, 2}},
                                {"r4", {16, 32, 64, 128}, {2, 0, 3, 1}},
                                {"r4", {16, 32, 64, 128}, {1, 3, 0, 2}},
                                {"r4", {4, 7, 300, 65}, {0, 2, 1, 3}},
                                {"r4", {2, 3, 4, 5}, {3, 1, 2, 0}}};
  for (const P& c : perms)
    for (D dt : {D::kFloat32, D::kBFloat16}) s.Permute(c.cls, c.shape, c.perm, dt);
  for (const P& c : perms)
    if (c.shape.size() == 4) s.Permute(c.cls, c.shape, c.perm, D::kFloat16);
}

}  // namespace
}  // namespace gpucompute::sweep

int main(int argc, char** argv) {
  using namespace gpucompute;
  sweep::SweepOptions options;
  options.json = "sweep-memops.json";
  std::string command;
  if (std::optional<int> done = sweep::ParseSweepFlags(
          argc, argv, "gc_sweep_memops",
          "  GEMV, transpose and reduce through the server's default path on GPU 0, every\n"
          "  version forced too, against cuBLAS, CUB and cuBLASLt in the same run.\n"
          "  --filter keeps the cases whose \"op class shape dtype\" contains SUBSTR;\n"
          "  --no-variants times the default only. tests/sweep/torch_vendor.py adds\n"
          "  PyTorch's times and writes the markdown table.\n",
          &options, &command))
    return *done;
  if (options.random > 0 || options.list) {
    std::fprintf(stderr, "gc_sweep_memops: --random and --list are not offered here\n");
    return 2;
  }
  std::unique_ptr<Engine> engine = sweep::MakeGpuEngine();
  if (engine == nullptr) return 1;
  sweep::Sweep s(options, std::move(engine));
  sweep::RunAll(s);
  s.Write(command);
  s.Print();
  std::printf("\nresults: %s; %d wrong\n", options.json.c_str(), s.failures());
  return s.failures() == 0 ? 0 : 1;
}
