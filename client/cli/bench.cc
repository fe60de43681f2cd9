// `gpucompute bench <op>`: N requests at concurrency C, as unary calls from C
// threads or over one Batch stream with up to C outstanding; then Echo of the
// same request payload at the same concurrency, so that the service's cost
// over bare gRPC shows as a ratio. With --resident the operands are uploaded
// once and every request names them by handle and keeps its result, which is
// freed after the call, outside the timed region.
//
// `gpucompute bench upload|download`: N transfers of --bytes, one at a time,
// each over --streams streams: the throughput of the data path.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
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
ABSL_FLAG(int, concurrency, 4,
          "bench: requests in flight at once C (bench upload|download: one transfer at a time, "
          "each over --streams streams).");
ABSL_FLAG(std::string, mode, "unary",
          "bench: unary (C threads of unary calls) or batch (one Batch stream with up to C "
          "requests outstanding; its deadline is --timeout per C requests).");
ABSL_FLAG(int64_t, warmup, 5,
          "bench: untimed requests before each measurement; with --mode=batch also an "
          "untimed job of that many items (at least one per stream) over the same streams.");
ABSL_FLAG(bool, echo_baseline, true, "bench: also measure Echo of the same request payload.");
ABSL_FLAG(int64_t, bytes, int64_t{256} << 20,
          "bench upload|download: bytes of each transfer (a multiple of the --dtype size).");

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

// Work after a call that its latency does not include (freeing the results
// a --resident call kept); its error counts as the call's.
using UntimedFn = std::function<absl::Status()>;

// One call: payload bytes of the response, or an error. It may set `untimed`.
using CallFn = std::function<absl::StatusOr<int64_t>(UntimedFn& untimed)>;

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
        UntimedFn untimed;
        auto t0 = Clock::now();
        absl::StatusOr<int64_t> result = call(untimed);
        double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        progress.Add();
        if (untimed) {
          if (absl::Status status = untimed(); !status.ok() && result.ok()) result = status;
        }
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

