// The wire codec against protobuf's own: what Parse reads and what
// Serialize writes must be what protobuf reads and writes, whatever slices
// the bytes arrive in.
#include "proto/wire.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "gpucompute/v1/compute.pb.h"

namespace gpucompute::wire {
namespace {

using google::protobuf::util::MessageDifferencer;

std::string RandomBytes(size_t n, std::mt19937& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// `bytes` cut into slices of random sizes (some empty, some of one byte).
grpc::ByteBuffer Sliced(const std::string& bytes, std::mt19937& rng) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - at, rng() % 3 == 0 ? rng() % 3 : rng() % 9000);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

v1::GemmRequest SampleGemm(std::mt19937& rng, size_t a_bytes, size_t b_bytes) {
  v1::GemmRequest r;
  r.mutable_a()->set_dtype(v1::BFLOAT16);
  r.mutable_a()->add_shape(3);
  r.mutable_a()->add_shape(int64_t{1} << 40);
  r.mutable_a()->set_data(RandomBytes(a_bytes, rng));
  r.mutable_b()->set_dtype(v1::FLOAT32);
  r.mutable_b()->set_data(RandomBytes(b_bytes, rng));
  r.mutable_c()->set_handle("t-123");
  r.set_alpha(1.5f);
  r.set_beta(-0.25f);
  r.set_transpose_b(true);
  r.mutable_options()->set_variant("tc_wgmma");
  r.mutable_options()->add_devices(1);
  return r;
}

TEST(WireParse, LargeFieldsStayInSlicesAndTheRestIsProtobufs) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const v1::GemmRequest sent = SampleGemm(rng, 70000 + rng() % 100000, rng() % 200);
    const grpc::ByteBuffer buffer = Sliced(sent.SerializeAsString(), rng);
    v1::GemmRequest got;
    std::vector<ExternalField> external;
    ASSERT_TRUE(Parse(buffer, &got, &external, 1000, "request").ok());
    // a is large: external and empty in the message; b is small: copied.
    ASSERT_EQ(external.size(), 1u);
    EXPECT_EQ(external[0].owner, got.mutable_a());
    EXPECT_EQ(external[0].field->name(), "data");
    EXPECT_TRUE(got.a().data().empty());
    EXPECT_EQ(external[0].bytes.ToString(), sent.a().data());
    // Any range copies out right.
    const int64_t n = external[0].bytes.size();
    const int64_t offset = rng() % n;
    const int64_t length = rng() % (n - offset + 1);
    std::string part(length, '\0');
    external[0].bytes.CopyTo(offset, length, part.data());
    EXPECT_EQ(part, sent.a().data().substr(offset, length));
    Materialize(&external);
    EXPECT_TRUE(external.empty());
    EXPECT_TRUE(MessageDifferencer::Equals(got, sent));
  }
}

TEST(WireParse, TopLevelBytesAndRepeatedOccurrences) {
  std::mt19937 rng(11);
  v1::UploadRequest first;
  first.set_offset(123);
  first.set_data(RandomBytes(5000, rng));
  v1::UploadRequest second;
  second.set_data(RandomBytes(10, rng));
  // Small after large: the small value wins.
  {
    v1::UploadRequest got;
    std::vector<ExternalField> external;
    ASSERT_TRUE(Parse(Sliced(first.SerializeAsString() + second.SerializeAsString(), rng), &got,
                      &external, 1000)
                    .ok());
    EXPECT_TRUE(external.empty());
    EXPECT_EQ(got.data(), second.data());
    EXPECT_EQ(got.offset(), 123);
  }
  // Large after small: the large value wins and is the only one.
  {
    v1::UploadRequest got;
    std::vector<ExternalField> external;
    ASSERT_TRUE(Parse(Sliced(second.SerializeAsString() + first.SerializeAsString(), rng), &got,
                      &external, 1000)
                    .ok());
    ASSERT_EQ(external.size(), 1u);
    EXPECT_TRUE(got.data().empty());
    EXPECT_EQ(external[0].bytes.ToString(), first.data());
  }
}

