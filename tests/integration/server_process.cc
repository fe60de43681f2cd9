#include "tests/integration/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gpucompute::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// fork + exec of argv with stdout and stderr into `log_path` (and stdin from
// `stdin_path` when given). The child dies with this process (a test that
// crashes leaves no server behind).
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log_path,
                            const std::string& stdin_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
      close(log);
    }
    int in = open(stdin_path.empty() ? "/dev/null" : stdin_path.c_str(), O_RDONLY);
    if (in >= 0) {
      dup2(in, STDIN_FILENO);
      close(in);
    }
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

// waitpid with a deadline. Returns the status, or nullopt on timeout.
std::optional<int> WaitFor(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (absl::Now() > deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace

namespace {

// The build's path, unless the environment names another (a bundle run on
// another machine sets these).
const char* PathFromEnv(const char* variable, const char* built) {
  const char* value = std::getenv(variable);
  return value && *value ? value : built;
}

}  // namespace

bool DevicesOverridden() {
  const char* extra = std::getenv("GPUCOMPUTE_TEST_SERVER_ARGS");
  return extra != nullptr && *extra != '\0';
}

const char* ServerPath() { return PathFromEnv("GPUCOMPUTE_TEST_SERVER", GC_SERVER_PATH); }
const char* CliPath() { return PathFromEnv("GPUCOMPUTE_TEST_CLI", GC_CLI_PATH); }
const char* PromtoolPath() { return PathFromEnv("GPUCOMPUTE_TEST_PROMTOOL", GC_PROMTOOL_PATH); }

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(base && *base ? base : "/tmp", "/gpucompute-test-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) std::abort();
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& args, absl::Duration timeout) {
  std::unique_ptr<ServerProcess> server(new ServerProcess());
  const std::string ready = server->dir_.File("ready.json");
  std::vector<std::string> argv = {ServerPath(), "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0", "--ready_file=" + ready};
  // GPUCOMPUTE_TEST_SERVER_ARGS (space-separated), e.g. "--backend=cuda
  // --devices=0", runs the suite against other devices: it replaces the
  // tests' own virtual-CPU device flags.
  const char* extra = std::getenv("GPUCOMPUTE_TEST_SERVER_ARGS");
  const bool override_devices = extra != nullptr && *extra != '\0';
  for (const std::string& arg : args) {
    if (override_devices &&
        (absl::StartsWith(arg, "--cpu_devices=") || absl::StartsWith(arg, "--device_weights="))) {
      continue;
    }
    argv.push_back(arg);
  }
  if (override_devices) {
    for (absl::string_view arg : absl::StrSplit(extra, ' ', absl::SkipEmpty()))
      argv.emplace_back(arg);
  }
  auto pid = Spawn(argv, server->dir_.File("server.log"), "");
  if (!pid.ok()) return pid.status();
  server->pid_ = *pid;

  static const std::regex kReady(
      R"re(\{\s*"grpc_port"\s*:\s*(\d+)\s*,\s*"metrics_port"\s*:\s*(\d+)\s*\})re");
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::string text = ReadAll(ready);
    std::smatch match;
    if (std::regex_search(text, match, kReady)) {
      server->grpc_port_ = std::stoi(match[1]);
      server->metrics_port_ = std::stoi(match[2]);
      if (server->grpc_port_ > 0) return server;
    }
    int status = 0;
    if (waitpid(server->pid_, &status, WNOHANG) == server->pid_) {
      server->pid_ = -1;
      return absl::InternalError(absl::StrCat("the server exited (status ", status,
                                              ") before it was ready:\n", server->Log()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the server was not ready in ", absl::FormatDuration(timeout), ":\n", server->Log()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

ServerProcess::~ServerProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  WaitFor(pid_, absl::Seconds(10));
}

std::string ServerProcess::address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }

std::unique_ptr<Client> ServerProcess::NewClient(absl::Duration timeout,
                                                 bool own_connection) const {
  ClientOptions options;
  options.target = address();
  options.default_timeout = timeout;
  options.own_connection = own_connection;
  return *Client::Create(std::move(options));
}

void ServerProcess::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

absl::StatusOr<int> ServerProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("the server was reaped already");
  std::optional<int> status = WaitFor(pid_, timeout);
  if (!status) return absl::DeadlineExceededError("the server is still running");
  pid_ = -1;
  return *status;
}

std::string ServerProcess::Log() const { return ReadAll(dir_.File("server.log")); }

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                         const std::string& stdin_path) {
  TempDir dir;
  CommandResult result;
  auto pid = Spawn(argv, dir.File("output"), stdin_path);
  if (!pid.ok()) {
    result.output = std::string(pid.status().message());
    return result;
  }
  std::optional<int> status = WaitFor(*pid, timeout);
  if (!status) {
    kill(*pid, SIGKILL);
    WaitFor(*pid, absl::Seconds(10));
    result.output = ReadAll(dir.File("output")) + "\n[timed out]";
    return result;
  }
  result.output = ReadAll(dir.File("output"));
  if (WIFEXITED(*status)) result.exit_code = WEXITSTATUS(*status);
  return result;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("connect to port ", port, ": ", std::strerror(errno)));
  }
  std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::InternalError("send failed");
  }
  std::string response;
  char buf[65536];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    response.append(buf, n);
  }
  close(fd);
  size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::InternalError(absl::StrCat("not an HTTP answer: ", response.substr(0, 200)));
  }
  std::string status_line = response.substr(0, response.find("\r\n"));
  if (status_line.find(" 200") == std::string::npos) {
    return absl::InternalError(absl::StrCat("HTTP answer: ", status_line));
  }
  return response.substr(body + 4);
}

double MetricSum(const std::string& text, const std::string& name,
                 const std::vector<std::string>& labels) {
  double total = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    size_t end = line.find_first_of("{ ");
    if (end == absl::string_view::npos || line.substr(0, end) != name) continue;
    bool match = true;
    for (const std::string& l : labels) match = match && absl::StrContains(line, l);
    if (!match) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) total += value;
  }
  return total;
}

}  // namespace gpucompute::testing
