// Packed-weight cache: an int4 checkpoint's linears in the kernels' W4P layout
// (kernels/int4_packed.h), written to one file at the first load and read back at later loads of
// the unchanged checkpoint, so those skip repacking. Repacking writes every weight byte into
// memory the process has never touched, and that first touch, not the repack arithmetic, is most
// of a 7B load (docs/PERFORMANCE.md "Loading"): by default a hit maps the entry's page-cache pages;
// WeightCachePages::kOwned copies them into owned huge pages instead (slower load).
//
// Entry `<dir>/<path hash>-<identity hash>.w4p` (little endian):
//   [0, 4096)  header: "NIBBLE-W4P\n" then "<version> <index offset> <index bytes> <file bytes> <key>\n"
//   data       each linear's packed bytes at a 4096-aligned offset; act-order linears' column
//              order as int32 x K after them
//   index      JSON {"key", "linears": {"<module>": {"n", "k", "group_size", "symmetric", "desc",
//              "offset", "bytes", "order_offset"}}}
// The key hashes the checkpoint's real path, the name, size, mtime and inode of each of its
// *.json / *.safetensors files, and kWeightCacheVersion: a changed checkpoint gets a new entry,
// and writing it removes the older entries of the same path. The file is written beside its final
// name, synced and renamed, so a killed load leaves no entry (its staging file is removed by the
// next load that finds its process gone).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nibble/model.h>

#include "base/result.h"
#include "model/int4_linear.h"

namespace nibble {

/// Bump whenever the W4P layout or a packer's output changes: older entries are then ignored.
inline constexpr int kWeightCacheVersion = 1;

/// $NIBBLE_CACHE_DIR, else $XDG_CACHE_HOME/nibble, else $HOME/.cache/nibble ("" when none is set).
std::string DefaultWeightCacheDir();

struct WeightCacheOptions {
  std::string dir;        // the cache directory (created when missing)
  int64_t min_bytes = 0;  // checkpoints whose *.safetensors total less are not cached
  WeightCachePages pages = WeightCachePages::kMapped;  // LoadOptions::weight_cache_pages
};

class WeightCache {
 public:
  /// The entry of the checkpoint in `checkpoint_dir`: mapped when a valid one exists (hit()), else
  /// a staging file to pack into. nullptr when the cache is not used for it; `note` then says why
  /// when that is worth saying (directory not writable, an entry that does not read back).
  static std::unique_ptr<WeightCache> Open(const std::string& checkpoint_dir, const WeightCacheOptions& o,
                                           std::string* note);
  ~WeightCache();
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;

  bool hit() const { return hit_; }
  /// The entry's file (its final name).
  const std::string& path() const { return path_; }

  /// Hit: linear `name` (over the mapped bytes, or a copy of them: WeightCachePages) when the
  /// entry holds it as [n, k], else nullptr.
  std::unique_ptr<Int4Linear> Load(const std::string& name, int64_t n, int64_t k, std::vector<float> bias) const;

  /// Miss: where linears being packed, one at a time, put their bytes while the file can grow
  /// (keeping max(1 GiB, 5 %) of its file system free): a scratch buffer (kMapped) or owned
  /// memory (kOwned) that Record() writes to the staging file; else owned memory (the entry is
  /// then dropped and note() says why).
  Int4Linear::PackedAllocator Allocator();
  /// Miss: writes `linear`, packed through Allocator(), to the entry as module `name`. kMapped
  /// then moves the linear onto the file's pages (onto owned memory if the entry was dropped);
  /// kOwned leaves it in its owned memory.
  void Record(const std::string& name, Int4Linear& linear);
  /// Miss: writes index and header, syncs and renames the entry into place; removes the older
  /// entries of the same checkpoint path. Errors name the file; the loaded model stays valid.
  Status Commit();
  /// Why the entry was not written ("" when nothing went wrong).
  const std::string& note() const { return note_; }

 private:
  struct Entry {
    int64_t n = 0, k = 0, group_size = 0;
    bool symmetric = false;
    std::string desc;
    uint64_t offset = 0, bytes = 0, order_offset = 0;  // order_offset 0: natural column order
  };
  WeightCache() = default;
  Status ReadIndex(const std::string& name_for_errors);
  PageBuffer AllocateInFile(size_t bytes);
  void Write(const std::string& name, const Int4Linear& linear, uint64_t at, size_t bytes);
  void Abandon(const std::string& why);

  bool hit_ = false;
  bool owned_ = false;  // WeightCachePages::kOwned
  std::string path_, staging_, key_, path_prefix_, dir_;
  int fd_ = -1;
  int read_fd_ = -1;                             // hit with owned pages: the entry, for pread
  uint64_t end_ = 0;                             // staging: bytes used so far
  std::shared_ptr<const void> map_;              // hit: the whole file, mapped
  uint64_t map_bytes_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<const uint8_t*, uint64_t> staged_;    // staging: each handed-out buffer's file offset
  std::shared_ptr<PageBuffer> scratch_;          // staging, kMapped: the buffer linears pack into
  std::string note_;
};

}  // namespace nibble
