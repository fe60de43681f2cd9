#include "server/service/convert.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "proto/host_memory.h"
#include "proto/wire.h"
#include "server/service/validate.h"

namespace gpucompute {
namespace {

double PerSecond(double amount, double seconds) { return seconds > 0 ? amount / seconds : 0; }

// The wire's name of a split axis (ShardTiming.axis).
const char* SplitAxisName(SplitAxis axis) {
  switch (axis) {
    case SplitAxis::kRows:
      return "rows";
    case SplitAxis::kOuter:
      return "outer";
    case SplitAxis::kAxis:
      return "axis";
    case SplitAxis::kOutBlocks:
      return "out_blocks";
    case SplitAxis::kHeads:
      return "heads";
    case SplitAxis::kQueryRows:
      return "query_rows";
  }
  return "unknown";
}

template <typename Response>
void FillOutput(OpResult& result, v1::Tensor* output, Response* response) {
  if (result.kept_output != nullptr) {
    ToProto(*result.kept_output, output);
  } else {
    MoveToProto(result.output, output);
  }
  FillTimings(result.shards, response->mutable_timings());
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  grpc::StatusCode code;
  switch (status.code()) {
    case absl::StatusCode::kCancelled:
      code = grpc::StatusCode::CANCELLED;
      break;
    case absl::StatusCode::kInvalidArgument:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
    case absl::StatusCode::kNotFound:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case absl::StatusCode::kAlreadyExists:
      code = grpc::StatusCode::ALREADY_EXISTS;
      break;
    case absl::StatusCode::kPermissionDenied:
      code = grpc::StatusCode::PERMISSION_DENIED;
      break;
    case absl::StatusCode::kResourceExhausted:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case absl::StatusCode::kAborted:
      code = grpc::StatusCode::ABORTED;
      break;
    case absl::StatusCode::kOutOfRange:
      code = grpc::StatusCode::OUT_OF_RANGE;
      break;
    case absl::StatusCode::kUnimplemented:
      code = grpc::StatusCode::UNIMPLEMENTED;
      break;
    case absl::StatusCode::kInternal:
      code = grpc::StatusCode::INTERNAL;
      break;
    case absl::StatusCode::kUnavailable:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    case absl::StatusCode::kDataLoss:
      code = grpc::StatusCode::DATA_LOSS;
      break;
    case absl::StatusCode::kUnauthenticated:
      code = grpc::StatusCode::UNAUTHENTICATED;
      break;
    default:
      code = grpc::StatusCode::UNKNOWN;
      break;
  }
  return grpc::Status(code, std::string(status.message()));
}

absl::StatusCode CodeSeenByClient(const absl::Status& status, grpc::CallbackServerContext* context,
                                  absl::Time deadline) {
  if (!context->IsCancelled()) return status.code();
  return absl::Now() >= deadline ? absl::StatusCode::kDeadlineExceeded
                                 : absl::StatusCode::kCancelled;
}

void MoveToProto(HostTensor& tensor, v1::Tensor* out) {
  out->set_dtype(ToProtoDType(tensor.dtype));
  out->mutable_shape()->Assign(tensor.shape.begin(), tensor.shape.end());
  out->mutable_data()->swap(tensor.data);
  tensor.data.clear();
  tensor.shape.clear();
}

void FillTimings(const std::vector<ShardTiming>& shards, v1::Timings* out) {
  out->mutable_shards()->Reserve(static_cast<int>(shards.size()));
  double h2d = 0, kernel = 0, d2h = 0;
  for (const ShardTiming& shard : shards) {
    v1::ShardTiming* t = out->add_shards();
    t->set_device(shard.device);
    t->set_variant(shard.run.variant);
    t->set_axis(SplitAxisName(shard.axis));
    t->set_begin(shard.range.begin);
    t->set_end(shard.range.end);
    t->set_kernel_seconds(shard.run.kernel_seconds);
    t->set_transfer_seconds(shard.run.transfer_seconds());
    t->set_bytes_per_second(PerSecond(shard.work.bytes, shard.run.kernel_seconds));
    t->set_flops_per_second(PerSecond(shard.work.flops, shard.run.kernel_seconds));
    t->set_host_to_device_seconds(shard.run.h2d_seconds);
    t->set_device_to_host_seconds(shard.run.d2h_seconds);
    t->set_peer_seconds(shard.run.peer_seconds);
    h2d = std::max(h2d, shard.run.h2d_seconds + shard.run.peer_seconds);
    kernel = std::max(kernel, shard.run.kernel_seconds);
    d2h = std::max(d2h, shard.run.d2h_seconds);
  }
  out->set_host_to_device_seconds(h2d);
  out->set_kernel_seconds(kernel);
  out->set_device_to_host_seconds(d2h);
}

void ToProto(const ResidentTensor& tensor, v1::Tensor* out) {
  out->set_dtype(ToProtoDType(tensor.dtype()));
  out->mutable_shape()->Assign(tensor.shape().begin(), tensor.shape().end());
  out->set_handle(tensor.handle());
}

void ToProto(const ResidentInfo& info, v1::TensorInfo* out) {
  out->set_handle(info.handle);
  out->set_dtype(ToProtoDType(info.dtype));
  out->mutable_shape()->Assign(info.shape.begin(), info.shape.end());
  out->set_bytes(info.bytes);
  out->set_device(info.device);
  out->mutable_replicas()->Assign(info.replicas.begin(), info.replicas.end());
  out->set_idle_seconds(info.idle_seconds);
  out->set_expires_in_seconds(info.expires_in_seconds);
}

namespace {

using FieldPath = std::vector<const google::protobuf::FieldDescriptor*>;

// Calls fn(tensor, path) for every Tensor in `message`: itself, its Tensor
// fields and those of its singular message fields, at any depth; `*path`
// holds the fields that lead from the top to `message` and, in fn, to the
// tensor.
void ForEachTensor(google::protobuf::Message* message, FieldPath* path,
                   const std::function<void(v1::Tensor*, const FieldPath&)>& fn) {
  if (message->GetDescriptor() == v1::Tensor::descriptor()) {
    fn(static_cast<v1::Tensor*>(message), *path);
    return;
  }
  const google::protobuf::Reflection* reflection = message->GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(*message, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE &&
        !field->is_repeated()) {
      path->push_back(field);
      ForEachTensor(reflection->MutableMessage(message, field), path, fn);
      path->pop_back();
    }
  }
}

}  // namespace

void RecycleTensorBytes(google::protobuf::Message* message) {
  FieldPath path;
  ForEachTensor(message, &path, [](v1::Tensor* tensor, const FieldPath&) {
    LargeStringCache::Default().Give(std::move(*tensor->mutable_data()));
    tensor->clear_data();
  });
}

absl::StatusOr<grpc::ByteBuffer> EncodeAnswer(google::protobuf::Message* message) {
  const size_t bytes = message->ByteSizeLong();
  if (bytes > size_t{INT_MAX}) {
    return absl::InternalError(absl::StrCat("encoding the answer: it is ", bytes,
                                            " bytes, more than a gRPC message carries (2 GiB)"));
  }
  if (static_cast<int64_t>(bytes) < wire::kDefaultMinExternalBytes) {
    return wire::Serialize(*message);
  }
  std::vector<wire::Attachment> attachments;
  const google::protobuf::FieldDescriptor* data =
      v1::Tensor::descriptor()->FindFieldByNumber(v1::Tensor::kDataFieldNumber);
  FieldPath path;
  ForEachTensor(message, &path, [&](v1::Tensor* tensor, const FieldPath& to_tensor) {
    if (static_cast<int64_t>(tensor->data().size()) < wire::kDefaultMinExternalBytes) return;
    std::shared_ptr<std::string> bytes(new std::string(std::move(*tensor->mutable_data())),
                                       [](std::string* s) {
                                         LargeStringCache::Default().Give(std::move(*s));
                                         delete s;
                                       });
    tensor->clear_data();
    wire::Attachment attachment;
    attachment.path = to_tensor;
    attachment.path.push_back(data);
    attachment.data = bytes->data();
    attachment.size = static_cast<int64_t>(bytes->size());
    attachment.keep_alive = std::move(bytes);
    attachments.push_back(std::move(attachment));
  });
  return wire::Serialize(*message, std::move(attachments));
}

void FillResponse(OpResult& result, v1::GemmResponse* response) {
  FillOutput(result, response->mutable_c(), response);
}

void FillResponse(OpResult& result, v1::GemvResponse* response) {
  FillOutput(result, response->mutable_y(), response);
}

void FillResponse(OpResult& result, v1::ReduceResponse* response) {
  FillOutput(result, response->mutable_output(), response);
}

void FillResponse(OpResult& result, v1::TransposeResponse* response) {
  FillOutput(result, response->mutable_output(), response);
}

void FillResponse(OpResult& result, v1::AttentionResponse* response) {
  FillOutput(result, response->mutable_o(), response);
  if (result.kept_lse != nullptr) {
    ToProto(*result.kept_lse, response->mutable_lse());
  } else if (result.lse) {
    MoveToProto(*result.lse, response->mutable_lse());
  }
}

void FillDeviceInfo(const DeviceDescription& description, bool healthy, v1::DeviceInfo* out) {
  out->set_index(description.index);
  out->set_kind(description.kind);
  out->set_name(description.name);
  out->set_memory_bytes(description.memory_bytes);
  out->set_compute_units(description.compute_units);
  out->set_weight(description.weight);
  out->mutable_peers()->Assign(description.peers.begin(), description.peers.end());
  out->set_healthy(healthy);
}

}  // namespace gpucompute
