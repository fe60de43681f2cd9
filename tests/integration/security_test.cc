// TLS, mutual TLS and bearer tokens end to end, through the CLI and the C++
// client: certificates made with openssl at test time (a CA, a server
// certificate for localhost and 127.0.0.1, client certificates, and a second
// CA the server does not trust), refused connections and calls, identities
// owning resident tensors, the token file read again on SIGHUP and on change,
// certificate files read again once replaced, and refusals and reloads in
// the metrics.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

constexpr int kExitOk = 0, kExitCallFailed = 1;

// Tokens of the tests' token files (at least 16 characters each).
constexpr char kAliceToken[] = "alice-0123456789abcdef";
constexpr char kBobToken[] = "bob-0123456789abcdef";
constexpr char kBareToken[] = "bare-0123456789abcdef";
constexpr char kNewToken[] = "new-0123456789abcdef";

void WriteFile(const std::string& path, const std::string& contents) {
  // Through a rename, as an operator's tooling would replace it.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << contents;
  }
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0) << path;
}

// A throwaway PKI in a temporary directory: ca.pem (the CA the server
// trusts), server.pem/key (localhost, 127.0.0.1), alice.pem/key and
// bob.pem/key (client certificates from the CA, common names "alice-cert"
// and "bob-cert"), rogue-ca.pem, mallory.pem/key (a CA nobody trusts and a
// client certificate from it) and rogue-server.pem/key (a server certificate
// for the same names from that CA).
class Pki {
 public:
  // Empty on success, else what openssl said.
  std::string Make() {
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    WriteExt("server.ext",
             "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
             "extendedKeyUsage=serverAuth\n");
    WriteExt("client.ext", "extendedKeyUsage=clientAuth\n");
    for (const char* ca : {"ca", "rogue-ca"}) {
      if (std::string error = Openssl(absl::StrCat("req -x509 ", ec, " -keyout ", ca, ".key -out ",
                                                   ca, ".pem -days 2 -subj /CN=", ca, "-test"));
          !error.empty()) {
        return error;
      }
    }
    for (const auto& [name, ca, ext] :
         {std::tuple<const char*, const char*, const char*>{"server", "ca", "server.ext"},
          {"rogue-server", "rogue-ca", "server.ext"},
          {"alice", "ca", "client.ext"},
          {"bob", "ca", "client.ext"},
          {"mallory", "rogue-ca", "client.ext"}}) {
      const std::string cn =
          absl::EndsWith(name, "server") ? std::string("localhost") : absl::StrCat(name, "-cert");
      if (std::string error = Openssl(absl::StrCat("req ", ec, " -keyout ", name, ".key -out ",
                                                   name, ".csr -subj /CN=", cn));
          !error.empty()) {
        return error;
      }
      if (std::string error = Openssl(absl::StrCat("x509 -req -in ", name, ".csr -CA ", ca,
                                                   ".pem -CAkey ", ca, ".key -CAcreateserial",
                                                   " -out ", name, ".pem -days 2 -extfile ", ext));
          !error.empty()) {
        return error;
      }
    }
    return "";
  }

  std::string File(const std::string& name) const { return dir_.File(name); }

 private:
  void WriteExt(const std::string& name, const std::string& contents) {
    std::ofstream(dir_.File(name)) << contents;
  }

  // Runs openssl in the directory; "" on success, else its output.
  std::string Openssl(const std::string& args) {
    CommandResult r = RunCommand(
        {"/bin/sh", "-c", absl::StrCat("cd ", dir_.path(), " && openssl ", args, " 2>&1")});
    return r.exit_code == 0 ? "" : absl::StrCat("openssl ", args, ": ", r.output);
  }

