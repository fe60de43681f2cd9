// Pieces shared by the subcommands of the `gpucompute` CLI.
//
// Exit codes: 0 success, 1 a call failed, 2 bad usage or unreadable input,
// 3 --check found a mismatch.
#ifndef GPUCOMPUTE_CLIENT_CLI_CLI_H_
#define GPUCOMPUTE_CLIENT_CLI_CLI_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/verify.h"

namespace gpucompute::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCallFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitMismatch = 3;

// A client built from the global flags (--server, --timeout, --tls...,
// --token, --token_file, --session, --streams).
absl::StatusOr<std::unique_ptr<Client>> MakeClient();

// Per-call options from --timeout.
CallOptions MakeCallOptions();

// The generator for random inputs: --seed, or a fresh seed when it is 0.
// Returns the seed used in `seed`.
std::mt19937_64 MakeRng(uint64_t& seed);

// Parses "2,3,4" (empty -> scalar). INVALID_ARGUMENT naming `flag`.
absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text, const std::string& flag);

// The dtype of the inputs (--dtype).
absl::StatusOr<v1::DType> InputDType();

// The OpOptions from --variant, --devices, --out_dtype, --allow_tf32.
absl::StatusOr<v1::OpOptions> MakeOpOptions();

// An input tensor: read from the .npy at `path` (converted to `dtype`; '<u2'
// is taken as bfloat16 bits, '<f8' is accepted too) when `path` is not empty,
// otherwise random of `shape`.
absl::StatusOr<v1::Tensor> LoadOrRandom(const std::string& path, v1::DType dtype,
                                        const std::vector<int64_t>& shape, std::mt19937_64& rng);

// Reads a .npy file into a tensor of `dtype` (as LoadOrRandom).
absl::StatusOr<v1::Tensor> LoadNpyTensor(const std::string& path, v1::DType dtype);

// Writes `tensor` to `path` as .npy ('<f4', '<f2', or '<u2' for bfloat16).
absl::Status SaveNpyTensor(const std::string& path, const v1::Tensor& tensor);

// One operation request of any kind, as the Batch stream carries it, built
// from the flags of `op` ("gemm", "gemv", "reduce", "transpose",
// "attention"). Used by the operation subcommands and by bench.
absl::StatusOr<v1::BatchRequest> BuildRequest(const std::string& op, std::mt19937_64& rng);

// The Echo input from --shape (default 1048576) or --input, in --dtype.
absl::StatusOr<v1::Tensor> BuildEchoInput(std::mt19937_64& rng);

// Options of the request's case; null when no operation is set.
v1::OpOptions* MutableOptions(v1::BatchRequest& request);

// Bytes and FLOPs of a request (client/verify.h WorkOf).
Work WorkOfRequest(const v1::BatchRequest& request);

// Payload bytes of the tensors in a request or a response.
int64_t RequestPayloadBytes(const v1::BatchRequest& request);
int64_t ResponsePayloadBytes(const v1::BatchResponse& response);

// Runs one request as its unary RPC and returns the answer in a
// BatchResponse (code 0 and the result, or the error's code and message).
v1::BatchResponse CallUnary(const Client& client, const v1::BatchRequest& request,
                            const CallOptions& call);

// Prints `status` to stderr as "gpucompute: <what>: CODE: message".
void PrintError(const std::string& what, const absl::Status& status);

// Resident tensors (resident.cc).

// --resident: the operation subcommands and bench upload the operands first
// and run the operation on their handles, keeping the results on the server.
bool ResidentMode();

// The resident tensors a command made, freed when it is done with them.
class HandleScope {
 public:
  // REQUIRES: `client` outlives the scope.
  explicit HandleScope(const Client& client) : client_(client) {}
  // Frees whatever is still held, printing an error if that fails.
  ~HandleScope();
  HandleScope(const HandleScope&) = delete;
  HandleScope& operator=(const HandleScope&) = delete;

  void Add(const std::string& handle) { handles_.push_back(handle); }
  void Add(const std::vector<std::string>& handles);
  // Frees `handles` (which must have been added) and forgets them; the
  // error of Free otherwise.
  absl::Status Free(const std::vector<std::string>& handles);
  // Frees every handle held.
  absl::Status FreeAll();

 private:
  const Client& client_;
  std::vector<std::string> handles_;
};

// Bytes moved and the wall time it took.
struct TransferCost {
  int64_t bytes = 0;
  double seconds = 0;
};

// "12.345 ms (1048576 bytes, 3.210 GB/s)".
std::string FormatCost(const TransferCost& cost);

// Uploads every inline operand of `request`, names it by its handle instead
// (the handles go into `scope`) and sets options.keep_output. Returns what
// the uploads cost; on an error the handles made so far are in `scope`.
absl::StatusOr<TransferCost> MakeResident(const Client& client, v1::BatchRequest& request,
                                          HandleScope& scope);

// The handles of the results a response kept on the server.
std::vector<std::string> KeptHandles(const v1::BatchResponse& response);

// Replaces every kept result of `response` by the downloaded tensor (dtype,
// shape, data). Returns what the downloads cost.
absl::StatusOr<TransferCost> DownloadKept(const Client& client, v1::BatchResponse& response);

// One line: handle first, then dtype, shape, bytes, device, replicas, idle
// time and expiry.
std::string FormatTensorInfo(const v1::TensorInfo& info);

// The subcommands; each returns the process exit code.
int RunOp(const std::string& op);  // gemm, gemv, reduce, transpose, attention
int RunEcho();
int RunInfo();
// Prints the server's overall health; exit 0 only when SERVING (for probes).
int RunHealth();
int RunBench(const std::string& op);  // bench <op>, bench upload|download
int RunUpload();
int RunDownload();
int RunFree();
int RunList();

}  // namespace gpucompute::cli

#endif  // GPUCOMPUTE_CLIENT_CLI_CLI_H_
