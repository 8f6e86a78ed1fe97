// StagingDir (io/staging_dir.h): outputs appear whole or not at all, a directory that is not a
// model directory is never replaced, and `nibble synth` goes through it.
#include "io/staging_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/bench.h"

#include "test_paths.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using nibble_test::TempDir;

void WriteText(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
}

std::string ReadText(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Entries of `dir` other than `keep`.
std::vector<std::string> Others(const fs::path& dir, const std::string& keep) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != keep) out.push_back(e.path().filename().string());
  return out;
}

TEST(StagingDir, CommitRenamesOntoTheTargetAndLeavesNothingElse) {
  TempDir t;
  const fs::path out = fs::path(t.path()) / "out";
  auto s = nibble::StagingDir::Create(out.string());
  ASSERT_TRUE(s.ok()) << s.error().message;
  nibble::StagingDir st = std::move(s).value();
  EXPECT_EQ(fs::path(st.path()).parent_path(), fs::path(t.path()));
  WriteText(fs::path(st.path()) / "config.json", "{}");
  EXPECT_FALSE(fs::exists(out));  // nothing at the target until Commit
  ASSERT_TRUE(st.Commit(false).ok());
  EXPECT_EQ(ReadText(out / "config.json"), "{}");
  EXPECT_TRUE(Others(fs::path(t.path()), "out").empty());
  EXPECT_FALSE(st.Commit(false).ok());  // a second Commit is an error, not a crash
}

