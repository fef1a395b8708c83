// sanitize: address
// Safetensors reader: every malformed input is an Error naming the file and the tensor; valid
// files give views of exactly the right bytes.
#include <gtest/gtest.h>

#include "model/safetensors.h"
#include "test_safetensors_util.h"

namespace megadecode {
namespace {

using st_test::parse_error;
using st_test::safetensors_bytes;

// Expects parse() to fail with a message holding every one of `parts`.
void expect_error(const std::string& header, size_t data_bytes, std::initializer_list<std::string> parts) {
  std::string err = parse_error(safetensors_bytes(header, data_bytes));
  ASSERT_FALSE(err.empty()) << "accepted: " << header;
  EXPECT_NE(err.find("test.safetensors"), std::string::npos) << err;
  for (const std::string& p : parts) EXPECT_NE(err.find(p), std::string::npos) << "missing \"" << p << "\" in: " << err;
}

TEST(SafetensorsParse, ValidFileGivesViewsOfItsBytes) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[5],"data_offsets":[24,34]},"c":{"dtype":"F16","shape":[0,7],"data_offsets":[34,34]},)"
      R"("d":{"dtype":"F16","shape":[],"data_offsets":[34,36]}})";
  std::vector<std::byte> bytes = safetensors_bytes(header, 36);
  auto f = SafetensorsFile::parse(bytes, "x.safetensors");
  const TensorMap& t = f->tensors();
  ASSERT_EQ(t.size(), 4u);
  const std::byte* data = bytes.data() + 8 + header.size();
  EXPECT_EQ(t.at("a").dtype, Dtype::kF32);
  EXPECT_EQ(t.at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.at("a").data, data);
  EXPECT_EQ(t.at("b").data, data + 24);
  EXPECT_EQ(t.at("b").dtype, Dtype::kBF16);
  EXPECT_EQ(t.at("c").n_elements(), 0);
  EXPECT_EQ(t.at("d").n_elements(), 1);
  EXPECT_EQ(t.at("d").data, data + 34);
  EXPECT_EQ(t.at("a").file, "x.safetensors");
}

TEST(SafetensorsParse, TruncatedAndAbsurdLengths) {
  for (size_t n = 0; n < 8; ++n) {
    std::vector<std::byte> bytes(n, std::byte{0});
    std::string err = parse_error(bytes);
    EXPECT_NE(err.find("too short"), std::string::npos) << err;
    EXPECT_NE(err.find("test.safetensors"), std::string::npos) << err;
  }
  std::vector<std::byte> bytes = safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  bytes[0] = std::byte{0xff};  // header length now past the end
  EXPECT_NE(parse_error(bytes).find("past the end"), std::string::npos) << parse_error(bytes);
  for (int i = 0; i < 8; ++i) bytes[i] = std::byte{0xff};  // 2^64 - 1: no overflow in the bound check
  EXPECT_NE(parse_error(bytes).find("absurd"), std::string::npos) << parse_error(bytes);
  std::vector<std::byte> cut(bytes.begin(), bytes.end() - 1);  // data truncated by one byte
  cut = safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 3);
  std::string err = parse_error(cut);
  EXPECT_NE(err.find("\"a\""), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST(SafetensorsParse, MalformedJson) {
  expect_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4, {"not valid JSON"});
  expect_error(R"({"a":{"dtype":"F32",})", 4, {"not valid JSON"});
  expect_error(R"([1,2])", 0, {"'{'"});
  expect_error(R"(   )", 0, {"'{'"});
  expect_error(std::string(R"({"a":)") + std::string(100, '[') + std::string(100, ']') + "}", 0, {"nests"});
  expect_error("{\"a\xff\":{}}", 0, {"not valid JSON"});  // invalid UTF-8
}

TEST(SafetensorsParse, EntryFieldErrorsNameTheTensor) {
  expect_error(R"({"w":[1]})", 0, {"\"w\"", "not an object"});
  expect_error(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4, {"\"w\"", "dtype"});
  expect_error(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4, {"\"w\"", "shape"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1]}})", 4, {"\"w\"", "data_offsets"});
  expect_error(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4, {"\"w\"", "dtype"});
  expect_error(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8, {"\"w\"", "F64", "not supported"});
  expect_error(R"({"w":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1, {"\"w\"", "I8", "not supported"});
  expect_error(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1, {"\"w\"", "unknown dtype", "Q4"});
  expect_error(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, {"\"w\"", "-1", "non-negative"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, {"\"w\"", "1.5"});
  expect_error(R"({"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", 4, {"\"w\"", "shape"});
  expect_error(R"({"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", 4, {"\"w\"", "shape"});
  expect_error(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4, {"\"w\""});
  expect_error(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4,
               {"\"w\"", "overflow"});
  expect_error(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}})", 4,
               {"\"w\"", "overflow"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, {"\"w\"", "data_offsets"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4, {"\"w\"", "data_offsets"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4, {"\"w\"", "non-negative"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", 4, {"\"w\"", "non-negative"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, {"\"w\"", "past end"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", 4, {"\"w\"", "run past"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})", 4, {"\"w\""});
  expect_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8, {"\"w\"", "need 8"});
  expect_error(R"({"__metadata__":{"format":1}})", 0, {"__metadata__", "format"});
  expect_error(R"({"__metadata__":[1]})", 0, {"__metadata__"});
}

TEST(SafetensorsParse, LayoutErrorsNameBothTensors) {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  expect_error("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
               {"\"a\"", "\"b\"", "overlaps"});
  expect_error("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, {"\"a\"", "\"b\"", "overlaps"});
  expect_error("{" + a + R"(,"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", 8, {"overlaps"});
  expect_error("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16, {"\"b\"", "gap"});
  expect_error("{" + a + "}", 12, {"trailing"});
  expect_error(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, {"\"b\"", "gap"});
  expect_error("{" + a + "," + a + "}", 8, {"repeats", "\"a\""});
  expect_error(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8,
               {"repeats", "dtype", "\"a\""});
}

TEST(SafetensorsParse, EmptyHeaderObjectIsAnEmptyFile) {
  auto f = SafetensorsFile::parse(safetensors_bytes("{}", 0), "e");
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_NE(parse_error(safetensors_bytes("{}", 1)).find("trailing"), std::string::npos);
}

TEST(SafetensorsOpen, MissingFileAndDirectoryNamed) {
  st_test::TempDir dir("st-open");
  try {
    SafetensorsFile::open(dir.path() / "nope.safetensors");
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsFile::open(dir.path()), Error);
  st_test::write_text(dir.path() / "empty.safetensors", "");
  try {
    SafetensorsFile::open(dir.path() / "empty.safetensors");
    FAIL() << "opened an empty file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megadecode
