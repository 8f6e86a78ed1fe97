#include "io/checkpoint_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "base/sha256.h"
#include "base/strings.h"
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

// An append-only file in the staging directory: the spool (the bytes of tensors added but not yet
// written into a shard; removed when the writer is done with it) or a laid-out shard being
// written (kept).
class CheckpointWriter::AppendFile {
 public:
  static Result<std::shared_ptr<AppendFile>> Create(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return MakeErrorCode(ErrorCode::kIo, "cannot create ", path, ": ", std::strerror(errno));
    return std::shared_ptr<AppendFile>(new AppendFile(path, fd));
  }
  // The spool of a resumed run: its first `size` bytes kept, anything a killed run appended after
  // its last boundary cut off.
  static Result<std::shared_ptr<AppendFile>> Reopen(const std::string& path, uint64_t size) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return MakeErrorCode(ErrorCode::kCorruptInput, "cannot open ", path, ": ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < size || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      ::close(fd);
      return MakeErrorCode(ErrorCode::kCorruptInput, path, " is shorter than the ", size, " bytes the manifest records");
    }
    auto f = std::shared_ptr<AppendFile>(new AppendFile(path, fd));
    f->end_ = size;
    return f;
  }
  uint64_t size() const { return end_; }
  Status Sync() {
    if (::fsync(fd_) != 0) return MakeErrorCode(ErrorCode::kIo, "cannot fsync ", path_, ": ", std::strerror(errno));
    return Status::Ok();
  }
  ~AppendFile() {
    ::close(fd_);
    if (!keep_) ::unlink(path_.c_str());
  }
  // Left in place when the writer goes without finishing (a resumable run stopped).
  void Keep(bool keep) { keep_ = keep; }
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  const std::string& path() const { return path_; }

  // Appends `data`; returns its offset.
  Result<uint64_t> Append(std::span<const uint8_t> data) {
    const uint64_t at = end_;
    const uint8_t* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      const ssize_t n = ::pwrite(fd_, p, left, static_cast<off_t>(end_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return MakeErrorCode(ErrorCode::kIo, "cannot write ", path_, ": ", std::strerror(errno));
      p += n;
      left -= static_cast<size_t>(n);
      end_ += static_cast<uint64_t>(n);
    }
    return at;
  }
  // Frees the disk space and page cache of [offset, offset + size) once written into a shard
  // (best effort: a file system without hole punching keeps it until the spool is removed).
  void Discard(uint64_t offset, uint64_t size) {
    if (size > 0)
      (void)::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                        static_cast<off_t>(size));
  }

 private:
  AppendFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_;
  uint64_t end_ = 0;
  bool keep_ = false;
};

// A laid-out output: every tensor's shard fixed, the shard being written and, in a resumable
// writer, the SHA-256 of its bytes so far.
struct CheckpointWriter::LaidOut {
  std::vector<TensorSlot> tensors;     // in output order
  std::vector<size_t> shard_end;       // per shard: one past its last tensor
  std::vector<std::string> preamble;   // per shard: length prefix and header
  size_t next = 0;                     // tensors written
  std::shared_ptr<AppendFile> open;    // the shard being written; null between shards
  std::unique_ptr<Sha256> sha;         // of `open`'s bytes (resumable)
  // A resumed run's position at its boundary (Resume), checked when laid out again.
  size_t resume_next = 0;
  uint64_t resume_bytes = 0;
  std::string resume_sha256;
  size_t ShardStart(size_t shard) const { return shard == 0 ? 0 : shard_end[shard - 1]; }
};

