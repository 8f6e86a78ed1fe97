// Streamed quantize output: each decoder layer's tensors reach the staged output on disk as soon
// as the calibrated pipeline finishes the layer (nothing waits in memory for the last layer), and
// the output keeps the input's tensor order ("model.layers.10." before "model.layers.2.") with
// shards filled greedily up to max_shard_size.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nibble/quantize.h>

#include "io/safetensors.h"
#include "test_paths.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace fs = std::filesystem;

namespace {

using nibble_test::TempDir;

// Bytes of the regular files in the staging directories of output `out` ("<parent>/.<name>.nibble-*").
int64_t StagedBytes(const fs::path& out) {
  int64_t bytes = 0;
  const std::string prefix = "." + out.filename().string() + ".nibble-";
  for (const auto& d : fs::directory_iterator(out.parent_path())) {
    if (!d.is_directory() || !d.path().filename().string().starts_with(prefix)) continue;
    for (const auto& f : fs::directory_iterator(d.path()))
      if (f.is_regular_file()) bytes += static_cast<int64_t>(f.file_size());
  }
  return bytes;
}

// "model.layers.10.mlp.down_proj.qweight" -> 10; -1 for a tensor outside the decoder layers.
int64_t LayerOf(const std::string& name) {
  const std::string p = "model.layers.";
  if (!name.starts_with(p)) return -1;
  return std::stoll(name.substr(p.size(), name.find('.', p.size()) - p.size()));
}

// The output's tensors shard by shard, each shard's in data order.
std::vector<std::vector<nibble::TensorView>> ShardsInDataOrder(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::vector<nibble::TensorView>> out;
  for (const fs::path& f : files) {
    auto st = nibble::SafetensorsFile::Open(f.string());
    EXPECT_TRUE(st.ok()) << f;
    if (!st.ok()) continue;
    std::vector<nibble::TensorView> ts = (*st)->tensors();
    std::sort(ts.begin(), ts.end(), [](const auto& a, const auto& b) { return a.data < b.data; });
    for (auto& t : ts) t.data = nullptr;  // the map is gone after this scope
    out.push_back(std::move(ts));
  }
  return out;
}

TEST(QuantizeStream, GptqWritesEachLayerAsItFinishesInInputOrderAndGreedyShards) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  TempDir tmp;
  nibble_test::TinyLlamaSpec spec;
  spec.layers = 12;  // "model.layers.10." and ".11." sort before ".2.": finished out of output order
  nibble_test::WriteTinyModel(tmp.sub("m"), spec);
  const fs::path out = tmp.sub("q");
  auto req = nibble_test::TinyCalibRequest("gptq", tmp.sub("m"), out.string(),
                                           nibble_test::TinyCalibFile(tmp.sub("calib.txt")));
  req.num_calib_data = 2;
  req.model_export = "gptq";
  req.max_shard_size = 100000;
  std::vector<int64_t> staged;  // bytes on disk in the staging directory when layer i + 1 was done
  req.on_layer = [&](int64_t, int64_t) { staged.push_back(StagedBytes(out)); };
  auto s = nibble::Quantize(req);
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(staged.size(), 12u);
  EXPECT_GE(s->peak_anon_bytes, s->start_anon_bytes);
  EXPECT_GT(s->peak_anon_bytes, 0);

  const auto shards = ShardsInDataOrder(out);
  ASSERT_GE(shards.size(), 3u);
  std::map<int64_t, int64_t> layer_bytes;
  std::string prev_module;
  for (size_t i = 0; i < shards.size(); ++i) {
    int64_t bytes = 0;
    for (const auto& t : shards[i]) {
      bytes += static_cast<int64_t>(t.nbytes);
      if (LayerOf(t.name) >= 0) layer_bytes[LayerOf(t.name)] += static_cast<int64_t>(t.nbytes);
      // The input's order: sorted by module (a quantized linear's tensors stand in for its weight).
      const std::string module = t.name.substr(0, t.name.rfind('.'));
      EXPECT_LE(prev_module, module) << t.name << " after " << prev_module;
      prev_module = module;
    }
    EXPECT_LE(bytes, req.max_shard_size) << "shard " << i;
    if (i + 1 < shards.size()) {
      EXPECT_GT(bytes + static_cast<int64_t>(shards[i + 1].front().nbytes), req.max_shard_size)
          << "shard " << i << " had room for the next tensor";
    }
  }
  ASSERT_EQ(layer_bytes.size(), 12u);
  // When layer l was done, the tensors of layers 0..l were already on disk, not held in memory
  // until the last layer (spooled ones counted until their shard is written, so ">=").
  int64_t done = 0;
  for (int64_t l = 0; l < 12; ++l) {
    done += layer_bytes[l];
    EXPECT_GE(staged[l], done) << "after layer " << l;
  }
}

}  // namespace
