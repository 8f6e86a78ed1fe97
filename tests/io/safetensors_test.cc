// safetensors reader/writer and TensorStore tests (io/safetensors.h).
//
// The corrupt-input suite is an enumerated list (DESIGN.md "Tests"): one test per class of bad
// file, each building the bytes itself and asserting the specific error it must produce (and that
// the error names the file). Then writer -> reader round trips, TensorStore over single and sharded
// model directories (good and bad), and the real shared models beside the repository.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "base/half.h"
#include "test_paths.h"

namespace nibble {
namespace {

constexpr char kFile[] = "bad.safetensors";

// 8-byte little-endian header length (the header's size unless `declared` is given), the header
// text, then `data_bytes` data bytes (0, 1, 2, ...).
std::vector<uint8_t> Image(const std::string& header, size_t data_bytes, uint64_t declared = UINT64_MAX) {
  const uint64_t n = declared == UINT64_MAX ? header.size() : declared;
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = static_cast<uint8_t>(i);
  return out;
}

// Asserts that parsing fails with an error that contains `needle` and names the file.
void ExpectCorrupt(const std::vector<uint8_t>& bytes, const std::string& needle) {
  auto r = ParseSafetensors(bytes.data(), bytes.size(), kFile);
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << "got: " << r.error().message;
  EXPECT_NE(r.error().message.find(kFile), std::string::npos) << "error should name the file: " << r.error().message;
}

// ---------------------------------------------------------------------------------------------
// Corrupt inputs.

TEST(SafetensorsCorrupt, ValidBaselineParses) {
  // The template the corrupt cases below deviate from: must itself be accepted.
  auto bytes = Image(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 16);
  auto r = ParseSafetensors(bytes.data(), bytes.size(), kFile);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(r->tensors[0].nbytes, 16u);
}

TEST(SafetensorsCorrupt, FileShorterThan8Bytes) {
  for (size_t n : {0, 1, 7}) {
    std::vector<uint8_t> bytes(n, 0);
    ExpectCorrupt(bytes, "too short for a safetensors header length");
  }
}

TEST(SafetensorsCorrupt, HeaderLengthZero) { ExpectCorrupt(Image("", 16), "header length is 0"); }

TEST(SafetensorsCorrupt, HeaderLengthLargerThanFile) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  ExpectCorrupt(Image(h, 4, h.size() + 5), "runs past the end of the file");
}

TEST(SafetensorsCorrupt, AbsurdHeaderLength) {
  ExpectCorrupt(Image("{}", 0, 1ull << 63), "larger than the limit");
  ExpectCorrupt(Image("{}", 0, UINT64_MAX - 1), "larger than the limit");
}

TEST(SafetensorsCorrupt, HeaderNotJson) {
  ExpectCorrupt(Image("this is not json", 0), "not valid JSON");
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4), "not valid JSON");  // truncated
}

TEST(SafetensorsCorrupt, HeaderNotUtf8) {
  // 0xff never occurs in UTF-8; 0xc3 0x28 is a broken two-byte sequence.
  ExpectCorrupt(Image("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4), "UTF-8");
  ExpectCorrupt(Image("{\"__metadata__\":{\"k\":\"\xc3\x28\"}}", 0), "UTF-8");
}

TEST(SafetensorsCorrupt, HeaderNestedTooDeep) {
  // 2 MB of brackets is far under the header size limit but must not build a 1M-level DOM.
  std::string h = "{\"a\":";
  h.append(1000000, '[');
  h.append(1000000, ']');
  h += '}';
  ExpectCorrupt(Image(h, 0), "nested deeper than");
}

TEST(SafetensorsCorrupt, HeaderIsArrayNotObject) {
  ExpectCorrupt(Image(R"([{"dtype":"F32","shape":[1],"data_offsets":[0,4]}])", 4), "header is array, expected a JSON object");
  ExpectCorrupt(Image("42", 0), "expected a JSON object");
}

TEST(SafetensorsCorrupt, DuplicateTensorNames) {
  ExpectCorrupt(Image(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      8),
                "duplicate key \"w\"");
}

TEST(SafetensorsCorrupt, DataOffsetsReversed) {
  ExpectCorrupt(Image(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 8), "are reversed");
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      12),
                "overlap");
  // Same span twice.
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                      8),
                "overlap");
  // One span inside another, listed in reverse order of offsets.
  ExpectCorrupt(Image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[10,12]},)"
                      R"("b":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})",
                      16),
                "overlap");
}