// `n` requests over --streams Batch streams (each on a connection of its
// own) with up to `concurrency` outstanding in all.
// The handles of the results the requests kept go to `kept`. `label` names
// the job on the progress bar.
Stats RunBatch(const Client& client, v1::BatchRequest request, int64_t n, int concurrency,
               std::vector<std::string>& kept, const std::string& label) {
  Stats stats;
  Progress progress(label, n);
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
      call, concurrency, client.options().streams);
  stats.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!items.ok()) {
    stats.errors = n;
    stats.first_error = absl::StrCat(absl::StatusCodeToString(items.status().code()), ": ",
                                     items.status().message());
    return stats;
  }
  for (const BatchItem& item : *items) {
    for (const std::string& h : KeptHandles(item.response)) kept.push_back(h);
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

void PrintTableHeader() {
  std::cout << absl::StrFormat("%-10s %12s %10s %10s %10s %14s %8s\n", "", "requests/s", "p50 ms",
                               "p90 ms", "p99 ms", "payload GB/s", "errors");
}

// bench upload|download: `n` transfers of --bytes, one at a time.
int RunTransferBench(const std::string& op, int64_t n) {
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  auto dtype = InputDType();
  if (!dtype.ok()) {
    PrintError("bench", dtype.status());
    return kExitUsage;
  }
  if (bytes < 0 || bytes % ElementSize(*dtype) != 0) {
    PrintError("bench", absl::InvalidArgumentError(absl::StrCat("--bytes: ", bytes,
                                                                " is not a whole number of ",
                                                                DTypeName(*dtype), " elements")));
    return kExitUsage;
  }
  auto client = MakeClient();
  if (!client.ok()) {
    PrintError("client", client.status());
    return kExitUsage;
  }
  const Client& c = **client;
  const CallOptions call = MakeCallOptions();
  const std::vector<int64_t> shape = {bytes / ElementSize(*dtype)};
  // Arbitrary bits: the transfer does not look at them.
  std::string data(bytes, '\0');
  uint64_t seed = 0;
  std::mt19937_64 rng = MakeRng(seed);
  for (int64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t word = rng();
    std::memcpy(data.data() + i, &word, 8);
  }
  const int64_t warmup = std::max<int64_t>(0, absl::GetFlag(FLAGS_warmup));
  const size_t streams =
      SplitTransfer(bytes, c.options().streams, c.options().parallel_min_bytes).size();

  HandleScope handles(c);
  CallFn transfer;
  if (op == "upload") {
    transfer = [&](UntimedFn& untimed) -> absl::StatusOr<int64_t> {
      auto info = c.Upload(*dtype, shape, data.data(), {}, call);
      if (!info.ok()) return info.status();
      untimed = [&c, handle = info->handle(), &call] { return c.Free({handle}, call).status(); };
      return 0;
    };
  } else {
    auto info = c.Upload(*dtype, shape, data.data(), {}, call);
    if (!info.ok()) {
      PrintError("upload", info.status());
      return kExitCallFailed;
    }
    handles.Add(info->handle());
    transfer = [&, handle = info->handle()](UntimedFn&) -> absl::StatusOr<int64_t> {
      absl::Status status = c.Download(handle, data.data(), bytes, {}, call);
      if (!status.ok()) return status;
      return bytes;
    };
  }
  std::cout << "bench " << op << ": " << n << " transfers of " << bytes << " bytes, one at a time, "
            << streams << " stream(s) each, " << c.options().chunk_bytes << "-byte chunks\n";
  PrintTableHeader();
  for (int64_t i = 0; i < warmup; ++i) {
    UntimedFn untimed;
    absl::StatusOr<int64_t> result = transfer(untimed);
    if (result.ok() && untimed) {
      if (absl::Status status = untimed(); !status.ok()) result = status;
    }
    if (!result.ok()) {
      PrintError(op, result.status());
      return kExitCallFailed;
    }
  }
  Stats stats = RunUnary(op, n, 1, transfer);
  stats.payload_bytes = double(bytes);
  Row row = Summarize(op, stats);
  std::cout << absl::StrFormat("%s: %.3f GB/s per transfer at p50 (%.3f ms for %d bytes)\n", op,
                               double(bytes) / row.p50 / 1e9, row.p50 * 1e3, bytes);
  if (absl::Status s = handles.FreeAll(); !s.ok()) {
    PrintError("free", s);
    return kExitCallFailed;
  }
  return stats.errors > 0 ? kExitCallFailed : kExitOk;
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
  if (op == "upload" || op == "download") {
    if (mode != "unary" || ResidentMode()) {
      PrintError("bench", absl::InvalidArgumentError(
                              "bench upload|download takes neither --mode=batch nor --resident"));
      return kExitUsage;
    }
    return RunTransferBench(op, n);
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
  // (or, for "bench echo", the tensor of --shape/--input). With --resident
  // the request carries handles only, and so does Echo: an empty tensor.
  const bool resident = ResidentMode();
  HandleScope handles(**client);
  TransferCost upload;
  v1::BatchRequest request;
  v1::EchoRequest echo;
  if (op != "echo") {
    auto built = BuildRequest(op, rng);
    if (!built.ok()) {
      PrintError("bench", built.status());
      return kExitUsage;
    }
    request = *std::move(built);
    if (resident) {
      auto cost = MakeResident(**client, request, handles);
      if (!cost.ok()) {
        PrintError("upload", cost.status());
        return kExitCallFailed;
      }
      upload = *cost;
    }
    *echo.mutable_input() =
        RandomTensor(v1::FLOAT32, {(RequestPayloadBytes(request) + 3) / 4}, rng);
  } else {
    if (mode == "batch") {
      PrintError("bench", absl::InvalidArgumentError("echo has no batch form; use --mode=unary"));
      return kExitUsage;
    }
    if (resident) {
      PrintError("bench", absl::InvalidArgumentError("echo has no operands to keep resident"));
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

  CallFn echo_call = [&](UntimedFn&) -> absl::StatusOr<int64_t> {
    auto r = (*client)->Echo(echo, call);
    if (!r.ok()) return r.status();
    return PayloadBytes(r->output());
  };
  // Frees the results a call kept (--resident).
  auto free_kept = [&](std::vector<std::string> kept) -> absl::Status {
    if (kept.empty()) return absl::OkStatus();
    return (*client)->Free(kept, call).status();
  };

  std::cout << "bench " << op << " (seed " << seed << "): " << n << " requests, concurrency "
            << concurrency << ", " << mode << ", " << request_bytes << " request bytes\n";
  if (resident) {
    std::cout << "resident: operands uploaded once, " << FormatCost(upload)
              << "; each result kept and freed after its call, untimed\n";
  }
  PrintTableHeader();
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
      if (absl::Status s = free_kept(KeptHandles(r)); !s.ok()) {
        PrintError("free", s);
        return kExitCallFailed;
      }
      response_bytes = ResponsePayloadBytes(r);
    }
    Stats stats;
    if (mode == "unary") {
      stats = RunUnary(op, n, concurrency, [&](UntimedFn& untimed) -> absl::StatusOr<int64_t> {
        v1::BatchResponse r = CallUnary(**client, request, call);
        if (r.code() != 0)
          return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
        if (std::vector<std::string> kept = KeptHandles(r); !kept.empty()) {
          untimed = [&free_kept, kept] { return free_kept(kept); };
        }
        return ResponsePayloadBytes(r);
      });
    } else {
      // The results are freed once the stream is done.
      auto free_all = [&](const std::vector<std::string>& kept) -> absl::Status {
        constexpr size_t kPerFree = 1000;
        for (size_t i = 0; i < kept.size(); i += kPerFree) {
          std::vector<std::string> some(kept.begin() + i,
                                        kept.begin() + std::min(kept.size(), i + kPerFree));
          if (absl::Status s = free_kept(some); !s.ok()) return s;
        }
        return absl::OkStatus();
      };
      // A warm-up job over the same streams first (untimed, at least one item
      // per stream): every stream's connection is made and the server's
      // streams and lanes are warm before the timed job starts.
      if (warmup > 0) {
        std::vector<std::string> kept;
        const int64_t items = std::max<int64_t>(warmup, (*client)->options().streams);
        Stats warm = RunBatch(**client, request, items, concurrency, kept, "warm-up");
        if (warm.errors > 0) {
          PrintError(op, absl::InternalError(absl::StrCat("warm-up batch: ", warm.first_error)));
          return kExitCallFailed;
        }
        if (absl::Status s = free_all(kept); !s.ok()) {
          PrintError("free", s);
          return kExitCallFailed;
        }
      }
      std::vector<std::string> kept;
      stats = RunBatch(**client, request, n, concurrency, kept, "batch");
      if (absl::Status s = free_all(kept); !s.ok()) {
        PrintError("free", s);
        exit_code = kExitCallFailed;
      }
    }
    stats.payload_bytes = double(request_bytes + response_bytes);
    op_row = Summarize(op, stats);
    have_op = true;
    if (stats.errors > 0) exit_code = kExitCallFailed;
  }
  if (absl::GetFlag(FLAGS_echo_baseline) || op == "echo") {
    for (int64_t i = 0; i < warmup; ++i) {
      UntimedFn none;
      if (auto r = echo_call(none); !r.ok()) {
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
  if (absl::Status s = handles.FreeAll(); !s.ok()) {
    PrintError("free", s);
    exit_code = kExitCallFailed;
  }
  return exit_code;
}

}  // namespace gpucompute::cli