  TempDir dir_;
};

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new Pki();
    *pki_error_ = pki_->Make();
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(pki_error_->empty()) << *pki_error_;
    WriteFile(TokenFile(), absl::StrCat("# the tests' tokens\n", kAliceToken, " alice\n", kBobToken,
                                        "\tbob\n\n", kBareToken, "\n"));
  }

  static std::string Pem(const std::string& name) { return pki_->File(name); }
  std::string TokenFile() const { return dir_.File("tokens"); }

  // A server on TLS (server.pem) with `args` besides.
  static std::unique_ptr<ServerProcess> StartTls(std::vector<std::string> args = {}) {
    args.push_back("--tls_cert=" + Pem("server.pem"));
    args.push_back("--tls_key=" + Pem("server.key"));
    auto server = ServerProcess::Start(args);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }
  std::unique_ptr<ServerProcess> StartWithTokens(std::vector<std::string> args = {}) const {
    args.push_back("--token_file=" + TokenFile());
    return StartTls(std::move(args));
  }

  // Client options for `server` over TLS trusting ca.pem, with the client
  // certificate `cert` ("alice": alice.pem and alice.key) and the bearer
  // token `token` when not empty.
  static ClientOptions TlsOptions(const ServerProcess& server, const std::string& cert = "",
                                  const std::string& token = "", const std::string& session = "") {
    ClientOptions options;
    options.target = server.address();
    options.default_timeout = absl::Seconds(20);
    options.max_attempts = 1;
    options.use_tls = true;
    options.root_certs_path = Pem("ca.pem");
    if (!cert.empty()) {
      options.client_cert_path = Pem(cert + ".pem");
      options.client_key_path = Pem(cert + ".key");
    }
    options.token = token;
    options.session = session;
    options.own_connection = true;
    return options;
  }
  static std::unique_ptr<Client> NewClient(const ClientOptions& options) {
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // The CLI against `server` with `args`.
  static CommandResult Cli(const ServerProcess& server, std::vector<std::string> args) {
    std::vector<std::string> argv = {CliPath(), "--server=" + server.address(), "--timeout=20s",
                                     "--max_attempts=1"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }
  static std::vector<std::string> CliTls(std::vector<std::string> args) {
    args.insert(args.begin(), {"--tls", "--tls_ca=" + Pem("ca.pem")});
    return args;
  }

  // A small GEMM through `client`, checked against the reference.
  static ::testing::AssertionResult GemmWorks(const Client& client) {
    const v1::GemmRequest request = MakeGemm(v1::FLOAT32, {.m = 9, .n = 7, .k = 5});
    absl::StatusOr<v1::GemmResponse> response = client.Gemm(request);
    if (!response.ok()) return ::testing::AssertionFailure() << response.status();
    return Passes(CheckGemm(request, *response));
  }

  // Copies the file `from` to `to` (through a rename).
  static void CopyPem(const std::string& from, const std::string& to) {
    std::ifstream in(from, std::ios::binary);
    WriteFile(to, std::string(std::istreambuf_iterator<char>(in), {}));
  }

  // A TLS server on live.pem and live.key, copies of server.pem and server.key
  // that the test may replace, read again every `interval`.
  std::unique_ptr<ServerProcess> StartOnLiveFiles(const std::string& interval) const {
    CopyPem(Pem("server.pem"), dir_.File("live.pem"));
    CopyPem(Pem("server.key"), dir_.File("live.key"));
    auto started = ServerProcess::Start({"--tls_cert=" + dir_.File("live.pem"),
                                         "--tls_key=" + dir_.File("live.key"),
                                         "--tls_reload_interval=" + interval});
    EXPECT_TRUE(started.ok()) << started.status();
    return started.ok() ? *std::move(started) : nullptr;
  }

  // Whether a new client with `base`'s options, trusting the PKI's `ca`
  // instead, is served within `within` (tried at least once).
  static bool ServedTo(const ClientOptions& base, const std::string& ca, absl::Duration within) {
    ClientOptions options = base;
    options.root_certs_path = Pem(ca);
    options.default_timeout = absl::Seconds(5);
    const absl::Time deadline = absl::Now() + within;
    while (true) {
      auto client = Client::Create(options);
      if (client.ok() && (*client)->GetServerInfo().ok()) return true;
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  // Waits up to 10 s for the server's log to contain `text`.
  static bool WaitForLog(const ServerProcess& server, const std::string& text) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      if (absl::StrContains(server.Log(), text)) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  static Pki* pki_;
  static std::string* pki_error_;
  TempDir dir_;
};

Pki* SecurityTest::pki_ = nullptr;
std::string* SecurityTest::pki_error_ = new std::string;

TEST_F(SecurityTest, TlsServesTheCliAndTheClient) {
  auto server = StartTls();
  ASSERT_NE(server, nullptr);
  CommandResult cli =
      Cli(*server, CliTls({"gemm", "--m=33", "--n=17", "--k=9", "--dtype=bfloat16", "--check"}));
  EXPECT_EQ(cli.exit_code, kExitOk) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "check: OK")) << cli.output;
  cli = Cli(*server, CliTls({"health"}));
  EXPECT_EQ(cli.exit_code, kExitOk) << cli.output;

  auto client = NewClient(TlsOptions(*server));
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(GemmWorks(*client));
  // Without client certificates or tokens, sessions still own tensors.
  auto mine = NewClient(TlsOptions(*server, "", "", "mine"));
  auto theirs = NewClient(TlsOptions(*server, "", "", "theirs"));
  const std::vector<float> data(64, 1.5f);
  auto info = mine->Upload(v1::FLOAT32, {8, 8}, data.data());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(mine->ListTensors()->tensors_size(), 1);
  EXPECT_EQ(theirs->ListTensors()->tensors_size(), 0);
  EXPECT_TRUE(absl::StrContains(server->Log(), "(TLS)")) << server->Log();
}

TEST_F(SecurityTest, PlaintextOrUntrustingClientsCannotConnect) {
  auto server = StartTls();
  ASSERT_NE(server, nullptr);
  CommandResult cli = Cli(*server, {"info"});
  EXPECT_EQ(cli.exit_code, kExitCallFailed) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "UNAVAILABLE")) << cli.output;

  ClientOptions plaintext;
  plaintext.target = server->address();
  plaintext.default_timeout = absl::Seconds(10);
  plaintext.max_attempts = 1;
  auto client = NewClient(plaintext);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);

  // A client that trusts another CA refuses the server's certificate.
  ClientOptions untrusting = TlsOptions(*server);
  untrusting.root_certs_path = Pem("rogue-ca.pem");
  client = NewClient(untrusting);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  cli = Cli(*server, {"--tls", "--tls_ca=" + Pem("rogue-ca.pem"), "info"});
  EXPECT_EQ(cli.exit_code, kExitCallFailed) << cli.output;
}