Status CheckpointWriter::LayOut(std::vector<TensorSlot> tensors) {
  if (laid_ != nullptr && !laid_->tensors.empty())
    return MakeErrorCode(ErrorCode::kInternal, "the output ", staging_.target(), " is laid out twice");
  const bool resumed = laid_ != nullptr;  // Resume read a laid-out state
  if (!resumed && !(shard_tensors_.empty() && pending_.empty() && spool_ == nullptr)) {
    if (resumed_) return Status::Ok();  // resumed from a streamed state: it stays streamed
    return MakeErrorCode(ErrorCode::kInternal, "the output ", staging_.target(), " cannot be laid out after its first tensor");
  }
  auto l = resumed ? laid_ : std::make_shared<LaidOut>();
  int64_t bytes = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = static_cast<int64_t>(SlotBytes(tensors[i]));
    if (i > l->ShardStart(l->shard_end.size()) && bytes + b > max_shard_size_) {  // as Add fills shards
      l->shard_end.push_back(i);
      bytes = 0;
    }
    bytes += b;
    total += b;
  }
  if (!tensors.empty()) l->shard_end.push_back(tensors.size());
  for (size_t sh = 0; sh < l->shard_end.size(); ++sh) {
    std::vector<TensorSlot> in(tensors.begin() + static_cast<std::ptrdiff_t>(l->ShardStart(sh)),
                               tensors.begin() + static_cast<std::ptrdiff_t>(l->shard_end[sh]));
    NIBBLE_ASSIGN_OR_RETURN(std::string p, SafetensorsPreamble(in, {{"format", "pt"}}));
    l->preamble.push_back(std::move(p));
  }
  l->tensors = std::move(tensors);
  laid_ = l;
  total_bytes_ = total;
  return resumed ? ResumeLaidOut() : Status::Ok();
}

Status CheckpointWriter::OpenLaidOutShard() {
  LaidOut& l = *laid_;
  const std::string file = JoinPath(staging_.path(), PendingName(shard_tensors_.size()));
  NIBBLE_ASSIGN_OR_RETURN(l.open, AppendFile::Create(file));
  l.open->Keep(true);
  const std::string& p = l.preamble[shard_tensors_.size()];
  if (resumable_) {
    l.sha = std::make_unique<Sha256>();
    l.sha->Update(p);
  }
  NIBBLE_RETURN_IF_ERROR(l.open->Append({reinterpret_cast<const uint8_t*>(p.data()), p.size()}));
  return Status::Ok();
}

// The shard's last tensor is written: fsync'd, its size, SHA-256 and tensor names recorded.
Status CheckpointWriter::CloseLaidOutShard() {
  LaidOut& l = *laid_;
  NIBBLE_RETURN_IF_ERROR(l.open->Sync());
  const size_t shard = shard_tensors_.size();
  std::vector<std::string> names;
  for (size_t i = l.ShardStart(shard); i < l.shard_end[shard]; ++i) names.push_back(l.tensors[i].name);
  shard_info_.push_back({l.open->size(), l.sha != nullptr ? l.sha->HexDigest() : ""});
  shard_tensors_.push_back(std::move(names));
  l.open.reset();
  l.sha.reset();
  return Status::Ok();
}

