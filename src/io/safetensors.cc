#include "io/safetensors.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>

#include "base/strings.h"
#include "io/json.h"

namespace nibble {

using nlohmann::json;

namespace {

// Headers larger than this are refused: real headers are a few MB at most (safetensors' own
// reader uses 100 MB as its limit).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
    {DType::kF64, "F64", 8}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2}, {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

const char* DTypeName(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

size_t DTypeSize(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

Result<DType> ParseDType(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.type;
  return MakeErrorCode(ErrorCode::kCorruptInput, "unknown dtype \"", name,
                   "\" (expected one of F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)");
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorView::ShapeString() const { return ShapeToString(shape); }

Result<SafetensorsHeader> ParseSafetensors(const uint8_t* data, size_t size, const std::string& file) {
  if (size < 8) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": file is ", size, " bytes, too short for a safetensors header length (8 bytes)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n == 0) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": safetensors header length is 0, expected a JSON header");
  if (n > kMaxHeaderBytes) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": safetensors header length ", n, " bytes is larger than the limit of ", kMaxHeaderBytes, " bytes");
  if (n > size - 8) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": safetensors header length ", n, " runs past the end of the file (", size, " bytes)");
  const char* hb = reinterpret_cast<const char*>(data + 8);
  NIBBLE_ASSIGN_OR_RETURN(json header, ParseJsonText(std::string(hb, n), file + ": safetensors header"));
  if (!header.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": safetensors header is ", header.type_name(), ", expected a JSON object");

  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  SafetensorsHeader out;
  struct Span { uint64_t b, e; std::string name; };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      if (!v.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": __metadata__ is ", v.type_name(), ", expected an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": __metadata__[\"", m.key(), "\"] is ", m.value().type_name(), ", expected a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    std::string where = file + ": tensor \"" + name + "\"";
    if (!v.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": entry is ", v.type_name(), ", expected an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": missing or non-string \"dtype\"");
    if (sh == v.end() || !sh->is_array()) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": missing or non-array \"shape\"");
    if (off == v.end() || !off->is_array() || off->size() != 2) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": \"data_offsets\" must be an array of 2 integers");
    auto dtype = ParseDType(dt->get<std::string>());
    if (!dtype.ok()) return dtype.error().WithContext(where);
    TensorView t;
    t.name = name;
    t.dtype = *dtype;
    t.file = file;
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_integer()) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": shape ", sh->dump(), " has a non-integer dimension");
      if (d.is_number_unsigned() ? d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) : d.get<int64_t>() < 0)
        return MakeErrorCode(ErrorCode::kCorruptInput, where, ": shape ", sh->dump(), " has a negative or out-of-range dimension");
      int64_t dim = d.get<int64_t>();
      if (MulOverflow(numel, static_cast<uint64_t>(dim), &numel) || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return MakeErrorCode(ErrorCode::kCorruptInput, where, ": shape ", sh->dump(), " overflows 64-bit element count");
      t.shape.push_back(dim);
    }
    uint64_t nbytes;
    if (MulOverflow(numel, DTypeSize(t.dtype), &nbytes)) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": shape ", sh->dump(), " x ", DTypeName(t.dtype), " overflows 64-bit byte count");
    const json& b = (*off)[0];
    const json& e = (*off)[1];
    if (!b.is_number_unsigned() || !e.is_number_unsigned())
      return MakeErrorCode(ErrorCode::kCorruptInput, where, ": data_offsets ", off->dump(), " must be non-negative integers");
    uint64_t begin = b.get<uint64_t>(), end = e.get<uint64_t>();
    if (end < begin) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": data_offsets ", off->dump(), " are reversed (end < begin)");
    if (end > data_size) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": data_offsets end ", end, " is past the end of the data region (", data_size, " bytes)");
    if (end - begin != nbytes)
      return MakeErrorCode(ErrorCode::kCorruptInput, where, ": data_offsets span ", end - begin, " bytes but shape ", ShapeToString(t.shape), " x ", DTypeName(t.dtype), " needs ", nbytes, " bytes");
    t.data = data + data_start + begin;
    t.nbytes = static_cast<size_t>(nbytes);
    spans.push_back({begin, end, name});
    out.tensors.push_back(std::move(t));
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.b < b.b || (a.b == b.b && a.e < b.e); });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].b < spans[i - 1].e)
      return MakeErrorCode(ErrorCode::kCorruptInput, file, ": tensors \"", spans[i - 1].name, "\" [", spans[i - 1].b, ", ", spans[i - 1].e, ") and \"", spans[i].name, "\" [", spans[i].b, ", ", spans[i].e, ") overlap");
  }
  return out;
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(auto map, MappedFile::Open(path));
  NIBBLE_ASSIGN_OR_RETURN(auto header, ParseSafetensors(map->data(), map->size(), path));
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->map_ = std::move(map);
  f->header_ = std::move(header);
  return f;
}