TEST(SafetensorsCorrupt, OffsetsPastEndOfFile) {
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 15), "past the end of the data region");
  ExpectCorrupt(Image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})", 4),
                "past the end of the data region");
}

TEST(SafetensorsCorrupt, SpanNotMatchingShapeTimesDtype) {
  // [2, 2] F32 needs 16 bytes, the span is 12.
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16), "needs 16 bytes");
  // Same element count, wrong element size: [4] BF16 is 8 bytes, not 16.
  ExpectCorrupt(Image(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", 16), "needs 8 bytes");
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  ExpectCorrupt(Image(R"({"a":{"dtype":"F8_E9","shape":[1],"data_offsets":[0,1]}})", 1), "unknown dtype \"F8_E9\"");
  ExpectCorrupt(Image(R"({"a":{"dtype":"int3","shape":[1],"data_offsets":[0,1]}})", 1), "unknown dtype \"int3\"");
  ExpectCorrupt(Image(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4), "unknown dtype \"f32\"");  // case matters
}

TEST(SafetensorsCorrupt, NegativeDim) {
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,0]}})", 0), "negative or out-of-range dimension");
}

TEST(SafetensorsCorrupt, DimsWhoseProductOverflowsInt64) {
  // 2^32 * 2^32 = 2^64 wraps uint64 to 0, which would match an empty span without the check.
  ExpectCorrupt(Image(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
                "overflows 64-bit element count");
  // 2^62 * 2 = 2^63 fits uint64 but not int64.
  ExpectCorrupt(Image(R"({"a":{"dtype":"U8","shape":[4611686018427387904,2],"data_offsets":[0,0]}})", 0),
                "overflows 64-bit element count");
  // A zero dimension after a huge one is still rejected only if the partial product overflowed;
  // 2^62 elements of F32 is 2^64 bytes: the byte count overflows.
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
                "overflows 64-bit byte count");
  // A dimension beyond int64.
  ExpectCorrupt(Image(R"({"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0),
                "negative or out-of-range dimension");
}

TEST(SafetensorsCorrupt, MetadataWithNonStringValue) {
  ExpectCorrupt(Image(R"({"__metadata__":{"format":"pt","step":3}})", 0), "__metadata__[\"step\"] is number, expected a string");
  ExpectCorrupt(Image(R"({"__metadata__":["pt"]})", 0), "__metadata__ is array");
}

TEST(SafetensorsCorrupt, MalformedTensorEntries) {
  ExpectCorrupt(Image(R"({"a":[1,2]})", 0), "entry is array, expected an object");
  ExpectCorrupt(Image(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "missing or non-string \"dtype\"");
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", 4), "non-array \"shape\"");
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), "array of 2 integers");
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), "non-integer dimension");
  ExpectCorrupt(Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4), "must be non-negative integers");
}

TEST(SafetensorsCorrupt, ErrorNamesTheTensor) {
  auto bytes = Image(R"({"model.norm.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  auto r = ParseSafetensors(bytes.data(), bytes.size(), kFile);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tensor \"model.norm.weight\""), std::string::npos) << r.error().message;
}

// ---------------------------------------------------------------------------------------------
// Writer -> reader.

TensorToWrite MakeTensor(const std::string& name, DType dtype, std::vector<int64_t> shape, uint8_t seed) {
  TensorToWrite t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  size_t n = DTypeSize(dtype);
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  for (size_t i = 0; i < n; ++i) t.bytes.push_back(static_cast<uint8_t>(seed + 7 * i));
  return t;
}

