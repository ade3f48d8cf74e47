// safetensors files: the writer's bytes against hand-built files of the format, round trips, and a
// table of damaged files the reader must refuse (plus random damage) without crashing.
#include "worker/engine/checkpoint/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/crc32c.h"

namespace dropless::engine {
namespace {

std::string TestDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir =
      std::string(base ? base : "/tmp") + "/dropless-safetensors-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Le64(uint64_t n) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Writes through the library and returns the file's bytes.
std::string Serialize(const std::vector<SafetensorsTensorRef>& tensors,
                      const SafetensorsMetadata& metadata, const std::string& name) {
  const std::string path = TestDir() + "/" + name;
  AtomicFileWriter writer(path);
  EXPECT_TRUE(writer.Open().ok());
  absl::Status status = WriteSafetensors(tensors, metadata, &writer);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(writer.Commit().ok());
  return ReadBytes(path);
}

TEST(SafetensorsTest, OneTensorIsByteForByteTheSpecLayout) {
  const float values[] = {0, 1, 2, 3, 4, 5};
  const std::string bytes =
      Serialize({{"attn.0", SafetensorsDtype::kF32, {1, 2, 3}, values}}, {}, "one.safetensors");
  // 64 header bytes: already a multiple of 8, no padding.
  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64u);
  const std::string data(
      "\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40"
      "\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40",
      24);
  EXPECT_EQ(bytes, Le64(64) + header + data);
}

TEST(SafetensorsTest, MetadataFirstTensorsByDescendingDtypeThenNameHeaderPaddedToEight) {
  const int64_t b = 7;
  const float c = 2.5f;
  const uint16_t a[] = {0x3f80, 0xc000};  // bf16 1.0, -2.0
  const std::string bytes = Serialize({{"a", SafetensorsDtype::kBF16, {2}, a},
                                       {"c", SafetensorsDtype::kF32, {}, &c},
                                       {"b", SafetensorsDtype::kI64, {1}, &b}},
                                      {{"format", "pt"}}, "mixed.safetensors");
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("c":{"dtype":"F32","shape":[],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]}})";
  ASSERT_EQ(header.size(), 194u);
  const std::string data(
      "\x07\0\0\0\0\0\0\0"
      "\x00\x00\x20\x40"
      "\x80\x3f\x00\xc0",
      16);
  EXPECT_EQ(bytes, Le64(200) + header + std::string(6, ' ') + data);
  // An empty file: "{}" and six spaces.
  EXPECT_EQ(Serialize({}, {}, "empty.safetensors"), Le64(8) + "{}      ");
}

TEST(SafetensorsTest, RoundTripsRandomTensors) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> x(3 * 5 * 7), empty;
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> ids(9);
  for (int32_t& v : ids) v = static_cast<int32_t>(rng());
  const std::string path = TestDir() + "/roundtrip.safetensors";
  {
    AtomicFileWriter writer(path);
    ASSERT_TRUE(writer.Open().ok());
    ASSERT_TRUE(WriteSafetensors({{"x", SafetensorsDtype::kF32, {3, 5, 7}, x.data()},
                                  {"ids", SafetensorsDtype::kI32, {9}, ids.data()},
                                  {"none", SafetensorsDtype::kF32, {4, 0}, nullptr}},
                                 {{"k\"ey", "v\nalue"}, {"step", "3"}}, &writer)
                    .ok());
    ASSERT_TRUE(writer.Commit().ok());
  }
  EXPECT_FALSE(std::filesystem::exists(AtomicFileWriter::TempPath(path)));
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->header().buffer_offset % 8, 0u);
  EXPECT_EQ(reader->header().metadata.at("k\"ey"), "v\nalue");
  ASSERT_EQ(reader->header().tensors.size(), 3u);
  const SafetensorsTensorInfo* info = reader->header().Find("x");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{3, 5, 7}));
  std::vector<float> x_back(x.size());
  ASSERT_TRUE(reader
                  ->Read(*info, absl::MakeSpan(reinterpret_cast<char*>(x_back.data()),
                                               x_back.size() * sizeof(float)))
                  .ok());
  EXPECT_EQ(x_back, x);
  EXPECT_FALSE(reader->Read(*info, absl::MakeSpan(reinterpret_cast<char*>(x_back.data()), 4)).ok());
  std::vector<int32_t> ids_back(ids.size());
  absl::StatusOr<uint32_t> crc =
      reader->ReadAll([&](const SafetensorsTensorInfo& t) -> absl::StatusOr<void*> {
        if (t.name == "x") return static_cast<void*>(x_back.data());
        if (t.name == "ids") return static_cast<void*>(ids_back.data());
        return static_cast<void*>(nullptr);
      });
  ASSERT_TRUE(crc.ok()) << crc.status();
  EXPECT_EQ(ids_back, ids);
  const std::string bytes = ReadBytes(path);
  EXPECT_EQ(*crc, Crc32c(bytes.data(), bytes.size()));
}

TEST(SafetensorsTest, WriterRefusesBadTensors) {
  const float v = 1;
  const std::vector<std::vector<SafetensorsTensorRef>> bad = {
      {{"", SafetensorsDtype::kF32, {1}, &v}},
      {{"__metadata__", SafetensorsDtype::kF32, {1}, &v}},
      {{"a", SafetensorsDtype::kF32, {1}, &v}, {"a", SafetensorsDtype::kI32, {1}, &v}},
      {{"a", SafetensorsDtype::kF32, {-1}, &v}},
      {{"a", SafetensorsDtype::kF32, {1}, nullptr}},
      {{"a", SafetensorsDtype::kF32, {INT64_MAX, INT64_MAX}, &v}}};
  for (const auto& tensors : bad) {
    EXPECT_EQ(LayOutSafetensors(tensors, {}).status().code(), absl::StatusCode::kInvalidArgument)
        << tensors[0].name;
  }
}