TEST(StagingDir, UncommittedIsRemovedAndTheTargetNeverAppears) {
  TempDir t;
  const fs::path out = fs::path(t.path()) / "out";
  {
    auto s = nibble::StagingDir::Create(out.string());
    ASSERT_TRUE(s.ok());
    nibble::StagingDir st = std::move(s).value();
    WriteText(fs::path(st.path()) / "model.safetensors", "partial");
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(Others(fs::path(t.path()), "").empty());
}

TEST(StagingDir, NeverReplacesADirectoryThatIsNotAModelDirectory) {
  TempDir t;
  const fs::path out = fs::path(t.path()) / "home";
  fs::create_directory(out);
  WriteText(out / "notes.txt", "keep me");
  auto s = nibble::StagingDir::Create(out.string());
  ASSERT_TRUE(s.ok());
  nibble::StagingDir st = std::move(s).value();
  WriteText(fs::path(st.path()) / "config.json", "{}");
  const nibble::Status r = st.Commit(/*overwrite=*/true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not a model directory"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(out.string()), std::string::npos) << r.error().message;
  EXPECT_EQ(ReadText(out / "notes.txt"), "keep me");
  // A file at the target is refused too.
  const fs::path file = fs::path(t.path()) / "file";
  WriteText(file, "x");
  auto s2 = nibble::StagingDir::Create(file.string());
  ASSERT_TRUE(s2.ok());
  nibble::StagingDir st2 = std::move(s2).value();
  EXPECT_FALSE(st2.Commit(true).ok());
  EXPECT_EQ(ReadText(file), "x");
}

TEST(StagingDir, ReplacesAModelDirectoryOnlyWithOverwrite) {
  TempDir t;
  const fs::path out = fs::path(t.path()) / "model";
  fs::create_directory(out);
  WriteText(out / "config.json", "old");
  WriteText(out / "old.safetensors", "old");
  auto s = nibble::StagingDir::Create(out.string());
  ASSERT_TRUE(s.ok());
  nibble::StagingDir st = std::move(s).value();
  WriteText(fs::path(st.path()) / "config.json", "new");
  const nibble::Status no = st.Commit(false);
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.error().message.find("--overwrite"), std::string::npos) << no.error().message;
  EXPECT_EQ(ReadText(out / "config.json"), "old");
  ASSERT_TRUE(st.Commit(true).ok());
  EXPECT_EQ(ReadText(out / "config.json"), "new");
  EXPECT_FALSE(fs::exists(out / "old.safetensors"));
  EXPECT_TRUE(Others(fs::path(t.path()), "model").empty());
}

TEST(StagingDir, KindsForTheSameTargetDoNotCollideAndMissingParentIsAnError) {
  TempDir t;
  const fs::path out = fs::path(t.path()) / "out";
  auto a = nibble::StagingDir::Create(out.string(), "a");
  auto b = nibble::StagingDir::Create(out.string(), "b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a.value().path(), b.value().path());
  EXPECT_TRUE(fs::is_directory(a.value().path()));
  EXPECT_TRUE(fs::is_directory(b.value().path()));
  auto bad = nibble::StagingDir::Create((fs::path(t.path()) / "no" / "such" / "out").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("does not exist"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(nibble::StagingDir::Create("").ok());
}

// `nibble synth --overwrite` used to remove the output directory before writing: pointed at a
// directory that is not a model directory, it deleted its contents.
// Entries beside the target whose names are shorter than the staging prefix are skipped without
// reading past them (under ASan the old order read past the name's end); a dead run's directory
// holding the marker is found, one without it is not.
TEST(StagingDir, FindInterruptedSkipsShortNamesAndFindsTheDeadRunWithItsMarker) {
  TempDir tmp;
  const fs::path dir(tmp.path());
  fs::create_directory(dir / "a");
  WriteText(dir / "b", "x");
  const std::string target = (dir / "out").string();
  EXPECT_EQ(nibble::StagingDir::FindInterrupted(target, "quantize", "manifest.json"), "");
  // pid 0 is no running process of ours: an interrupted run.
  const fs::path dead = dir / ".out.nibble-quantize-0";
  fs::create_directory(dead);
  EXPECT_EQ(nibble::StagingDir::FindInterrupted(target, "quantize", "manifest.json"), "");
  WriteText(dead / "manifest.json", "{}");
  EXPECT_EQ(nibble::StagingDir::FindInterrupted(target, "quantize", "manifest.json"), dead.string());
}

TEST(SynthOutput, OverwriteNeverRemovesANonModelDirectoryAndReplacesAModelOne) {
  TempDir t;
  const fs::path cfg = fs::path(t.path()) / "config.json";
  WriteText(cfg,
            R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,)"
            R"("intermediate_size":128,"num_hidden_layers":1,"num_attention_heads":4,)"
            R"("num_key_value_heads":2,"vocab_size":512,"rms_norm_eps":1e-5,"max_position_embeddings":64})");
  const fs::path victim = fs::path(t.path()) / "victim";
  fs::create_directory(victim);
  WriteText(victim / "notes.txt", "keep me");
  for (const char* format : {"dense", "quark"}) {
    nibble::SynthRequest q;
    q.config_path = cfg.string();
    q.out_dir = victim.string();
    q.format = format;
    q.tokenizer_dir = "";
    q.group_size = 64;
    q.overwrite = true;
    const nibble::Status r = nibble::WriteSyntheticCheckpoint(q);
    EXPECT_FALSE(r.ok()) << format;
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find("not a model directory"), std::string::npos) << r.error().message;
    }
    EXPECT_EQ(ReadText(victim / "notes.txt"), "keep me") << format;
    EXPECT_EQ(Others(fs::path(t.path()), "victim"), std::vector<std::string>{"config.json"}) << format;  // no staging left
  }
  // A model directory is replaced with --overwrite, refused without.
  const fs::path model = fs::path(t.path()) / "model";
  nibble::SynthRequest q;
  q.config_path = cfg.string();
  q.out_dir = model.string();
  q.format = "dense";
  q.tokenizer_dir = "";
  ASSERT_TRUE(nibble::WriteSyntheticCheckpoint(q).ok());
  EXPECT_TRUE(fs::exists(model / "model.safetensors"));
  EXPECT_FALSE(nibble::WriteSyntheticCheckpoint(q).ok());
  q.format = "quark";
  q.group_size = 64;
  q.overwrite = true;
  const nibble::Status r = nibble::WriteSyntheticCheckpoint(q);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(ReadText(model / "config.json").find("quantization_config"), std::string::npos);
  std::vector<std::string> left = Others(fs::path(t.path()), "");
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"config.json", "model", "victim"}));
}

}  // namespace
