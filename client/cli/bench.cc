// `gpucompute bench <op>`: N requests at concurrency C, as unary calls from C
// threads or over one Batch stream with up to C outstanding; then Echo of the
// same request payload at the same concurrency, so that the service's cost
// over bare gRPC shows as a ratio.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/cli/cli.h"

ABSL_FLAG(int64_t, requests, 200, "bench: timed requests N.");
ABSL_FLAG(int, concurrency, 4, "bench: requests in flight at once C.");
ABSL_FLAG(std::string, mode, "unary",
          "bench: unary (C threads of unary calls) or batch (one Batch stream with up to C "
          "requests outstanding; its deadline is --timeout per C requests).");
ABSL_FLAG(int64_t, warmup, 5, "bench: untimed requests before each measurement.");
ABSL_FLAG(bool, echo_baseline, true, "bench: also measure Echo of the same request payload.");

namespace gpucompute::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  Progress(std::string label, int64_t total)
      : label_(std::move(label)), total_(total), enabled_(isatty(STDERR_FILENO) != 0) {
    if (enabled_) thread_ = std::thread([this] { Loop(); });
  }
  ~Progress() {
    if (!enabled_) return;
    done_.Notify();
    thread_.join();
    Draw();
    std::fputs("\n", stderr);
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(int64_t n = 1) { count_.fetch_add(n, std::memory_order_relaxed); }

 private:
  void Loop() {
    while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) Draw();
  }
  void Draw() {
    constexpr int kWidth = 40;
    int64_t count = std::min(count_.load(std::memory_order_relaxed), total_);
    int filled = total_ > 0 ? static_cast<int>(kWidth * count / total_) : kWidth;
    std::fprintf(stderr, "\r%-6s [%s%s] %lld/%lld", label_.c_str(),
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, ' ').c_str(),
                 static_cast<long long>(count), static_cast<long long>(total_));
    std::fflush(stderr);
  }

  std::string label_;
  int64_t total_;
  bool enabled_;
  std::atomic<int64_t> count_{0};
  absl::Notification done_;
  std::thread thread_;
};

// What one measurement saw.
struct Stats {
  std::vector<double> latencies;  // seconds, of the successful requests
  double wall_seconds = 0;
  int64_t errors = 0;
  std::string first_error;
  double payload_bytes = 0;  // request + response bytes of one request
};

// Outcome of one call: payload bytes of the response, or an error.
using CallFn = std::function<absl::StatusOr<int64_t>()>;

// `n` calls of `call` from `concurrency` threads.
Stats RunUnary(const std::string& label, int64_t n, int concurrency, const CallFn& call) {
  Stats stats;
  absl::Mutex mu;
  std::atomic<int64_t> next{0};
  Progress progress(label, n);
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      std::vector<double> mine;
      while (next.fetch_add(1) < n) {
        auto t0 = Clock::now();
        absl::StatusOr<int64_t> result = call();
        double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        progress.Add();
        if (result.ok()) {
          mine.push_back(seconds);
          continue;
        }
        absl::MutexLock lock(&mu);
        if (stats.errors++ == 0) {
          stats.first_error = absl::StrCat(absl::StatusCodeToString(result.status().code()), ": ",
                                           result.status().message());
        }
      }
      absl::MutexLock lock(&mu);
      stats.latencies.insert(stats.latencies.end(), mine.begin(), mine.end());
    });
  }
  for (std::thread& t : threads) t.join();
  stats.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

// `n` requests over one Batch stream with up to `concurrency` outstanding.
Stats RunBatch(const Client& client, v1::BatchRequest request, int64_t n, int concurrency) {
  Stats stats;
  Progress progress("batch", n);
  CallOptions call = MakeCallOptions();
  call.timeout *= std::max<int64_t>(1, (n + concurrency - 1) / concurrency);
  auto start = Clock::now();
  auto items = client.Batch(
      n,
      [&](int64_t i) -> const v1::BatchRequest& {
        request.set_id(absl::StrCat(i));
        progress.Add();
        return request;
      },
      call, concurrency);
  stats.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!items.ok()) {
    stats.errors = n;
    stats.first_error = absl::StrCat(absl::StatusCodeToString(items.status().code()), ": ",
                                     items.status().message());
    return stats;
  }
  for (const BatchItem& item : *items) {
    if (item.response.code() == 0) {
      stats.latencies.push_back(item.latency_seconds);
    } else if (stats.errors++ == 0) {
      stats.first_error = absl::StrCat(
          absl::StatusCodeToString(static_cast<absl::StatusCode>(item.response.code())), ": ",
          item.response.message());
    }
  }
  return stats;
}

