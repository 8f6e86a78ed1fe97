// quantize --resume: a run stopped after a finished decoder layer (SIGKILL at a random layer,
// SIGTERM, a write that fails) continues from its last boundary and writes, file for file, the
// bytes of an uninterrupted run (RTN, AWQ, GPTQ, AWQ+GPTQ; resumed at another thread count); a
// resume whose flags, input or staged files differ is refused naming what differs.
// The kill point comes from NIBBLE_QUANTIZE_KILL_AFTER_LAYER (quantize/resume.h): the process
// SIGKILLs itself at its first export after that boundary, so the staged files already run past
// it. The layers are drawn from a printed seed (NIBBLE_TEST_SEED replays one).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nibble/nibble.h>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nibble_test::ReadFile;

using nibble_test::HashDir;
using nibble_test::SpawnOptions;
using nibble_test::WaitExit;

// The kill point of a run (NIBBLE_QUANTIZE_KILL_AFTER_LAYER).
SpawnOptions KillAfter(const std::string& layer) {
  SpawnOptions o;
  o.env = {{"NIBBLE_QUANTIZE_KILL_AFTER_LAYER", layer}};
  return o;
}

// Runs `nibble ARGS` with stdout and stderr to `log`: its exit code, or -signal.
int RunQ(const std::vector<std::string>& args, const std::string& log, SpawnOptions o = {}) {
  o.log = log;
  return WaitExit(nibble_test::SpawnNibble(args, o));
}

// The staging directories of output `name` in `parent` (".name.nibble-tmp-<pid>").
std::vector<std::string> Staging(const std::string& parent, const std::string& name) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(parent))
    if (e.path().filename().string().starts_with("." + name + ".nibble-tmp-")) out.push_back(e.path().string());
  return out;
}

// 4 x 64 calibration tokens of prose-calib.txt; 1 MB shards, so finished shards, the open one and
// the spool all carry state across the boundary.
std::vector<std::string> Args(const std::string& algo, const std::string& model, const std::string& out,
                              const std::string& calib, const std::string& threads) {
  std::vector<std::string> a = {"quantize", "--model_dir", model, "--output_dir", out, "--quant_algo", algo,
                                "--max_shard_size", "1MB", "--threads", threads};
  if (algo != "rtn") a.insert(a.end(), {"--dataset", calib, "--num_calib_data", "4", "--seq_len", "64"});
  if (algo.starts_with("awq")) a.insert(a.end(), {"--n_grid", "5"});  // a shorter search: the same code path
  return a;
}

std::string Calib(const nibble_test::TempDir& tmp) {
  const std::string path = tmp.sub("calib.txt");
  std::ofstream(path, std::ios::binary) << ReadFile(nibble_test::SharedData("prose-calib.txt")).substr(0, 60000);
  return path;
}

uint32_t Seed() {
  const char* s = std::getenv("NIBBLE_TEST_SEED");
  return s != nullptr ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : std::random_device{}();
}

// A copy of the embedded model (writable, to be changed by a test).
std::string CopyModel(const nibble_test::TempDir& tmp) {
  const std::string dir = tmp.sub("model");
  fs::create_directory(dir);
  for (const auto& e : fs::directory_iterator(nibble_test::EmbeddedModel()))
    if (e.is_regular_file()) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
  for (const auto& e : fs::directory_iterator(dir)) fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return dir;
}

// Replaces the first `from` in `path` by `to` (same length: sizes stay).
void Patch(const std::string& path, const std::string& from, const std::string& to) {
  std::string bytes = ReadFile(path);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from << " in " << path;
  bytes.replace(at, from.size(), to);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(QuantizeResume, KilledAfterARandomLayerResumesByteIdentical) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  const std::string calib = Calib(tmp), model = nibble_test::EmbeddedModel();
  const uint32_t seed = Seed();
  std::mt19937 rng(seed);
  std::printf("seed %u (NIBBLE_TEST_SEED=%u replays it)\n", seed, seed);
  for (const std::string algo : {"rtn", "awq", "gptq", "awq,gptq"}) {
    const int layer = std::uniform_int_distribution<int>(1, 5)(rng);
    SCOPED_TRACE("--quant_algo " + algo + ", killed after layer " + std::to_string(layer) + ", seed " + std::to_string(seed));
    std::printf("%s: SIGKILL after layer %d\n", algo.c_str(), layer);
    ASSERT_EQ(RunQ(Args(algo, model, tmp.sub("full"), calib, "1"), tmp.sub("log")), 0) << ReadFile(tmp.sub("log"));
    ASSERT_EQ(RunQ(Args(algo, model, tmp.sub("out"), calib, "1"), tmp.sub("log"), KillAfter(std::to_string(layer))), -SIGKILL)
        << ReadFile(tmp.sub("log"));
    ASSERT_FALSE(fs::exists(tmp.sub("out")));
    const std::vector<std::string> staged = Staging(tmp.path(), "out");
    ASSERT_EQ(staged.size(), 1u);
    EXPECT_NE(ReadFile(staged[0] + "/resume.json").find("\"layers_done\": " + std::to_string(layer)), std::string::npos);
    std::vector<std::string> resume = Args(algo, model, tmp.sub("out"), calib, "2");
    resume.push_back("--resume");
    ASSERT_EQ(RunQ(resume, tmp.sub("log")), 0) << ReadFile(tmp.sub("log"));
    EXPECT_NE(ReadFile(tmp.sub("log")).find("resuming the run staged in"), std::string::npos);
    const auto full = HashDir(tmp.sub("full"));
    ASSERT_GT(full.size(), 3u);  // several shards, their index, config, card, tokenizer
    EXPECT_EQ(HashDir(tmp.sub("out")), full);
    EXPECT_TRUE(Staging(tmp.path(), "out").empty());
    fs::remove_all(tmp.sub("full"));
    fs::remove_all(tmp.sub("out"));
  }
}