Status CheckpointWriter::AddLaidOut(const TensorToWrite& t) {
  LaidOut& l = *laid_;
  const std::span<const uint8_t> d = t.data();
  if (l.next >= l.tensors.size() || !(l.tensors[l.next] == TensorSlot{t.name, t.dtype, t.shape}) ||
      d.size() != SlotBytes(l.tensors[l.next])) {
    const std::string want = l.next < l.tensors.size() ? l.tensors[l.next].name + " " + DTypeName(l.tensors[l.next].dtype) + " " +
                                                             ShapeToString(l.tensors[l.next].shape)
                                                       : "none (all are written)";
    return MakeErrorCode(ErrorCode::kInternal, "the laid-out output ", staging_.target(), " was given tensor ", t.name, " ",
                         DTypeName(t.dtype), " ", ShapeToString(t.shape), " (", d.size(), " bytes) at position ", l.next,
                         "; the layout has ", want);
  }
  if (l.open == nullptr) NIBBLE_RETURN_IF_ERROR(OpenLaidOutShard());
  NIBBLE_RETURN_IF_ERROR(l.open->Append(d));
  if (l.sha != nullptr) l.sha->Update(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
  if (t.borrowed != nullptr && after_borrowed_) after_borrowed_(t.borrowed, t.borrowed_size);
  if (++l.next == l.shard_end[shard_tensors_.size()]) NIBBLE_RETURN_IF_ERROR(CloseLaidOutShard());
  return Status::Ok();
}

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
  // The spool as it is now holds every spooled tensor of this shard; mapped only for the write.
  std::shared_ptr<MappedFile> spooled;
  for (const Pending& p : pending_)
    if (p.spooled && p.tensor.borrowed_size > 0 && spooled == nullptr) {
      NIBBLE_ASSIGN_OR_RETURN(spooled, MappedFile::Open(spool_->path()));
    }
  std::vector<const TensorToWrite*> ptrs;
  std::vector<std::string> names;
  for (Pending& p : pending_) {
    if (p.spooled && p.tensor.borrowed_size > 0) {
      if (!spooled->Contains(spooled->data() + p.offset, p.tensor.borrowed_size))
        return MakeErrorCode(ErrorCode::kInternal, spool_->path(), " does not hold tensor ", p.tensor.name);
      p.tensor.borrowed = spooled->data() + p.offset;
    }
    ptrs.push_back(&p.tensor);
    names.push_back(p.tensor.name);
  }
  const std::string file = JoinPath(staging_.path(), PendingName(shard_tensors_.size()));
  // Each tensor's mapped pages go once its bytes are written: the spool's range (and its disk
  // space), a borrowed tensor's through the caller's hook.
  auto written = [&](size_t i) {
    const Pending& p = pending_[i];
    if (p.spooled && p.tensor.borrowed_size > 0) {
      spooled->Release(p.tensor.borrowed, p.tensor.borrowed_size);
      if (resumable_) discard_later_.emplace_back(p.offset, p.tensor.borrowed_size);
      else spool_->Discard(p.offset, p.tensor.borrowed_size);
    } else if (!p.spooled && after_borrowed_ && p.tensor.borrowed != nullptr) {
      after_borrowed_(p.tensor.borrowed, p.tensor.borrowed_size);
    }
  };
  NIBBLE_RETURN_IF_ERROR(WriteSafetensors(file, ptrs, {{"format", "pt"}}, written));
  ShardInfo info;
  if (resumable_) {
    std::error_code ec;
    info.size = static_cast<uint64_t>(fs::file_size(file, ec));
    NIBBLE_ASSIGN_OR_RETURN(info.sha256, FileSha256(file));
  }
  shard_info_.push_back(std::move(info));
  shard_tensors_.push_back(std::move(names));
  pending_.clear();
  pending_bytes_ = 0;
  return Status::Ok();
}

Result<CheckpointWriter::Spooled> CheckpointWriter::Spool(const TensorToWrite& tensor) {
  if (laid_ != nullptr)
    return MakeErrorCode(ErrorCode::kInternal, "the laid-out output ", staging_.target(), " cannot spool tensor ", tensor.name);
  if (spool_ == nullptr) {
    NIBBLE_ASSIGN_OR_RETURN(spool_, AppendFile::Create(JoinPath(staging_.path(), "tensors.spool")));
    spool_->Keep(keep_);
  }
  Spooled s{tensor.name, tensor.dtype, tensor.shape, 0, tensor.data().size(), ""};
  if (resumable_)
    s.sha256 = Sha256Hex(std::string_view(reinterpret_cast<const char*>(tensor.data().data()), tensor.data().size()));
  NIBBLE_ASSIGN_OR_RETURN(s.offset, spool_->Append(tensor.data()));
  return s;
}

Status CheckpointWriter::Add(TensorToWrite tensor) {
  if (laid_ != nullptr) return AddLaidOut(tensor);
  if (tensor.borrowed == nullptr) {
    NIBBLE_ASSIGN_OR_RETURN(Spooled s, Spool(tensor));
    tensor = TensorToWrite{};  // the bytes are on disk now
    return Add(std::move(s));
  }
  const int64_t b = static_cast<int64_t>(tensor.data().size());
  if (!pending_.empty() && pending_bytes_ + b > max_shard_size_) NIBBLE_RETURN_IF_ERROR(FlushShard());
  pending_.push_back({std::move(tensor), false, 0, ""});
  pending_bytes_ += b;
  total_bytes_ += b;
  return Status::Ok();
}

