// Results -> response messages, and the one mapping of internal errors to
// gRPC status codes.
#ifndef GPUCOMPUTE_SERVER_SERVICE_CONVERT_H_
#define GPUCOMPUTE_SERVER_SERVICE_CONVERT_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpucompute/v1/compute.pb.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "proto/host_memory.h"
#include "server/engine/engine.h"

namespace gpucompute {

// THE mapping from absl::Status to grpc::Status: the code carries over (both
// follow google.rpc.Code; an out-of-range code becomes UNKNOWN) and the
// message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The code a call ends with for its client: `status`'s, unless the client
// cancelled the call or its deadline (`deadline`) passed, which end it
// CANCELLED or DEADLINE_EXCEEDED whatever the server computed.
absl::StatusCode CodeSeenByClient(const absl::Status& status, grpc::CallbackServerContext* context,
                                  absl::Time deadline);

// Moves `tensor` into `out`: its bytes are swapped into out->data without a
// copy; `tensor` is left empty.
void MoveToProto(HostTensor& tensor, v1::Tensor* out);

// A request this large may hold tensor bytes worth keeping
// (RecycleTensorBytes); smaller ones are not looked through.
inline constexpr int64_t kRecycleMessageBytes = int64_t{LargeStringCache::kMinBytes};

// Gives the bytes of every Tensor in `message` (its own Tensor fields and
// those of its singular message fields, as a Batch item's operation) to
// LargeStringCache::Default(), which keeps the large ones for the next
// request or result, and leaves them empty. For a request that is done with.
void RecycleTensorBytes(google::protobuf::Message* message);

// The encoding of an answer, its tensors' bytes sent from where they are:
// every Tensor in `message` (as RecycleTensorBytes finds them) with at least
// wire::kDefaultMinExternalBytes is moved out of it into an attachment, and
// its buffer goes to LargeStringCache::Default() once gRPC is done with it.
// Errors: INTERNAL for an answer over 2 GiB, which no gRPC message carries.
absl::StatusOr<grpc::ByteBuffer> EncodeAnswer(google::protobuf::Message* message);

// Fills `out` from a finished operation's shards: one ShardTiming per shard
// with bytes/s and FLOP/s over its kernel time, and the device stages (each
// the longest shard's). The other stages are the caller's to set.
void FillTimings(const std::vector<ShardTiming>& shards, v1::Timings* out);

// A resident tensor as a response's tensor: handle, dtype and shape, no data.
void ToProto(const ResidentTensor& tensor, v1::Tensor* out);

// Moves `result` into the response of its operation (the output and, for
// attention, the LSE; kept ones as handles), filling the shard timings.
// `result` is left empty.
void FillResponse(OpResult& result, v1::GemmResponse* response);
void FillResponse(OpResult& result, v1::GemvResponse* response);
void FillResponse(OpResult& result, v1::ReduceResponse* response);
void FillResponse(OpResult& result, v1::TransposeResponse* response);
void FillResponse(OpResult& result, v1::AttentionResponse* response);

// A resident tensor as clients see it.
void ToProto(const ResidentInfo& info, v1::TensorInfo* out);

// A device as GetServerInfo reports it.
void FillDeviceInfo(const DeviceDescription& description, bool healthy, v1::DeviceInfo* out);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_CONVERT_H_
