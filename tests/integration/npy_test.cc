// The .npy reader and writer of the client.
#include "client/npy.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gpucompute {
namespace {

// A file as NumPy 1.x writes it: version 1.0, header padded to 64 bytes.
std::string NumpyFile(const std::string& dict, const std::string& data) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header + data;
}

TEST(NpyTest, RoundTripsEveryRank) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{}, {0}, {3}, {2, 3}, {2, 3, 4}, {1, 1, 1, 5}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (const char* descr : {"<f4", "<f2", "<u2", "<f8"}) {
      NpyArray array{descr, shape, std::string(n * NpyItemSize(descr), '\0')};
      for (size_t i = 0; i < array.data.size(); ++i) array.data[i] = static_cast<char>(i * 7);
      std::string bytes = SerializeNpy(array);
      size_t header_end = bytes.size() - array.data.size();
      EXPECT_EQ(header_end % 64, 0u) << "data not 64-aligned";
      EXPECT_EQ(bytes[header_end - 1], '\n');
      auto parsed = ParseNpy(bytes);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->descr, descr);
      EXPECT_EQ(parsed->shape, shape);
      EXPECT_EQ(parsed->data, array.data);
    }
  }
}

TEST(NpyTest, ReadsNumpyHeaders) {
  float values[6] = {1, 2, 3, 4, 5, 6};
  std::string data(reinterpret_cast<const char*>(values), sizeof(values));
  auto a = ParseNpy(NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->descr, "<f4");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->data, data);

  auto b = ParseNpy(
      NumpyFile("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", std::string(6, 'x')));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->shape, (std::vector<int64_t>{3}));

  auto scalar = ParseNpy(
      NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", std::string(4, 'x')));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
}

TEST(NpyTest, RejectsWhatItCannotRead) {
  std::string data(24, '\0');
  EXPECT_FALSE(ParseNpy("not a numpy file").ok());
  EXPECT_FALSE(
      ParseNpy(NumpyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data)).ok());
  EXPECT_FALSE(
      ParseNpy(NumpyFile("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data))
          .ok());
  EXPECT_FALSE(ParseNpy(NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }",
                                  data))
                   .ok());  // too little data
  EXPECT_FALSE(
      ParseNpy(NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", data))
          .ok());
  EXPECT_FALSE(ParseNpy(NumpyFile("{'descr': [('a', '<f4')], 'fortran_order': False, "
                                  "'shape': (6,), }",
                                  data))
                   .ok());  // structured dtype
  EXPECT_EQ(ReadNpy("/nonexistent/x.npy").status().code(), absl::StatusCode::kNotFound);
}

// A type string is a byte order, a kind letter and a size in digits: what
// SerializeNpy writes back. "<'4" in double quotes was read, then written
// as '<'4', which no reader takes (tests/fuzz/fuzz_npy's round trip).
TEST(NpyTest, TypeStringsAreOrderKindAndDigits) {
  EXPECT_EQ(NpyItemSize("<f4"), 4);
  EXPECT_EQ(NpyItemSize("|b1"), 1);
  EXPECT_EQ(NpyItemSize(">u2"), 2);
  EXPECT_EQ(NpyItemSize("<U10"), 10);
  for (const char* bad :
       {"<'4", "<f+4", "<f 4", "<4", "<f", "f4", "<f4 ", "<f-4", "<f0", "<f99999999999"}) {
    EXPECT_EQ(NpyItemSize(bad), 0) << bad;
  }
  EXPECT_FALSE(ParseNpy(NumpyFile("{\"descr\": \"<'4\", 'fortran_order': False, 'shape': (1,), }",
                                  std::string(4, '\0')))
                   .ok());
}

}  // namespace
}  // namespace gpucompute
