// gc_bench: runs the registered benchmarks and prints a table and a JSON file.
//
//   gc_bench [--filter=SUBSTR] [--json=PATH] [--quick]
//
// --filter keeps the ops (or "op/variant") whose name contains SUBSTR; --quick
// shrinks warm-up and iteration counts for smoke runs (not for recorded results).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

#include "kernels/bench/harness.h"

namespace gpucompute::bench {
namespace {

__device__ inline uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

__global__ void FillKernel(void* p, size_t n, int dtype, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float u = float(Mix(seed ^ (i * 0x9e3779b97f4a7c15ULL)) >> 40) * (1.0f / 16777216.0f);
    float v = lo + (hi - lo) * u;
    if (dtype == 0) static_cast<float*>(p)[i] = v;
    else if (dtype == 1) static_cast<__half*>(p)[i] = __float2half(v);
    else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  }
}

__device__ inline float Load(const void* p, size_t i, int dtype) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  if (dtype == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// worst[0] = max normalised error (as float bits, non-negative so int max works);
// NaN anywhere maps to +inf.
__global__ void CompareKernel(const void* a, const void* b, size_t n, int dtype, double atol,
                              double rtol, unsigned int* worst) {
  float local = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float x = Load(a, i, dtype), y = Load(b, i, dtype);
    float e = fabsf(x - y) / float(atol + rtol * fabsf(y));
    if (isnan(e) && !(isnan(x) && isnan(y))) e = INFINITY;
    if (isnan(e)) e = 0.f;
    local = fmaxf(local, e);
  }
  atomicMax(worst, __float_as_uint(local));
}

}  // namespace

std::vector<Registered>& Registry() {
  static std::vector<Registered> r;
  return r;
}

Registrar::Registrar(const char* op, BenchFn fn) { Registry().push_back({op, fn}); }

Context::Context(bool quick, std::string filter) : quick_(quick), filter_(std::move(filter)) {
  GC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  int dev = 0;
  GC_CUDA_CHECK(cudaGetDevice(&dev));
  GC_CUDA_CHECK(cudaGetDeviceProperties(&props_, dev));
  seed_ = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) | 1;
}

Context::~Context() { cudaStreamDestroy(stream_); }

bool Context::Wants(const std::string& name) const {
  return filter_.empty() || name.find(filter_) != std::string::npos ||
         filter_.find(name) != std::string::npos;
}

double Context::Time(const std::function<void(cudaStream_t)>& fn, int warmup, int iters) {
  if (quick_) {
    warmup = std::min(warmup, 2);
    iters = std::min(iters, 5);
  }
  for (int i = 0; i < warmup; ++i) fn(stream_);
  GC_CUDA_CHECK(cudaGetLastError());
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) GC_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    GC_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream_));
    fn(stream_);
    GC_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream_));
  }
  GC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  GC_CUDA_CHECK(cudaGetLastError());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) GC_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
}

double Context::CopyMsForTraffic(double bytes) {
  for (auto& [b, ms] : copy_cache_)
    if (b == bytes) return ms;
  size_t half = size_t(bytes / 2);
  DeviceBuffer src(half), dst(half);
  FillRandom(src.get(), half / 4, kernels::DType::kF32);
  double ms = Time([&](cudaStream_t s) {
    GC_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), half, cudaMemcpyDeviceToDevice, s));
  });
  copy_cache_.push_back({bytes, ms});
  return ms;
}

void Context::Record(Row row, bool with_copy_ratio) {
  if (with_copy_ratio && row.bytes > 0) row.copy_ratio = CopyMsForTraffic(row.bytes) / row.ms;
  double gbs = row.bytes / (row.ms * 1e-3) / 1e9;
  double tflops = row.flops / (row.ms * 1e-3) / 1e12;
  std::printf("%-10s %-24s %-5s %-22s %9.4f ms %8.1f GB/s %8.2f TFLOP/s  vendor x%.3f  copy x%.3f %s %s\n",
              row.op.c_str(), row.case_name.c_str(), row.dtype.c_str(), row.variant.c_str(),
              row.ms, gbs, tflops, row.vendor_ratio, row.copy_ratio,
              row.correct ? "" : "WRONG", row.note.c_str());
  std::fflush(stdout);
  rows_.push_back(std::move(row));
}