Status CheckpointWriter::Add(Spooled s) {
  if (laid_ != nullptr)
    return MakeErrorCode(ErrorCode::kInternal, "the laid-out output ", staging_.target(), " was given spooled tensor ", s.name);
  const int64_t b = static_cast<int64_t>(s.size);
  if (!pending_.empty() && pending_bytes_ + b > max_shard_size_) NIBBLE_RETURN_IF_ERROR(FlushShard());
  Pending p;
  p.tensor.name = std::move(s.name);
  p.tensor.dtype = s.dtype;
  p.tensor.shape = std::move(s.shape);
  p.tensor.borrowed_size = s.size;  // the pointer is set when the spool is mapped (FlushShard)
  p.spooled = true;
  p.offset = s.offset;
  p.sha256 = std::move(s.sha256);
  pending_.push_back(std::move(p));
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
  if (laid_ != nullptr && laid_->next != laid_->tensors.size())
    return MakeErrorCode(ErrorCode::kInternal, "the laid-out output ", staging_.target(), " was given ", laid_->next,
                         " of its ", laid_->tensors.size(), " tensors");
  if (laid_ == nullptr && (shard_tensors_.empty() || !pending_.empty())) NIBBLE_RETURN_IF_ERROR(FlushShard());
  if (spool_ != nullptr) spool_->Keep(false);
  spool_.reset();
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
    return MakeError(config_path, ": not valid JSON (", PrintableBytes(e.what()), ")");
  }
}

}  // namespace nibble

namespace nibble {

namespace {

Status FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return MakeErrorCode(ErrorCode::kIo, "cannot open ", path, ": ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return MakeErrorCode(ErrorCode::kIo, "cannot fsync ", path, ": ", std::strerror(err));
  return Status::Ok();
}

}  // namespace

nlohmann::ordered_json CheckpointWriter::SpooledJson(const Spooled& s) {
  return {{"name", s.name}, {"dtype", DTypeName(s.dtype)}, {"shape", s.shape},
          {"offset", s.offset}, {"size", s.size},     {"sha256", s.sha256}};
}

Result<CheckpointWriter::Spooled> CheckpointWriter::SpooledFromJson(const nlohmann::ordered_json& j) {
  try {
    Spooled s;
    s.name = j.at("name").get<std::string>();
    NIBBLE_ASSIGN_OR_RETURN(s.dtype, ParseDType(j.at("dtype").get<std::string>()));
    s.shape = j.at("shape").get<std::vector<int64_t>>();
    s.offset = j.at("offset").get<uint64_t>();
    s.size = j.at("size").get<uint64_t>();
    s.sha256 = j.at("sha256").get<std::string>();
    return s;
  } catch (const std::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, "spooled tensor entry ", j.dump(), ": ", e.what());
  }
}

Status CheckpointWriter::VerifySpooled(const Spooled& s) const {
  if (s.size == 0) return Status::Ok();
  if (spool_ == nullptr || s.offset + s.size > spool_->size())
    return MakeErrorCode(ErrorCode::kCorruptInput, "the spool ", JoinPath(staging_.path(), "tensors.spool"),
                         " does not hold tensor ", s.name);
  NIBBLE_ASSIGN_OR_RETURN(std::string sha, FileSha256(spool_->path(), s.offset, static_cast<int64_t>(s.size)));
  if (sha != s.sha256)
    return MakeErrorCode(ErrorCode::kCorruptInput, spool_->path(), ": the bytes of tensor ", s.name, " (", s.size,
                         " at offset ", s.offset, ") have a different SHA-256 than the manifest records");
  return Status::Ok();
}

