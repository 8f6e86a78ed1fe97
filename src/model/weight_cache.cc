#include "model/weight_cache.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/check.h"
#include "base/memory.h"
#include "base/page_buffer.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "io/file.h"
#include "io/json.h"
#include "kernels/int4_packed.h"

namespace nibble {

namespace {

constexpr uint64_t kPage = 4096;
constexpr char kMagic[] = "NIBBLE-W4P\n";

uint64_t AlignUp(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }

// One line per *.json / *.safetensors file of the checkpoint (name, size, mtime, inode), sorted;
// symbolic links (a Hugging Face cache snapshot) are followed. Adds the safetensors bytes.
Result<std::string> CheckpointIdentity(const std::string& dir, int64_t* safetensors_bytes) {
  std::vector<std::string> lines;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".json") && !name.ends_with(".safetensors")) continue;
    struct stat st;
    if (::stat(e.path().c_str(), &st) != 0) return MakeErrorCode(ErrorCode::kIo, "cannot stat ", e.path().string(), ": ", ErrnoText());
    if (!S_ISREG(st.st_mode)) continue;
    if (name.ends_with(".safetensors")) *safetensors_bytes += st.st_size;
    char line[512];
    std::snprintf(line, sizeof line, " %jd %jd.%09ld %ju %ju", static_cast<intmax_t>(st.st_size),
                  static_cast<intmax_t>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec, static_cast<uintmax_t>(st.st_ino),
                  static_cast<uintmax_t>(st.st_dev));
    lines.push_back(name + line);
  }
  if (ec) return MakeErrorCode(ErrorCode::kIo, "cannot list ", dir, ": ", ec.message());
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// Staging files "<entry>.tmp-<pid>" whose process is gone (a killed load).
void RemoveDeadStaging(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".w4p.tmp-");
    if (at == std::string::npos) continue;
    const long pid = std::strtol(name.c_str() + at + 9, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink(e.path().c_str());
  }
}

