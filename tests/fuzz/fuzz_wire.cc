// Fuzz target: the wire codec (proto/wire.h) against protobuf's own. The
// bytes, cut into slices, are parsed as one message of the API by
// wire::Parse and by protobuf; then the message is sent again by
// wire::Serialize with its bytes fields attached.
//
// Input: three bytes, then the message. The first picks the message type
// (kTypes), the second the bytes from which a field stays in the slices
// (min_external_bytes: 1 to 255, or 0 for the default), the third seeds the
// slice sizes (some empty, some of one byte).
//
// Besides no crash, leak or undefined behaviour:
// - wire::Parse accepts what protobuf accepts and nothing else, except
//   groups (wire types 3 and 4), which it refuses: the API has none;
// - what it accepts is protobuf's message, field for field, once the fields
//   left in the slices are copied in; those fields are singular bytes fields
//   of at least min_external_bytes, left empty in their message;
// - wire::Serialize with attachments writes what protobuf reads back as the
//   same message.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "gpucompute/v1/compute.pb.h"
#include "proto/wire.h"
#include "tests/fuzz/fuzz_check.h"

namespace gpucompute {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Every message the API sends in either direction.
const Message* const kTypes[] = {
    &v1::GemmRequest::default_instance(),      &v1::GemvRequest::default_instance(),
    &v1::ReduceRequest::default_instance(),    &v1::TransposeRequest::default_instance(),
    &v1::AttentionRequest::default_instance(), &v1::BatchRequest::default_instance(),
    &v1::EchoRequest::default_instance(),      &v1::UploadRequest::default_instance(),
    &v1::DownloadRequest::default_instance(),  &v1::FreeRequest::default_instance(),
    &v1::GemmResponse::default_instance(),     &v1::AttentionResponse::default_instance(),
    &v1::BatchResponse::default_instance(),    &v1::EchoResponse::default_instance(),
    &v1::UploadResponse::default_instance(),   &v1::DownloadResponse::default_instance(),
};
constexpr size_t kNumTypes = sizeof(kTypes) / sizeof(kTypes[0]);

// `bytes` cut into slices whose sizes come from `seed`.
grpc::ByteBuffer Sliced(const std::string& bytes, uint8_t seed) {
  std::minstd_rand rng(seed + 1);
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - at, rng() % 3 == 0 ? rng() % 3 : rng() % 64);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  if (slices.empty() && seed % 2 == 1) slices.emplace_back();  // one empty slice
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  FUZZ_CHECK(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

bool IsSingularBytes(const FieldDescriptor* field) {
  return field->type() == FieldDescriptor::TYPE_BYTES && !field->is_repeated();
}

// Moves the non-empty singular bytes fields of `message`, and of its set
// singular message fields, into attachments (the fields left empty).
std::vector<wire::Attachment> Detach(Message* message) {
  std::vector<wire::Attachment> attachments;
  const auto* reflection = message->GetReflection();
  auto detach = [&](Message* owner, std::vector<const FieldDescriptor*> path) {
    auto bytes =
        std::make_shared<std::string>(owner->GetReflection()->GetString(*owner, path.back()));
    if (bytes->empty()) return;
    owner->GetReflection()->SetString(owner, path.back(), std::string());
    attachments.push_back(
        {std::move(path), bytes->data(), static_cast<int64_t>(bytes->size()), bytes});
  };
  const auto* type = message->GetDescriptor();
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    if (IsSingularBytes(field)) detach(message, {field});
    if (field->type() != FieldDescriptor::TYPE_MESSAGE || field->is_repeated() ||
        !reflection->HasField(*message, field)) {
      continue;
    }
    Message* child = reflection->MutableMessage(message, field);
    const auto* child_type = child->GetDescriptor();
    for (int j = 0; j < child_type->field_count(); ++j) {
      if (IsSingularBytes(child_type->field(j))) detach(child, {field, child_type->field(j)});
    }
  }
  return attachments;
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size < 3) return;
  const Message& prototype = *kTypes[data[0] % kNumTypes];
  const int64_t min_external = data[1] == 0 ? wire::kDefaultMinExternalBytes : data[1];
  const std::string bytes(reinterpret_cast<const char*>(data) + 3, size - 3);

  std::unique_ptr<Message> by_protobuf(prototype.New());
  const bool protobuf_ok = by_protobuf->ParseFromString(bytes);

  std::unique_ptr<Message> by_wire(prototype.New());
  std::vector<wire::ExternalField> external;
  const absl::Status status =
      wire::Parse(Sliced(bytes, data[2]), by_wire.get(), &external, min_external, "fuzz");
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(external.empty());
    if (protobuf_ok) FUZZ_CHECK(absl::StrContains(status.message(), "groups are not used"));
    return;
  }
  FUZZ_CHECK(protobuf_ok);
  for (const wire::ExternalField& e : external) {
    FUZZ_CHECK(IsSingularBytes(e.field));
    FUZZ_CHECK(e.bytes.size() >= min_external);
    FUZZ_CHECK(e.owner->GetReflection()->GetString(*e.owner, e.field).empty());
    std::string copied(static_cast<size_t>(e.bytes.size()), '\0');
    e.bytes.CopyTo(0, e.bytes.size(), copied.data());
    FUZZ_CHECK(copied == e.bytes.ToString());
  }
  wire::Materialize(&external);
  FUZZ_CHECK(external.empty());
  const std::string expected = by_protobuf->SerializeAsString();
  FUZZ_CHECK(by_wire->SerializeAsString() == expected);

  std::vector<wire::Attachment> attachments = Detach(by_wire.get());
  const grpc::ByteBuffer sent = wire::Serialize(*by_wire, std::move(attachments));
  std::unique_ptr<Message> read_back(prototype.New());
  FUZZ_CHECK(read_back->ParseFromString(Flatten(sent)));
  FUZZ_CHECK(read_back->SerializeAsString() == expected);
}

}  // namespace
}  // namespace gpucompute

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every string field with invalid UTF-8 it refuses.
  google::protobuf::SetLogHandler(nullptr);
  // gRPC's and protobuf's process-wide state, made once before the first
  // input so that its allocations are not taken for that input's leaks.
  grpc::Slice slice(std::string("init"));
  const grpc::ByteBuffer buffer(&slice, 1);
  for (const google::protobuf::Message* type : gpucompute::kTypes) {
    std::unique_ptr<google::protobuf::Message> message(type->New());
    message->ParseFromString(std::string());
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpucompute::FuzzOne(data, size);
  return 0;
}
