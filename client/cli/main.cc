// gpucompute: the command-line client of the gpucompute service.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "client/cli/cli.h"
#include "proto/host_memory.h"

ABSL_FLAG(int64_t, retain_host_memory_bytes, INT32_MAX,
          "Freed memory the allocator keeps for reuse, so that large tensors do not "
          "page-fault their buffers in again; 0 = the C library's defaults.");
ABSL_FLAG(int, host_memory_arenas, 1,
          "with --retain_host_memory_bytes: heaps the allocator spreads threads over; 1 keeps "
          "every freed block for reuse by any thread (best for large messages), more lets many "
          "threads allocate at once (small requests at high rates)");

namespace {

constexpr char kUsage[] = R"(gpucompute: call a gpucompute server.

usage: gpucompute <command> [flags]

commands:
  gemm        C = alpha * op(A) op(B) + beta * C   --m --n --k --batch --transpose_a/b --alpha --beta
  gemv        y = alpha * op(A) x + beta * y        --m --k --n (columns of x, 0: vector)
  reduce      sum|max|min|mean                      --shape --op --axis --keepdims
  transpose   axis permutation                      --shape --perm
  attention   softmax(scale Q K^T) V                --batch --heads_q --heads_kv --seq_q --seq_kv
                                                    --head_dim --causal --scale --lse
  echo        send a tensor and get it back         --shape
  info        server version, backend, devices, kernel variants, health
  health      SERVING (exit 0) or not (exit 1): for container health checks  --service
  bench <op>  N requests of <op> (or echo) at concurrency C, then Echo of the same payload
                                                    --requests --concurrency --mode=unary|batch
  bench upload|download  N transfers of --bytes, one at a time: GB/s and latency
                                                    --bytes --requests --streams

resident tensors (kept on the server, owned by --session):
  upload      a tensor from --in=x.npy, or random of --shape and --dtype; prints its handle first
  download    --handle=H [--out=y.npy]
  free        --handle=H[,H2...]
  list        this session's tensors, bytes held and quota
  --resident on an operation or bench: upload the operands, run on their handles keeping the
  result (downloaded for --check and --out), free every handle made; prints each cost.

common flags:
  --server=localhost:50051 (replicas: --server=10.0.0.1:50051,10.0.0.2:50051 or dns:///name:port)
  --lb_policy=round_robin|pick_first --max_attempts=4 (idempotent calls retried when a replica is down)
  --timeout=60s --connect_timeout=1s --tls --tls_ca --tls_cert --tls_key (mutual TLS) --tls_server_name
  --token_file (or --token): bearer token for a server started with --token_file
  --session (owner of resident tensors) --streams=4 (parallel streams of transfers >= 64 MiB)
  --offload_min_bytes=67108864 (operands this large go as resident tensors, parallel streams)
  --dtype=float32|float16|bfloat16 --out_dtype --variant --devices=0,1 --allow_tf32 --seed
  --check (compare with the float64 reference; exit 3 on a mismatch) --repeat=N
  --out=result.npy (--lse_out=lse.npy), inputs from .npy: --a --b --c --x --y --input
  --query --key --value; bfloat16 .npy files hold the raw bits as '<u2'.

exit codes: 0 ok, 1 the call failed, 2 bad usage or input, 3 check mismatch.
Every flag: gpucompute --helpfull)";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  // Debian's abseil is built with mutex deadlock detection on, which records
  // every lock in one process-wide graph under a global lock: a fifth of the
  // server's CPU time for a stream of small items, and a point where every
  // thread queues. Off, as in release builds of abseil.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Large tensors reuse freed memory instead of page-faulting new buffers in
  // (server/common/host_memory.h). An allocator that refuses the setting (a
  // sanitizer's) is used as it is: the output stays the command's own.
  if (absl::Status status = gpucompute::KeepFreedHostMemory(
          absl::GetFlag(FLAGS_retain_host_memory_bytes), absl::GetFlag(FLAGS_host_memory_arenas));
      absl::IsInvalidArgument(status)) {
    std::cerr << "gpucompute: --retain_host_memory_bytes: " << status.message() << "\n";
    return gpucompute::cli::kExitUsage;
  }
  if (args.size() < 2 || std::string(args[1]) == "help") {
    std::cout << kUsage << "\n";
    return args.size() < 2 ? gpucompute::cli::kExitUsage : gpucompute::cli::kExitOk;
  }
  const std::string command = args[1];
  const size_t expected_args = command == "bench" ? 3 : 2;
  if (args.size() != expected_args) {
    std::cerr << "gpucompute: "
              << (command == "bench" ? "bench takes one operation: bench <op>"
                                     : "unexpected argument " + std::string(args[2]))
              << "\n";
    return gpucompute::cli::kExitUsage;
  }
  if (command == "gemm" || command == "gemv" || command == "reduce" || command == "transpose" ||
      command == "attention") {
    return gpucompute::cli::RunOp(command);
  }
  if (command == "echo") return gpucompute::cli::RunEcho();
  if (command == "info") return gpucompute::cli::RunInfo();
  if (command == "health") return gpucompute::cli::RunHealth();
  if (command == "bench") return gpucompute::cli::RunBench(args[2]);
  if (command == "upload") return gpucompute::cli::RunUpload();
  if (command == "download") return gpucompute::cli::RunDownload();
  if (command == "free") return gpucompute::cli::RunFree();
  if (command == "list") return gpucompute::cli::RunList();
  std::cerr << "gpucompute: unknown command \"" << command << "\" (gpucompute help)\n";
  return gpucompute::cli::kExitUsage;
}