Result<nlohmann::ordered_json> CheckpointWriter::SaveState() {
  if (spool_ != nullptr) NIBBLE_RETURN_IF_ERROR(spool_->Sync());
  NIBBLE_RETURN_IF_ERROR(FsyncPath(staging_.path(), O_RDONLY | O_DIRECTORY));
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (size_t i = 0; i < shard_tensors_.size(); ++i)
    shards.push_back({{"file", PendingName(i)}, {"size", shard_info_[i].size}, {"sha256", shard_info_[i].sha256},
                      {"tensors", shard_tensors_[i]}});
  nlohmann::ordered_json pending = nlohmann::ordered_json::array();
  for (const Pending& p : pending_) {
    if (p.spooled)
      pending.push_back(SpooledJson({p.tensor.name, p.tensor.dtype, p.tensor.shape, p.offset, p.tensor.borrowed_size, p.sha256}));
    else
      pending.push_back({{"name", p.tensor.name}, {"borrowed", true}});
  }
  nlohmann::ordered_json j;
  if (laid_ != nullptr) {
    if (laid_->open != nullptr) NIBBLE_RETURN_IF_ERROR(laid_->open->Sync());
    j["laid_out"] = {{"tensors_written", laid_->next},
                     {"open_bytes", laid_->open != nullptr ? laid_->open->size() : 0},
                     {"open_sha256", laid_->sha != nullptr ? laid_->sha->HexDigestSoFar() : ""}};
  }
  j["shards"] = shards;
  j["open_shard"] = pending;
  j["open_shard_bytes"] = pending_bytes_;
  j["total_bytes"] = total_bytes_;
  j["spool_bytes"] = spool_ != nullptr ? spool_->size() : 0;
  return j;
}

void CheckpointWriter::KeepStaging(bool keep) {
  keep_ = keep;
  staging_.Keep(keep);
  if (spool_ != nullptr) spool_->Keep(keep);
}

void CheckpointWriter::AfterBoundary() {
  for (const auto& [offset, size] : discard_later_) spool_->Discard(offset, size);
  discard_later_.clear();
}

Result<CheckpointWriter> CheckpointWriter::Resume(StagingDir staging, int64_t max_shard_size, const nlohmann::ordered_json& state,
                                                  const std::function<Result<TensorToWrite>(const std::string&)>& borrow) {
  CheckpointWriter w;
  w.staging_ = std::move(staging);
  w.max_shard_size_ = max_shard_size;
  w.resumable_ = true;
  w.resumed_ = true;
  try {
    if (state.contains("laid_out")) {
      const auto& lo = state.at("laid_out");
      w.laid_ = std::make_shared<LaidOut>();
      w.laid_->resume_next = lo.at("tensors_written").get<size_t>();
      w.laid_->resume_bytes = lo.at("open_bytes").get<uint64_t>();
      w.laid_->resume_sha256 = lo.at("open_sha256").get<std::string>();
    }
    for (const auto& sh : state.at("shards")) {
      const std::string file = JoinPath(w.staging_.path(), sh.at("file").get<std::string>());
      if (!PathExists(file)) return MakeErrorCode(ErrorCode::kCorruptInput, "staged shard ", file, " is missing");
      std::error_code ec;
      const uint64_t size = static_cast<uint64_t>(fs::file_size(file, ec));
      if (size != sh.at("size").get<uint64_t>())
        return MakeErrorCode(ErrorCode::kCorruptInput, "staged shard ", file, ": size ", size, ", the manifest records ",
                             sh.at("size").get<uint64_t>());
      NIBBLE_ASSIGN_OR_RETURN(std::string sha, FileSha256(file));
      if (sha != sh.at("sha256").get<std::string>())
        return MakeErrorCode(ErrorCode::kCorruptInput, "staged shard ", file, ": SHA-256 differs from the manifest's");
      w.shard_info_.push_back({size, sha});
      w.shard_tensors_.push_back(sh.at("tensors").get<std::vector<std::string>>());
    }
    // Temporary files of writes a killed run did not finish (AtomicFileWriter's "<name>.tmp-<pid>").
    std::error_code lec;
    for (const auto& e : fs::directory_iterator(w.staging_.path(), lec))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) fs::remove(e.path(), lec);
    // Shards a killed run wrote after its last boundary (a laid-out shard open at the boundary is
    // kept: ResumeLaidOut cuts it back).
    const bool open_kept = w.laid_ != nullptr && w.laid_->resume_bytes > 0;
    for (size_t i = w.shard_tensors_.size() + (open_kept ? 1 : 0);; ++i) {
      const std::string extra = JoinPath(w.staging_.path(), PendingName(i));
      if (!PathExists(extra)) break;
      std::error_code ec;
      fs::remove(extra, ec);
    }
    const uint64_t spool_bytes = state.at("spool_bytes").get<uint64_t>();
    const std::string spool_path = JoinPath(w.staging_.path(), "tensors.spool");
    if (spool_bytes > 0 || PathExists(spool_path)) {
      NIBBLE_ASSIGN_OR_RETURN(w.spool_, AppendFile::Reopen(spool_path, spool_bytes));
      w.spool_->Keep(true);
    }
    w.keep_ = true;
    for (const auto& p : state.at("open_shard")) {
      if (p.contains("borrowed")) {
        NIBBLE_ASSIGN_OR_RETURN(TensorToWrite t, borrow(p.at("name").get<std::string>()));
        w.pending_.push_back({std::move(t), false, 0, ""});
        continue;
      }
      NIBBLE_ASSIGN_OR_RETURN(Spooled s, SpooledFromJson(p));
      NIBBLE_RETURN_IF_ERROR(w.VerifySpooled(s));
      Pending q;
      q.tensor.name = s.name;
      q.tensor.dtype = s.dtype;
      q.tensor.shape = s.shape;
      q.tensor.borrowed_size = s.size;
      q.spooled = true;
      q.offset = s.offset;
      q.sha256 = s.sha256;
      w.pending_.push_back(std::move(q));
    }
    w.pending_bytes_ = state.at("open_shard_bytes").get<int64_t>();
    w.total_bytes_ = state.at("total_bytes").get<int64_t>();
  } catch (const std::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, "the manifest's writer state: ", e.what());
  }
  return w;
}

