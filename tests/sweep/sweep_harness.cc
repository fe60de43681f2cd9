#include "tests/sweep/sweep_harness.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/device/cuda/backend.h"
#include "tests/sweep/device_timer.h"
#include "tests/sweep/gpu_clocks.h"
#include "tests/sweep/sweep_vendor.h"

namespace gpucompute::sweep {

std::optional<int> ParseSweepFlags(int argc, char** argv, const char* name, const char* help,
                                   SweepOptions* options, std::string* command,
                                   const ExtraFlag& extra) {
  *command = name;
  bool seeded = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    *command += " " + arg;
    auto value = [&](const char* flag) -> std::optional<std::string> {
      const std::string prefix = std::string(flag) + "=";
      if (arg.rfind(prefix, 0) == 0) return arg.substr(prefix.size());
      return std::nullopt;
    };
    if (auto v = value("--json")) {
      options->json = *v;
    } else if (auto v = value("--filter")) {
      options->filter = *v;
    } else if (auto v = value("--reps")) {
      options->reps = std::max(1, std::atoi(v->c_str()));
    } else if (auto v = value("--warmup")) {
      options->warmup = std::max(0, std::atoi(v->c_str()));
    } else if (arg == "--no-variants") {
      options->variants = false;
    } else if (auto v = value("--cooldown_ms")) {
      options->cooldown_ms = std::max(0, std::atoi(v->c_str()));
    } else if (auto v = value("--gap_us")) {
      options->gap_us = std::max(0, std::atoi(v->c_str()));
    } else if (auto v = value("--l2")) {
      if (*v != "cold" && *v != "warm") {
        std::fprintf(stderr, "%s: --l2 is cold or warm, not '%s'\n", name, v->c_str());
        return 2;
      }
      options->cold_l2 = *v == "cold";
    } else if (auto v = value("--random")) {
      options->random = std::max(0, std::atoi(v->c_str()));
    } else if (auto v = value("--seed")) {
      options->seed = std::strtoull(v->c_str(), nullptr, 10);
      seeded = true;
    } else if (arg == "--list") {
      options->list = true;
    } else if (arg == "--help") {
      std::printf(
          "%s [--json=PATH] [--filter=SUBSTR] [--reps=N] [--warmup=N] [--no-variants]\n"
          "  [--cooldown_ms=N] [--gap_us=N] [--l2=cold|warm] [--random=N [--seed=S]] [--list]\n%s"
          "  --cooldown_ms lets the GPU idle N ms before each timing, ours and the vendor's "
          "(default 0).\n"
          "  --gap_us lets it idle N us before each timed run (default %d).\n"
          "  --l2=cold flushes L2 before each run, ours and the vendor's; warm leaves it\n"
          "  (default %s).\n"
          "  --random runs N cases of random shapes from the sweep's classes instead of its\n"
          "  list, drawn with --seed (default: from the clock, written into the command).\n"
          "  --list prints the cases --filter keeps and stops.\n",
          name, help, options->gap_us, options->cold_l2 ? "cold" : "warm");
      return 0;
    } else {
      const absl::StatusOr<bool> taken = extra ? extra(arg) : absl::StatusOr<bool>(false);
      if (!taken.ok()) {
        std::fprintf(stderr, "%s: %s\n", arg.c_str(),
                     std::string(taken.status().message()).c_str());
        return 2;
      }
      if (!*taken) {
        std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
        return 2;
      }
    }
  }
  if (options->random > 0 && !seeded) {
    options->seed =
        uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000007;
    *command += " --seed=" + std::to_string(options->seed);
  }
  return std::nullopt;
}