// The format writers' own state: compressed-tensors lists the modules written with an act-order
// g_idx in config.json (a resumed run that forgot the layers before its boundary lists only the
// last one), GPTQ's desc_act says whether any had one.
TEST(QuantizeResume, ActOrderConfigSurvivesAResume) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  const std::string calib = Calib(tmp), model = nibble_test::EmbeddedModel();
  for (const std::string format : {"compressed-tensors", "gptq"}) {
    SCOPED_TRACE("--model_export " + format);
    std::vector<std::string> args = Args("gptq", model, tmp.sub("full"), calib, "1");
    args.insert(args.end(), {"--actorder", "group", "--model_export", format});
    ASSERT_EQ(RunQ(args, tmp.sub("log")), 0) << ReadFile(tmp.sub("log"));
    args[4] = tmp.sub("out");
    ASSERT_EQ(RunQ(args, tmp.sub("log"), KillAfter("5")), -SIGKILL) << ReadFile(tmp.sub("log"));
    args.push_back("--resume");
    ASSERT_EQ(RunQ(args, tmp.sub("log")), 0) << ReadFile(tmp.sub("log"));
    const std::string config = ReadFile(tmp.sub("out") + "/config.json");
    EXPECT_NE(config.find(format == "gptq" ? "\"desc_act\": true" : "\"actorder\": \"group\""), std::string::npos)
        << config;
    EXPECT_EQ(HashDir(tmp.sub("out")), HashDir(tmp.sub("full")));
    fs::remove_all(tmp.sub("full"));
    fs::remove_all(tmp.sub("out"));
  }
}

// SIGTERM during a GPTQ run (16 x 128 tokens: ~0.2 s a layer) drops the layer in progress, keeps
// the last boundary and says how to resume; --resume then finishes with the uninterrupted bytes.
TEST(QuantizeResume, SigtermStopsAtALayerBoundaryAndResumes) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  const std::string calib = Calib(tmp), model = nibble_test::EmbeddedModel();
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"quantize", "--model_dir", model, "--output_dir", out, "--quant_algo", "gptq",
                                    "--dataset", calib, "--num_calib_data", "16", "--seq_len", "128", "--threads", "1"};
  };
  const std::string log = tmp.sub("log");
  const pid_t pid = nibble_test::SpawnNibble(args(tmp.sub("out")), log);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (ReadFile(log).find("gptq layers 1/6") == std::string::npos && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill(pid, SIGTERM);
  ASSERT_EQ(WaitExit(pid), 143) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("nibble: cancelled: quantize at "), std::string::npos) << text;
  EXPECT_NE(text.find("run the same command with --resume to continue"), std::string::npos) << text;
  EXPECT_NE(text.find("(SIGTERM)"), std::string::npos) << text;
  ASSERT_EQ(Staging(tmp.path(), "out").size(), 1u);
  std::vector<std::string> resume = args(tmp.sub("out"));
  resume.push_back("--resume");
  ASSERT_EQ(RunQ(resume, log), 0) << ReadFile(log);
  ASSERT_EQ(RunQ(args(tmp.sub("full")), log), 0) << ReadFile(log);
  EXPECT_EQ(HashDir(tmp.sub("out")), HashDir(tmp.sub("full")));
}

