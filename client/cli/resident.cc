// Resident tensors from the command line: upload, download, free and list,
// and what --resident needs (operands uploaded and named by handle, kept
// results downloaded, every handle freed at the end).
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"

ABSL_FLAG(bool, resident, false,
          "Operations and bench: upload the operands first, run on their handles with "
          "keep_output, download the result (for --check, --out) and free every handle made.");
ABSL_FLAG(std::string, in, "", "upload: the tensor from this .npy file (converted to --dtype).");
ABSL_FLAG(std::vector<std::string>, handle, {},
          "download: the resident tensor; free: one or more, e.g. h1,h2.");

ABSL_DECLARE_FLAG(std::string, shape);
ABSL_DECLARE_FLAG(std::string, out);

namespace gpucompute::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The inline operands of a request.
std::vector<v1::Tensor*> InlineOperands(v1::BatchRequest& r) {
  std::vector<v1::Tensor*> all;
  switch (r.op_case()) {
    case v1::BatchRequest::kGemm:
      all = {r.mutable_gemm()->mutable_a(), r.mutable_gemm()->mutable_b()};
      if (r.gemm().has_c()) all.push_back(r.mutable_gemm()->mutable_c());
      break;
    case v1::BatchRequest::kGemv:
      all = {r.mutable_gemv()->mutable_a(), r.mutable_gemv()->mutable_x()};
      if (r.gemv().has_y()) all.push_back(r.mutable_gemv()->mutable_y());
      break;
    case v1::BatchRequest::kReduce:
      all = {r.mutable_reduce()->mutable_input()};
      break;
    case v1::BatchRequest::kTranspose:
      all = {r.mutable_transpose()->mutable_input()};
      break;
    case v1::BatchRequest::kAttention:
      all = {r.mutable_attention()->mutable_q(), r.mutable_attention()->mutable_k(),
             r.mutable_attention()->mutable_v()};
      break;
    default:
      break;
  }
  std::vector<v1::Tensor*> operands;
  for (v1::Tensor* t : all) {
    if (t->handle().empty()) operands.push_back(t);
  }
  return operands;
}

// The result tensors of a response (O and, when returned, the LSE).
std::vector<const v1::Tensor*> Results(const v1::BatchResponse& r) {
  switch (r.result_case()) {
    case v1::BatchResponse::kGemm:
      return {&r.gemm().c()};
    case v1::BatchResponse::kGemv:
      return {&r.gemv().y()};
    case v1::BatchResponse::kReduce:
      return {&r.reduce().output()};
    case v1::BatchResponse::kTranspose:
      return {&r.transpose().output()};
    case v1::BatchResponse::kAttention:
      if (r.attention().has_lse()) return {&r.attention().o(), &r.attention().lse()};
      return {&r.attention().o()};
    default:
      return {};
  }
}

std::vector<v1::Tensor*> MutableResults(v1::BatchResponse& r) {
  switch (r.result_case()) {
    case v1::BatchResponse::kGemm:
      return {r.mutable_gemm()->mutable_c()};
    case v1::BatchResponse::kGemv:
      return {r.mutable_gemv()->mutable_y()};
    case v1::BatchResponse::kReduce:
      return {r.mutable_reduce()->mutable_output()};
    case v1::BatchResponse::kTranspose:
      return {r.mutable_transpose()->mutable_output()};
    case v1::BatchResponse::kAttention:
      if (r.attention().has_lse()) {
        return {r.mutable_attention()->mutable_o(), r.mutable_attention()->mutable_lse()};
      }
      return {r.mutable_attention()->mutable_o()};
    default:
      return {};
  }
}

absl::StatusOr<std::unique_ptr<Client>> ClientOrPrint() {
  auto client = MakeClient();
  if (!client.ok()) PrintError("client", client.status());
  return client;
}

}  // namespace

bool ResidentMode() { return absl::GetFlag(FLAGS_resident); }

HandleScope::~HandleScope() {
  if (absl::Status status = FreeAll(); !status.ok()) PrintError("free", status);
}

void HandleScope::Add(const std::vector<std::string>& handles) {
  handles_.insert(handles_.end(), handles.begin(), handles.end());
}