void CoolDown(int ms) {
  if (ms <= 0) return;
  cudaDeviceSynchronize();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

Timed TimeRequest(const std::function<absl::StatusOr<OpResult>()>& run, int warmup, int reps,
                  double long_seconds, int cooldown_ms, int gap_us, bool cold_l2) {
  Timed t;
  CoolDown(cooldown_ms);
  std::vector<double> s, spans;
  std::vector<int> clocks;
  DeviceTimer& timer = DeviceTimer::Get();
  for (int i = 0; i < warmup + reps; ++i) {
    if (cold_l2) EvictL2();
    if (i >= warmup && gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    timer.Begin();
    absl::StatusOr<OpResult> r = run();
    double span = -1;
    const double busy = timer.End(&span);
    if (!r.ok()) {
      t.status = r.status();
      return t;
    }
    if (i == 0 && long_seconds > 0 && busy > long_seconds) {  // long: 1 warm-up, 3 timed
      warmup = 1;
      reps = 3;
    }
    std::vector<std::string> names;
    for (const ShardTiming& shard : r->shards) names.push_back(shard.run.variant);
    if (i >= warmup) {
      s.push_back(busy);
      spans.push_back(span);
      if (std::optional<ClockSample> clock = SampleGpuClocks()) {
        clocks.push_back(clock->sm_mhz);
        t.clock_events |= clock->events;
        t.temp_c = std::max(t.temp_c, clock->temp_c);
        t.power_w = std::max(t.power_w, clock->power_w);
      }
    }
    t.variant = absl::StrJoin(names, "+");
    t.output = r->kept_output;
  }
  if (s.empty()) return t;
  std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
  t.seconds = s[s.size() / 2];
  std::nth_element(spans.begin(), spans.begin() + spans.size() / 2, spans.end());
  t.span = spans[spans.size() / 2];
  if (!clocks.empty()) {
    std::nth_element(clocks.begin(), clocks.begin() + clocks.size() / 2, clocks.end());
    t.sm_mhz = clocks[clocks.size() / 2];
  }
  return t;
}

std::string ClockJson(const Timed& t) {
  if (t.sm_mhz < 0) return "";
  return absl::StrCat(", \"sm_mhz\": ", t.sm_mhz, ", \"clock_events\": \"",
                      ClockEventNames(t.clock_events), "\", \"temp_c\": ", t.temp_c,
                      ", \"power_w\": ", static_cast<int>(t.power_w + 0.5));
}

std::string ClockText(const Timed& t) {
  if (t.sm_mhz < 0) return "";
  const std::string events = ClockEventNames(t.clock_events);
  return absl::StrCat("  ", t.sm_mhz, " MHz ", t.temp_c, " C", events.empty() ? "" : " ", events);
}

TensorView ResidentView(gpucompute::DType dtype, std::vector<int64_t> shape, const void* data) {
  TensorView v;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.data = data;
  v.device = 0;
  return v;
}

FILE* OpenResults(const SweepOptions& options, const std::string& command) {
  FILE* f = std::fopen(options.json.c_str(), "w");
  if (f == nullptr) {
    std::perror(options.json.c_str());
    return nullptr;
  }
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::fprintf(f,
               "{\"gpu\": \"%s\", \"date\": \"%s\", \"command\": \"%s\", \"reps\": %d, "
               "\"gap_us\": %d, \"l2\": \"%s\",\n",
               DescribeGpu().c_str(), date, command.c_str(), options.reps, options.gap_us,
               options.cold_l2 ? "cold" : "warm");
  std::fprintf(f, " \"rows\": [\n");
  return f;
}

std::string ForcedJson(const std::map<std::string, double>& forced) {
  std::string out;
  for (const auto& [name, s] : forced) {
    if (!out.empty()) out += ", ";
    out += absl::StrCat("\"", name, "\": ", s);
  }
  return out;
}

uint64_t NextSeed() {
  static uint64_t seq = 0;
  return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^ (++seq << 32);
}

int64_t RandomShapes::Size(int64_t lo, int64_t hi) {
  const double x = std::exp(
      std::uniform_real_distribution<double>(std::log(double(lo)), std::log(double(hi) + 1))(rng_));
  int64_t v = std::clamp<int64_t>(int64_t(x), lo, hi);
  if (Pick(2)) v = std::clamp<int64_t>(int64_t(1) << std::lround(std::log2(double(v))), lo, hi);
  return v;
}

std::unique_ptr<Engine> MakeGpuEngine() {
  absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices =
      cuda::CreateCudaDevices({0}, {1.0}, cuda::CudaDeviceOptions{});
  if (!devices.ok()) {
    std::fprintf(stderr, "no GPU: %s\n", devices.status().ToString().c_str());
    return nullptr;
  }
  return std::make_unique<Engine>("cuda", std::move(*devices));
}

}  // namespace gpucompute::sweep