void Context::FillRandom(void* p, size_t n, kernels::DType dtype, float lo, float hi) {
  seed_ = seed_ * 6364136223846793005ULL + 1442695040888963407ULL;
  FillKernel<<<4 * props_.multiProcessorCount, 256, 0, stream_>>>(p, n, int(dtype), seed_, lo, hi);
  GC_CUDA_CHECK(cudaGetLastError());
}

void Context::Poison(void* p, size_t bytes) {
  GC_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, bytes, stream_));
}

bool DeviceAllClose(const void* a, const void* b, size_t n, kernels::DType dtype, double atol,
                    double rtol, cudaStream_t stream, double* worst) {
  unsigned int* d_worst = nullptr;
  GC_CUDA_CHECK(cudaMallocAsync(&d_worst, sizeof(unsigned), stream));
  GC_CUDA_CHECK(cudaMemsetAsync(d_worst, 0, sizeof(unsigned), stream));
  CompareKernel<<<1024, 256, 0, stream>>>(a, b, n, int(dtype), atol, rtol, d_worst);
  unsigned h = 0;
  GC_CUDA_CHECK(cudaMemcpyAsync(&h, d_worst, sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
  GC_CUDA_CHECK(cudaFreeAsync(d_worst, stream));
  GC_CUDA_CHECK(cudaStreamSynchronize(stream));
  float w;
  std::memcpy(&w, &h, sizeof(w));
  if (worst) *worst = w;
  return w <= 1.0f;
}

namespace {

void WriteJson(const Context& ctx, const std::string& path, const std::string& cmd) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return;
  }
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::fprintf(f, "{\n  \"gpu\": \"%s\",\n  \"sm_count\": %d,\n  \"date\": \"%s\",\n  \"command\": \"%s\",\n  \"rows\": [\n",
               ctx.props().name, ctx.props().multiProcessorCount, date, cmd.c_str());
  for (size_t i = 0; i < ctx.rows().size(); ++i) {
    const Row& r = ctx.rows()[i];
    std::fprintf(f,
                 "    {\"op\": \"%s\", \"case\": \"%s\", \"dtype\": \"%s\", \"variant\": \"%s\", "
                 "\"ms\": %.6f, \"bytes\": %.0f, \"flops\": %.0f, \"gb_per_s\": %.2f, "
                 "\"tflop_per_s\": %.3f, \"vendor_ratio\": %.4f, \"copy_ratio\": %.4f, "
                 "\"correct\": %s, \"note\": \"%s\"}%s\n",
                 r.op.c_str(), r.case_name.c_str(), r.dtype.c_str(), r.variant.c_str(), r.ms,
                 r.bytes, r.flops, r.bytes / (r.ms * 1e-3) / 1e9, r.flops / (r.ms * 1e-3) / 1e12,
                 r.vendor_ratio, r.copy_ratio, r.correct ? "true" : "false", r.note.c_str(),
                 i + 1 < ctx.rows().size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

}  // namespace
}  // namespace gpucompute::bench

int main(int argc, char** argv) {
  using namespace gpucompute::bench;
  bool quick = false;
  std::string filter, json;
  std::string cmd;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    cmd += (i ? " " : "") + a;
    if (a == "--quick") quick = true;
    else if (a.rfind("--filter=", 0) == 0) filter = a.substr(9);
    else if (a.rfind("--json=", 0) == 0) json = a.substr(7);
    else if (i > 0) {
      std::fprintf(stderr, "usage: %s [--filter=SUBSTR] [--json=PATH] [--quick]\n", argv[0]);
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "gc_bench: no CUDA device\n");
    return 1;
  }
  Context ctx(quick, filter);
  std::printf("GPU: %s (%d SMs)\n", ctx.props().name, ctx.props().multiProcessorCount);
  for (auto& r : Registry())
    if (ctx.Wants(r.op)) r.fn(ctx);
  if (!json.empty()) WriteJson(ctx, json, cmd);
  return 0;
}