// All `n` bytes of buf at file offset `at` through `io` (::pread or ::pwrite), which moves at most
// about 2 GiB a call on Linux: 1 GiB at a time, short transfers continued.
template <typename Io, typename Ptr>
bool WholeRange(Io io, int fd, Ptr buf, uint64_t n, uint64_t at) {
  while (n > 0) {
    const ssize_t r = io(fd, buf, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    buf += r, at += static_cast<uint64_t>(r), n -= static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace

std::string DefaultWeightCacheDir() {
  if (const char* d = std::getenv("NIBBLE_CACHE_DIR"); d != nullptr && *d != '\0') return JoinPath(d, "weights");
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d != nullptr && *d != '\0') return JoinPath(d, "nibble/weights");
  if (const char* d = std::getenv("HOME"); d != nullptr && *d != '\0') return JoinPath(d, ".cache/nibble/weights");
  return "";
}

std::unique_ptr<WeightCache> WeightCache::Open(const std::string& checkpoint_dir, const WeightCacheOptions& o,
                                               std::string* note) {
  if (o.dir.empty()) return nullptr;
  std::error_code ec;
  const std::string real = std::filesystem::canonical(checkpoint_dir, ec).string();
  if (ec) return nullptr;
  int64_t safetensors_bytes = 0;
  Result<std::string> identity = CheckpointIdentity(real, &safetensors_bytes);
  if (!identity.ok() || safetensors_bytes < o.min_bytes) return nullptr;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) {
    *note = "weight cache not used: cannot create " + o.dir + ": " + ec.message();
    return nullptr;
  }
  std::unique_ptr<WeightCache> c(new WeightCache());
  c->dir_ = o.dir;
  c->owned_ = o.pages == WeightCachePages::kOwned;
  c->key_ = Sha256Hex("nibble-w4p " + std::to_string(kWeightCacheVersion) + "\n" + real + "\n" + *identity);
  c->path_prefix_ = Sha256Hex(real).substr(0, 16) + "-";
  c->path_ = JoinPath(o.dir, c->path_prefix_ + c->key_.substr(0, 32) + ".w4p");
  RemoveDeadStaging(o.dir);
  if (PathExists(c->path_)) {
    Status s = c->ReadIndex(c->path_);
    if (s.ok()) {
      c->hit_ = true;
      return c;
    }
    *note = "weight cache entry ignored and written again: " + s.error().message;
    c->map_.reset();
    c->entries_.clear();
    if (c->read_fd_ >= 0) ::close(std::exchange(c->read_fd_, -1));
  }
  c->staging_ = c->path_ + ".tmp-" + std::to_string(::getpid());
  c->fd_ = ::open(c->staging_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (c->fd_ < 0) {
    *note = "weight cache not written: cannot create " + c->staging_ + ": " + ErrnoText();
    return nullptr;
  }
  c->end_ = kPage;  // the header's page
  return c;
}

WeightCache::~WeightCache() {
  if (read_fd_ >= 0) ::close(read_fd_);
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(staging_.c_str());
  }
}

// Maps the entry at `path_` and reads its index; every offset and size is checked against the file.
Status WeightCache::ReadIndex(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MakeErrorCode(ErrorCode::kIo, "cannot open ", file, ": ", ErrnoText());
  struct stat st;
  char head[kPage + 1] = {};
  const bool read_ok = ::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(kPage) &&
                       ::pread(fd, head, kPage, 0) == static_cast<ssize_t>(kPage);
  if (!read_ok) {
    ::close(fd);
    return MakeErrorCode(ErrorCode::kCorruptInput, file, ": shorter than its ", kPage, "-byte header");
  }
  int version = 0;
  unsigned long long index_at = 0, index_bytes = 0, file_bytes = 0;
  char key[65] = {};
  if (std::strncmp(head, kMagic, sizeof kMagic - 1) != 0 ||
      std::sscanf(head + sizeof kMagic - 1, "%d %llu %llu %llu %64s", &version, &index_at, &index_bytes, &file_bytes, key) != 5 ||
      version != kWeightCacheVersion || key_ != key || file_bytes != static_cast<unsigned long long>(st.st_size) ||
      index_at < kPage || index_at > file_bytes || index_bytes > file_bytes - index_at) {
    ::close(fd);
    return MakeErrorCode(ErrorCode::kCorruptInput, file, ": header does not match this checkpoint, version ",
                         kWeightCacheVersion, " and a file of ", st.st_size, " bytes");
  }
  // Owned pages: the weights are read with pread (no page of them mapped here), the map serves
  // the index and column orders.
  void* p = ::mmap(nullptr, file_bytes, PROT_READ, owned_ ? MAP_SHARED : MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return MakeErrorCode(ErrorCode::kIo, "cannot mmap ", file, ": ", ErrnoText());
  }
  if (owned_)
    read_fd_ = fd;
  else
    ::close(fd);
  map_bytes_ = file_bytes;
  map_ = std::shared_ptr<const void>(p, [bytes = map_bytes_](const void* q) { ::munmap(const_cast<void*>(q), bytes); });
  const char* base = static_cast<const char*>(p);
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json index, ParseJsonText(std::string(base + index_at, index_bytes), file));
  try {
    for (const auto& [name, j] : index.at("linears").items()) {
      Entry e;
      e.n = j.at("n").get<int64_t>(), e.k = j.at("k").get<int64_t>(), e.group_size = j.at("group_size").get<int64_t>();
      e.symmetric = j.at("symmetric").get<bool>();
      e.desc = j.at("desc").get<std::string>();
      e.offset = j.at("offset").get<uint64_t>(), e.bytes = j.at("bytes").get<uint64_t>();
      e.order_offset = j.at("order_offset").get<uint64_t>();
      const bool shape_ok = e.n >= 1 && e.k >= 1 && e.group_size >= 1 && e.k % e.group_size == 0 &&
                            e.bytes == static_cast<uint64_t>(W4PackedBytes(e.n, e.k, e.group_size, e.symmetric));
      const bool in_file = e.offset % kPage == 0 && e.offset >= kPage && e.offset <= index_at && e.bytes <= index_at - e.offset &&
                           (e.order_offset == 0 || (e.order_offset <= index_at && 4 * static_cast<uint64_t>(e.k) <= index_at - e.order_offset));
      if (!shape_ok || !in_file)
        return MakeErrorCode(ErrorCode::kCorruptInput, file, ": linear \"", name, "\" has a size or offset outside the file");
      entries_[name] = std::move(e);
    }
  } catch (const nlohmann::json::exception& ex) {
    return MakeErrorCode(ErrorCode::kCorruptInput, file, ": index: ", ex.what());
  }
  return Status::Ok();
}