TEST_F(SecurityTest, MutualTlsNeedsAClientCertificateFromTheCa) {
  auto server = StartTls({"--tls_client_ca=" + Pem("ca.pem")});
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(absl::StrContains(server->Log(), "(mutual TLS)")) << server->Log();

  // No client certificate.
  CommandResult cli = Cli(*server, CliTls({"info"}));
  EXPECT_EQ(cli.exit_code, kExitCallFailed) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "UNAVAILABLE")) << cli.output;
  auto client = NewClient(TlsOptions(*server));
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);

  // A certificate from a CA the server does not trust.
  cli =
      Cli(*server,
          CliTls({"--tls_cert=" + Pem("mallory.pem"), "--tls_key=" + Pem("mallory.key"), "info"}));
  EXPECT_EQ(cli.exit_code, kExitCallFailed) << cli.output;
  client = NewClient(TlsOptions(*server, "mallory"));
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);

  // The CA's.
  cli = Cli(*server, CliTls({"--tls_cert=" + Pem("alice.pem"), "--tls_key=" + Pem("alice.key"),
                             "gemm", "--m=20", "--n=30", "--k=40", "--check"}));
  EXPECT_EQ(cli.exit_code, kExitOk) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "check: OK")) << cli.output;
  client = NewClient(TlsOptions(*server, "alice"));
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(GemmWorks(*client));
}

