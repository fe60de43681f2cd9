// gc_bench_device_path: the CUDA device's host-side path on one GPU, below
// the engine and the service.
//
//   gc_bench_device_path [--mib=N] [--reps=N] [--rounds=N] [--threads=8,12,16]
//                        [--chunks_mib=11,32] [--small_gemm=N] [--json=PATH]
//
// 1. Staging (skipped with --mib=0): what the device moves between pageable
// host memory and the GPU for settings of its copy threads, pinned chunks,
// pieces, stores and the copy threads' spin (the staging as it was, each
// change alone, the default, and the default with other thread counts and
// chunk sizes; all of them --rounds times), beside pinned DMA and memcpy
// between pageable buffers on as many threads. Each setting makes its own
// device (CudaDevice::Create, one lane, three staging buffers) and moves
// --mib MiB of pageable, already touched host
// memory into a resident buffer (CudaDevice::Write, the path of an inline
// operand) and back (CudaDevice::Read), --reps times after one warm-up. It
// reports the p50 rate of the whole call (the copy to the device complete)
// and checks that the bytes came back unchanged. The same bytes are also
// written as an upload stream writes them: 4 MiB at a time (WriteFrom).
//
// 2. A small GEMM's fixed cost (--small_gemm calls of 64^3 fp32 on resident
// operands, the result kept on the GPU, as the service runs it with
// keep_output): the p50 of the result's allocation, of the GEMM shard
// (CudaDevice::Gemm) and of the result's free, for the default variant and
// for ours forced by name. Nothing here runs in CI.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/core/ops.h"
#include "server/core/planner.h"
#include "server/device/cuda/cuda_device.h"
#include "server/device/thread_pool.h"

namespace gpucompute::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The integers of a comma-separated list that are at least `min`.
std::vector<int> ParseList(const std::string& text, int min = 1) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v) && v >= min) out.push_back(v);
  }
  return out;
}

struct Row {
  std::string what;
  double value = 0;  // GB/s, or microseconds where `what` says so
  bool checked = true;
};

