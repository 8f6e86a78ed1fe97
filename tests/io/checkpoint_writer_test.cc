// CheckpointWriter (io/checkpoint_writer.h): owned tensors leave memory at Add (spooled to disk),
// tensors finished out of order are spooled and added in order later, and the shards are the same
// bytes as the in-memory serialization of the same tensors split greedily at max_shard_size; a
// laid-out writer (LayOut) gives the same shards with no spool, refuses a tensor other than the
// laid-out one, and resumes from a saved state with its open shard cut back and checked.
#include "io/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/staging_dir.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using nibble_test::TempDir;

std::string FileBytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// An owned F32 tensor of `n` values i * 0.5 + seed.
nibble::TensorToWrite Owned(const std::string& name, int64_t n, float seed) {
  nibble::TensorToWrite t;
  t.name = name;
  t.dtype = nibble::DType::kF32;
  t.shape = {n};
  t.bytes.resize(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i) * 0.5f + seed;
    std::memcpy(t.bytes.data() + 4 * i, &v, 4);
  }
  return t;
}

// The expected shards, independently of the writer: consecutive tensors while they fit
// `max_bytes` (a tensor alone may exceed it), each serialized in memory.
std::vector<std::string> ReferenceShards(const std::vector<nibble::TensorToWrite>& ts, int64_t max_bytes) {
  std::vector<std::vector<const nibble::TensorToWrite*>> groups(1);
  int64_t bytes = 0;
  for (const auto& t : ts) {
    const int64_t b = static_cast<int64_t>(t.data().size());
    if (!groups.back().empty() && bytes + b > max_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(&t);
    bytes += b;
  }
  std::vector<std::string> out;
  for (const auto& g : groups) {
    auto img = nibble::SerializeSafetensors(g, {{"format", "pt"}});
    EXPECT_TRUE(img.ok());
    out.emplace_back(img->begin(), img->end());
  }
  return out;
}

TEST(CheckpointWriter, SpooledOutOfOrderTensorsGiveTheInMemoryShardsAndTheSpoolIsGone) {
  TempDir tmp;
  const fs::path out = fs::path(tmp.path()) / "out";
  // Output order a0 a1 b0 b1 b2 c0; the b* tensors are finished first (as a layer "model.layers.2"
  // is before "model.layers.10" sorts ahead of it), c0 is borrowed.
  std::vector<nibble::TensorToWrite> ref = {Owned("a0", 300, 1), Owned("a1", 10, 2), Owned("b0", 200, 3),
                                            Owned("b1", 0, 4), Owned("b2", 120, 5), Owned("c0", 64, 6)};
  const int64_t max_shard = 1400;  // bytes: shards a0 a1 (1240) | b0 b1 b2 (1280) | c0 (256)
  auto w = nibble::CheckpointWriter::Create(out.string(), max_shard);
  ASSERT_TRUE(w.ok()) << w.error().message;
  const std::vector<uint8_t> c0_bytes = ref[5].bytes;
  std::vector<std::pair<const uint8_t*, size_t>> released;
  w->SetAfterBorrowedWritten([&](const uint8_t* p, size_t n) { released.emplace_back(p, n); });
  std::vector<nibble::CheckpointWriter::Spooled> early;
  for (int i : {2, 3, 4}) {
    auto s = w->Spool(ref[i]);
    ASSERT_TRUE(s.ok()) << s.error().message;
    early.push_back(std::move(s).value());
  }
  ASSERT_TRUE(fs::exists(fs::path(w->path()) / "tensors.spool"));
  ASSERT_TRUE(w->Add(Owned("a0", 300, 1)).ok());
  ASSERT_TRUE(w->Add(Owned("a1", 10, 2)).ok());
  for (auto& s : early) ASSERT_TRUE(w->Add(std::move(s)).ok());
  nibble::TensorToWrite c0;
  c0.name = "c0";
  c0.dtype = nibble::DType::kF32;
  c0.shape = {64};
  c0.borrowed = c0_bytes.data();
  c0.borrowed_size = c0_bytes.size();
  ASSERT_TRUE(w->Add(std::move(c0)).ok());
  const std::string staging = w->path();
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_FALSE(fs::exists(fs::path(staging) / "tensors.spool"));
  ASSERT_TRUE(w->Commit(false).ok());
  const std::vector<std::string> want = ReferenceShards(ref, max_shard);
  ASSERT_EQ(w->shards(), static_cast<int64_t>(want.size()));
  ASSERT_GE(want.size(), 2u);
  for (size_t i = 0; i < want.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, want.size());
    EXPECT_EQ(FileBytes(out / name), want[i]) << name;
  }
  EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  ASSERT_EQ(released.size(), 1u);  // the borrowed tensor, once its shard was written
  EXPECT_EQ(released[0].first, c0_bytes.data());
  EXPECT_EQ(released[0].second, c0_bytes.size());
}