uint64_t HeaderLength(const std::vector<uint8_t>& image) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | image[i];
  return n;
}

TEST(SafetensorsRoundTrip, EveryDtype) {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64,
                       DType::kI32, DType::kI16, DType::kI8,   DType::kU8,  DType::kBool};
  const size_t sizes[] = {4, 2, 2, 8, 8, 4, 2, 1, 1, 1};
  std::vector<TensorToWrite> ts;
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(DTypeSize(all[i]), sizes[i]) << DTypeName(all[i]);
    auto parsed = ParseDType(DTypeName(all[i]));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, all[i]);
    ts.push_back(MakeTensor(std::string("t.") + DTypeName(all[i]), all[i], {2, 3}, static_cast<uint8_t>(i * 31)));
  }
  // Odd-sized tensor first so later tensors start at unaligned offsets.
  ts.push_back(MakeTensor("odd", DType::kU8, {3}, 5));
  std::vector<const TensorToWrite*> ptrs;
  ptrs.push_back(&ts.back());
  for (size_t i = 0; i + 1 < ts.size(); ++i) ptrs.push_back(&ts[i]);

  auto image = SerializeSafetensors(ptrs, {});
  ASSERT_TRUE(image.ok()) << image.error().message;
  auto r = ParseSafetensors(image->data(), image->size(), "rt.safetensors");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->tensors.size(), ts.size());
  EXPECT_TRUE(r->metadata.empty());
  for (const TensorToWrite& want : ts) {
    const TensorView* got = nullptr;
    for (const auto& v : r->tensors)
      if (v.name == want.name) got = &v;
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->dtype, want.dtype) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    EXPECT_EQ(got->numel(), static_cast<int64_t>(want.bytes.size() / DTypeSize(want.dtype)));
    ASSERT_EQ(got->nbytes, want.bytes.size()) << want.name;
    EXPECT_EQ(std::memcmp(got->data, want.bytes.data(), got->nbytes), 0) << want.name;
    EXPECT_EQ(got->file, "rt.safetensors");
  }
  // The data region holds exactly the tensors, back to back, in the caller's order.
  EXPECT_EQ(image->size(), 8 + HeaderLength(*image) + (3 + 6 * (4 + 2 + 2 + 8 + 8 + 4 + 2 + 1 + 1 + 1)));
  EXPECT_EQ(std::memcmp(image->data() + 8 + HeaderLength(*image), ts.back().bytes.data(), 3), 0);
}

TEST(SafetensorsRoundTrip, ValuesSurviveThroughHalfConversions) {
  // bf16 values written by F32ToBf16 read back bit-exactly through Bf16ToF32.
  TensorToWrite t;
  t.name = "w";
  t.dtype = DType::kBF16;
  t.shape = {4};
  for (float f : {1.0f, -2.5f, 0.15625f, 3.0e38f}) {
    uint16_t h = F32ToBf16(f);
    t.bytes.push_back(static_cast<uint8_t>(h));
    t.bytes.push_back(static_cast<uint8_t>(h >> 8));  // little-endian
  }
  auto image = SerializeSafetensors({&t}, {});
  ASSERT_TRUE(image.ok());
  auto r = ParseSafetensors(image->data(), image->size(), "w.safetensors");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const uint8_t* p = r->tensors[0].data;
  EXPECT_EQ(Bf16ToF32(static_cast<uint16_t>(p[0] | (p[1] << 8))), 1.0f);
  EXPECT_EQ(Bf16ToF32(static_cast<uint16_t>(p[2] | (p[3] << 8))), -2.5f);
  EXPECT_EQ(Bf16ToF32(static_cast<uint16_t>(p[4] | (p[5] << 8))), 0.15625f);
}

