// Writes a Hugging Face checkpoint directory the way `save_pretrained` lays it out: safetensors
// shards of at most max_shard_size bytes ("model.safetensors" alone, or
// "model-0000i-of-0000n.safetensors" with model.safetensors.index.json), config.json and side
// files (tokenizer, generation config), all into a staging directory beside the target
// (io/staging_dir.h) that Commit renames onto it only when complete.
//
// Tensors are written in the order added: consecutive tensors fill a shard up to max_shard_size
// bytes (a larger tensor gets a shard of its own), and a shard is written as soon as the next
// tensor does not fit. A shard's header (names, shapes, offsets) is known only then, so the bytes
// of owned tensors go at once to a spool file in the staging directory and are copied into the
// shard when it is written (its spooled range is then punched out): memory holds no tensor past
// its Add, whatever the shard size. Borrowed tensors (the mmap'd input) are read when their shard
// is written. Tensors finished before their turn are spooled (Spool) and added in order later.
// Shards are written under temporary names and renamed once their count is known.
//
// Laid out (LayOut): a run that knows every output tensor's name, dtype and shape before the first
// is produced (RTN) fixes the shards and their headers up front; each tensor Add'ed is then
// written once, straight after the previous one in its shard, and no spool is used.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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

  /// A tensor whose bytes are in the spool file, not in memory: Spool's handle for a later Add.
  struct Spooled {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    uint64_t offset = 0, size = 0;  // the byte range in the spool file
    std::string sha256;             // of the range, in a resumable writer (else empty)
  };

  /// Lays the output out before its first tensor: the shards `tensors` (in order) fill as Add
  /// would, each shard's header fixed now. Add must then be given exactly these tensors in this
  /// order (anything else is kInternal); each is written at once at its offset in its shard, and
  /// a shard is complete (fsync'd) with its last tensor. A writer resumed from a laid-out state is
  /// laid out again with the same tensors: its staged shards are checked against the layout and
  /// the open shard's bytes against the manifest's SHA-256 (kCorruptInput naming the file); one
  /// resumed from a streamed state stays streamed. Errors: a fresh writer already holding
  /// tensors (kInternal), the header's (SafetensorsPreamble).
  Status LayOut(std::vector<TensorSlot> tensors);
  bool laid_out() const { return laid_ != nullptr; }

  /// Adds a tensor. Owned bytes are spooled at once (and freed with `tensor`); borrowed data must
  /// stay valid until Finish (it is read when its shard is written). Errors: the spool's write
  /// errors (naming the file).
  Status Add(TensorToWrite tensor);
  /// Writes the bytes of a tensor finished before its turn in the output order to the spool now;
  /// Add the handle when its turn comes. Errors: as Add.
  Result<Spooled> Spool(const TensorToWrite& tensor);
  Status Add(Spooled tensor);
  /// Called with the bytes of each borrowed tensor once they are written into its shard (quantize
  /// drops the input's pages read once: TensorStore::Evict).
  void SetAfterBorrowedWritten(std::function<void(const uint8_t* data, size_t size)> f) { after_borrowed_ = std::move(f); }
  /// Writes `bytes` as the file `name` of the output.
  Status WriteFile(const std::string& name, const std::string& bytes);
  /// Copies each of `names` that exists in `from_dir` into the output; returns those copied.
  Result<std::vector<std::string>> CopyFiles(const std::string& from_dir, const std::vector<std::string>& names);
  /// Writes README.md: from_dir's README.md with `note` at its top, or the note alone when
  /// from_dir has none (io/model_card.h). Call after CopyFiles (it replaces the copied card).
  Status WriteModelCard(const std::string& from_dir, const ModelCardNote& note);
  /// Writes the last shard, removes the spool, renames the shards to their final names and writes
  /// the index.
  Status Finish();
  /// Renames the staging directory onto the output (StagingDir::Commit). Call after Finish.
  Status Commit(bool overwrite);

  // A resumable writer (quantize --resume): its state at a boundary is saved to a manifest and a
  // later process continues from it. Spooled ranges carry their SHA-256, and the spool's ranges
  // already copied into a shard are punched out only after the next boundary (a resumed run may
  // still need those the last boundary left pending).
  void SetResumable() { resumable_ = true; }
  /// The writer's state now: finished shards (file, size, SHA-256, tensors), the open shard's
  /// entries (borrowed: by name; spooled: range and SHA-256), the spool's length. The spool and
  /// the staging directory are fsync'd first. Errors: fsync / read errors naming the file.
  Result<nlohmann::ordered_json> SaveState();
  /// After the manifest holding SaveState's state is durable: frees the spool ranges copied into
  /// shards since.
  void AfterBoundary();
  /// A writer continuing `staging` (an adopted staging directory) from `state` (SaveState's):
  /// verifies every finished shard (size, SHA-256) and pending spooled range, removes shards
  /// written after the boundary, truncates the spool to its saved length; borrowed entries are
  /// re-borrowed through `borrow`. Errors (corrupt input, naming the file and what differs).
  static Result<CheckpointWriter> Resume(StagingDir staging, int64_t max_shard_size, const nlohmann::ordered_json& state,
                                         const std::function<Result<TensorToWrite>(const std::string&)>& borrow);
  /// A Spooled handle as JSON and back; Verify checks its range against its SHA-256.
  static nlohmann::ordered_json SpooledJson(const Spooled& s);
  static Result<Spooled> SpooledFromJson(const nlohmann::ordered_json& j);
  Status VerifySpooled(const Spooled& s) const;
  /// Keep the staging directory if this writer is destroyed without Commit.
  void KeepStaging(bool keep = true);

  /// The staging directory (where the files are until Commit).
  std::string path() const { return staging_.path(); }
  int64_t shards() const { return static_cast<int64_t>(shard_tensors_.size()); }
  int64_t total_bytes() const { return total_bytes_; }

 private:
  class AppendFile;
  struct LaidOut;
  // One tensor of the shard being filled: borrowed (`tensor` holds the pointer) or spooled.
  struct Pending {
    TensorToWrite tensor;  // no owned bytes
    bool spooled = false;
    uint64_t offset = 0;
    std::string sha256;  // spooled, resumable
  };
  struct ShardInfo {
    uint64_t size = 0;
    std::string sha256;  // resumable only
  };
  CheckpointWriter() = default;
  Status FlushShard();
  Status AddLaidOut(const TensorToWrite& tensor);
  Status OpenLaidOutShard();
  Status CloseLaidOutShard();
  Status ResumeLaidOut();

  StagingDir staging_;
  int64_t max_shard_size_ = 0;
  std::shared_ptr<AppendFile> spool_;  // created at the first owned tensor; gone after Finish
  std::shared_ptr<LaidOut> laid_;       // LayOut's layout and the shard being written; null: streamed
  std::function<void(const uint8_t*, size_t)> after_borrowed_;
  std::vector<Pending> pending_;  // the shard being filled
  int64_t pending_bytes_ = 0;
  std::vector<std::vector<std::string>> shard_tensors_;  // names per written shard
  std::vector<ShardInfo> shard_info_;                    // per written shard
  int64_t total_bytes_ = 0;
  bool resumable_ = false;
  bool resumed_ = false;  // made by Resume
  bool keep_ = false;  // KeepStaging: the staging directory and the spool outlive the writer
  std::vector<std::pair<uint64_t, uint64_t>> discard_later_;  // spool ranges to free after the next boundary
};

}  // namespace nibble
