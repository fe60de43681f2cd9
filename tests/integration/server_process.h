// The real gpucompute-server as a child process on an ephemeral loopback
// port, and small helpers the integration tests share (running the CLI,
// fetching /metrics).
#ifndef GPUCOMPUTE_TESTS_INTEGRATION_SERVER_PROCESS_H_
#define GPUCOMPUTE_TESTS_INTEGRATION_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace gpucompute::testing {

// Paths baked in by tests/integration/CMakeLists.txt.
// True when GPUCOMPUTE_TEST_SERVER_ARGS replaces the tests' device flags
// (the suite run over other devices). Tests that pin a topology of their own
// skip then.
bool DevicesOverridden();

#define GC_SKIP_IF_DEVICES_OVERRIDDEN()                                                   \
  do {                                                                                    \
    if (::gpucompute::testing::DevicesOverridden())                                       \
      GTEST_SKIP() << "pins its own device topology; GPUCOMPUTE_TEST_SERVER_ARGS is set"; \
  } while (0)

const char* ServerPath();
const char* CliPath();
const char* PromtoolPath();  // "" when promtool was not found

// A fresh directory under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One running gpucompute-server. The destructor kills (SIGKILL) and reaps a
// server that is still running; the child also dies with this process.
class ServerProcess {
 public:
  // Starts the server with --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0
  // --ready_file=<tmp> and `args`, and waits up to `timeout` for the ready
  // file ({"grpc_port": N, "metrics_port": M}). Errors: INTERNAL when the
  // server cannot be started or exits first (with its log), DEADLINE_EXCEEDED
  // when it is not ready in time.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::vector<std::string>& args = {}, absl::Duration timeout = absl::Seconds(30));
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const;  // "127.0.0.1:<grpc_port>"
  pid_t pid() const { return pid_; }

  // A client of this server; `timeout` is its default deadline.
  std::unique_ptr<Client> NewClient(absl::Duration timeout = absl::Seconds(60),
                                    bool own_connection = false) const;

  // Sends `signal` to the server (no-op once it has been reaped).
  void Signal(int signal);

  // Waits up to `timeout` for the server to exit and reaps it. Returns the
  // raw waitpid status; DEADLINE_EXCEEDED if it is still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // What the server wrote to stdout and stderr so far.
  std::string Log() const;

 private:
  ServerProcess() = default;

  TempDir dir_;
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
};

// The exit status and combined stdout+stderr of a finished command.
struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal or timed out
  std::string output;
};

// Runs argv[0] with its arguments, waiting up to `timeout` (then SIGKILL).
CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(60),
                         const std::string& stdin_path = "");

// GET http://127.0.0.1:<port><path> over a plain socket; the body of a 200
// answer, INTERNAL otherwise.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

// Sum of the samples of metric `name` in Prometheus text `text` whose labels
// include every `labels` pair (written as `key="value"`).
double MetricSum(const std::string& text, const std::string& name,
                 const std::vector<std::string>& labels = {});

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_INTEGRATION_SERVER_PROCESS_H_