TEST(SafetensorsRoundTrip, Metadata) {
  auto t = MakeTensor("a", DType::kF16, {2}, 1);
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"quant_method", "awq"}, {"note", "quote \" and \xc3\xa9"}};
  auto image = SerializeSafetensors({&t}, meta);
  ASSERT_TRUE(image.ok()) << image.error().message;
  auto r = ParseSafetensors(image->data(), image->size(), "m.safetensors");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->metadata, meta);
  ASSERT_EQ(r->tensors.size(), 1u);  // __metadata__ is not a tensor
}

TEST(SafetensorsRoundTrip, HeaderPaddedToMultipleOf8) {
  // Vary the name length so every header length residue mod 8 occurs before padding.
  for (int len = 1; len <= 16; ++len) {
    auto t = MakeTensor(std::string(static_cast<size_t>(len), 'x'), DType::kF32, {1}, 0);
    auto image = SerializeSafetensors({&t}, {});
    ASSERT_TRUE(image.ok());
    const uint64_t n = HeaderLength(*image);
    EXPECT_EQ(n % 8, 0u) << "name length " << len;
    EXPECT_EQ((8 + n) % 8, 0u);  // so the data region starts 8-aligned in the file
    auto r = ParseSafetensors(image->data(), image->size(), "p.safetensors");
    ASSERT_TRUE(r.ok()) << r.error().message;
    // Padding is spaces (trailing JSON whitespace), never NULs.
    for (uint64_t i = 8; i < 8 + n; ++i) ASSERT_NE((*image)[i], 0) << "NUL in header at " << i;
  }
}

TEST(SafetensorsRoundTrip, ZeroElementAndScalarTensors) {
  auto empty = MakeTensor("empty", DType::kF32, {0, 4}, 0);
  auto scalar = MakeTensor("scalar", DType::kI64, {}, 9);
  auto after = MakeTensor("after", DType::kU8, {2}, 3);
  auto image = SerializeSafetensors({&empty, &scalar, &after}, {});
  ASSERT_TRUE(image.ok()) << image.error().message;
  auto r = ParseSafetensors(image->data(), image->size(), "z.safetensors");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->tensors.size(), 3u);
  for (const auto& v : r->tensors) {
    if (v.name == "empty") {
      EXPECT_EQ(v.nbytes, 0u);
      EXPECT_EQ(v.numel(), 0);
      EXPECT_EQ(v.ShapeString(), "[0, 4]");
    } else if (v.name == "scalar") {
      EXPECT_EQ(v.nbytes, 8u);
      EXPECT_EQ(v.numel(), 1);
      EXPECT_EQ(v.ShapeString(), "[]");
    } else {
      EXPECT_EQ(std::memcmp(v.data, after.bytes.data(), 2), 0);
    }
  }
}

TEST(SafetensorsWriter, RejectsDuplicateNames) {
  auto a = MakeTensor("w", DType::kF32, {1}, 0);
  auto b = MakeTensor("w", DType::kF32, {1}, 1);
  auto image = SerializeSafetensors({&a, &b}, {});
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.error().message.find("duplicate tensor name \"w\""), std::string::npos) << image.error().message;
}

TEST(SafetensorsWriter, RejectsByteCountMismatch) {
  auto a = MakeTensor("w", DType::kF32, {2}, 0);
  a.bytes.pop_back();
  auto image = SerializeSafetensors({&a}, {});
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.error().message.find("has 7 bytes"), std::string::npos) << image.error().message;
}

TEST(SafetensorsWriter, RejectsShapeWhoseSizeOverflows) {
  // 2^62 x 4 elements wraps to 0 in 64 bits and would "match" an empty byte vector.
  TensorToWrite t;
  t.name = "w";
  t.dtype = DType::kU8;
  t.shape = {int64_t{1} << 62, 4};
  auto image = SerializeSafetensors({&t}, {});
  ASSERT_FALSE(image.ok()) << "wrote a header the reader must refuse";
  EXPECT_NE(image.error().message.find("overflow"), std::string::npos) << image.error().message;
  t.shape = {-1};
  image = SerializeSafetensors({&t}, {});
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.error().message.find("negative"), std::string::npos) << image.error().message;
}

