// The packed-weight cache (LoadOptions::weight_cache, src/model/weight_cache.h): a load that
// packs into a new entry and a load that reads it (copied or mapped) give logits bit-identical to
// a load without the cache, for a checkpoint repacked from its stored words (Quark) and one decoded first with an
// act-order g_idx (GPTQ); a changed checkpoint, a broken entry, an unwritable directory, a file
// size limit met part-way and a killed writer's staging file each end in a correct model.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nibble/model.h>
#include <nibble/quantize.h>

#include "api/load_or_fail.h"
#include "test_paths.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace {

using nibble_test::TempDir;

nibble::LoadOptions CacheIn(const std::string& dir, nibble::WeightCachePages pages = nibble::WeightCachePages::kMapped) {
  nibble::LoadOptions o;
  o.weight_cache_dir = dir;
  o.weight_cache_min_bytes = 0;
  o.weight_cache_pages = pages;
  return o;
}

std::vector<float> LogitsOf(const nibble::Model& m) {
  auto ids = m.Tokenize("Once upon a time there was a little dog who");
  EXPECT_TRUE(ids.ok());
  auto l = m.Logits(*ids);
  EXPECT_TRUE(l.ok()) << l.error().message;
  return l.ok() ? *l : std::vector<float>{};
}

bool HasNote(const nibble::ModelInfo& i, const std::string& piece) {
  for (const std::string& w : i.warnings)
    if (w.find(piece) != std::string::npos) return true;
  return false;
}

// The logits of `model` loaded without the cache (empty, with a failure recorded, if it does not load).
std::vector<float> UncachedLogits(const std::string& model) {
  nibble::LoadOptions off;
  off.weight_cache = false;
  auto plain = nibble_test::LoadOrFail(model, off);
  return plain != nullptr ? LogitsOf(*plain) : std::vector<float>{};
}

// Packs into an entry, then reads it back (copied or mapped: `pages` for both loads): both
// bit-identical to no cache. Returns the entry's path.
std::string CheckMissThenHit(const std::string& model, const std::string& cache_dir,
                             nibble::WeightCachePages pages = nibble::WeightCachePages::kMapped) {
  nibble::LoadOptions off;
  off.weight_cache = false;
  auto plain = nibble_test::LoadOrFail(model, off);
  if (plain == nullptr) return "";
  EXPECT_EQ(plain->info().weight_cache, "");
  const std::vector<float> want = LogitsOf(*plain);
  auto packed = nibble_test::LoadOrFail(model, CacheIn(cache_dir, pages));
  if (packed == nullptr) return "";
  EXPECT_FALSE(packed->info().weight_cache_hit);
  EXPECT_NE(packed->info().weight_cache, "");
  EXPECT_EQ(LogitsOf(*packed), want);
  auto mapped = nibble_test::LoadOrFail(model, CacheIn(cache_dir, pages));
  if (mapped == nullptr) return "";
  EXPECT_TRUE(mapped->info().weight_cache_hit);
  EXPECT_EQ(mapped->info().weight_cache, packed->info().weight_cache);
  EXPECT_EQ(mapped->info().int4_linears, plain->info().int4_linears);
  EXPECT_EQ(LogitsOf(*mapped), want);
  EXPECT_NE(nibble::LoadSummary(mapped->info()).find("read from " + mapped->info().weight_cache), std::string::npos);
  return mapped->info().weight_cache;
}

TEST(WeightCache, MappedEntryGivesTheLogitsOfRepacking) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  EXPECT_NE(CheckMissThenHit(model, tmp.sub("cache"), nibble::WeightCachePages::kMapped), "");
}

// Owned pages: packed into memory and written to the entry, then read back into memory.
TEST(WeightCache, CopiedEntryGivesTheLogitsOfRepacking) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  EXPECT_NE(CheckMissThenHit(model, tmp.sub("cache"), nibble::WeightCachePages::kOwned), "");
}

// An entry written with one kind of pages reads back with the other: the file is the same.
TEST(WeightCache, EntryReadsBackWithEitherKindOfPages) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  const std::vector<float> want = UncachedLogits(model);
  ASSERT_FALSE(want.empty());
  using P = nibble::WeightCachePages;
  for (const auto& [write, read] : {std::pair{P::kOwned, P::kMapped}, std::pair{P::kMapped, P::kOwned}}) {
    const std::string dir = tmp.sub(write == P::kOwned ? "cache-owned" : "cache-mapped");
    auto first = nibble_test::LoadOrFail(model, CacheIn(dir, write));
    ASSERT_NE(first, nullptr);
    EXPECT_FALSE(first->info().weight_cache_hit);
    auto second = nibble_test::LoadOrFail(model, CacheIn(dir, read));
    ASSERT_NE(second, nullptr);
    EXPECT_TRUE(second->info().weight_cache_hit);
    EXPECT_EQ(LogitsOf(*second), want);
  }
}

TEST(WeightCache, ActOrderColumnsComeBackFromTheEntry) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  TempDir tmp;
  nibble_test::WriteTinyModel(tmp.sub("m"), nibble_test::TinyLlamaSpec{});
  auto req = nibble_test::TinyCalibRequest("gptq", tmp.sub("m"), tmp.sub("q"), nibble_test::TinyCalibFile(tmp.sub("calib.txt")));
  req.actorder = "group";
  req.model_export = "gptq";
  const auto q = nibble::Quantize(req);
  ASSERT_TRUE(q.ok()) << q.error().message;
  const std::string entry = CheckMissThenHit(tmp.sub("q"), tmp.sub("cache"));
  auto m = nibble_test::LoadOrFail(tmp.sub("q"), CacheIn(tmp.sub("cache")));
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(HasNote(m->info(), "act-order")) << "the test needs act-order linears";
}