TEST(WireParse, UnknownFieldsSurvive) {
  v1::UploadRequest known;
  known.set_offset(5);
  std::string bytes = known.SerializeAsString();
  bytes += std::string("\xa8\x1f\x07", 3);  // field 501, varint 7
  v1::UploadRequest got;
  std::vector<ExternalField> external;
  std::mt19937 rng(3);
  ASSERT_TRUE(Parse(Sliced(bytes, rng), &got, &external).ok());
  EXPECT_EQ(got.offset(), 5);
  EXPECT_EQ(got.SerializeAsString(), bytes);
}

TEST(WireParse, EveryTruncationAndCorruptionFailsCleanly) {
  std::mt19937 rng(5);
  const std::string bytes = SampleGemm(rng, 3000, 100).SerializeAsString();
  int rejected = 0;
  for (size_t cut = 0; cut < bytes.size(); cut += 1 + rng() % 50) {
    v1::GemmRequest got;
    std::vector<ExternalField> external;
    const absl::Status s = Parse(Sliced(bytes.substr(0, cut), rng), &got, &external, 1000);
    v1::GemmRequest reference;
    // Protobuf's verdict and ours agree on every prefix.
    EXPECT_EQ(s.ok(), reference.ParseFromString(bytes.substr(0, cut))) << "cut at " << cut;
    if (!s.ok()) {
      ++rejected;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("gpucompute.v1.GemmRequest"), std::string::npos) << s.message();
      EXPECT_TRUE(external.empty());
    }
  }
  EXPECT_GT(rejected, 10);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string corrupt = bytes;
    for (int i = 0; i < 3; ++i) corrupt[rng() % corrupt.size()] = static_cast<char>(rng());
    v1::GemmRequest got;
    std::vector<ExternalField> external;
    (void)Parse(Sliced(corrupt, rng), &got, &external, 1000);  // no crash, no sanitizer report
  }
}

// A length (or any varint) whose bytes run past the end of the message that
// holds it is refused; it used to be read on into the outer message, and the
// length then compared against a negative remainder taken as unsigned, so
// that the field was copied from past the end of the buffer. (Found by
// tests/fuzz/fuzz_request: the input corpus/fuzz_request/regression-*.)
TEST(WireParse, VarintsDoNotRunPastTheirMessage) {
  // header (field 1) of 1 byte: the tag of field 2 (length-delimited), then
  // its length 0x4a outside the header.
  const std::string length_outside("\x0a\x01\x12\x4a", 4);
  // A varint field of the header whose value continues past it.
  const std::string value_outside("\x0a\x02\x08\x81\x01", 5);
  // A tag that continues past the header.
  const std::string tag_outside("\x0a\x01\x80\x01\x10\x01", 6);
  std::mt19937 rng(11);
  for (const std::string& bytes : {length_outside, value_outside, tag_outside}) {
    for (int trial = 0; trial < 20; ++trial) {
      v1::UploadRequest got;
      std::vector<ExternalField> external;
      const absl::Status s = Parse(Sliced(bytes, rng), &got, &external, 1 + trial % 3);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      v1::UploadRequest reference;
      EXPECT_FALSE(reference.ParseFromString(bytes));
      EXPECT_TRUE(external.empty());
    }
  }
}