const TensorView* TensorStore::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Result<const TensorView*> TensorStore::Get(const std::string& name) const {
  const TensorView* t = Find(name);
  if (t == nullptr) return MakeErrorCode(ErrorCode::kNotFound, description_, ": missing tensor \"", name, "\"");
  return t;
}

const std::shared_ptr<SafetensorsFile>* TensorStore::FileOf(const TensorView& t) const {
  for (const auto& f : files_)
    if (f->map().Contains(t.data, t.nbytes)) return &f;
  return nullptr;
}

std::shared_ptr<const uint8_t> TensorStore::Share(const TensorView& t) const {
  const std::shared_ptr<SafetensorsFile>* f = FileOf(t);
  if (f == nullptr) return nullptr;
  return std::shared_ptr<const uint8_t>(*f, t.data);
}

void TensorStore::Release(const TensorView& t) const {
  if (const std::shared_ptr<SafetensorsFile>* f = FileOf(t)) (*f)->map().Release(t.data, t.nbytes);
}

void TensorStore::Evict(const uint8_t* p, size_t n) const {
  for (const auto& f : files_)
    if (f->map().Contains(p, n)) return f->map().Evict(p, n);
}

void TensorStore::WillNeed(const TensorView& t) const {
  if (const std::shared_ptr<SafetensorsFile>* f = FileOf(t)) (*f)->map().WillNeed(t.data, t.nbytes);
}

std::vector<std::string> TensorStore::Names() const {
  std::vector<std::string> names;
  for (const auto& kv : by_name_) names.push_back(kv.first);
  return names;
}

Result<TensorStore> TensorStore::OpenFiles(const std::vector<std::string>& paths) {
  TensorStore store;
  store.description_ = paths.size() == 1 ? paths[0] : "checkpoint (" + std::to_string(paths.size()) + " shards)";
  for (const auto& p : paths) {
    NIBBLE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(p));
    for (const auto& t : f->tensors()) {
      auto [it, inserted] = store.by_name_.emplace(t.name, &t);
      if (!inserted) return MakeErrorCode(ErrorCode::kCorruptInput, "tensor \"", t.name, "\" is present in two shards: ", it->second->file, " and ", p);
    }
    store.files_.push_back(std::move(f));
  }
  return store;
}