TEST_F(SecurityTest, ClientCertificatesOwnResidentTensors) {
  auto server = StartTls({"--tls_client_ca=" + Pem("ca.pem")});
  ASSERT_NE(server, nullptr);
  auto alice = NewClient(TlsOptions(*server, "alice", "", "one"));
  // The certificate's name is the owner: another session of alice's is alice.
  auto alice_again = NewClient(TlsOptions(*server, "alice", "", "two"));
  auto bob = NewClient(TlsOptions(*server, "bob", "", "one"));
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);
  const std::vector<float> data(32, 2.0f);
  auto info = alice->Upload(v1::FLOAT32, {4, 8}, data.data());
  ASSERT_TRUE(info.ok()) << info.status();

  auto listed = alice_again->ListTensors();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->tensors_size(), 1);
  EXPECT_EQ(listed->tensors(0).handle(), info->handle());
  EXPECT_EQ(bob->ListTensors()->tensors_size(), 0);
  std::vector<float> out(32);
  EXPECT_EQ(bob->Download(info->handle(), out.data(), 32 * 4).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob->Free({info->handle()}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(alice_again->Download(info->handle(), out.data(), 32 * 4).ok());
  EXPECT_EQ(out, data);
  EXPECT_TRUE(alice->Free({info->handle()}).ok());
}

TEST_F(SecurityTest, CallsWithoutAValidTokenAreUnauthenticated) {
  auto server = StartWithTokens();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(absl::StrContains(server->Log(), "(TLS, 3 bearer tokens)")) << server->Log();

  auto anonymous = NewClient(TlsOptions(*server));
  ASSERT_NE(anonymous, nullptr);
  absl::Status missing = anonymous->GetServerInfo().status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated) << missing;
  EXPECT_TRUE(absl::StrContains(missing.message(), "authorization: Bearer <token>")) << missing;
  const v1::GemmRequest gemm = MakeGemm(v1::FLOAT32, {.m = 3, .n = 3, .k = 3});
  EXPECT_EQ(anonymous->Gemm(gemm).status().code(), absl::StatusCode::kUnauthenticated);
  const std::vector<float> data(16, 1.0f);
  EXPECT_EQ(anonymous->Upload(v1::FLOAT32, {4, 4}, data.data()).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->ListTensors().status().code(), absl::StatusCode::kUnauthenticated);

  auto wrong = NewClient(TlsOptions(*server, "", "not-a-token-of-this-server"));
  ASSERT_NE(wrong, nullptr);
  absl::Status invalid = wrong->Gemm(gemm).status();
  EXPECT_EQ(invalid.code(), absl::StatusCode::kUnauthenticated) << invalid;
  EXPECT_TRUE(absl::StrContains(invalid.message(), "not valid")) << invalid;

  // Another scheme than Bearer.
  grpc::SslCredentialsOptions ssl;
  {
    std::ifstream in(Pem("ca.pem"));
    ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto stub =
      v1::Compute::NewStub(grpc::CreateChannel(server->address(), grpc::SslCredentials(ssl)));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Basic ", kAliceToken));
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::ServerInfoRequest request;
  v1::ServerInfoResponse response;
  grpc::Status basic = stub->GetServerInfo(&ctx, request, &response);
  EXPECT_EQ(basic.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(basic.error_message(), "Bearer")) << basic.error_message();

  // Each refusal counted by its reason: 4 calls without a token, 1 with an
  // unknown one, 1 with another scheme; the tokens in force.
  absl::StatusOr<std::string> scrape = HttpGet(server->metrics_port(), "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_EQ(MetricSum(*scrape, "gpucompute_auth_refused_total", {"reason=\"missing\""}), 4);
  EXPECT_EQ(MetricSum(*scrape, "gpucompute_auth_refused_total", {"reason=\"invalid\""}), 1);
  EXPECT_EQ(MetricSum(*scrape, "gpucompute_auth_refused_total", {"reason=\"malformed\""}), 1);
  EXPECT_EQ(MetricSum(*scrape, "gpucompute_bearer_tokens"), 3);

  auto alice = NewClient(TlsOptions(*server, "", kAliceToken));
  ASSERT_NE(alice, nullptr);
  EXPECT_TRUE(GemmWorks(*alice));
  auto bare = NewClient(TlsOptions(*server, "", kBareToken));
  ASSERT_NE(bare, nullptr);
  EXPECT_TRUE(GemmWorks(*bare));

  // The CLI: --token, --token_file.
  CommandResult cli = Cli(*server, CliTls({"info"}));
  EXPECT_EQ(cli.exit_code, kExitCallFailed) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "UNAUTHENTICATED")) << cli.output;
  cli = Cli(*server, CliTls({"--token=not-a-token-of-this-server", "info"}));
  EXPECT_EQ(cli.exit_code, kExitCallFailed) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "UNAUTHENTICATED")) << cli.output;
  WriteFile(dir_.File("alice.token"), absl::StrCat(kAliceToken, "\n"));
  cli = Cli(*server, CliTls({"--token_file=" + dir_.File("alice.token"), "gemm", "--m=17", "--n=5",
                             "--k=64", "--check"}));
  EXPECT_EQ(cli.exit_code, kExitOk) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "check: OK")) << cli.output;
  cli = Cli(*server, CliTls({std::string("--token=") + kBobToken, "info"}));
  EXPECT_EQ(cli.exit_code, kExitOk) << cli.output;
}