TEST(SafetensorsWriter, RejectsReservedAndNonUtf8Names) {
  auto meta_named = MakeTensor("__metadata__", DType::kU8, {1}, 0);
  auto image = SerializeSafetensors({&meta_named}, {});
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.error().message.find("__metadata__"), std::string::npos) << image.error().message;

  auto bad = MakeTensor("w\xff", DType::kU8, {1}, 0);
  image = SerializeSafetensors({&bad}, {});  // must be an error value, not an exception
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.error().message.find("UTF-8"), std::string::npos) << image.error().message;

  auto good = MakeTensor("w", DType::kU8, {1}, 0);
  image = SerializeSafetensors({&good}, {{"k", "\xc3\x28"}});
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.error().message.find("UTF-8"), std::string::npos) << image.error().message;
}

// ---------------------------------------------------------------------------------------------
// Files and model directories.

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/nibble_st_test_XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    if (p == nullptr) std::abort();
    path_ = p;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Path(const std::string& name) const { return path_ + "/" + name; }
  void WriteText(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
  }
  void WriteBytes(const std::string& name, const std::vector<uint8_t>& b) const {
    std::ofstream(Path(name), std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  // A shard holding tensors `names`, each [2] F32.
  void WriteShard(const std::string& file, const std::vector<std::string>& names) const {
    std::vector<TensorToWrite> ts;
    for (size_t i = 0; i < names.size(); ++i) ts.push_back(MakeTensor(names[i], DType::kF32, {2}, static_cast<uint8_t>(i)));
    std::vector<const TensorToWrite*> ptrs;
    for (const auto& t : ts) ptrs.push_back(&t);
    Status s = WriteSafetensors(Path(file), ptrs, {{"format", "pt"}});
    if (!s.ok()) std::abort();
  }

 private:
  std::string path_;
};

void ExpectOpenDirError(const std::string& dir, const std::vector<std::string>& needles) {
  auto r = TensorStore::OpenDir(dir);
  ASSERT_FALSE(r.ok());
  for (const auto& n : needles) EXPECT_NE(r.error().message.find(n), std::string::npos) << "want \"" << n << "\" in: " << r.error().message;
}

TEST(SafetensorsFileTest, WriteThenOpen) {
  TempDir dir;
  auto a = MakeTensor("a", DType::kI32, {3, 1}, 4);
  ASSERT_TRUE(WriteSafetensors(dir.Path("x.safetensors"), {&a}, {{"format", "pt"}}).ok());
  auto f = SafetensorsFile::Open(dir.Path("x.safetensors"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  ASSERT_EQ((*f)->tensors().size(), 1u);
  EXPECT_EQ((*f)->tensors()[0].file, dir.Path("x.safetensors"));
  EXPECT_EQ(std::memcmp((*f)->tensors()[0].data, a.bytes.data(), a.bytes.size()), 0);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  // No temporary file is left beside the written one.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++entries;
  EXPECT_EQ(entries, 1);
}

// The streamed file equals the in-memory image byte for byte, with owned and borrowed tensors
// mixed (a borrowed tensor wins over its `bytes`); a borrowed span of the wrong size is refused
// and leaves no file.
TEST(SafetensorsFileTest, StreamedWriteEqualsSerializedImageWithBorrowedTensors) {
  TempDir dir;
  auto a = MakeTensor("a", DType::kU8, {5}, 1);
  auto src = MakeTensor("unused", DType::kF16, {3, 4}, 9);
  TensorToWrite b;
  b.name = "b";
  b.dtype = DType::kF16;
  b.shape = {3, 4};
  b.bytes = {1, 2, 3};  // ignored: borrowed wins
  b.borrowed = src.bytes.data();
  b.borrowed_size = src.bytes.size();
  auto c = MakeTensor("c", DType::kF32, {2, 2}, 77);
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  auto image = SerializeSafetensors({&a, &b, &c}, meta);
  ASSERT_TRUE(image.ok()) << image.error().message;
  ASSERT_TRUE(WriteSafetensors(dir.Path("s.safetensors"), {&a, &b, &c}, meta).ok());
  std::ifstream in(dir.Path("s.safetensors"), std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(file, *image);
  auto f = SafetensorsFile::Open(dir.Path("s.safetensors"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  const TensorView* got = nullptr;
  for (const auto& v : (*f)->tensors())
    if (v.name == "b") got = &v;
  ASSERT_NE(got, nullptr);
  ASSERT_EQ(got->nbytes, src.bytes.size());
  EXPECT_EQ(std::memcmp(got->data, src.bytes.data(), got->nbytes), 0);

  b.borrowed_size = src.bytes.size() - 2;
  Status bad = WriteSafetensors(dir.Path("bad.safetensors"), {&a, &b}, meta);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("\"b\" has 22 bytes"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(std::filesystem::exists(dir.Path("bad.safetensors")));
}

TEST(SafetensorsFileTest, EmptyFileIsAnError) {
  TempDir dir;
  dir.WriteText("e.safetensors", "");
  auto f = SafetensorsFile::Open(dir.Path("e.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("too short"), std::string::npos) << f.error().message;
  EXPECT_NE(f.error().message.find(dir.Path("e.safetensors")), std::string::npos) << f.error().message;
}

TEST(TensorStoreTest, SingleFile) {
  TempDir dir;
  dir.WriteShard("model.safetensors", {"model.norm.weight", "lm_head.weight"});
  auto s = TensorStore::OpenDir(dir.path());
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->Names(), (std::vector<std::string>{"lm_head.weight", "model.norm.weight"}));
  EXPECT_EQ(s->description(), dir.path());
  auto t = s->Get("model.norm.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(s->Find("nope"), nullptr);
  auto missing = s->Get("model.layers.0.self_attn.q_proj.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing tensor \"model.layers.0.self_attn.q_proj.weight\""), std::string::npos);
  EXPECT_NE(missing.error().message.find(dir.path()), std::string::npos) << missing.error().message;
}

constexpr char kIndex[] = "model.safetensors.index.json";
constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

TEST(TensorStoreTest, ShardedTwoShards) {
  TempDir dir;
  dir.WriteShard(kShard1, {"a", "b"});
  dir.WriteShard(kShard2, {"c"});
  dir.WriteText(kIndex, std::string(R"({"metadata": {"total_size": 24}, "weight_map": {"a": ")") + kShard1 + R"(", "b": ")" + kShard1 +
                            R"(", "c": ")" + kShard2 + R"("}})");
  auto s = TensorStore::OpenDir(dir.path());
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->Names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s->Find("a")->file, dir.Path(kShard1));
  EXPECT_EQ(s->Find("c")->file, dir.Path(kShard2));
  EXPECT_EQ(s->Find("c")->nbytes, 8u);
}

TEST(TensorStoreTest, IndexNamesMissingShard) {
  TempDir dir;
  dir.WriteShard(kShard1, {"a"});
  dir.WriteText(kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"(", "c": ")" + kShard2 + R"("}})");
  ExpectOpenDirError(dir.path(), {"names shard \"" + std::string(kShard2) + "\" which does not exist", kIndex});
}

TEST(TensorStoreTest, TensorPresentInTwoShards) {
  TempDir dir;
  dir.WriteShard(kShard1, {"a", "b"});
  dir.WriteShard(kShard2, {"b", "c"});
  dir.WriteText(kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"(", "b": ")" + kShard1 + R"(", "c": ")" + kShard2 +
                            R"("}})");
  ExpectOpenDirError(dir.path(), {"tensor \"b\" is present in two shards", kShard1, kShard2});
}

TEST(TensorStoreTest, IndexListsTensorNotInNamedShard) {
  TempDir dir;
  dir.WriteShard(kShard1, {"a"});
  dir.WriteShard(kShard2, {"c"});
  // "z" exists nowhere.
  dir.WriteText(kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"(", "c": ")" + kShard2 + R"(", "z": ")" + kShard2 +
                            R"("}})");
  ExpectOpenDirError(dir.path(), {"tensor \"z\" is listed in shard \"" + std::string(kShard2) + "\" but not found there"});
  // "c" exists, but in the other shard than the index says.
  dir.WriteText(kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"(", "c": ")" + kShard1 + R"(", "x": ")" + kShard2 +
                            R"("}})");
  ExpectOpenDirError(dir.path(), {"tensor \"c\" is listed in shard \"" + std::string(kShard1) + "\" but stored in", kShard2});
}