TEST(CheckpointWriter, OneShardIsModelSafetensorsWithoutIndex) {
  TempDir tmp;
  const fs::path out = fs::path(tmp.path()) / "out";
  std::vector<nibble::TensorToWrite> ref = {Owned("x", 5, 0), Owned("y", 7, 1)};
  auto w = nibble::CheckpointWriter::Create(out.string(), 1 << 20);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Add(Owned("x", 5, 0)).ok());
  ASSERT_TRUE(w->Add(Owned("y", 7, 1)).ok());
  ASSERT_TRUE(w->Finish().ok());
  ASSERT_TRUE(w->Commit(false).ok());
  EXPECT_EQ(FileBytes(out / "model.safetensors"), ReferenceShards(ref, 1 << 20)[0]);
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
  for (const auto& e : fs::directory_iterator(out)) EXPECT_EQ(e.path().filename(), "model.safetensors");
}

TEST(CheckpointWriter, AnUnfinishedWriterLeavesNoOutputAndNoSpool) {
  TempDir tmp;
  const fs::path out = fs::path(tmp.path()) / "out";
  {
    auto w = nibble::CheckpointWriter::Create(out.string(), 64);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Add(Owned("x", 40, 0)).ok());
    ASSERT_TRUE(w->Add(Owned("y", 40, 0)).ok());  // x's shard written
  }
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

// The layout of `ts`: each tensor's name, dtype and shape.
std::vector<nibble::TensorSlot> Slots(const std::vector<nibble::TensorToWrite>& ts) {
  std::vector<nibble::TensorSlot> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

// A copy of `t`: borrowed from `t`'s bytes when `borrow`, else owned.
nibble::TensorToWrite Copy(const nibble::TensorToWrite& t, bool borrow) {
  nibble::TensorToWrite c{t.name, t.dtype, t.shape, {}, nullptr, 0};
  if (borrow) {
    c.borrowed = t.bytes.data();
    c.borrowed_size = t.bytes.size();
  } else {
    c.bytes = t.bytes;
  }
  return c;
}

// The six tensors of the spool test above, shards a0 a1 | b0 b1 b2 | c0 at 1400 bytes.
std::vector<nibble::TensorToWrite> SixTensors() {
  return {Owned("a0", 300, 1), Owned("a1", 10, 2), Owned("b0", 200, 3), Owned("b1", 0, 4), Owned("b2", 120, 5), Owned("c0", 64, 6)};
}

void ExpectShards(const fs::path& out, const std::vector<std::string>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, want.size());
    EXPECT_EQ(FileBytes(out / name), want[i]) << name;
  }
}

TEST(CheckpointWriter, LaidOutWritesTheSameShardsWithoutASpool) {
  TempDir tmp;
  const fs::path out = fs::path(tmp.path()) / "out";
  const std::vector<nibble::TensorToWrite> ref = SixTensors();
  auto w = nibble::CheckpointWriter::Create(out.string(), 1400);
  ASSERT_TRUE(w.ok()) << w.error().message;
  ASSERT_TRUE(w->LayOut(Slots(ref)).ok());
  std::vector<const uint8_t*> released;
  w->SetAfterBorrowedWritten([&](const uint8_t* p, size_t) { released.push_back(p); });
  const std::string staging = w->path();
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(w->Add(Copy(ref[i], i == 1 || i == 2 || i == 5)).ok()) << i;
    EXPECT_FALSE(fs::exists(fs::path(staging) / "tensors.spool")) << i;
  }
  ASSERT_TRUE(w->Finish().ok());
  ASSERT_TRUE(w->Commit(false).ok());
  const std::vector<std::string> want = ReferenceShards(ref, 1400);
  ASSERT_EQ(w->shards(), 3);
  ExpectShards(out, want);
  EXPECT_EQ(released, (std::vector<const uint8_t*>{ref[1].bytes.data(), ref[2].bytes.data(), ref[5].bytes.data()}));
}

