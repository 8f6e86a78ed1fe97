#include "io/checkpoint_writer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "io/file.h"

namespace nibble {

namespace fs = std::filesystem;

namespace {

std::string ShardName(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

std::string PendingName(size_t i) { return "shard-" + std::to_string(i) + ".safetensors.partial"; }

}  // namespace

Result<CheckpointWriter> CheckpointWriter::Create(const std::string& out_dir, int64_t max_shard_size,
                                                  const std::string& staging_kind) {
  if (out_dir.empty()) return MakeError("output directory is empty");
  if (max_shard_size <= 0) return MakeError("max shard size must be positive, got ", max_shard_size);
  CheckpointWriter w;
  NIBBLE_ASSIGN_OR_RETURN(w.staging_, StagingDir::Create(out_dir, staging_kind));
  w.max_shard_size_ = max_shard_size;
  return w;
}

Status CheckpointWriter::FlushShard() {
  if (pending_.empty()) return Status::Ok();
  std::vector<const TensorToWrite*> ptrs;
  std::vector<std::string> names;
  for (const auto& t : pending_) {
    ptrs.push_back(&t);
    names.push_back(t.name);
  }
  const std::string file = JoinPath(staging_.path(), PendingName(shard_tensors_.size()));
  NIBBLE_RETURN_IF_ERROR(WriteSafetensors(file, ptrs, {{"format", "pt"}}));
  shard_tensors_.push_back(std::move(names));
  pending_.clear();
  pending_bytes_ = 0;
  return Status::Ok();
}

Status CheckpointWriter::Add(TensorToWrite tensor) {
  const int64_t b = static_cast<int64_t>(tensor.data().size());
  if (!pending_.empty() && pending_bytes_ + b > max_shard_size_) NIBBLE_RETURN_IF_ERROR(FlushShard());
  pending_.push_back(std::move(tensor));
  pending_bytes_ += b;
  total_bytes_ += b;
  return Status::Ok();
}

Status CheckpointWriter::WriteFile(const std::string& name, const std::string& bytes) {
  return WriteFileAtomic(JoinPath(staging_.path(), name), bytes.data(), bytes.size());
}

Result<std::vector<std::string>> CheckpointWriter::CopyFiles(const std::string& from_dir,
                                                             const std::vector<std::string>& names) {
  std::vector<std::string> copied;
  for (const std::string& f : names) {
    const std::string src = JoinPath(from_dir, f);
    if (!PathExists(src)) continue;
    NIBBLE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(src));
    NIBBLE_RETURN_IF_ERROR(WriteFile(f, bytes));
    copied.push_back(f);
  }
  return copied;
}

Status CheckpointWriter::WriteModelCard(const std::string& from_dir, const ModelCardNote& note) {
  const std::string src = JoinPath(from_dir, "README.md");
  std::string card;
  if (PathExists(src)) {
    NIBBLE_ASSIGN_OR_RETURN(card, ReadFileToString(src));
  }
  return WriteFile("README.md", ModelCardWithNote(card, note));
}

Status CheckpointWriter::Finish() {
  if (shard_tensors_.empty() || !pending_.empty()) NIBBLE_RETURN_IF_ERROR(FlushShard());
  const size_t n = shard_tensors_.size();
  if (n == 0) return MakeErrorCode(ErrorCode::kInternal, "checkpoint ", staging_.target(), " has no tensors");
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < n; ++i) {
    const std::string from = JoinPath(staging_.path(), PendingName(i)), to = JoinPath(staging_.path(), ShardName(i, n));
    std::error_code ec;
    fs::rename(from, to, ec);
    if (ec) return MakeErrorCode(ErrorCode::kIo, "cannot rename ", from, " to ", to, ": ", ec.message());
    for (const std::string& t : shard_tensors_[i]) weight_map[t] = ShardName(i, n);
  }
  if (n == 1) return Status::Ok();
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_bytes_}};
  index["weight_map"] = weight_map;
  return WriteFile("model.safetensors.index.json", index.dump(2) + "\n");
}

Status CheckpointWriter::Commit(bool overwrite) { return staging_.Commit(overwrite); }

std::vector<std::string> CheckpointSideFiles(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const std::string name = e.path().filename().string(), ext = e.path().extension().string();
    if (name == "config.json" || name == "model.safetensors.index.json" || name == "pytorch_model.bin.index.json" ||
        ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" || name.front() == '.')
      continue;
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

Result<nlohmann::ordered_json> ReadConfigJsonOrdered(const std::string& model_dir) {
  const std::string config_path = JoinPath(model_dir, "config.json");
  NIBBLE_ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(config_path));
  try {
    return nlohmann::ordered_json::parse(config_text);
  } catch (const std::exception& e) {
    return MakeError(config_path, ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace nibble
