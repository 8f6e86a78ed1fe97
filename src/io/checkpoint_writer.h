// Writes a Hugging Face checkpoint directory the way `save_pretrained` lays it out: safetensors
// shards of at most max_shard_size bytes ("model.safetensors" alone, or
// "model-0000i-of-0000n.safetensors" with model.safetensors.index.json), config.json and side
// files (tokenizer, generation config), all into a staging directory beside the target
// (io/staging_dir.h) that Commit renames onto it only when complete.
//
// Tensors are written in the order added: consecutive tensors fill a shard up to max_shard_size
// bytes (a larger tensor gets a shard of its own), and a shard is written as soon as the next
// tensor does not fit, so memory holds one shard's tensors at a time. Shards are written under
// temporary names and renamed once their count is known.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "io/model_card.h"
#include "io/safetensors.h"
#include "io/staging_dir.h"

namespace nibble {

/// The files of a checkpoint directory that travel with it when it is re-written: every regular
/// file but the weights (safetensors shards and their index, PyTorch pickles), config.json (written
/// anew) and hidden files — tokenizer files, chat templates, generation config, model card, ...
/// Sorted by name.
std::vector<std::string> CheckpointSideFiles(const std::string& model_dir);

/// dir/config.json parsed keeping its key order (it is written back with a new
/// quantization_config). Errors: unreadable, not JSON (naming the file).
Result<nlohmann::ordered_json> ReadConfigJsonOrdered(const std::string& model_dir);

class CheckpointWriter {
 public:
  /// Errors: empty out_dir, max_shard_size <= 0, the staging directory not creatable (names it).
  static Result<CheckpointWriter> Create(const std::string& out_dir, int64_t max_shard_size,
                                         const std::string& staging_kind = "tmp");

  /// Adds a tensor. Borrowed data must stay valid until Finish (it is written with its shard).
  Status Add(TensorToWrite tensor);
  /// Writes `bytes` as the file `name` of the output.
  Status WriteFile(const std::string& name, const std::string& bytes);
  /// Copies each of `names` that exists in `from_dir` into the output; returns those copied.
  Result<std::vector<std::string>> CopyFiles(const std::string& from_dir, const std::vector<std::string>& names);
  /// Writes README.md: from_dir's README.md with `note` at its top, or the note alone when
  /// from_dir has none (io/model_card.h). Call after CopyFiles (it replaces the copied card).
  Status WriteModelCard(const std::string& from_dir, const ModelCardNote& note);
  /// Writes the last shard, renames the shards to their final names and writes the index.
  Status Finish();
  /// Renames the staging directory onto the output (StagingDir::Commit). Call after Finish.
  Status Commit(bool overwrite);

  /// The staging directory (where the files are until Commit).
  std::string path() const { return staging_.path(); }
  int64_t shards() const { return static_cast<int64_t>(shard_tensors_.size()); }
  int64_t total_bytes() const { return total_bytes_; }

 private:
  CheckpointWriter() = default;
  Status FlushShard();

  StagingDir staging_;
  int64_t max_shard_size_ = 0;
  std::vector<TensorToWrite> pending_;  // the shard being filled
  int64_t pending_bytes_ = 0;
  std::vector<std::vector<std::string>> shard_tensors_;  // names per written shard
  int64_t total_bytes_ = 0;
};

}  // namespace nibble