std::unique_ptr<Int4Linear> WeightCache::Load(const std::string& name, int64_t n, int64_t k, std::vector<float> bias) const {
  const auto it = entries_.find(name);
  if (!hit_ || it == entries_.end() || it->second.n != n || it->second.k != k) return nullptr;
  const Entry& e = it->second;
  uint8_t* const base = static_cast<uint8_t*>(const_cast<void*>(map_.get()));
  std::vector<int32_t> order;
  if (e.order_offset != 0) {
    order.resize(static_cast<size_t>(k));
    std::memcpy(order.data(), base + e.order_offset, order.size() * sizeof(int32_t));
    for (const int32_t c : order)
      if (c < 0 || c >= k) return nullptr;
  }
  PageBuffer bytes;
  if (owned_) {
    bytes = PageBuffer(e.bytes, PageBuffer::Uninitialized{});
    if (!WholeRange(::pread, read_fd_, bytes.data(), e.bytes, e.offset)) return nullptr;  // repacked from the checkpoint
  } else {
    bytes = PageBuffer::View(base + e.offset, e.bytes, map_);
  }
  return Int4Linear::FromPacked(std::move(bytes), n, k, e.group_size, e.symmetric, std::move(order), std::move(bias),
                                e.desc);
}

void WeightCache::Abandon(const std::string& why) {
  if (fd_ < 0) return;
  note_ = "weight cache " + path_ + " not written: " + why;
  ::close(fd_);
  ::unlink(staging_.c_str());
  fd_ = -1;
}

Int4Linear::PackedAllocator WeightCache::Allocator() {
  return [this](size_t bytes) { return AllocateInFile(bytes); };
}

PageBuffer WeightCache::AllocateInFile(size_t bytes) {
  const uint64_t at = AlignUp(end_);
  struct statvfs fs;
  if (fd_ >= 0 && ::fstatvfs(fd_, &fs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    const uint64_t keep = std::max<uint64_t>(uint64_t{1} << 30, static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize / 20);
    if (avail < bytes + keep)
      Abandon(dir_ + " has " + FormatBytes(static_cast<double>(avail)) + " free and " +
              FormatBytes(static_cast<double>(keep)) + " of its file system stay free");
  }
  // Blocks reserved up front: a full disk is an error here, never a SIGBUS when a page is written.
  if (fd_ >= 0 && ::fallocate(fd_, 0, static_cast<off_t>(at), static_cast<off_t>(bytes)) != 0)
    Abandon("cannot reserve " + FormatBytes(static_cast<double>(bytes)) + " in " + staging_ + ": " + ErrnoText());
  if (fd_ >= 0 && owned_) {  // written to the file by Record(); the linear keeps it
    PageBuffer b(bytes, PageBuffer::Uninitialized{});
    end_ = at + bytes;
    staged_[b.data()] = at;
    return b;
  }
  // Mapped: one scratch buffer, reused linear after linear; Record() writes it to the file with
  // pwrite and moves the linear onto the file's pages. Page-cache pages that write faults of a
  // shared mapping create are mostly single 4 KiB folios scattered in memory, which the decode
  // loops of every later load read up to a quarter slower than the large folios pwrite and
  // readahead leave (docs/PERFORMANCE.md "Packed-weight cache").
  if (fd_ >= 0) {
    if (scratch_ == nullptr || scratch_->size() < bytes)
      scratch_ = std::make_shared<PageBuffer>(bytes, PageBuffer::Uninitialized{});
    end_ = at + bytes;
    staged_[scratch_->data()] = at;
    return PageBuffer::View(scratch_->data(), bytes, scratch_);
  }
  return PageBuffer(bytes, PageBuffer::Uninitialized{});
}

void WeightCache::Record(const std::string& name, Int4Linear& linear) {
  const auto it = staged_.find(linear.packed().data);
  if (it == staged_.end()) return;
  const uint64_t at = it->second;
  staged_.erase(it);
  const W4PackedWeight& w = linear.packed();
  const size_t bytes = static_cast<size_t>(W4PackedBytes(w.n, w.k, w.group_size, w.symmetric));
  if (fd_ >= 0) Write(name, linear, at, bytes);
  if (owned_) return;
  // Off the scratch buffer: onto the file's pages, or owned memory when the entry was dropped.
  PageBuffer moved;
  if (fd_ >= 0) {
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd_, static_cast<off_t>(at));
    if (p != MAP_FAILED) {
      auto owner = std::shared_ptr<const void>(p, [bytes](const void* q) { ::munmap(const_cast<void*>(q), bytes); });
      moved = PageBuffer::View(static_cast<uint8_t*>(p), bytes, std::move(owner));
    }
  }
  if (moved.size() == 0) {
    moved = PageBuffer(bytes, PageBuffer::Uninitialized{});
    std::memcpy(moved.data(), w.data, bytes);
  }
  linear.MovePacked(std::move(moved));
}

