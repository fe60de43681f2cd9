// What the server-path sweeps share: their flags, the timing of one request
// through the Engine (device busy time from CUPTI, median of many), resident
// views of device arrays, fresh seeds, the engine over GPU 0, and the GPU's
// clocks beside each timing (gpu_clocks.h).
#ifndef GPUCOMPUTE_TESTS_SWEEP_SWEEP_HARNESS_H_
#define GPUCOMPUTE_TESTS_SWEEP_SWEEP_HARNESS_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/engine.h"

namespace gpucompute::sweep {

struct SweepOptions {
  std::string json;
  std::string filter;
  int reps = 20;
  int warmup = 3;
  bool variants = true;
  // The GPU idles this long before each timing (the default's and every
  // forced version's), so that one starts from a GPU no longer slowed by
  // the work before it (power cap, heat); 0: timings back to back.
  int cooldown_ms = 0;
  // The GPU idles this long before each timed run, as a vendor timing that
  // queues a sleep kernel before each of its runs does (attention_vendor.py:
  // 10^6 cycles, ~0.5 ms): both then start each run from the same state.
  // 0: timed runs back to back.
  int gap_us = 0;
  // --l2=cold: before each timed run, ours and the vendor's, L2 is flushed
  // (EvictL2), as nvbench and Triton's do_bench time kernels; --l2=warm:
  // each run finds what the one before it left there. Warm favours a vendor
  // call that reuses one output buffer: with an output that fits in L2 its
  // writes, and beta's addend restored right before it, stay there, while a
  // request writes a new tensor each time. Each sweep sets its default.
  bool cold_l2 = false;
  // With N > 0, N cases of random shapes drawn from the sweep's classes run
  // instead of its list (sizes log-uniform within each class's range, half
  // of them not powers of two): a look at shapes that no list names. `seed`
  // draws them; without --seed one is taken from the clock and written into
  // the command.
  int random = 0;
  uint64_t seed = 0;
  // --list: print the cases that --filter keeps and stop (no GPU needed).
  bool list = false;
};

// A sweep's own flags: true when it took `arg`; false when `arg` is not one
// of them; an error (printed, exit status 2) when it is but its value is bad.
using ExtraFlag = std::function<absl::StatusOr<bool>(const std::string& arg)>;

// Parses --json, --filter, --reps, --warmup, --no-variants, --cooldown_ms,
// --gap_us, --random, --seed, --list and --help into
// `options` (which holds the defaults), anything else through `extra` when
// given, and the command line into `*command` (`name` and the arguments).
// Returns the exit status when main should stop (after --help: 0; an
// unknown or bad argument: 2), nullopt to go on.
std::optional<int> ParseSweepFlags(int argc, char** argv, const char* name, const char* help,
                                   SweepOptions* options, std::string* command,
                                   const ExtraFlag& extra = nullptr);

// One request as the sweeps time it.
struct Timed {
  double seconds = -1;                     // device busy time (CUPTI), median of the timed runs
  double span = -1;                        // the activities' span, median
  std::string variant;                     // what ran, the shards' names joined by '+'
  std::shared_ptr<ResidentTensor> output;  // the last run's kept result
  absl::Status status;
  // The GPU read after each timed run (gpu_clocks.h); sm_mhz -1 without
  // NVML: the median SM clock, the clock event reasons seen (ORed), the
  // highest temperature and power.
  int sm_mhz = -1;
  uint64_t clock_events = 0;
  int temp_c = -1;
  double power_w = -1;
};

// `, "sm_mhz": ..., "clock_events": "...", "temp_c": ..., "power_w": ...`
// of `t`, to end a row's JSON object; "" without NVML.
std::string ClockJson(const Timed& t);
// "  1980 MHz 61 C" (with " power_cap" etc. when the GPU was slowed) for a
// log line; "" without NVML.
std::string ClockText(const Timed& t);

// Lets the GPU finish its work and idle `ms` milliseconds (nothing when
// ms <= 0): called before each timing, ours (TimeRequest) and the vendor's,
// so that both start from the same state.
void CoolDown(int ms);

// Runs `run` warmup + reps times and times it, after the GPU has idled
// `cooldown_ms`, and `gap_us` before each timed run, L2 flushed before each
// run with cold_l2. With long_seconds > 0, a first run longer than that cuts
// the runs to 1 + 3.
Timed TimeRequest(const std::function<absl::StatusOr<OpResult>()>& run, int warmup, int reps,
                  double long_seconds = 0, int cooldown_ms = 0, int gap_us = 0,
                  bool cold_l2 = false);

// A view of `data`, device memory of GPU 0, as the engine takes operands.
TensorView ResidentView(gpucompute::DType dtype, std::vector<int64_t> shape, const void* data);

// Opens options.json for writing and writes the results' header (GPU, date,
// command, reps) up to the opening of "rows": [; null (reported on stderr)
// when it cannot be opened. The caller writes the rows, then " ]}".
FILE* OpenResults(const SweepOptions& options, const std::string& command);

// {"name": seconds, ...} of the forced versions' times, as JSON members.
std::string ForcedJson(const std::map<std::string, double>& forced);

// A seed no earlier call returned.
uint64_t NextSeed();

// Draws for --random from one seed: sizes log-uniform in [lo, hi], rounded
// to the nearest power of two (kept in range) half the time.
class RandomShapes {
 public:
  explicit RandomShapes(uint64_t seed) : rng_(seed) {}
  int64_t Size(int64_t lo, int64_t hi);
  // 0 .. n - 1, uniformly.
  int Pick(int n) { return int(rng_() % uint64_t(n)); }

 private:
  std::mt19937_64 rng_;
};

// The engine over GPU 0; null (with the reason on stderr) without a GPU.
std::unique_ptr<Engine> MakeGpuEngine();

}  // namespace gpucompute::sweep

#endif  // GPUCOMPUTE_TESTS_SWEEP_SWEEP_HARNESS_H_