TEST(TensorStoreTest, IndexShardNameWithPathTraversal) {
  TempDir dir;
  dir.WriteShard(kShard1, {"a"});
  for (const char* shard : {"../model.safetensors", "/etc/passwd", "sub/model.safetensors", "..", "."}) {
    dir.WriteText(kIndex, std::string(R"({"weight_map": {"a": ")") + shard + R"("}})");
    ExpectOpenDirError(dir.path(), {"is not a plain file name in the model directory", shard});
  }
}

TEST(TensorStoreTest, MalformedIndex) {
  TempDir dir;
  dir.WriteShard(kShard1, {"a"});
  dir.WriteText(kIndex, R"({"weight_map": {"a": ")");
  ExpectOpenDirError(dir.path(), {dir.Path(kIndex), "not valid JSON"});
  dir.WriteText(kIndex, R"({"metadata": {}})");
  ExpectOpenDirError(dir.path(), {dir.Path(kIndex), "\"weight_map\""});
  dir.WriteText(kIndex, R"({"weight_map": {"a": 3}})");
  ExpectOpenDirError(dir.path(), {"weight_map[\"a\"] is number"});
  dir.WriteText(kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"(", "a": ")" + kShard1 + R"("}})");
  ExpectOpenDirError(dir.path(), {"duplicate key \"a\""});
}