int Main(int argc, char** argv) {
  int64_t mib = 1024;
  int reps = 7;
  int small_gemm = 0;
  int rounds = 2;
  std::string threads_list = "8,12,16", chunks_list = "11,32", json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = absl::StrCat("--", name, "=");
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("mib")) {
      mib = std::atoll(v);
    } else if (const char* v = value("reps")) {
      reps = std::atoi(v);
    } else if (const char* v = value("threads")) {
      threads_list = v;
    } else if (const char* v = value("chunks_mib")) {
      chunks_list = v;
    } else if (const char* v = value("rounds")) {
      rounds = std::atoi(v);
    } else if (const char* v = value("small_gemm")) {
      small_gemm = std::atoi(v);
    } else if (const char* v = value("json")) {
      json = v;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const size_t bytes = size_t(mib) << 20;
  const int cores = int(std::thread::hardware_concurrency());
  std::vector<char> src(bytes), back(bytes), other(bytes);
  {
    std::mt19937_64 rng(12345);
    auto* words = reinterpret_cast<uint64_t*>(src.data());
    for (size_t i = 0; i < bytes / 8; ++i) words[i] = rng();
    std::memset(back.data(), 0x5a, bytes);
    std::memset(other.data(), 0x33, bytes);
  }
  std::vector<Row> rows;
  auto report = [&](Row r) {
    std::printf("%-52s %8.2f GB/s%s\n", r.what.c_str(), r.value, r.checked ? "" : "  MISMATCH");
    std::fflush(stdout);
    rows.push_back(std::move(r));
  };

  // 1. Staging. Ceilings first: pinned DMA both ways, and memcpy between
  // pageable buffers.
  if (bytes > 0) {
    if (cudaSetDevice(0) != cudaSuccess) {
      std::fprintf(stderr, "no GPU\n");
      return 1;
    }
    void *pinned = nullptr, *dev = nullptr;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    if (cudaHostAlloc(&pinned, bytes, cudaHostAllocPortable) != cudaSuccess ||
        cudaMalloc(&dev, bytes) != cudaSuccess) {
      std::fprintf(stderr, "allocation failed\n");
      return 1;
    }
    std::memcpy(pinned, src.data(), bytes);
    for (int dir = 0; dir < 2; ++dir) {
      std::vector<double> t;
      for (int r = 0; r <= reps; ++r) {
        auto start = Clock::now();
        if (dir == 0) {
          cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, stream);
        } else {
          cudaMemcpyAsync(pinned, dev, bytes, cudaMemcpyDeviceToHost, stream);
        }
        cudaStreamSynchronize(stream);
        if (r > 0) t.push_back(Seconds(start));
      }
      report({dir == 0 ? "ceiling: pinned host to device" : "ceiling: device to pinned host",
              double(bytes) / Median(t) / 1e9});
    }
    cudaFreeHost(pinned);
    cudaFree(dev);
    cudaStreamDestroy(stream);
  }
  for (int threads : ParseList(threads_list)) {
    if (threads > cores || bytes == 0) continue;
    ThreadPool pool(threads);
    std::vector<double> t;
    for (int r = 0; r <= reps; ++r) {
      auto start = Clock::now();
      pool.ParallelRange(0, int64_t(bytes), 1 << 20, threads, [&](int64_t b, int64_t e) {
        std::memcpy(other.data() + b, src.data() + b, size_t(e - b));
      });
      if (r > 0) t.push_back(Seconds(start));
    }
    report({absl::StrCat("ceiling: memcpy pageable, ", threads, " threads"),
            double(bytes) / Median(t) / 1e9});
  }

  // Settings: the lane's staging as the server ran it before (whole chunks
  // of pinned_staging_bytes / 24, 1 MiB pieces, threads that sleep between
  // chunks), each change on its own, and the default of CudaDeviceOptions.
  struct Setting {
    std::string name;
    int threads, chunk_mib, spin_us, piece_kib, min_chunk_kib;
    bool to_host, to_device;  // non-temporal stores that way
  };
  const CudaDeviceOptions defaults;
  const int def_piece = int(defaults.staging.copy_piece_bytes >> 10);
  const int def_min = int(defaults.staging.min_chunk_bytes >> 10);
  std::vector<Setting> settings = {
      {"before", 8, 11, 0, 1024, 0, false, false},
      {"before + spin", 8, 11, defaults.copy_spin_us, 1024, 0, false, false},
      {"before + small pieces and chunks", 8, 11, 0, def_piece, def_min, false, false},
      {"before + streaming stores", 8, 11, 0, 1024, 0, true, true},
      {"default", 8, 11, defaults.copy_spin_us, def_piece, def_min,
       defaults.staging.streaming_to_host, defaults.staging.streaming_to_device},
      {"default, no streaming stores", 8, 11, defaults.copy_spin_us, def_piece, def_min, false,
       false},
      {"default, streaming stores both ways", 8, 11, defaults.copy_spin_us, def_piece, def_min,
       true, true},
  };
  for (int threads : ParseList(threads_list)) {
    if (threads == 8) continue;
    settings.push_back({absl::StrCat("default, ", threads, " threads"), threads, 11,
                        defaults.copy_spin_us, def_piece, def_min,
                        defaults.staging.streaming_to_host, defaults.staging.streaming_to_device});
  }
  for (int chunk_mib : ParseList(chunks_list)) {
    if (chunk_mib == 11) continue;
    settings.push_back({absl::StrCat("default, ", chunk_mib, " MiB chunks"), 8, chunk_mib,
                        defaults.copy_spin_us, def_piece, def_min,
                        defaults.staging.streaming_to_host, defaults.staging.streaming_to_device});
  }
  for (int round = 0; round < rounds && bytes > 0; ++round) {
    for (const Setting& set : settings) {
      if (set.threads > cores) continue;
      CudaDeviceOptions options;
      options.lanes = 1;
      options.copy_threads = set.threads;
      options.copy_spin_us = set.spin_us;
      options.staging.chunk_bytes = size_t(set.chunk_mib) << 20;
      options.staging.buffers = 3;
      options.staging.copy_piece_bytes = size_t(set.piece_kib) << 10;
      options.staging.min_chunk_bytes = size_t(set.min_chunk_kib) << 10;
      options.staging.streaming_to_host = set.to_host;
      options.staging.streaming_to_device = set.to_device;
      auto device = CudaDevice::Create(0, 0, 1.0, options);
      if (!device.ok()) {
        std::fprintf(stderr, "%s\n", std::string(device.status().message()).c_str());
        return 1;
      }
      auto buffer = (*device)->Allocate(int64_t(bytes));
      if (!buffer.ok()) {
        std::fprintf(stderr, "%s\n", std::string(buffer.status().message()).c_str());
        return 1;
      }
      std::vector<double> up, down, msgs;
      bool ok = true;
      for (int r = 0; r <= reps && ok; ++r) {
        auto start = Clock::now();
        ok = (*device)->Write(**buffer, 0, src.data(), int64_t(bytes), nullptr).ok();
        if (r > 0) up.push_back(Seconds(start));
        std::memset(back.data(), r, 4096);
        start = Clock::now();
        ok = ok && (*device)->Read(**buffer, 0, back.data(), int64_t(bytes), nullptr).ok();
        if (r > 0) down.push_back(Seconds(start));
      }
      bool same = ok && std::memcmp(back.data(), src.data(), bytes) == 0;
      // An upload stream's path: 4 MiB messages, each written on its own
      // (WriteFrom, synchronised), as the Upload RPC writes its chunks.
      const size_t msg = size_t{4} << 20;
      for (int r = 0; r <= reps && ok; ++r) {
        auto start = Clock::now();
        for (size_t off = 0; off < bytes && ok; off += msg) {
          const size_t n = std::min(msg, bytes - off);
          ok = (*device)
                   ->WriteFrom(
                       **buffer, int64_t(off), int64_t(n),
                       [&](int64_t at, int64_t len, void* dst) {
                         std::memcpy(dst, src.data() + off + size_t(at), size_t(len));
                       },
                       nullptr)
                   .ok();
        }
        if (r > 0) msgs.push_back(Seconds(start));
      }
      std::memset(back.data(), 0x77, 4096);
      same = same && ok &&
             (*device)->Read(**buffer, 0, back.data(), int64_t(bytes), nullptr).ok() &&
             std::memcmp(back.data(), src.data(), bytes) == 0;
      const std::string name = absl::StrCat(set.name, " (", set.threads, " threads, ",
                                            set.chunk_mib, " MiB, round ", round + 1, ")");
      report({absl::StrCat("to device:  ", name), double(bytes) / Median(up) / 1e9, same});
      report({absl::StrCat("to host:    ", name), double(bytes) / Median(down) / 1e9, same});
      report({absl::StrCat("4 MiB msgs: ", name), double(bytes) / Median(msgs) / 1e9, same});
    }
  }

  // 2. A small GEMM's fixed cost.
  if (small_gemm > 0) {
    CudaDeviceOptions options;
    auto device = CudaDevice::Create(0, 0, 1.0, options);
    if (!device.ok()) return 1;
    const int64_t n = 64;
    auto a = (*device)->Allocate(n * n * 4);
    auto b = (*device)->Allocate(n * n * 4);
    if (!a.ok() || !b.ok()) return 1;
    std::vector<float> host(size_t(n * n), 0.5f);
    if (!(*device)->Write(**a, 0, host.data(), n * n * 4, nullptr).ok() ||
        !(*device)->Write(**b, 0, host.data(), n * n * 4, nullptr).ok())
      return 1;
    for (const char* variant : {"", "reg8x8", "cublaslt"}) {
      GemmSpec spec;
      spec.a = TensorView{DType::kFloat32, {n, n}, (*a)->data(), 0};
      spec.b = TensorView{DType::kFloat32, {n, n}, (*b)->data(), 0};
      spec.m = spec.n = spec.k = n;
      spec.out_shape = {n, n};
      spec.options.variant = variant;
      spec.options.keep_output = true;
      std::vector<double> alloc, gemm, release, whole;
      bool checked = true;
      std::string ran;
      for (int i = 0; i < small_gemm + 100; ++i) {
        auto t0 = Clock::now();
        auto c = (*device)->Allocate(n * n * 4);
        auto t1 = Clock::now();
        if (!c.ok()) return 1;
        auto run = (*device)->Gemm(spec, Range{0, n}, OutputView((*c)->data(), 0));
        auto t2 = Clock::now();
        if (!run.ok()) {
          std::fprintf(stderr, "%s\n", std::string(run.status().message()).c_str());
          return 1;
        }
        ran = run->variant;
        if (i == 0) {
          std::vector<float> out(size_t(n * n), 0);
          checked = (*device)->Read(**c, 0, out.data(), n * n * 4, nullptr).ok() &&
                    out[0] == 16.0f && out.back() == 16.0f;  // 64 * 0.5 * 0.5
        }
        c->reset();
        auto t3 = Clock::now();
        if (i < 100) continue;
        auto us = [](Clock::time_point x, Clock::time_point y) {
          return std::chrono::duration<double, std::micro>(y - x).count();
        };
        alloc.push_back(us(t0, t1));
        gemm.push_back(us(t1, t2));
        release.push_back(us(t2, t3));
        whole.push_back(us(t0, t3));
      }
      const std::string name =
          absl::StrCat("64^3 ", *variant ? variant : "default", " (ran ", ran, ")");
      std::printf("%-40s p50 us: allocate %6.1f  gemm %6.1f  free %6.1f  whole %6.1f%s\n",
                  name.c_str(), Median(alloc), Median(gemm), Median(release), Median(whole),
                  checked ? "" : "  MISMATCH");
      std::fflush(stdout);
      rows.push_back({absl::StrCat(name, " whole us"), Median(whole), checked});
      rows.push_back({absl::StrCat(name, " gemm us"), Median(gemm), checked});
    }
  }

  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "{\"mib\": %lld, \"reps\": %d, \"cores\": %d, \"rows\": [", (long long)mib,
                 reps, cores);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::fprintf(f, "%s\n {\"what\": \"%s\", \"value\": %.3f, \"checked\": %s}", i ? "," : "",
                   rows[i].what.c_str(), rows[i].value, rows[i].checked ? "true" : "false");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  for (const Row& r : rows)
    if (!r.checked) return 1;
  return 0;
}

}  // namespace
}  // namespace gpucompute::cuda

int main(int argc, char** argv) { return gpucompute::cuda::Main(argc, argv); }