Result<TensorStore> TensorStore::OpenDir(const std::string& dir) {
  if (!IsDirectory(dir)) return MakeErrorCode(ErrorCode::kNotFound, "model directory ", dir, ": not found or not a directory");
  const std::string single = JoinPath(dir, "model.safetensors");
  const std::string index = JoinPath(dir, "model.safetensors.index.json");
  if (PathExists(index)) {
    NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index));
    NIBBLE_ASSIGN_OR_RETURN(json j, ParseJsonText(text, index));
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return MakeErrorCode(ErrorCode::kCorruptInput, index, ": expected an object with a \"weight_map\" object");
    std::vector<std::string> shards;
    std::map<std::string, std::string> expected;  // tensor -> shard
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return MakeErrorCode(ErrorCode::kCorruptInput, index, ": weight_map[\"", it.key(), "\"] is ", it.value().type_name(), ", expected a shard file name");
      std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        return MakeErrorCode(ErrorCode::kCorruptInput, index, ": weight_map[\"", it.key(), "\"] = \"", shard, "\" is not a plain file name in the model directory");
      expected[it.key()] = shard;
      if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
    }
    std::vector<std::string> paths;
    for (const auto& s : shards) {
      std::string p = JoinPath(dir, s);
      if (!PathExists(p)) return MakeErrorCode(ErrorCode::kCorruptInput, index, ": names shard \"", s, "\" which does not exist in ", dir);
      paths.push_back(p);
    }
    NIBBLE_ASSIGN_OR_RETURN(TensorStore store, OpenFiles(paths));
    store.description_ = dir;
    for (const auto& [name, shard] : expected) {
      const TensorView* t = store.Find(name);
      if (t == nullptr) return MakeErrorCode(ErrorCode::kCorruptInput, index, ": tensor \"", name, "\" is listed in shard \"", shard, "\" but not found there");
      if (t->file != JoinPath(dir, shard)) return MakeErrorCode(ErrorCode::kCorruptInput, index, ": tensor \"", name, "\" is listed in shard \"", shard, "\" but stored in ", t->file);
    }
    return store;
  }
  if (PathExists(single)) {
    NIBBLE_ASSIGN_OR_RETURN(TensorStore store, OpenFiles({single}));
    store.description_ = dir;
    return store;
  }
  for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "consolidated.00.pth"}) {
    if (PathExists(JoinPath(dir, pickle)))
      return MakeErrorCode(ErrorCode::kUnsupported, dir, ": found ", pickle, " but no model.safetensors; PyTorch pickle files are refused because loading them can execute arbitrary code. Convert the checkpoint to safetensors (e.g. save_pretrained(..., safe_serialization=True)).");
  }
  return MakeErrorCode(ErrorCode::kNotFound, dir, ": no model.safetensors or model.safetensors.index.json found");
}