TEST(TensorStoreTest, CorruptShardErrorNamesTheShard) {
  TempDir dir;
  dir.WriteShard(kShard1, {"a"});
  dir.WriteBytes(kShard2, Image(R"({"c":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4));
  dir.WriteText(kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"(", "c": ")" + kShard2 + R"("}})");
  ExpectOpenDirError(dir.path(), {dir.Path(kShard2), "past the end of the data region"});
}

TEST(TensorStoreTest, PytorchPickleOnlyIsRefused) {
  TempDir dir;
  dir.WriteText("pytorch_model.bin", "PK\x03\x04 not really a zip");
  dir.WriteText("config.json", "{}");
  ExpectOpenDirError(dir.path(), {"pytorch_model.bin", "pickle", "execute arbitrary code", "safetensors"});
}

TEST(TensorStoreTest, EmptyAndNonexistentDirs) {
  TempDir dir;
  ExpectOpenDirError(dir.path(), {"no model.safetensors"});
  ExpectOpenDirError(dir.Path("does_not_exist"), {dir.Path("does_not_exist"), "not found or not a directory"});
  dir.WriteText("file", "x");
  ExpectOpenDirError(dir.Path("file"), {"not a directory"});
}

TEST(TensorStoreTest, OpenFilesDuplicateAcrossFiles) {
  TempDir dir;
  dir.WriteShard("x.safetensors", {"w"});
  dir.WriteShard("y.safetensors", {"w"});
  auto r = TensorStore::OpenFiles({dir.Path("x.safetensors"), dir.Path("y.safetensors")});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tensor \"w\" is present in two shards"), std::string::npos) << r.error().message;
}

// ---------------------------------------------------------------------------------------------
// The real shared models (shared/ sits beside the repository, as in CI).