TEST_F(SecurityTest, HealthIsOpenOnlyWhenExempt) {
  {
    auto server = StartWithTokens();
    ASSERT_NE(server, nullptr);
    auto anonymous = NewClient(TlsOptions(*server));
    ASSERT_NE(anonymous, nullptr);
    auto health = anonymous->Health();
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, grpc::health::v1::HealthCheckResponse::SERVING);
    EXPECT_TRUE(anonymous->Health("gpucompute.v1.Compute").ok());
    CommandResult cli = Cli(*server, CliTls({"health"}));
    EXPECT_EQ(cli.exit_code, kExitOk) << cli.output;
    // Only health: the service itself still wants a token.
    EXPECT_EQ(anonymous->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);
  }
  auto server = StartWithTokens({"--auth_exempt_health=false"});
  ASSERT_NE(server, nullptr);
  auto anonymous = NewClient(TlsOptions(*server));
  ASSERT_NE(anonymous, nullptr);
  EXPECT_EQ(anonymous->Health().status().code(), absl::StatusCode::kUnauthenticated);
  CommandResult cli = Cli(*server, CliTls({"health"}));
  EXPECT_NE(cli.exit_code, kExitOk) << cli.output;
  auto alice = NewClient(TlsOptions(*server, "", kAliceToken));
  ASSERT_NE(alice, nullptr);
  auto health = alice->Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(SecurityTest, TokenIdentitiesOwnResidentTensors) {
  auto server = StartWithTokens();
  ASSERT_NE(server, nullptr);
  // A session name cannot reach into another identity's tensors.
  auto alice = NewClient(TlsOptions(*server, "", kAliceToken, "shared"));
  auto alice_again = NewClient(TlsOptions(*server, "", kAliceToken, "other"));
  auto bob = NewClient(TlsOptions(*server, "", kBobToken, "shared"));
  auto bare = NewClient(TlsOptions(*server, "", kBareToken, "shared"));
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);
  ASSERT_NE(bare, nullptr);
  const std::vector<float> data(16, 3.0f);
  auto a = alice->Upload(v1::FLOAT32, {4, 4}, data.data());
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = bob->Upload(v1::FLOAT32, {4, 4}, data.data());
  ASSERT_TRUE(b.ok()) << b.status();

  auto listed = alice_again->ListTensors();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->tensors_size(), 1);
  EXPECT_EQ(listed->tensors(0).handle(), a->handle());
  listed = bob->ListTensors();
  ASSERT_EQ(listed->tensors_size(), 1);
  EXPECT_EQ(listed->tensors(0).handle(), b->handle());
  EXPECT_EQ(bare->ListTensors()->tensors_size(), 0);

  std::vector<float> out(16);
  EXPECT_EQ(bob->Download(a->handle(), out.data(), 64).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(alice->Download(b->handle(), out.data(), 64).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bare->Download(a->handle(), out.data(), 64).code(), absl::StatusCode::kNotFound);
  // An operation naming another identity's tensor.
  v1::TransposeRequest transpose = MakeTranspose(v1::FLOAT32, {4, 4});
  *transpose.mutable_input() = HandleTensor(a->handle());
  EXPECT_EQ(bob->Transpose(transpose).status().code(), absl::StatusCode::kNotFound);
  auto transposed = alice_again->Transpose(transpose);
  EXPECT_TRUE(transposed.ok()) << transposed.status();
  EXPECT_EQ(bob->Free({a->handle()}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(alice_again->Free({a->handle()}).ok());
  EXPECT_TRUE(bob->Free({b->handle()}).ok());
}

TEST_F(SecurityTest, SighupReadsTheTokenFileAgain) {
  auto server = StartWithTokens();
  ASSERT_NE(server, nullptr);
  auto alice = NewClient(TlsOptions(*server, "", kAliceToken));
  auto newcomer = NewClient(TlsOptions(*server, "", kNewToken));
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(newcomer, nullptr);
  ASSERT_TRUE(alice->GetServerInfo().ok());
  EXPECT_EQ(newcomer->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);

  // Alice's token goes, a new one comes.
  WriteFile(TokenFile(), absl::StrCat(kBobToken, " bob\n", kNewToken, " carol\n"));
  server->Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "SIGHUP, token file read: 2 tokens")) << server->Log();
  auto info = newcomer->GetServerInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(GemmWorks(*newcomer));
  absl::Status revoked = alice->GetServerInfo().status();
  EXPECT_EQ(revoked.code(), absl::StatusCode::kUnauthenticated) << revoked;
  CommandResult cli = Cli(*server, CliTls({std::string("--token=") + kNewToken, "info"}));
  EXPECT_EQ(cli.exit_code, kExitOk) << cli.output;
  cli = Cli(*server, CliTls({std::string("--token=") + kAliceToken, "info"}));
  EXPECT_EQ(cli.exit_code, kExitCallFailed) << cli.output;

  // A broken file leaves the tokens in force.
  WriteFile(TokenFile(), "short\n");
  server->Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "the tokens stay as they were")) << server->Log();
  EXPECT_TRUE(absl::StrContains(server->Log(), "line 1")) << server->Log();
  EXPECT_TRUE(newcomer->GetServerInfo().ok());
  EXPECT_EQ(alice->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);
  absl::StatusOr<std::string> scrape = HttpGet(server->metrics_port(), "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_GE(MetricSum(*scrape, "gpucompute_token_reloads_total", {"result=\"ok\""}), 1);
  EXPECT_EQ(MetricSum(*scrape, "gpucompute_token_reloads_total", {"result=\"error\""}), 1);
  EXPECT_EQ(MetricSum(*scrape, "gpucompute_bearer_tokens"), 2);
  // The server survived the signals.
  EXPECT_EQ(server->Wait(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(SecurityTest, AChangedTokenFileIsReadWithoutASignal) {
  auto server = StartWithTokens();
  ASSERT_NE(server, nullptr);
  auto alice = NewClient(TlsOptions(*server, "", kAliceToken));
  auto newcomer = NewClient(TlsOptions(*server, "", kNewToken));
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(newcomer, nullptr);
  ASSERT_TRUE(alice->GetServerInfo().ok());
  WriteFile(TokenFile(), absl::StrCat(kNewToken, " carol\n"));
  // The file is looked at on a call, at most once a second.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::Status status = newcomer->GetServerInfo().status();
  while (!status.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    status = newcomer->GetServerInfo().status();
  }
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(alice->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(server->Log(), "changed: 1 tokens")) << server->Log();
}

// The certificate and key files replaced while the server runs (a renewal,
// a Secret's rotation): new connections get the new pair within
// --tls_reload_interval, and no restart is needed. While only the key is
// new the old pair is still served.
TEST_F(SecurityTest, ReplacedCertificatesServeNewConnections) {
  auto server = StartOnLiveFiles("1s");
  ASSERT_NE(server, nullptr);
  const ClientOptions base = TlsOptions(*server);
  EXPECT_TRUE(ServedTo(base, "ca.pem", absl::ZeroDuration()));
  EXPECT_FALSE(ServedTo(base, "rogue-ca.pem", absl::ZeroDuration()));

  // The key alone first: it is not the certificate's, so readings in
  // between keep serving the old pair.
  CopyPem(Pem("rogue-server.key"), dir_.File("live.key"));
  ASSERT_TRUE(WaitForLog(*server, "not the private key of --tls_cert")) << server->Log();
  absl::SleepFor(absl::Milliseconds(1500));  // gRPC reads its copy every second
  EXPECT_TRUE(ServedTo(base, "ca.pem", absl::ZeroDuration())) << server->Log();
  CopyPem(Pem("rogue-server.pem"), dir_.File("live.pem"));
  ASSERT_TRUE(ServedTo(base, "rogue-ca.pem", absl::Seconds(15)))
      << "the new certificate was not served within 15 s\n"
      << server->Log();
  EXPECT_FALSE(ServedTo(base, "ca.pem", absl::ZeroDuration()));
  ClientOptions rotated = base;
  rotated.root_certs_path = Pem("rogue-ca.pem");
  EXPECT_TRUE(GemmWorks(*NewClient(rotated)));
}

// With a long interval, SIGHUP reads the files at once; a broken key is
// logged and changes nothing.
TEST_F(SecurityTest, SighupReadsTheTlsFilesAgain) {
  auto server = StartOnLiveFiles("1h");
  ASSERT_NE(server, nullptr);
  const ClientOptions base = TlsOptions(*server);
  CopyPem(Pem("rogue-server.key"), dir_.File("live.key"));
  CopyPem(Pem("rogue-server.pem"), dir_.File("live.pem"));
  server->Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "TLS files read: changed")) << server->Log();
  EXPECT_TRUE(ServedTo(base, "rogue-ca.pem", absl::Seconds(10))) << server->Log();
  WriteFile(dir_.File("live.key"), "not a key\n");
  server->Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "the previous TLS files stay in use")) << server->Log();
  EXPECT_TRUE(ServedTo(base, "rogue-ca.pem", absl::ZeroDuration())) << server->Log();
}