TEST(WeightCache, ChangedCheckpointGetsANewEntryAndTheOldOneGoes) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  const std::string old_entry = CheckMissThenHit(model, tmp.sub("cache"));
  ASSERT_NE(old_entry, "");
  // A new modification time on config.json: the same bytes, but the entry no longer vouches for them.
  const struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (model + "/config.json").c_str(), times, 0), 0);
  auto m = nibble_test::LoadOrFail(model, CacheIn(tmp.sub("cache")));
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->info().weight_cache_hit);
  EXPECT_NE(m->info().weight_cache, old_entry);
  EXPECT_FALSE(std::filesystem::exists(old_entry));
  auto again = nibble_test::LoadOrFail(model, CacheIn(tmp.sub("cache")));
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->info().weight_cache_hit);
}

TEST(WeightCache, BrokenEntryIsIgnoredAndWrittenAgain) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  const std::string entry = CheckMissThenHit(model, tmp.sub("cache"));
  ASSERT_NE(entry, "");
  nibble::LoadOptions off;
  off.weight_cache = false;
  auto plain = nibble_test::LoadOrFail(model, off);
  ASSERT_NE(plain, nullptr);
  const std::vector<float> want = LogitsOf(*plain);
  const auto size = std::filesystem::file_size(entry);
  for (const auto& [what, bytes] : std::vector<std::pair<std::string, uintmax_t>>{{"truncated", size / 2}, {"header only", 4096}, {"empty", 0}}) {
    std::filesystem::resize_file(entry, bytes);
    auto m = nibble_test::LoadOrFail(model, CacheIn(tmp.sub("cache")));
    ASSERT_NE(m, nullptr) << what;
    EXPECT_FALSE(m->info().weight_cache_hit) << what;
    EXPECT_TRUE(HasNote(m->info(), "weight cache entry ignored")) << what;
    EXPECT_EQ(LogitsOf(*m), want) << what;
    EXPECT_EQ(std::filesystem::file_size(entry), size) << what << ": written again";
  }
  // A header naming another key (the same size): ignored too.
  {
    std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
    std::string head(4096, '\0');
    f.read(head.data(), 4096);
    const size_t key_at = head.find('\n', 11) - 64;  // the key ends the header's second line
    f.seekp(static_cast<std::streamoff>(key_at));
    f.write(head[key_at] == 'a' ? "b" : "a", 1);
  }
  auto m = nibble_test::LoadOrFail(model, CacheIn(tmp.sub("cache")));
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->info().weight_cache_hit);
  EXPECT_EQ(LogitsOf(*m), want);
}

TEST(WeightCache, UnwritableDirectoryLoadsWithoutTheCache) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  const std::string file = tmp.Write("not_a_dir", "x");
  auto m = nibble_test::LoadOrFail(model, CacheIn(file + "/cache"));
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->info().weight_cache, "");
  EXPECT_TRUE(HasNote(m->info(), "weight cache not used: cannot create " + file + "/cache"));
}

TEST(WeightCache, StagingFileOfAGoneProcessIsRemoved) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  std::filesystem::create_directories(tmp.sub("cache"));
  const std::string stale = tmp.Write("cache/0123-4567.w4p.tmp-" + std::to_string(child), "half");
  const std::string live = tmp.Write("cache/89ab-cdef.w4p.tmp-" + std::to_string(::getpid()), "in progress");
  auto m = nibble_test::LoadOrFail(model, CacheIn(tmp.sub("cache")));
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live));
}

// A file-size limit (RLIMIT_FSIZE, soft, lifted again after the load) met part-way through
// packing: the entry is dropped, and the linears already written (kMapped: moved onto the dropped
// file's pages) and those packed after it into owned memory give the logits of no cache.
TEST(WeightCache, EntryDroppedPartWayLeavesACorrectModel) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  const std::vector<float> want = UncachedLogits(model);
  ASSERT_FALSE(want.empty());
  using P = nibble::WeightCachePages;
  for (const P pages : {P::kMapped, P::kOwned}) {
    SCOPED_TRACE(pages == P::kMapped ? "mapped" : "owned");
    const std::string dir = tmp.sub(pages == P::kMapped ? "cache-mapped" : "cache-owned");
    rlimit before{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
    rlimit lim = before;
    lim.rlim_cur = 600 << 10;  // the header and about one decoder layer (~420 KB)
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
    auto m = nibble::Model::Load(model, CacheIn(dir, pages));
    ::setrlimit(RLIMIT_FSIZE, &before);
    std::signal(SIGXFSZ, old_handler);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_FALSE((*m)->info().weight_cache_hit);
    EXPECT_TRUE(HasNote((*m)->info(), "not written"));
    EXPECT_EQ(LogitsOf(**m), want);
    for (const auto& e : std::filesystem::directory_iterator(dir)) ADD_FAILURE() << "left behind: " << e.path();
  }
}

TEST(WeightCache, SmallCheckpointsAndDenseOnesAreNotCached) {
  TempDir tmp;
  const std::string model = nibble_test::QuantizedEmbeddedModel(tmp);
  nibble::LoadOptions o;
  o.weight_cache_dir = tmp.sub("cache");  // default min_bytes: far above this 7M model
  auto small = nibble_test::LoadOrFail(model, o);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->info().weight_cache, "");
  auto dense = nibble_test::LoadOrFail(nibble_test::EmbeddedModel(), CacheIn(tmp.sub("cache")));
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->info().weight_cache, "");
  EXPECT_FALSE(std::filesystem::exists(tmp.sub("cache")) && !std::filesystem::is_empty(tmp.sub("cache")));
}

}  // namespace