double Percentile(std::vector<double> sorted, double q) {
  if (sorted.empty()) return NAN;
  size_t rank = static_cast<size_t>(std::ceil(q * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

struct Row {
  double rps = 0, p50 = 0, p90 = 0, p99 = 0, gbps = 0;
};

Row Summarize(const std::string& name, Stats& stats) {
  std::sort(stats.latencies.begin(), stats.latencies.end());
  Row row;
  double ok = double(stats.latencies.size());
  row.rps = ok / stats.wall_seconds;
  row.p50 = Percentile(stats.latencies, 0.50);
  row.p90 = Percentile(stats.latencies, 0.90);
  row.p99 = Percentile(stats.latencies, 0.99);
  row.gbps = row.rps * stats.payload_bytes / 1e9;
  std::cout << absl::StrFormat("%-10s %12.1f %10.3f %10.3f %10.3f %14.3f %8d\n", name, row.rps,
                               row.p50 * 1e3, row.p90 * 1e3, row.p99 * 1e3, row.gbps, stats.errors);
  if (stats.errors > 0) std::cout << "  first error: " << stats.first_error << "\n";
  return row;
}

}  // namespace

int RunBench(const std::string& op) {
  const int64_t n = absl::GetFlag(FLAGS_requests);
  const int concurrency = absl::GetFlag(FLAGS_concurrency);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (n <= 0 || concurrency <= 0) {
    PrintError("bench", absl::InvalidArgumentError("--requests and --concurrency must be > 0"));
    return kExitUsage;
  }
  if (mode != "unary" && mode != "batch") {
    PrintError("bench", absl::InvalidArgumentError("--mode: unary or batch"));
    return kExitUsage;
  }
  uint64_t seed = 0;
  std::mt19937_64 rng = MakeRng(seed);
  auto client = MakeClient();
  if (!client.ok()) {
    PrintError("client", client.status());
    return kExitUsage;
  }
  const CallOptions call = MakeCallOptions();

  // The operation's request; Echo carries the same number of request bytes
  // (or, for "bench echo", the tensor of --shape/--input).
  v1::BatchRequest request;
  v1::EchoRequest echo;
  if (op != "echo") {
    auto built = BuildRequest(op, rng);
    if (!built.ok()) {
      PrintError("bench", built.status());
      return kExitUsage;
    }
    request = *std::move(built);
    *echo.mutable_input() =
        RandomTensor(v1::FLOAT32, {(RequestPayloadBytes(request) + 3) / 4}, rng);
  } else {
    if (mode == "batch") {
      PrintError("bench", absl::InvalidArgumentError("echo has no batch form; use --mode=unary"));
      return kExitUsage;
    }
    auto input = BuildEchoInput(rng);
    if (!input.ok()) {
      PrintError("bench", input.status());
      return kExitUsage;
    }
    *echo.mutable_input() = *std::move(input);
  }
  const int64_t request_bytes =
      op != "echo" ? RequestPayloadBytes(request) : PayloadBytes(echo.input());
  const int64_t warmup = std::max<int64_t>(0, absl::GetFlag(FLAGS_warmup));

  CallFn echo_call = [&]() -> absl::StatusOr<int64_t> {
    auto r = (*client)->Echo(echo, call);
    if (!r.ok()) return r.status();
    return PayloadBytes(r->output());
  };

  std::cout << "bench " << op << " (seed " << seed << "): " << n << " requests, concurrency "
            << concurrency << ", " << mode << ", " << request_bytes << " request bytes\n";
  std::cout << absl::StrFormat("%-10s %12s %10s %10s %10s %14s %8s\n", "", "requests/s", "p50 ms",
                               "p90 ms", "p99 ms", "payload GB/s", "errors");
  int exit_code = kExitOk;
  Row op_row;
  bool have_op = false;
  if (op != "echo") {
    int64_t response_bytes = 0;
    for (int64_t i = 0; i < std::max<int64_t>(1, warmup); ++i) {
      v1::BatchResponse r = CallUnary(**client, request, call);
      if (r.code() != 0) {
        PrintError(op, absl::Status(static_cast<absl::StatusCode>(r.code()), r.message()));
        return kExitCallFailed;
      }
      response_bytes = ResponsePayloadBytes(r);
    }
    Stats stats;
    if (mode == "unary") {
      stats = RunUnary(op, n, concurrency, [&]() -> absl::StatusOr<int64_t> {
        v1::BatchResponse r = CallUnary(**client, request, call);
        if (r.code() != 0)
          return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
        return ResponsePayloadBytes(r);
      });
    } else {
      stats = RunBatch(**client, request, n, concurrency);
    }
    stats.payload_bytes = double(request_bytes + response_bytes);
    op_row = Summarize(op, stats);
    have_op = true;
    if (stats.errors > 0) exit_code = kExitCallFailed;
  }
  if (absl::GetFlag(FLAGS_echo_baseline) || op == "echo") {
    for (int64_t i = 0; i < warmup; ++i) {
      if (auto r = echo_call(); !r.ok()) {
        PrintError("echo", r.status());
        return kExitCallFailed;
      }
    }
    Stats stats = RunUnary("echo", n, concurrency, echo_call);
    stats.payload_bytes = 2.0 * double(PayloadBytes(echo.input()));
    Row echo_row = Summarize("echo", stats);
    if (stats.errors > 0) exit_code = kExitCallFailed;
    if (have_op) {
      std::cout << absl::StrFormat("%s over echo: p50 x%.2f, p99 x%.2f latency; x%.2f requests/s\n",
                                   op, op_row.p50 / echo_row.p50, op_row.p99 / echo_row.p99,
                                   op_row.rps / echo_row.rps);
    }
  }
  return exit_code;
}

}  // namespace gpucompute::cli