uint16_t U16At(const uint8_t* p, size_t i) { return static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)); }
uint32_t U32At(const uint8_t* p, size_t i) {
  uint32_t v = 0;
  for (int b = 3; b >= 0; --b) v = (v << 8) | p[4 * i + static_cast<size_t>(b)];
  return v;
}

void ExpectShape(const TensorStore& s, const std::string& name, std::vector<int64_t> shape, DType dtype) {
  auto t = s.Get(name);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ((*t)->shape, shape) << name << " is " << (*t)->ShapeString();
  EXPECT_EQ((*t)->dtype, dtype) << name << " is " << DTypeName((*t)->dtype);
  EXPECT_EQ((*t)->nbytes, static_cast<size_t>((*t)->numel()) * DTypeSize(dtype)) << name;
}

void CheckProseLlama7m(const std::string& dir) {
  ASSERT_TRUE(IsDirectory(dir)) << dir << " missing";
  auto s = TensorStore::OpenDir(dir);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->Names().size(), 57u);
  ExpectShape(*s, "model.layers.0.self_attn.q_proj.weight", {256, 256}, DType::kBF16);
  ExpectShape(*s, "model.layers.0.self_attn.k_proj.weight", {128, 256}, DType::kBF16);
  ExpectShape(*s, "model.layers.5.mlp.down_proj.weight", {256, 768}, DType::kBF16);
  ExpectShape(*s, "model.embed_tokens.weight", {4096, 256}, DType::kBF16);
  ExpectShape(*s, "lm_head.weight", {4096, 256}, DType::kBF16);  // untied
  int64_t params = 0;
  for (const auto& n : s->Names()) params += s->Find(n)->numel();
  EXPECT_EQ(params, 6819072);  // README
  // First elements of q_proj, read independently (python struct) from the same file.
  const uint8_t* q = s->Find("model.layers.0.self_attn.q_proj.weight")->data;
  EXPECT_EQ(U16At(q, 0), 0x3dbbu);
  EXPECT_EQ(U16At(q, 1), 0x3d7au);
  EXPECT_EQ(U16At(q, 2), 0xbd88u);
  EXPECT_EQ(U16At(q, 3), 0x3d9au);
  EXPECT_FLOAT_EQ(Bf16ToF32(U16At(q, 2)), -0.06640625f);
}

// shared/ must sit beside the repository (as in CI).
TEST(SharedModels, ProseLlama7mBf16) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m");
  CheckProseLlama7m(nibble_test::SharedModel("prose-llama-7m"));
}

// The copy embedded in the repository is the same model.
TEST(SharedModels, EmbeddedProseLlama7mBf16) { CheckProseLlama7m(nibble_test::EmbeddedModel()); }

TEST(SharedModels, Stories260KF32) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  const std::string dir = nibble_test::SharedModel("stories260K");
  ASSERT_TRUE(IsDirectory(dir)) << dir << " missing: shared/ must sit beside the repository";
  auto s = TensorStore::OpenDir(dir);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->Names().size(), 47u);
  EXPECT_EQ(s->Find("lm_head.weight"), nullptr);  // tied to the embeddings
  ExpectShape(*s, "model.embed_tokens.weight", {512, 64}, DType::kF32);
  ExpectShape(*s, "model.layers.0.self_attn.q_proj.weight", {64, 64}, DType::kF32);
  ExpectShape(*s, "model.layers.0.self_attn.k_proj.weight", {32, 64}, DType::kF32);
  ExpectShape(*s, "model.layers.0.mlp.gate_proj.weight", {172, 64}, DType::kF32);
  int64_t params = 0;
  for (const auto& n : s->Names()) params += s->Find(n)->numel();
  EXPECT_EQ(params, 260032);
  const uint8_t* q = s->Find("model.layers.0.self_attn.q_proj.weight")->data;
  EXPECT_EQ(U32At(q, 0), 0x3d35d536u);
  EXPECT_EQ(U32At(q, 1), 0x3da352c4u);
}

}  // namespace
}  // namespace nibble
