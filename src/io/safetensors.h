// safetensors reading (over mmap, single file or sharded index) and writing.
//
// Format: 8-byte little-endian header length n, n bytes of UTF-8 JSON object
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the
// data region; offsets are relative to the data region start. Everything read from the file is
// checked: header length against the file, JSON well-formed, no duplicate names, offsets in range,
// non-overlapping, and end - begin == prod(shape) * dtype size (with overflow checks).
// Non-goal: PyTorch pickles (.bin/.pt) are never read (arbitrary code execution risk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "io/file.h"

namespace nibble {

/// Element types stored in safetensors files (names as in the safetensors header).
enum class DType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

/// Header name of a dtype ("F32", "BF16", ...).
const char* DTypeName(DType t);
/// Bytes per element.
size_t DTypeSize(DType t);
/// Parses a header dtype name; nullopt-like error for unknown names.
Result<DType> ParseDType(const std::string& name);

/// A tensor inside a mapped file: raw little-endian bytes, row-major, no copy.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mmap; valid while the owning file lives
  size_t nbytes = 0;
  std::string file;  // path of the file it came from (for error messages)

  int64_t numel() const;
  /// "[4096, 11008]" for messages.
  std::string ShapeString() const;
};

/// Formats a shape as "[a, b]".
std::string ShapeToString(const std::vector<int64_t>& shape);

/// The parsed header of one safetensors file. Tensor data pointers refer to `base + offset`.
struct SafetensorsHeader {
  std::vector<TensorView> tensors;  // in header order
  std::map<std::string, std::string> metadata;
};

/// Parses and validates a whole safetensors file image `data[0..size)`. `file` names it in errors.
/// Errors: header length 0 / past EOF / absurd; not UTF-8 / not JSON / not an object; duplicate
/// names; bad dtype; bad shape (negative, overflow); offsets reversed / past end / overlapping /
/// not matching shape x dtype; malformed __metadata__.
Result<SafetensorsHeader> ParseSafetensors(const uint8_t* data, size_t size, const std::string& file);

/// One opened safetensors file (mmap kept alive).
class SafetensorsFile {
 public:
  static Result<std::shared_ptr<SafetensorsFile>> Open(const std::string& path);
  const std::vector<TensorView>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::string& path() const { return map_->path(); }
  const MappedFile& map() const { return *map_; }

 private:
  std::shared_ptr<MappedFile> map_;
  SafetensorsHeader header_;
};

/// All tensors of a model directory: `model.safetensors`, or the shards listed by
/// `model.safetensors.index.json` (key "weight_map"). Lookup by HF tensor name.
class TensorStore {
 public:
  /// Opens the tensors of model dir `dir`. Errors: no safetensors (a `pytorch_model.bin` is
  /// refused with the reason), bad index, missing shard, a tensor listed in two shards or present
  /// in a shard other than the one the index names, plus every ParseSafetensors error.
  static Result<TensorStore> OpenDir(const std::string& dir);
  /// Opens explicit files (tests, tools).
  static Result<TensorStore> OpenFiles(const std::vector<std::string>& paths);

  /// nullptr when absent.
  const TensorView* Find(const std::string& name) const;
  /// Error naming the tensor and the directory when absent.
  Result<const TensorView*> Get(const std::string& name) const;
  /// Sorted tensor names.
  std::vector<std::string> Names() const;
  const std::string& description() const { return description_; }

  /// `t`'s bytes (a tensor of this store) with shared ownership of its mapped file: valid after
  /// the store is gone, for as long as the pointer lives (zero-copy weights).
  std::shared_ptr<const uint8_t> Share(const TensorView& t) const;
  /// Drops the process's resident pages of `t`'s bytes (MappedFile::Release): for a tensor a
  /// loader has copied or repacked, so that the mapping and the copy are not resident together.
  /// Reading `t` afterwards stays valid (the bytes fault back in from the file).
  void Release(const TensorView& t) const;
  /// MappedFile::Evict of bytes [p, p + n) when they lie in one of this store's files (else
  /// nothing): the process's pages and the page cache of input read once.
  void Evict(const uint8_t* p, size_t n) const;
  void Evict(const TensorView& t) const { Evict(t.data, t.nbytes); }
  /// MappedFile::WillNeed of `t`'s bytes: read ahead of its use (nothing when `t` is not here).
  void WillNeed(const TensorView& t) const;

 private:
  // The file holding `t`'s bytes; nullptr when `t` is not a tensor of this store.
  const std::shared_ptr<SafetensorsFile>* FileOf(const TensorView& t) const;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> by_name_;
  std::string description_;
};

/// A tensor to write: its data must be prod(shape) * DTypeSize(dtype) bytes long. The data is
/// either owned (`bytes`) or borrowed (`borrowed`, e.g. a tensor of a memory-mapped input
/// checkpoint written unchanged, so it is never copied into memory); borrowed memory must stay
/// valid until the write returns. When `borrowed` is non-null it wins and `bytes` is ignored.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  const uint8_t* borrowed = nullptr;
  size_t borrowed_size = 0;

  /// The data to write: the borrowed span when set, else `bytes`.
  std::span<const uint8_t> data() const {
    return borrowed != nullptr ? std::span<const uint8_t>(borrowed, borrowed_size) : std::span<const uint8_t>(bytes);
  }
};

/// A tensor written unchanged: its data borrowed from the memory-mapped input, never copied.
TensorToWrite BorrowTensor(const TensorView& t);

/// A tensor's header entry without its bytes: an output laid out before its data exists
/// (CheckpointWriter::LayOut).
struct TensorSlot {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  bool operator==(const TensorSlot&) const = default;
};
/// Its byte count (shape x dtype; the caller has checked the shape: SafetensorsPreamble).
uint64_t SlotBytes(const TensorSlot& t);

/// The bytes before the data region of a safetensors file holding `tensors` in order: the 8-byte
/// length and the padded header, as WriteSafetensors writes them. Errors: as SerializeSafetensors.
Result<std::string> SafetensorsPreamble(const std::vector<TensorSlot>& tensors,
                                        const std::map<std::string, std::string>& metadata);

/// Serialises tensors (in the given order) with optional __metadata__ into a safetensors image.
/// Header padded with spaces to a multiple of 8 bytes. Errors: duplicate names, a tensor named
/// "__metadata__", negative dimension, size overflow, byte count not matching shape x dtype, a name
/// or metadata string that is not UTF-8 (so it never writes a file ParseSafetensors refuses).
Result<std::vector<uint8_t>> SerializeSafetensors(const std::vector<const TensorToWrite*>& tensors,
                                                  const std::map<std::string, std::string>& metadata);

/// Writes the same image as SerializeSafetensors to `path` atomically (temporary file, fsync,
/// rename; file.h AtomicFileWriter), streaming header and tensor data to the file without
/// assembling the image in memory; `written(i)`, when given, is called once tensors[i]'s bytes are
/// written (a caller drops their mapped pages). Same errors, plus the file's write errors (naming
/// the path).
Status WriteSafetensors(const std::string& path, const std::vector<const TensorToWrite*>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        const std::function<void(size_t)>& written = nullptr);

}  // namespace nibble
