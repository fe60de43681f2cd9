#include "proto/wire.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/host_memory.h"

namespace gpucompute::wire {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Protobuf's own bound on message nesting.
constexpr int kMaxDepth = 100;

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void AppendTag(int number, WireType type, std::string* out) {
  AppendVarint((static_cast<uint64_t>(number) << 3) | type, out);
}

// The wire type protobuf parses `field` from (a singular field; packed
// repeated fields are never oneof members).
WireType WireTypeOf(const FieldDescriptor* field) {
  switch (field->type()) {
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
      return kFixed64;
    case FieldDescriptor::TYPE_FLOAT:
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
      return kFixed32;
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_MESSAGE:
      return kLengthDelimited;
    case FieldDescriptor::TYPE_GROUP:
      return kStartGroup;
    default:
      return kVarint;
  }
}

// Reads the bytes of a message that arrived as a list of slices.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices_) size_ += static_cast<int64_t>(s.size());
    Settle();
  }

  int64_t position() const { return position_; }
  int64_t size() const { return size_; }

  // Reads one byte before `end`. REQUIRES: end <= size().
  bool ReadByte(int64_t end, uint8_t* byte) {
    if (position_ >= end) return false;
    *byte = slices_[index_].begin()[offset_];
    Advance(1);
    return true;
  }

  // Reads a varint of at most `max_bytes` bytes that ends before `end` (a
  // field never runs past the end of its message); bits past 64 are
  // dropped, as protobuf drops them. REQUIRES: end <= size().
  bool ReadVarint(int64_t end, uint64_t* value, int max_bytes = 10) {
    uint64_t result = 0;
    for (int shift = 0; shift < 7 * max_bytes; shift += 7) {
      uint8_t byte;
      if (!ReadByte(end, &byte)) return false;
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return false;
  }

  // The next n bytes as references to the slices.
  // REQUIRES: n <= size() - position().
  void Take(int64_t n, SliceBytes* out) {
    while (n > 0) {
      const grpc::Slice& slice = slices_[index_];
      const size_t piece = std::min<size_t>(n, slice.size() - offset_);
      out->Append(slice.sub(offset_, offset_ + piece));
      Advance(piece);
      n -= static_cast<int64_t>(piece);
    }
  }

  // Appends the next n bytes to *out. REQUIRES: n <= size() - position().
  void Copy(int64_t n, std::string* out) {
    while (n > 0) {
      const grpc::Slice& slice = slices_[index_];
      const size_t piece = std::min<size_t>(n, slice.size() - offset_);
      out->append(reinterpret_cast<const char*>(slice.begin()) + offset_, piece);
      Advance(piece);
      n -= static_cast<int64_t>(piece);
    }
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    position_ += static_cast<int64_t>(n);
    Settle();
  }
  // Moves past exhausted (and empty) slices.
  void Settle() {
    while (index_ < slices_.size() && offset_ >= slices_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
  int64_t position_ = 0;
  int64_t size_ = 0;
};

class Parser {
 public:
  Parser(Cursor* cursor, std::vector<ExternalField>* external, int64_t min_external)
      : cursor_(*cursor), external_(*external), min_external_(min_external) {}

  // Parses fields into `message` up to byte `end`. The fields kept as
  // encoded bytes (scalars, strings, small bytes, unknown fields) are merged
  // by protobuf at the end (and around each oneof member, in order);
  // message fields are descended into, so that large bytes inside them stay
  // in the slices.
  // REQUIRES: cursor position <= end <= cursor size.
  bool ParseMessage(Message* message, int64_t end, int depth) {
    if (depth > kMaxDepth) return Fail("nested too deeply");
    const Descriptor* type = message->GetDescriptor();
    const Reflection* reflection = message->GetReflection();
    std::string plain;  // the fields protobuf parses
    while (cursor_.position() < end) {
      // Tags and lengths as protobuf reads them: at most 5 bytes; a tag
      // keeps its low 32 bits, a length must fit in an int32.
      uint64_t tag;
      if (!cursor_.ReadVarint(end, &tag, 5)) return Fail("truncated field tag");
      tag = static_cast<uint32_t>(tag);
      const uint64_t number = tag >> 3;
      const auto wire_type = static_cast<WireType>(tag & 7);
      if (number == 0 || number > FieldDescriptor::kMaxNumber) return Fail("invalid field number");
      const FieldDescriptor* field = type->FindFieldByNumber(static_cast<int>(number));
      // A oneof's members replace one another in the order they come (the
      // message of one replaced is deleted): what came before is merged
      // first, and a member that does not go through `plain` last.
      const bool oneof_member = field != nullptr && field->real_containing_oneof() != nullptr &&
                                wire_type == WireTypeOf(field);
      if (oneof_member && !EnterOneofMember(message, field, &plain)) return false;
      switch (wire_type) {
        case kVarint: {
          uint64_t value;
          if (!cursor_.ReadVarint(end, &value)) return Fail("truncated varint");
          AppendVarint(tag, &plain);
          AppendVarint(value, &plain);
          break;
        }
        case kFixed64:
        case kFixed32: {
          const int64_t n = wire_type == kFixed64 ? 8 : 4;
          if (end - cursor_.position() < n) return Fail("truncated fixed-width field");
          AppendVarint(tag, &plain);
          cursor_.Copy(n, &plain);
          break;
        }
        case kLengthDelimited: {
          uint64_t length;
          if (!cursor_.ReadVarint(end, &length, 5) ||
              length > uint64_t{std::numeric_limits<int32_t>::max()}) {
            return Fail("invalid length");
          }
          if (length > static_cast<uint64_t>(end - cursor_.position())) {
            return Fail(absl::StrCat("field ", number, " runs past the end of its message"));
          }
          const auto n = static_cast<int64_t>(length);
          if (field != nullptr && field->type() == FieldDescriptor::TYPE_MESSAGE) {
            Message* child = field->is_repeated() ? reflection->AddMessage(message, field)
                                                  : reflection->MutableMessage(message, field);
            if (!ParseMessage(child, cursor_.position() + n, depth + 1)) return false;
          } else if (field != nullptr && field->type() == FieldDescriptor::TYPE_BYTES &&
                     !field->is_repeated() && !oneof_member && n >= min_external_) {
            DropExternal(message, field);  // a later value replaces an earlier one
            ExternalField value;
            value.owner = message;
            value.field = field;
            cursor_.Take(n, &value.bytes);
            external_.push_back(std::move(value));
            pending_clear_.emplace_back(message, field);
          } else {
            if (field != nullptr && field->type() == FieldDescriptor::TYPE_BYTES &&
                !field->is_repeated()) {
              DropExternal(message, field);  // this later value replaces it
            }
            AppendVarint(tag, &plain);
            AppendVarint(length, &plain);
            cursor_.Copy(n, &plain);
          }
          break;
        }
        default:
          return Fail(absl::StrCat("field ", number, " has wire type ", int(wire_type),
                                   " (groups are not used by this API)"));
      }
      if (oneof_member && !Merge(message, &plain)) return false;
    }
    if (cursor_.position() != end) return Fail("a field runs past the end of its message");
    return Merge(message, &plain);
  }

  // Where a large value of a field came after a small one, the large one
  // wins: the small value protobuf merged is cleared.
  void ClearShadowed() {
    for (const auto& [message, field] : pending_clear_) {
      for (const ExternalField& e : external_) {
        if (e.owner == message && e.field == field) {
          message->GetReflection()->ClearField(message, field);
          break;
        }
      }
    }
  }

  const std::string& error() const { return error_; }

 private:
  // Merges the fields kept as encoded bytes into `message`; empties *plain.
  bool Merge(Message* message, std::string* plain) {
    if (!plain->empty() && !message->MergeFromString(*plain)) {
      return Fail(absl::StrCat("invalid ", message->GetDescriptor()->name(), " fields"));
    }
    plain->clear();
    return true;
  }

  // Before `field`, a member of a oneof of `message`, takes its place:
  // merges what came before it, and forgets what the slices hold for the
  // message of another member, which it replaces (and protobuf deletes).
  bool EnterOneofMember(Message* message, const FieldDescriptor* field, std::string* plain) {
    if (!Merge(message, plain)) return false;
    const FieldDescriptor* current =
        message->GetReflection()->GetOneofFieldDescriptor(*message, field->real_containing_oneof());
    if (current != nullptr && current != field &&
        current->type() == FieldDescriptor::TYPE_MESSAGE) {
      Forget(message->GetReflection()->GetMessage(*message, current));
    }
    return true;
  }

  // Forgets the external fields and pending clears of `root` and of every
  // message under it.
  void Forget(const Message& root) {
    std::vector<const Message*> within = {&root};
    for (size_t i = 0; i < within.size(); ++i) {
      const Message& m = *within[i];
      const Reflection* reflection = m.GetReflection();
      std::vector<const FieldDescriptor*> fields;
      reflection->ListFields(m, &fields);
      for (const FieldDescriptor* f : fields) {
        if (f->type() != FieldDescriptor::TYPE_MESSAGE) continue;
        if (!f->is_repeated()) {
          within.push_back(&reflection->GetMessage(m, f));
          continue;
        }
        for (int j = 0; j < reflection->FieldSize(m, f); ++j) {
          within.push_back(&reflection->GetRepeatedMessage(m, f, j));
        }
      }
    }
    auto inside = [&within](const Message* m) {
      return std::find(within.begin(), within.end(), m) != within.end();
    };
    external_.erase(std::remove_if(external_.begin(), external_.end(),
                                   [&](const ExternalField& e) { return inside(e.owner); }),
                    external_.end());
    pending_clear_.erase(std::remove_if(pending_clear_.begin(), pending_clear_.end(),
                                        [&](const auto& pending) { return inside(pending.first); }),
                         pending_clear_.end());
  }

  void DropExternal(const Message* message, const FieldDescriptor* field) {
    for (auto it = external_.begin(); it != external_.end();) {
      it = (it->owner == message && it->field == field) ? external_.erase(it) : it + 1;
    }
  }

  bool Fail(std::string why) {
    error_ = std::move(why);
    return false;
  }

  Cursor& cursor_;
  std::vector<ExternalField>& external_;
  const int64_t min_external_;
  std::vector<std::pair<Message*, const FieldDescriptor*>> pending_clear_;
  std::string error_;
};

void DeleteKeepAlive(void* p) { delete static_cast<std::shared_ptr<const void>*>(p); }

// A slice over the attachment's memory that holds its keep_alive.
grpc::Slice AttachmentSlice(const Attachment& a) {
  auto* hold = new std::shared_ptr<const void>(a.keep_alive);
  return grpc::Slice(const_cast<void*>(a.data), static_cast<size_t>(a.size), DeleteKeepAlive, hold);
}

}  // namespace

void SliceBytes::Append(grpc::Slice slice) {
  size_ += static_cast<int64_t>(slice.size());
  pieces_.push_back(std::move(slice));
}

void SliceBytes::ForEach(const std::function<void(const char*, size_t)>& fn) const {
  for (const grpc::Slice& s : pieces_) fn(reinterpret_cast<const char*>(s.begin()), s.size());
}

void SliceBytes::CopyTo(int64_t offset, int64_t n, void* dst) const {
  char* out = static_cast<char*>(dst);
  for (const grpc::Slice& s : pieces_) {
    if (n <= 0) break;
    const auto size = static_cast<int64_t>(s.size());
    if (offset >= size) {
      offset -= size;
      continue;
    }
    const int64_t piece = std::min(n, size - offset);
    std::memcpy(out, s.begin() + offset, static_cast<size_t>(piece));
    out += piece;
    n -= piece;
    offset = 0;
  }
}

std::string SliceBytes::ToString() const {
  std::string out = LargeStringCache::Default().Take(static_cast<size_t>(size_));
  ForEach([&out](const char* data, size_t n) { out.append(data, n); });
  return out;
}

absl::Status Parse(const grpc::ByteBuffer& buffer, Message* message,
                   std::vector<ExternalField>* external, int64_t min_external_bytes,
                   absl::string_view what) {
  message->Clear();
  external->clear();
  std::vector<grpc::Slice> slices;
  if (buffer.Valid()) {
    if (grpc::Status s = buffer.Dump(&slices); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unreadable: ", s.error_message()));
    }
  }
  Cursor cursor(slices);
  Parser parser(&cursor, external, std::max<int64_t>(min_external_bytes, 1));
  if (!parser.ParseMessage(message, cursor.size(), 0)) {
    external->clear();
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": not a valid ", message->GetDescriptor()->full_name(), " (", parser.error(), ")"));
  }
  parser.ClearShadowed();
  return absl::OkStatus();
}