// Other flags, another input header or config.json: refused with each difference named, and the
// staged run left as it was (the original request still resumes it to the right bytes).
TEST(QuantizeResume, RefusesChangedFlagsOrInput) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  const std::string calib = Calib(tmp), model = CopyModel(tmp), log = tmp.sub("log");
  ASSERT_EQ(RunQ(Args("gptq", model, tmp.sub("out"), calib, "1"), log, KillAfter("2")), -SIGKILL) << ReadFile(log);
  std::vector<std::string> resume = Args("gptq", model, tmp.sub("out"), calib, "1");
  resume.push_back("--resume");
  std::vector<std::string> other = resume;
  other.insert(other.end(), {"--group_size", "64"});
  EXPECT_NE(RunQ(other, log), 0);
  EXPECT_NE(ReadFile(log).find("--group_size: run had 128, now 64"), std::string::npos) << ReadFile(log);

  const std::string config = ReadFile(model + "/config.json"), weights = ReadFile(model + "/model.safetensors");
  const fs::file_time_type mtime = fs::last_write_time(model + "/model.safetensors");
  Patch(model + "/model.safetensors", "{\"format\":\"pt\"}", "{\"format\":\"pu\"}");  // a valid header, changed
  Patch(model + "/config.json", "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 2e-05");
  EXPECT_NE(RunQ(resume, log), 0);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("input shard model.safetensors: header SHA-256 differs"), std::string::npos) << text;
  EXPECT_NE(text.find("input config.json: SHA-256 differs"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(tmp.sub("out")));

  // Tensor data changed under an unchanged header: refused by the shard's modification time.
  std::ofstream(model + "/config.json", std::ios::binary | std::ios::trunc) << config;
  std::string poked = weights;
  poked.back() = static_cast<char>(poked.back() ^ 0x40);
  std::ofstream(model + "/model.safetensors", std::ios::binary | std::ios::trunc) << poked;
  EXPECT_NE(RunQ(resume, log), 0);
  EXPECT_NE(ReadFile(log).find("input shard model.safetensors: modified"), std::string::npos) << ReadFile(log);
  EXPECT_FALSE(fs::exists(tmp.sub("out")));

  std::ofstream(model + "/model.safetensors", std::ios::binary | std::ios::trunc) << weights;
  fs::last_write_time(model + "/model.safetensors", mtime);  // (the file as the run saw it)
  ASSERT_EQ(RunQ(resume, log), 0) << ReadFile(log);
  ASSERT_EQ(RunQ(Args("gptq", model, tmp.sub("full"), calib, "1"), log), 0) << ReadFile(log);
  EXPECT_EQ(HashDir(tmp.sub("out")), HashDir(tmp.sub("full")));
}

// The input is mapped, not copied: a shard modified while a run reads it stops the run at the
// next layer boundary with the shard named, and no output.
TEST(QuantizeResume, InputModifiedDuringTheRunStopsIt) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  const std::string model = CopyModel(tmp), shard = model + "/model.safetensors";
  for (const std::string algo : {"rtn", "gptq"}) {
    nibble::QuantizeRequest r;
    r.model_dir = model;
    r.output_dir = tmp.sub("out-" + algo);
    r.quant_algo = algo;
    r.resumable = true;
    if (algo != "rtn") {
      r.dataset = Calib(tmp);
      r.num_calib_data = 4;
      r.seq_len = 64;
    }
    bool touched = false;
    r.on_stage = [&](const nibble::QuantizeStage& st) {
      if (st.layers_done >= 1 && !touched) {  // (a write to the file, as far as its metadata tells)
        fs::last_write_time(shard, fs::last_write_time(shard) + std::chrono::seconds(1));
        touched = true;
      }
    };
    auto q = nibble::Quantize(r);
    ASSERT_FALSE(q.ok()) << algo;
    EXPECT_TRUE(touched) << algo;
    EXPECT_EQ(q.error().code, nibble::ErrorCode::kCorruptInput) << q.error().message;
    EXPECT_NE(q.error().message.find("changed during the run"), std::string::npos) << q.error().message;
    EXPECT_NE(q.error().message.find("input shard model.safetensors: modified"), std::string::npos) << q.error().message;
    EXPECT_FALSE(fs::exists(r.output_dir)) << algo;
  }
}

// The saved activations are checked by size and SHA-256 before they are used.
TEST(QuantizeResume, RefusesChangedOrTruncatedActivations) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  const std::string calib = Calib(tmp), model = nibble_test::EmbeddedModel(), log = tmp.sub("log");
  ASSERT_EQ(RunQ(Args("awq", model, tmp.sub("out"), calib, "1"), log, KillAfter("3")), -SIGKILL) << ReadFile(log);
  std::vector<std::string> resume = Args("awq", model, tmp.sub("out"), calib, "1");
  resume.push_back("--resume");
  const std::string acts = Staging(tmp.path(), "out").at(0) + "/activations-3.bin";
  std::string bytes = ReadFile(acts);
  ASSERT_EQ(bytes.size(), 4u * 64 * 256 * 2);  // bf16: the model's dtype is the default --calib_dtype
  bytes[1000] ^= 1;
  std::ofstream(acts, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(RunQ(resume, log), 1);
  EXPECT_NE(ReadFile(log).find("activations-3.bin: SHA-256 differs from the manifest's"), std::string::npos) << ReadFile(log);
  EXPECT_EQ(ReadFile(log).find("to continue"), std::string::npos) << "a refused resume must not suggest resuming:\n" << ReadFile(log);

  const std::string acts2 = Staging(tmp.path(), "out").at(0) + "/activations-3.bin";
  std::ofstream(acts2, std::ios::binary | std::ios::trunc) << bytes.substr(0, 4096);
  EXPECT_EQ(RunQ(resume, log), 1);
  EXPECT_NE(ReadFile(log).find("activations-3.bin: 4096 bytes, the manifest records 131072"), std::string::npos)
      << ReadFile(log);
}