absl::Status HandleScope::Free(const std::vector<std::string>& handles) {
  if (handles.empty()) return absl::OkStatus();
  auto freed = client_.Free(handles, MakeCallOptions());
  if (!freed.ok()) return freed.status();
  for (const std::string& h : handles) {
    auto it = std::find(handles_.begin(), handles_.end(), h);
    if (it != handles_.end()) handles_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status HandleScope::FreeAll() { return Free(std::vector<std::string>(handles_)); }

std::string FormatCost(const TransferCost& cost) {
  return absl::StrFormat("%.3f ms (%d bytes, %.3f GB/s)", cost.seconds * 1e3, cost.bytes,
                         cost.seconds > 0 ? double(cost.bytes) / cost.seconds / 1e9 : 0.0);
}

absl::StatusOr<TransferCost> MakeResident(const Client& client, v1::BatchRequest& request,
                                          HandleScope& scope) {
  TransferCost cost;
  auto start = Clock::now();
  for (v1::Tensor* operand : InlineOperands(request)) {
    auto info = client.Upload(*operand, {}, MakeCallOptions());
    if (!info.ok()) return info.status();
    scope.Add(info->handle());
    cost.bytes += info->bytes();
    // The dtype and shape stay: the server checks them against the handle's.
    operand->clear_data();
    operand->set_handle(info->handle());
  }
  cost.seconds = SecondsSince(start);
  if (v1::OpOptions* options = MutableOptions(request)) options->set_keep_output(true);
  return cost;
}

std::vector<std::string> KeptHandles(const v1::BatchResponse& response) {
  std::vector<std::string> handles;
  for (const v1::Tensor* t : Results(response)) {
    if (!t->handle().empty()) handles.push_back(t->handle());
  }
  return handles;
}

absl::StatusOr<TransferCost> DownloadKept(const Client& client, v1::BatchResponse& response) {
  TransferCost cost;
  auto start = Clock::now();
  for (v1::Tensor* result : MutableResults(response)) {
    if (result->handle().empty()) continue;
    auto tensor = client.DownloadTensor(result->handle(), {}, MakeCallOptions());
    if (!tensor.ok()) return tensor.status();
    cost.bytes += PayloadBytes(*tensor);
    *result = *std::move(tensor);
  }
  cost.seconds = SecondsSince(start);
  return cost;
}

std::string FormatTensorInfo(const v1::TensorInfo& info) {
  std::string line =
      absl::StrCat(info.handle(), "  ", DTypeName(info.dtype()),
                   ShapeString(std::vector<int64_t>(info.shape().begin(), info.shape().end())),
                   "  ", info.bytes(), " bytes  device ", info.device());
  if (!info.replicas().empty()) {
    absl::StrAppend(&line, "  replicas [", absl::StrJoin(info.replicas(), ","), "]");
  }
  absl::StrAppend(&line, absl::StrFormat("  idle %.1f s", info.idle_seconds()));
  if (info.expires_in_seconds() > 0) {
    absl::StrAppend(&line, absl::StrFormat("  expires in %.1f s", info.expires_in_seconds()));
  }
  return line;
}

int RunUpload() {
  const std::string in = absl::GetFlag(FLAGS_in);
  const std::string shape_text = absl::GetFlag(FLAGS_shape);
  if (in.empty() == shape_text.empty()) {
    PrintError("upload", absl::InvalidArgumentError(
                             "give either --in=x.npy or --shape=... (random data of --dtype)"));
    return kExitUsage;
  }
  auto dtype = InputDType();
  if (!dtype.ok()) {
    PrintError("upload", dtype.status());
    return kExitUsage;
  }
  auto shape = ParseShape(shape_text, "shape");
  if (!shape.ok()) {
    PrintError("upload", shape.status());
    return kExitUsage;
  }
  uint64_t seed = 0;
  std::mt19937_64 rng = MakeRng(seed);
  auto tensor = LoadOrRandom(in, *dtype, *shape, rng);
  if (!tensor.ok()) {
    PrintError("upload", tensor.status());
    return kExitUsage;
  }
  auto client = ClientOrPrint();
  if (!client.ok()) return kExitUsage;
  auto start = Clock::now();
  auto info = (*client)->Upload(*tensor, {}, MakeCallOptions());
  const double seconds = SecondsSince(start);
  if (!info.ok()) {
    PrintError("upload", info.status());
    return kExitCallFailed;
  }
  std::cout << FormatTensorInfo(*info) << "\n";
  std::cout << "upload " << FormatCost({info->bytes(), seconds}) << "  "
            << SplitTransfer(info->bytes(), (*client)->options().streams,
                             (*client)->options().parallel_min_bytes)
                   .size()
            << " stream(s)\n";
  return kExitOk;
}

int RunDownload() {
  const std::vector<std::string> handles = absl::GetFlag(FLAGS_handle);
  if (handles.size() != 1) {
    PrintError("download", absl::InvalidArgumentError("give one --handle"));
    return kExitUsage;
  }
  auto client = ClientOrPrint();
  if (!client.ok()) return kExitUsage;
  auto start = Clock::now();
  auto tensor = (*client)->DownloadTensor(handles[0], {}, MakeCallOptions());
  const double seconds = SecondsSince(start);
  if (!tensor.ok()) {
    PrintError("download", tensor.status());
    return kExitCallFailed;
  }
  std::cout << handles[0] << "  " << DTypeName(tensor->dtype()) << ShapeString(ShapeOf(*tensor))
            << "  " << PayloadBytes(*tensor) << " bytes\n";
  std::cout << "download " << FormatCost({PayloadBytes(*tensor), seconds}) << "\n";
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = SaveNpyTensor(out, *tensor); !s.ok()) {
      PrintError("--out", s);
      return kExitUsage;
    }
    std::cout << "wrote " << out << "\n";
  }
  return kExitOk;
}

int RunFree() {
  const std::vector<std::string> handles = absl::GetFlag(FLAGS_handle);
  if (handles.empty()) {
    PrintError("free", absl::InvalidArgumentError("give --handle=h1[,h2...]"));
    return kExitUsage;
  }
  auto client = ClientOrPrint();
  if (!client.ok()) return kExitUsage;
  auto freed = (*client)->Free(handles, MakeCallOptions());
  if (!freed.ok()) {
    PrintError("free", freed.status());
    return kExitCallFailed;
  }
  std::cout << "freed " << handles.size() << " tensor(s), " << freed->freed_bytes() << " bytes\n";
  return kExitOk;
}

int RunList() {
  auto client = ClientOrPrint();
  if (!client.ok()) return kExitUsage;
  auto list = (*client)->ListTensors(MakeCallOptions());
  if (!list.ok()) {
    PrintError("list", list.status());
    return kExitCallFailed;
  }
  for (const v1::TensorInfo& info : list->tensors()) std::cout << FormatTensorInfo(info) << "\n";
  std::cout << list->tensors_size() << " tensor(s), " << list->used_bytes() << " bytes; quota "
            << (list->quota_bytes() > 0 ? absl::StrCat(list->quota_bytes(), " bytes")
                                        : std::string("none"))
            << "\n";
  return kExitOk;
}

}  // namespace gpucompute::cli