TEST_F(SecurityTest, InconsistentSecurityFlagsStopTheServer) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  WriteFile(dir_.File("bad-tokens"), absl::StrCat(kAliceToken, " alice\nshort bob\n"));
  const std::vector<Case> cases = {
      {{"--token_file=" + TokenFile()}, "--token_file"},
      {{"--tls_client_ca=" + Pem("ca.pem")}, "--tls_client_ca"},
      {{"--tls_cert=" + Pem("server.pem")}, "--tls_key"},
      {{"--tls_cert=" + Pem("server.pem"), "--tls_key=" + Pem("missing.key")}, "--tls_key"},
      {{"--tls_cert=" + Pem("server.pem"), "--tls_key=" + Pem("alice.key")},
       "--tls_key: not the private key of --tls_cert"},
      {{"--tls_cert=" + Pem("server.pem"), "--tls_key=" + Pem("server.key"),
        "--tls_reload_interval=500ms"},
       "--tls_reload_interval"},
      {{"--tls_cert=" + Pem("server.pem"), "--tls_key=" + Pem("server.key"),
        "--token_file=" + dir_.File("bad-tokens")},
       "line 2"},
      {{"--tls_cert=" + Pem("server.pem"), "--tls_key=" + Pem("server.key"),
        "--token_file=" + dir_.File("missing")},
       "--token_file"},
  };
  for (const Case& c : cases) {
    auto server = ServerProcess::Start(c.args, absl::Seconds(20));
    ASSERT_FALSE(server.ok()) << c.message;
    EXPECT_TRUE(absl::StrContains(server.status().message(), c.message)) << server.status();
  }
}

}  // namespace
}  // namespace gpucompute::testing