void WeightCache::Write(const std::string& name, const Int4Linear& linear, uint64_t at, size_t bytes) {
  const W4PackedWeight& w = linear.packed();
  Entry e{w.n, w.k, w.group_size, w.symmetric, linear.Describe(), at, bytes, 0};
  if (!WholeRange(::pwrite, fd_, w.data, e.bytes, e.offset))
    return Abandon("cannot write " + staging_ + ": " + ErrnoText());
  const std::vector<int32_t>& order = linear.column_order();
  if (!order.empty()) {
    e.order_offset = AlignUp(end_);
    const size_t order_bytes = order.size() * sizeof(int32_t);
    if (::pwrite(fd_, order.data(), order_bytes, static_cast<off_t>(e.order_offset)) != static_cast<ssize_t>(order_bytes))
      return Abandon("cannot write " + staging_ + ": " + ErrnoText());
    end_ = e.order_offset + order_bytes;
  }
  entries_[name] = std::move(e);
}

Status WeightCache::Commit() {
  scratch_.reset();  // every linear has moved off it
  if (fd_ < 0) return Status::Ok();
  nlohmann::json linears = nlohmann::json::object();
  for (const auto& [name, e] : entries_)
    linears[name] = {{"n", e.n}, {"k", e.k}, {"group_size", e.group_size}, {"symmetric", e.symmetric},
                     {"desc", e.desc}, {"offset", e.offset}, {"bytes", e.bytes}, {"order_offset", e.order_offset}};
  const std::string index = nlohmann::json{{"key", key_}, {"linears", linears}}.dump();
  const uint64_t index_at = AlignUp(end_), file_bytes = index_at + index.size();
  std::string head(kPage, '\0');
  const int len = std::snprintf(head.data(), kPage, "%s%d %" PRIu64 " %zu %" PRIu64 " %s\n", kMagic, kWeightCacheVersion,
                                index_at, index.size(), file_bytes, key_.c_str());
  NIBBLE_CHECK(len > 0 && static_cast<uint64_t>(len) < kPage);
  // Data and index reach the disk before the header names them and the rename publishes them.
  const bool ok = ::pwrite(fd_, index.data(), index.size(), static_cast<off_t>(index_at)) == static_cast<ssize_t>(index.size()) &&
                  ::fdatasync(fd_) == 0 && ::pwrite(fd_, head.data(), kPage, 0) == static_cast<ssize_t>(kPage) &&
                  ::fdatasync(fd_) == 0 && ::rename(staging_.c_str(), path_.c_str()) == 0;
  if (!ok) {
    const std::string why = ErrnoText();
    Abandon("cannot write " + staging_ + ": " + why);
    return MakeErrorCode(ErrorCode::kIo, note_);
  }
  ::close(fd_);
  fd_ = -1;
  std::error_code ec;
  const std::string mine = std::filesystem::path(path_).filename().string();
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name != mine && name.rfind(path_prefix_, 0) == 0 && name.ends_with(".w4p")) std::filesystem::remove(e.path(), ec);
  }
  return Status::Ok();
}

}  // namespace nibble