void Materialize(std::vector<ExternalField>* external) {
  for (ExternalField& e : *external) {
    e.owner->GetReflection()->SetString(e.owner, e.field, e.bytes.ToString());
  }
  external->clear();
}

namespace {

// A piece of an encoding: an attachment's bytes, or (attachment null) bytes
// of its own.
struct Segment {
  std::string text;
  const Attachment* attachment = nullptr;
};

void AppendText(std::string text, std::vector<Segment>* out) {
  if (text.empty()) return;
  if (!out->empty() && out->back().attachment == nullptr) {
    out->back().text += text;
    return;
  }
  out->push_back({std::move(text), nullptr});
}

std::string LengthDelimitedHeader(int number, int64_t length) {
  std::string header;
  AppendTag(number, kLengthDelimited, &header);
  AppendVarint(static_cast<uint64_t>(length), &header);
  return header;
}

// Appends to *out the encoding of `message` with `attachments` added, each
// path taken from its element `depth` on; returns the encoding's bytes. The
// message's fields that lead to attachments further down come last, each
// encoded the same way (a field's place in the encoding does not matter to a
// parser).
int64_t Encode(const Message& message, const std::vector<const Attachment*>& attachments,
               size_t depth, std::vector<Segment>* out) {
  std::vector<const FieldDescriptor*> children;
  for (const Attachment* a : attachments) {
    if (a->path.size() > depth + 1 &&
        std::find(children.begin(), children.end(), a->path[depth]) == children.end()) {
      children.push_back(a->path[depth]);
    }
  }
  std::string head;
  if (children.empty()) {
    head = message.SerializeAsString();
  } else {
    std::unique_ptr<Message> rest(message.New());
    rest->CopyFrom(message);
    for (const FieldDescriptor* f : children) rest->GetReflection()->ClearField(rest.get(), f);
    head = rest->SerializeAsString();
  }
  int64_t bytes = static_cast<int64_t>(head.size());
  AppendText(std::move(head), out);
  for (const Attachment* a : attachments) {
    if (a->path.size() != depth + 1) continue;
    std::string header = LengthDelimitedHeader(a->path[depth]->number(), a->size);
    bytes += static_cast<int64_t>(header.size()) + a->size;
    AppendText(std::move(header), out);
    if (a->size > 0) out->push_back({std::string(), a});
  }
  for (const FieldDescriptor* f : children) {
    std::vector<const Attachment*> below;
    for (const Attachment* a : attachments) {
      if (a->path.size() > depth + 1 && a->path[depth] == f) below.push_back(a);
    }
    std::vector<Segment> child;
    const int64_t child_bytes =
        Encode(message.GetReflection()->GetMessage(message, f), below, depth + 1, &child);
    std::string header = LengthDelimitedHeader(f->number(), child_bytes);
    bytes += static_cast<int64_t>(header.size()) + child_bytes;
    AppendText(std::move(header), out);
    for (Segment& segment : child) {
      if (segment.attachment == nullptr) {
        AppendText(std::move(segment.text), out);
      } else {
        out->push_back(std::move(segment));
      }
    }
  }
  return bytes;
}

}  // namespace

grpc::ByteBuffer Serialize(const Message& message, std::vector<Attachment> attachments) {
  std::vector<grpc::Slice> slices;
  if (attachments.empty()) {
    std::string bytes = message.SerializeAsString();
    slices.emplace_back(bytes);
    return grpc::ByteBuffer(slices.data(), slices.size());
  }
  std::vector<const Attachment*> all;
  for (const Attachment& a : attachments) all.push_back(&a);
  std::vector<Segment> segments;
  Encode(message, all, 0, &segments);
  for (const Segment& segment : segments) {
    if (segment.attachment == nullptr) {
      slices.emplace_back(segment.text);
    } else {
      slices.push_back(AttachmentSlice(*segment.attachment));
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

const FieldDescriptor* Field(const Descriptor* type, absl::string_view name) {
  return type->FindFieldByName(std::string(name));
}

}  // namespace gpucompute::wire
