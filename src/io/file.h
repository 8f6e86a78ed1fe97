// File utilities: whole-file reads with clear errors, read-only memory maps, and atomic writes.
//
// Goals: every failure names the path and the OS reason; maps are read-only (model files are
// untrusted and never modified). Non-goal: Windows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"

namespace nibble {

/// Reads a whole file into a string. Errors: missing / unreadable / is a directory (names path).
Result<std::string> ReadFileToString(const std::string& path);

/// True when `path` exists (file or directory).
bool PathExists(const std::string& path);

/// True when `path` is a directory.
bool IsDirectory(const std::string& path);

/// Joins two path pieces with exactly one '/'.
std::string JoinPath(const std::string& a, const std::string& b);

/// A read-only mmap of a whole file; unmapped on destruction. An empty file maps to size 0.
class MappedFile {
 public:
  /// Maps `path`. Errors: cannot open / stat / map (names path and strerror).
  static Result<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Drops the process's pages of [p, p + n) (a range inside this map; only the whole pages
  /// inside it): madvise(MADV_DONTNEED). The map is read-only and private, so a later read of
  /// the range faults the same bytes back in from the file (the page cache keeps them); this only
  /// lowers resident memory once a loader has copied or repacked a tensor.
  void Release(const uint8_t* p, size_t n) const;
  /// Release, and the kernel's page cache of the same file range dropped too
  /// (posix_fadvise DONTNEED): for input read once (quantize), whose cached pages would otherwise
  /// count against a memory-limited cgroup. Best effort: errors are ignored.
  void Evict(const uint8_t* p, size_t n) const;
  /// Asks the kernel to read [p, p + n) (a range inside this map) into the page cache ahead of
  /// its use, without waiting (madvise(MADV_WILLNEED)): input about to be read once, whose
  /// page-by-page read faults would otherwise each wait for the disk. Best effort.
  void WillNeed(const uint8_t* p, size_t n) const;
  /// Whether [p, p + n) lies inside the map.
  bool Contains(const uint8_t* p, size_t n) const { return p >= data_ && n <= size_ && p - data_ <= static_cast<ptrdiff_t>(size_ - n); }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

/// Writes `bytes` to `path` via a temporary file in the same directory, fsync and rename, so a
/// reader never sees a half-written file. Errors name the path and strerror.
Status WriteFileAtomic(const std::string& path, const void* bytes, size_t size);

/// WriteFileAtomic for a file made of consecutive parts (written in order, never concatenated in
/// memory). Same guarantees and errors.
Status WriteFileAtomicParts(const std::string& path, const std::vector<std::span<const uint8_t>>& parts);

/// A file written in pieces as they are produced (too large to hold in memory) with the guarantees
/// of WriteFileAtomic: the data goes to a temporary file beside `path`, Commit() fsyncs and renames
/// it; a writer destroyed without Commit() removes the temporary file and leaves `path` as it was.
class AtomicFileWriter {
 public:
  /// Creates the temporary file. Errors name it and strerror.
  static Result<std::unique_ptr<AtomicFileWriter>> Open(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  Status Write(const void* bytes, size_t size);
  /// fsync, close, rename onto `path`. Errors name the files and strerror.
  Status Commit();

 private:
  AtomicFileWriter() = default;
  std::string path_, tmp_;
  int fd_ = -1;
};

class Sha256;  // base/sha256.h

/// The SHA-256 of bytes [offset, offset + size) of `path` (size -1: to the end), read in 1 MiB
/// chunks whose page cache is dropped after (files larger than memory; no mapped pages stay).
/// Errors: cannot open, a read error, the file shorter than the range (naming the path).
Result<std::string> FileSha256(const std::string& path, uint64_t offset = 0, int64_t size = -1);
/// The same range fed into `h` (a digest that goes on past it). Same errors.
Status FileSha256Update(const std::string& path, uint64_t offset, int64_t size, Sha256& h);

/// Checks that `dir` is a model directory holding a config.json. Errors name the path: "does not
/// exist", "is not a directory", "no config.json (expected a Hugging Face model directory)".
Status CheckModelDir(const std::string& dir);

}  // namespace nibble