// A resumed laid-out run, laid out again: its finished shards hold the layout's first shards, and
// the shard open at the boundary is cut back to the bytes the manifest records and checked
// against their SHA-256; writing goes on after them.
Status CheckpointWriter::ResumeLaidOut() {
  LaidOut& l = *laid_;
  const size_t done = shard_tensors_.size();
  for (size_t sh = 0; sh < done; ++sh) {
    const bool same = sh < l.shard_end.size() && shard_tensors_[sh].size() == l.shard_end[sh] - l.ShardStart(sh) &&
                      std::equal(shard_tensors_[sh].begin(), shard_tensors_[sh].end(), l.tensors.begin() + static_cast<std::ptrdiff_t>(l.ShardStart(sh)),
                                 [](const std::string& a, const TensorSlot& b) { return a == b.name; });
    if (!same)
      return MakeErrorCode(ErrorCode::kCorruptInput, "staged shard ", JoinPath(staging_.path(), PendingName(sh)),
                           " holds other tensors than this run lays out");
  }
  const size_t start = done < l.shard_end.size() ? l.ShardStart(done) : l.tensors.size();
  const size_t end = done < l.shard_end.size() ? l.shard_end[done] : l.tensors.size();
  uint64_t bytes = l.resume_next > start && done < l.preamble.size() ? l.preamble[done].size() : 0;
  for (size_t i = start; i < l.resume_next && i < end; ++i) bytes += SlotBytes(l.tensors[i]);
  if (l.resume_next < start || l.resume_next > end || (l.resume_next == end && end > start) || bytes != l.resume_bytes)
    return MakeErrorCode(ErrorCode::kCorruptInput, "the manifest's writer state (", l.resume_next, " tensors, ", l.resume_bytes,
                         " bytes in the open shard) does not match this run's layout (", bytes, " bytes)");
  l.next = l.resume_next;
  if (l.resume_bytes == 0) return Status::Ok();
  const std::string file = JoinPath(staging_.path(), PendingName(done));
  NIBBLE_ASSIGN_OR_RETURN(l.open, AppendFile::Reopen(file, l.resume_bytes));
  l.open->Keep(true);
  l.sha = std::make_unique<Sha256>();
  NIBBLE_RETURN_IF_ERROR(FileSha256Update(file, 0, static_cast<int64_t>(l.resume_bytes), *l.sha));
  if (l.sha->HexDigestSoFar() != l.resume_sha256)
    return MakeErrorCode(ErrorCode::kCorruptInput, "staged shard ", file, ": its first ", l.resume_bytes,
                         " bytes have a different SHA-256 than the manifest records");
  return Status::Ok();
}

}  // namespace nibble