namespace {

// The padded header text of a safetensors file holding `tensors` in order (8-byte length prefix
// not included), and the total data size; `have(i)`, when given, is tensor i's byte count, checked
// against its shape. Same checks as the reader, so the writer never emits a header the reader
// refuses.
Result<std::pair<std::string, uint64_t>> BuildHeader(const std::vector<const TensorSlot*>& tensors,
                                                     const std::map<std::string, std::string>& metadata,
                                                     const std::function<size_t(size_t)>& have = nullptr) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> seen;
  // nlohmann's object is sorted by key; the data region is laid out in the caller's order.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSlot* t = tensors[i];
    // "__metadata__" is the header's metadata slot: a tensor of that name would make the file
    // unreadable.
    if (t->name == "__metadata__") return MakeErrorCode(ErrorCode::kCorruptInput, "writing safetensors: \"__metadata__\" is reserved and cannot name a tensor");
    if (!seen.insert(t->name).second) return MakeErrorCode(ErrorCode::kCorruptInput, "writing safetensors: duplicate tensor name \"", t->name, "\"");
    uint64_t nbytes = DTypeSize(t->dtype);
    for (int64_t d : t->shape) {
      if (d < 0) return MakeErrorCode(ErrorCode::kCorruptInput, "writing safetensors: tensor \"", t->name, "\" has negative dimension in shape ", ShapeToString(t->shape));
      if (MulOverflow(nbytes, static_cast<uint64_t>(d), &nbytes) || nbytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return MakeErrorCode(ErrorCode::kCorruptInput, "writing safetensors: tensor \"", t->name, "\" shape ", ShapeToString(t->shape), " x ", DTypeName(t->dtype), " overflows 64-bit byte count");
    }
    if (have && nbytes != have(i))
      return MakeErrorCode(ErrorCode::kCorruptInput, "writing safetensors: tensor \"", t->name, "\" has ", have(i), " bytes but shape ", ShapeToString(t->shape), " x ", DTypeName(t->dtype), " needs ", nbytes);
    header[t->name] = {{"dtype", DTypeName(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string h;
  try {
    h = header.dump();  // throws type_error 316 on a name or metadata string that is not UTF-8
  } catch (const json::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, "writing safetensors: a tensor name or metadata string is not valid UTF-8 (", PrintableBytes(e.what()), ")");
  }
  while (h.size() % 8 != 0) h.push_back(' ');
  return std::pair<std::string, uint64_t>(std::move(h), offset);
}

// The header of tensors with their bytes: each one's size checked against its shape.
Result<std::pair<std::string, uint64_t>> BuildHeader(const std::vector<const TensorToWrite*>& tensors,
                                                     const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSlot> slots;
  slots.reserve(tensors.size());
  for (const TensorToWrite* t : tensors) slots.push_back({t->name, t->dtype, t->shape});
  std::vector<const TensorSlot*> ptrs;
  for (const TensorSlot& s : slots) ptrs.push_back(&s);
  return BuildHeader(ptrs, metadata, [&tensors](size_t i) { return tensors[i]->data().size(); });
}

std::array<uint8_t, 8> LengthPrefix(uint64_t n) {
  std::array<uint8_t, 8> b{};
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
  return b;
}

}  // namespace

Result<std::vector<uint8_t>> SerializeSafetensors(const std::vector<const TensorToWrite*>& tensors,
                                                  const std::map<std::string, std::string>& metadata) {
  NIBBLE_ASSIGN_OR_RETURN(auto header, BuildHeader(tensors, metadata));
  const std::string& h = header.first;
  std::vector<uint8_t> out(8 + h.size() + header.second);
  const auto prefix = LengthPrefix(h.size());
  std::copy(prefix.begin(), prefix.end(), out.begin());
  std::copy(h.begin(), h.end(), out.begin() + 8);
  size_t pos = 8 + h.size();
  for (const TensorToWrite* t : tensors) {
    const auto d = t->data();
    std::copy(d.begin(), d.end(), out.begin() + static_cast<std::ptrdiff_t>(pos));
    pos += d.size();
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<const TensorToWrite*>& tensors,
                        const std::map<std::string, std::string>& metadata, const std::function<void(size_t)>& written) {
  NIBBLE_ASSIGN_OR_RETURN(auto header, BuildHeader(tensors, metadata));
  const std::string& h = header.first;
  const auto prefix = LengthPrefix(h.size());
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Open(path));
  NIBBLE_RETURN_IF_ERROR(w->Write(prefix.data(), prefix.size()));
  NIBBLE_RETURN_IF_ERROR(w->Write(h.data(), h.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto d = tensors[i]->data();
    NIBBLE_RETURN_IF_ERROR(w->Write(d.data(), d.size()));
    if (written) written(i);
  }
  return w->Commit();
}

uint64_t SlotBytes(const TensorSlot& t) {
  uint64_t n = DTypeSize(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<std::string> SafetensorsPreamble(const std::vector<TensorSlot>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorSlot*> ptrs;
  for (const TensorSlot& s : tensors) ptrs.push_back(&s);
  NIBBLE_ASSIGN_OR_RETURN(auto header, BuildHeader(ptrs, metadata));
  const auto prefix = LengthPrefix(header.first.size());
  return std::string(prefix.begin(), prefix.end()) + header.first;
}

TensorToWrite BorrowTensor(const TensorView& t) {
  TensorToWrite w;
  w.name = t.name;
  w.dtype = t.dtype;
  w.shape = t.shape;
  w.borrowed = t.data;
  w.borrowed_size = t.nbytes;
  return w;
}

}  // namespace nibble