// --resume with nothing staged says how to start; a run without --resume replaces a staged one
// and says so.
TEST(QuantizeResume, NothingToResumeAndStartingOver) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  const std::string calib = Calib(tmp), model = nibble_test::EmbeddedModel(), log = tmp.sub("log");
  std::vector<std::string> resume = Args("rtn", model, tmp.sub("out"), calib, "1");
  resume.push_back("--resume");
  EXPECT_EQ(RunQ(resume, log), 1);
  EXPECT_NE(ReadFile(log).find("--resume: no interrupted run of " + tmp.sub("out") + " to continue"), std::string::npos)
      << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("run the same command without --resume to start one"), std::string::npos);

  ASSERT_EQ(RunQ(Args("rtn", model, tmp.sub("out"), calib, "1"), log, KillAfter("2")), -SIGKILL);
  ASSERT_EQ(Staging(tmp.path(), "out").size(), 1u);
  ASSERT_EQ(RunQ(Args("rtn", model, tmp.sub("out"), calib, "1"), log), 0) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("note: starting over: removing "), std::string::npos) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("(2 of 6 layers done); --resume continues such a run instead"), std::string::npos)
      << ReadFile(log);
  EXPECT_TRUE(Staging(tmp.path(), "out").empty());
}

// A write that fails mid-run (here EFBIG under RLIMIT_FSIZE, as ENOSPC would) names the file and
// leaves the last boundary resumable.
TEST(QuantizeResume, FailedWriteLeavesTheRunResumable) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  const std::string calib = Calib(tmp), model = nibble_test::EmbeddedModel(), log = tmp.sub("log");
  SpawnOptions limited;
  limited.max_file_size = 2200 << 10;  // above every shard (2 MiB at most); the spool outgrows it late in the run
  ASSERT_EQ(RunQ(Args("gptq", model, tmp.sub("out"), calib, "1"), log, limited), 1) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("cannot write " + Staging(tmp.path(), "out").at(0) + "/tensors.spool: File too large"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("run the same command with --resume to continue"), std::string::npos) << text;
  std::vector<std::string> resume = Args("gptq", model, tmp.sub("out"), calib, "2");
  resume.push_back("--resume");
  ASSERT_EQ(RunQ(resume, log), 0) << ReadFile(log);
  ASSERT_EQ(RunQ(Args("gptq", model, tmp.sub("full"), calib, "1"), log), 0) << ReadFile(log);
  EXPECT_EQ(HashDir(tmp.sub("out")), HashDir(tmp.sub("full")));
}

// The same for an RTN run, whose shards are laid out up front and written in place (no spool):
// the shard being written fails (3 MB shards: lm_head alone, then the embedding and the first
// layers past the 2.5 MB limit), is named, and the resumed run cuts it back to its last boundary.
TEST(QuantizeResume, FailedWriteInALaidOutShardLeavesTheRunResumable) {
  nibble_test::TempDir tmp;
  const std::string model = nibble_test::EmbeddedModel(), log = tmp.sub("log");
  auto args = [&](const std::string& out, const std::string& threads) {
    return std::vector<std::string>{"quantize", "--model_dir", model, "--output_dir", out, "--max_shard_size", "3MB",
                                    "--threads", threads};
  };
  SpawnOptions limited;
  limited.max_file_size = 2500 << 10;
  ASSERT_EQ(RunQ(args(tmp.sub("out"), "1"), log, limited), 1) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("cannot write " + Staging(tmp.path(), "out").at(0) + "/shard-1.safetensors.partial: File too large"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("run the same command with --resume to continue"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(Staging(tmp.path(), "out").at(0) + "/tensors.spool"));
  std::vector<std::string> resume = args(tmp.sub("out"), "2");
  resume.push_back("--resume");
  ASSERT_EQ(RunQ(resume, log), 0) << ReadFile(log);
  ASSERT_EQ(RunQ(args(tmp.sub("full"), "1"), log), 0) << ReadFile(log);
  EXPECT_EQ(HashDir(tmp.sub("out")), HashDir(tmp.sub("full")));
}

}  // namespace