// Tags and lengths are read as protobuf reads them: at most 5 bytes, a tag's
// bits past 32 dropped, a length within int32. (The first case was refused
// here and taken by protobuf: found by tests/fuzz/fuzz_wire.)
TEST(WireParse, TagsAndLengthsAsProtobufReadsThem) {
  const std::string cases[] = {
      std::string("\xc0\xc0\xf1\xd2\x60\x3f", 6),          // 5-byte tag, bits past 32: a varint
      std::string("\x80\x80\x80\x80\x10\x01", 6),          // 5-byte tag of field 0
      std::string("\x98\x80\x80\x80\x80\x00\x01", 7),      // 6-byte tag of field 3
      std::string("\x1a\x81\x80\x80\x80\x80\x00\x41", 8),  // 6-byte length 1
      std::string("\x1a\x81\x80\x80\x80\x00\x41", 7),      // 5-byte length 1
      std::string("\x1a\xff\xff\xff\xff\x0f", 6),          // length 2^32 - 1
      std::string("\x1a\x80\x80\x80\x80\x08", 6),          // length 2^31
  };
  std::mt19937 rng(13);
  for (const std::string& bytes : cases) {
    v1::DownloadResponse reference;
    const bool protobuf_ok = reference.ParseFromString(bytes);
    v1::DownloadResponse got;
    std::vector<ExternalField> external;
    const absl::Status s = Parse(Sliced(bytes, rng), &got, &external, 1);
    EXPECT_EQ(s.ok(), protobuf_ok) << s;
    if (s.ok()) {
      Materialize(&external);
      EXPECT_EQ(got.SerializeAsString(), reference.SerializeAsString());
    }
  }
}

// A oneof member that replaces another deletes it: the fields the replaced
// one left in the slices are forgotten, not written into the deleted
// message. (Found by tests/fuzz/fuzz_wire.)
TEST(WireParse, AReplacedOneofMemberKeepsNothingInTheSlices) {
  std::mt19937 rng(17);
  v1::BatchRequest gemm;
  gemm.set_id("first");
  gemm.mutable_gemm()->mutable_a()->set_data(RandomBytes(300, rng));
  gemm.mutable_gemm()->mutable_b()->set_data(RandomBytes(200, rng));
  v1::BatchRequest gemv;
  gemv.mutable_gemv()->mutable_x()->set_data(RandomBytes(100, rng));
  v1::BatchRequest reduce;
  reduce.mutable_reduce()->mutable_input()->set_data(RandomBytes(400, rng));
  reduce.set_id("last");
  const std::string cases[] = {
      gemm.SerializeAsString() + gemv.SerializeAsString(),
      gemv.SerializeAsString() + gemm.SerializeAsString() + reduce.SerializeAsString(),
      gemm.SerializeAsString() + gemm.SerializeAsString(),  // the same member: merged
      reduce.SerializeAsString() + gemm.SerializeAsString() + reduce.SerializeAsString(),
  };
  for (const std::string& bytes : cases) {
    v1::BatchRequest reference;
    ASSERT_TRUE(reference.ParseFromString(bytes));
    for (int trial = 0; trial < 10; ++trial) {
      v1::BatchRequest got;
      std::vector<ExternalField> external;
      ASSERT_TRUE(Parse(Sliced(bytes, rng), &got, &external, 50).ok());
      for (const ExternalField& e : external) EXPECT_GE(e.bytes.size(), 50);
      // gemm: a and b (a later value of each replacing the earlier); else
      // the one operand of the last member.
      EXPECT_EQ(external.size(), reference.has_gemm() ? 2u : 1u);
      Materialize(&external);
      EXPECT_TRUE(MessageDifferencer::Equals(got, reference));
    }
  }
}