TEST(CheckpointWriter, LaidOutRefusesATensorOutOfItsLayout) {
  TempDir tmp;
  const std::vector<nibble::TensorToWrite> ref = SixTensors();
  auto w = nibble::CheckpointWriter::Create((fs::path(tmp.path()) / "out").string(), 1400);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->LayOut(Slots(ref)).ok());
  EXPECT_FALSE(w->LayOut(Slots(ref)).ok());
  ASSERT_TRUE(w->Add(Copy(ref[0], false)).ok());
  auto wrong_name = w->Add(Copy(ref[2], false));
  ASSERT_FALSE(wrong_name.ok());
  EXPECT_EQ(wrong_name.error().code, nibble::ErrorCode::kInternal);
  EXPECT_NE(wrong_name.error().message.find("was given tensor b0"), std::string::npos) << wrong_name.error().message;
  EXPECT_NE(wrong_name.error().message.find("the layout has a1 F32 [10]"), std::string::npos) << wrong_name.error().message;
  nibble::TensorToWrite wrong_shape = Owned("a1", 11, 2);
  EXPECT_FALSE(w->Add(std::move(wrong_shape)).ok());
  auto early = w->Finish();
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.error().message.find("was given 1 of its 6 tensors"), std::string::npos) << early.error().message;
  EXPECT_FALSE(w->Spool(ref[1]).ok());
}

// A laid-out resumable writer stopped after a boundary (its state saved with shard 0 written and
// b0 in the open shard) that went on writing b1 and b2 before it died: a writer resumed from the
// state and laid out again cuts the open shard back to b0 and writes the same shards.
TEST(CheckpointWriter, LaidOutResumesFromItsSavedStateByteIdentical) {
  TempDir tmp;
  const fs::path out = fs::path(tmp.path()) / "out";
  const std::vector<nibble::TensorToWrite> ref = SixTensors();
  nlohmann::ordered_json state;
  std::string staging;
  {
    auto w = nibble::CheckpointWriter::Create(out.string(), 1400);
    ASSERT_TRUE(w.ok());
    w->SetResumable();
    ASSERT_TRUE(w->LayOut(Slots(ref)).ok());
    for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(w->Add(Copy(ref[i], false)).ok());
    auto st = w->SaveState();
    ASSERT_TRUE(st.ok()) << st.error().message;
    state = *st;
    for (size_t i = 3; i < 6; ++i) ASSERT_TRUE(w->Add(Copy(ref[i], false)).ok());  // past the boundary
    staging = w->path();
    w->KeepStaging();
  }
  ASSERT_TRUE(fs::exists(fs::path(staging) / "shard-2.safetensors.partial"));
  const std::string open = (fs::path(staging) / "shard-1.safetensors.partial").string();
  auto resume = [&]() -> nibble::Result<nibble::CheckpointWriter> {
    NIBBLE_ASSIGN_OR_RETURN(nibble::StagingDir dir, nibble::StagingDir::Adopt(out.string(), "tmp", staging));
    dir.Keep();
    auto no_borrow = [](const std::string& n) -> nibble::Result<nibble::TensorToWrite> { return nibble::MakeError("borrow ", n); };
    NIBBLE_ASSIGN_OR_RETURN(nibble::CheckpointWriter w, nibble::CheckpointWriter::Resume(std::move(dir), 1400, state, no_borrow));
    NIBBLE_RETURN_IF_ERROR(w.LayOut(Slots(ref)));
    return w;
  };
  {  // a changed byte in the open shard's kept prefix (b0's last; b2 follows it) is named
    const std::string good = FileBytes(open);
    std::string bytes = good;
    bytes[bytes.size() - 120 * 4 - 1] ^= 1;
    std::ofstream(open, std::ios::binary | std::ios::trunc) << bytes;
    auto bad = resume();
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().code, nibble::ErrorCode::kCorruptInput);
    EXPECT_NE(bad.error().message.find(open), std::string::npos) << bad.error().message;
    std::ofstream(open, std::ios::binary | std::ios::trunc) << good;
  }
  auto w = resume();
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_FALSE(fs::exists(fs::path(staging) / "shard-2.safetensors.partial"));
  for (size_t i = 3; i < 6; ++i) ASSERT_TRUE(w->Add(Copy(ref[i], i == 5)).ok());
  w->KeepStaging(false);
  ASSERT_TRUE(w->Finish().ok());
  ASSERT_TRUE(w->Commit(false).ok());
  ExpectShards(out, ReferenceShards(ref, 1400));
}

TEST(CheckpointWriter, AnUnfinishedLaidOutWriterLeavesNothing) {
  TempDir tmp;
  {
    auto w = nibble::CheckpointWriter::Create((fs::path(tmp.path()) / "out").string(), 1400);
    ASSERT_TRUE(w.ok());
    const std::vector<nibble::TensorToWrite> ref = SixTensors();
    ASSERT_TRUE(w->LayOut(Slots(ref)).ok());
    for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(w->Add(Copy(ref[i], false)).ok());
  }
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

}  // namespace
