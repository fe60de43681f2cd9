// The wire codec for messages that carry large `bytes` fields, shared by the
// server and the client: protobuf's own codec copies every bytes field once
// on receive (gRPC's slices -> std::string) and once on send (std::string ->
// gRPC's slices). Here a large field stays in the slices it arrived in
// (SliceBytes) and is copied once, straight to where it is used; and a large
// field is sent as a slice over the caller's memory, not copied at all.
//
// Everything else is protobuf's: the small fields are parsed and serialized
// by the generated code, so the messages are the same on the wire and any
// protobuf client or server reads them.
#ifndef GPUCOMPUTE_PROTO_WIRE_H_
#define GPUCOMPUTE_PROTO_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace gpucompute::wire {

// Bytes fields at least this long are left in their slices by Parse.
inline constexpr int64_t kDefaultMinExternalBytes = int64_t{64} << 10;

// Bytes that stay in gRPC's slices (each piece a reference, no copy).
class SliceBytes {
 public:
  SliceBytes() = default;

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Appends a piece (a reference to `slice`).
  void Append(grpc::Slice slice);

  // Calls fn(data, length) for each contiguous piece, in order.
  void ForEach(const std::function<void(const char*, size_t)>& fn) const;
  // Copies the bytes [offset, offset + n) to dst.
  // REQUIRES: 0 <= offset, offset + n <= size().
  void CopyTo(int64_t offset, int64_t n, void* dst) const;
  // The bytes as one string (a copy; a large one in a buffer from
  // LargeStringCache::Default()).
  std::string ToString() const;

 private:
  std::vector<grpc::Slice> pieces_;
  int64_t size_ = 0;
};

// A bytes field Parse left in the slices: `field` of `*owner`, which holds
// an empty value for it.
struct ExternalField {
  google::protobuf::Message* owner = nullptr;
  const google::protobuf::FieldDescriptor* field = nullptr;
  SliceBytes bytes;
};

// Parses `buffer` into `message` (cleared first), as protobuf would. Singular
// bytes fields of at least `min_external_bytes` (outside oneofs) are not
// copied: they are left empty in their message and appended to `*external`,
// in the order they came. Returns INVALID_ARGUMENT when the bytes are not a
// valid encoding of the message (naming `what`, e.g. "request"), or hold a
// group (wire types 3 and 4), which protobuf would take as unknown fields.
absl::Status Parse(const grpc::ByteBuffer& buffer, google::protobuf::Message* message,
                   std::vector<ExternalField>* external,
                   int64_t min_external_bytes = kDefaultMinExternalBytes,
                   absl::string_view what = "message");

// Copies each external field into its message (for code that wants the
// plain message); empties `*external`.
void Materialize(std::vector<ExternalField>* external);

// A bytes field sent from the caller's memory, without a copy: the field
// `path.back()` of the message reached through the singular message fields
// `path[0 .. n-2]` from the top (a path of one: a field of the top message;
// of two: a field of one of its message fields; and so on).
struct Attachment {
  std::vector<const google::protobuf::FieldDescriptor*> path;
  const void* data = nullptr;
  int64_t size = 0;
  // Keeps `data` alive until gRPC has sent it (released on any thread).
  std::shared_ptr<const void> keep_alive;
};

// The encoding of `message` with the attachments added. The attachments'
// fields must be empty in `message`; every field of a path but the last is a
// singular message field. The result references the attachments' memory
// (holding their keep_alive) and copies only the rest.
grpc::ByteBuffer Serialize(const google::protobuf::Message& message,
                           std::vector<Attachment> attachments = {});

// The field `name` of `message`'s type (for building attachment paths).
// REQUIRES: the field exists.
const google::protobuf::FieldDescriptor* Field(const google::protobuf::Descriptor* type,
                                               absl::string_view name);

}  // namespace gpucompute::wire

#endif  // GPUCOMPUTE_PROTO_WIRE_H_