TEST(WireSerialize, AttachmentsReadBackByProtobuf) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 10; ++trial) {
    const std::string o = RandomBytes(1 + rng() % 100000, rng);
    const std::string lse = RandomBytes(rng() % 3000, rng);
    v1::AttentionResponse response;
    response.mutable_o()->set_dtype(v1::FLOAT16);
    response.mutable_o()->add_shape(2);
    response.mutable_lse()->add_shape(4);
    response.mutable_timings()->set_kernel_seconds(0.5);
    response.mutable_timings()->add_shards()->set_variant("flash");
    const auto* type = v1::AttentionResponse::descriptor();
    const auto* data = Field(v1::Tensor::descriptor(), "data");
    auto owner = std::make_shared<std::string>(o);
    bool released = false;
    {
      std::shared_ptr<const void> keep(owner.get(), [&released](const void*) { released = true; });
      std::vector<Attachment> attachments = {
          {{Field(type, "o"), data}, owner->data(), static_cast<int64_t>(o.size()), keep},
          {{Field(type, "lse"), data}, lse.data(), static_cast<int64_t>(lse.size()), nullptr},
      };
      const grpc::ByteBuffer buffer = Serialize(response, std::move(attachments));
      keep.reset();
      EXPECT_FALSE(released);  // the buffer still references o
      v1::AttentionResponse got;
      ASSERT_TRUE(got.ParseFromString(Flatten(buffer)));
      v1::AttentionResponse expected = response;
      expected.mutable_o()->set_data(o);
      expected.mutable_lse()->set_data(lse);
      EXPECT_TRUE(MessageDifferencer::Equals(got, expected));
    }
    EXPECT_TRUE(released);
  }
}

TEST(WireSerialize, AttachmentsThreeFieldsDownAndBesideEachOther) {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 10; ++trial) {
    const std::string o = RandomBytes(1 + rng() % 100000, rng);
    const std::string lse = RandomBytes(rng() % 3000, rng);
    v1::BatchResponse item;
    item.set_id(absl::StrCat("item-", trial));
    v1::AttentionResponse* attention = item.mutable_attention();
    attention->mutable_o()->set_dtype(v1::BFLOAT16);
    attention->mutable_o()->add_shape(3);
    attention->mutable_lse()->add_shape(5);
    attention->mutable_timings()->add_shards()->set_variant("flash_mma");
    const auto* data = Field(v1::Tensor::descriptor(), "data");
    const auto* outer = Field(v1::BatchResponse::descriptor(), "attention");
    const auto* type = v1::AttentionResponse::descriptor();
    std::vector<Attachment> attachments = {
        {{outer, Field(type, "o"), data}, o.data(), static_cast<int64_t>(o.size()), nullptr},
        {{outer, Field(type, "lse"), data}, lse.data(), static_cast<int64_t>(lse.size()), nullptr},
    };
    if (trial % 2 == 1) std::swap(attachments[0], attachments[1]);
    const grpc::ByteBuffer buffer = Serialize(item, std::move(attachments));
    v1::BatchResponse got;
    ASSERT_TRUE(got.ParseFromString(Flatten(buffer)));
    v1::BatchResponse expected = item;
    expected.mutable_attention()->mutable_o()->set_data(o);
    expected.mutable_attention()->mutable_lse()->set_data(lse);
    EXPECT_TRUE(MessageDifferencer::Equals(got, expected));
    EXPECT_EQ(static_cast<int64_t>(buffer.Length()), static_cast<int64_t>(expected.ByteSizeLong()));
  }
}

TEST(WireSerialize, TopLevelAttachmentAndNone) {
  std::mt19937 rng(13);
  const std::string data = RandomBytes(200000, rng);
  v1::DownloadResponse message;
  message.set_offset(77);
  message.mutable_tensor()->set_handle("h");
  const grpc::ByteBuffer buffer =
      Serialize(message, {{{Field(v1::DownloadResponse::descriptor(), "data")},
                           data.data(),
                           static_cast<int64_t>(data.size()),
                           nullptr}});
  v1::DownloadResponse got;
  ASSERT_TRUE(got.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(got.offset(), 77);
  EXPECT_EQ(got.tensor().handle(), "h");
  EXPECT_EQ(got.data(), data);
  // And back through Parse, the field external again.
  v1::DownloadResponse again;
  std::vector<ExternalField> external;
  ASSERT_TRUE(Parse(buffer, &again, &external).ok());
  ASSERT_EQ(external.size(), 1u);
  EXPECT_EQ(external[0].bytes.ToString(), data);
  EXPECT_EQ(Flatten(Serialize(message)), message.SerializeAsString());
}

}  // namespace
}  // namespace gpucompute::wire