struct DamagedCase {
  const char* what;
  std::string bytes;
  absl::StatusCode code = absl::StatusCode::kDataLoss;
};

// A file of header `json` (unpadded: padding is not required) and `data` bytes of buffer.
std::string File(const std::string& json, size_t data) {
  return Le64(json.size()) + json + std::string(data, '\x01');
}

TEST(SafetensorsTest, DamagedFilesAreRefusedWithoutCrashing) {
  const std::string ok_tensor = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<DamagedCase> cases = {
      {"empty file", ""},
      {"seven bytes", std::string(7, '\0')},
      {"header length past the end", Le64(100) + "{}"},
      {"header length over the limit", Le64(kMaxSafetensorsHeaderBytes + 1) + "{}"},
      {"header length 2^64-1", Le64(UINT64_MAX) + "{}"},
      {"not an object", File("[]", 0)},
      {"leading space", File(" {}", 0)},
      {"truncated JSON", File("{\"t\":", 0)},
      {"text after the object", File("{}x", 0)},
      {"NUL padding", File(std::string("{}\0\0\0\0\0\0", 8), 0)},
      {"invalid UTF-8", File("{\"\xff\":1}", 0)},
      {"duplicate tensor", File("{" + ok_tensor + "," + ok_tensor + "}", 8)},
      {"unknown dtype", File(R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4),
       absl::StatusCode::kInvalidArgument},
      {"dtype not a string", File(R"({"t":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8)},
      {"negative dimension", File(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)},
      {"fractional dimension",
       File(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8)},
      {"shape not an array", File(R"({"t":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8)},
      {"three offsets", File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", 8)},
      {"end before begin", File(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8)},
      {"size does not match shape",
       File(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)},
      {"offset 2^64-1",
       File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551615,7]}})", 8)},
      {"offset above 2^64",
       File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}})", 8)},
      {"shape overflows",
       File(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0)},
      {"overlap",
       File(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           12)},
      {"gap",
       File(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           12)},
      {"bytes past the last tensor", File("{" + ok_tensor + "}", 12)},
      {"data truncated", File("{" + ok_tensor + "}", 5)},
      {"data but no tensors", File("{}", 4)},
      {"metadata value not a string", File(R"({"__metadata__":{"step":3}})", 0)},
      {"metadata not an object", File(R"({"__metadata__":"x"})", 0)},
      {"unknown tensor field",
       File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8)},
      {"missing offsets", File(R"({"t":{"dtype":"F32","shape":[2]}})", 8)},
      {"tensor not an object", File(R"({"t":[1]})", 0)},
      {"nested too deeply", File("{\"t\":{\"shape\":[[[[[[1]]]]]]}}", 0)},
  };
  const std::string path = TestDir() + "/damaged.safetensors";
  for (const DamagedCase& c : cases) {
    WriteBytes(path, c.bytes);
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
    EXPECT_EQ(reader.status().code(), c.code) << c.what << ": " << reader.status();
  }
  EXPECT_EQ(SafetensorsReader::Open(TestDir() + "/missing.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, HugeHeadersParseInLinearTime) {
  std::string json = "{";
  constexpr int kTensors = 100000;
  for (int i = 0; i < kTensors; ++i) {
    absl::StrAppend(&json, i ? "," : "", "\"t", i,
                    R"(":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]})");
  }
  json += "}";
  const absl::Time start = absl::Now();
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(json, 0);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->tensors.size(), static_cast<size_t>(kTensors));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // quadratic would take hours
  json.insert(json.size() - 1, R"(,"t7":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})");
  EXPECT_EQ(ParseSafetensorsHeader(json, 0).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SafetensorsTest, RandomDamageNeverCrashesTheReader) {
  std::vector<float> a(37, 1.5f), b(5, -2.f);
  const std::string good = Serialize({{"a", SafetensorsDtype::kF32, {37}, a.data()},
                                      {"b", SafetensorsDtype::kF32, {5, 1}, b.data()}},
                                     {{"step", "1"}}, "good.safetensors");
  const std::string path = TestDir() + "/fuzz.safetensors";
  std::mt19937 rng(5);
  std::vector<char> sink(good.size());
  int opened = 0;
  for (int i = 0; i < 1000; ++i) {
    std::string bytes = good;
    switch (i % 3) {
      case 0:
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
        break;
      case 1:
        bytes.resize(rng() % bytes.size());
        break;
      default:
        bytes.insert(rng() % bytes.size(), 1, static_cast<char>(rng()));
    }
    WriteBytes(path, bytes);
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
    if (!reader.ok()) continue;
    ++opened;
    for (const SafetensorsTensorInfo& t : reader->header().tensors) {
      ASSERT_LE(t.bytes(), sink.size());
      ASSERT_TRUE(reader->Read(t, absl::MakeSpan(sink.data(), t.bytes())).ok());
    }
  }
  EXPECT_GT(opened, 0);  // flips inside the data keep the file valid
  std::filesystem::remove_all(TestDir());
}

}  // namespace
}  // namespace dropless::engine
