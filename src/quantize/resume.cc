#include "quantize/resume.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "base/sha256.h"
#include "base/strings.h"
#include "io/file.h"
#include "io/json.h"

namespace nibble {

namespace fs = std::filesystem;

namespace {

std::string_view Chars(std::span<const uint8_t> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

// The header of a safetensors file: its 8-byte length and the JSON, as read from the file.
Result<std::string> SafetensorsHeaderBytes(const std::string& path, uint64_t file_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MakeErrorCode(ErrorCode::kIo, "cannot open ", path, ": ", std::strerror(errno));
  std::string head(8, '\0');
  uint64_t n = 0;
  bool ok = ::pread(fd, head.data(), 8, 0) == 8;
  if (ok) {
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(head[static_cast<size_t>(i)]);
    ok = n <= file_size - 8;
  }
  if (ok) {
    head.resize(8 + n);
    ok = ::pread(fd, head.data() + 8, n, 8) == static_cast<ssize_t>(n);
  }
  ::close(fd);
  if (!ok) return MakeErrorCode(ErrorCode::kCorruptInput, path, ": cannot read its safetensors header");
  return head;
}

std::string Show(const nlohmann::ordered_json& v) {
  if (v.is_null()) return "(not set)";
  return v.is_string() ? v.get<std::string>() : v.dump();
}

void DiffObject(const nlohmann::ordered_json& had, const nlohmann::ordered_json& now, const std::string& prefix,
                std::vector<std::string>& out) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : had.items()) keys.push_back(k);
  for (const auto& [k, v] : now.items())
    if (!had.contains(k)) keys.push_back(k);
  for (const std::string& k : keys) {
    const nlohmann::ordered_json a = had.contains(k) ? had[k] : nlohmann::ordered_json(), b = now.contains(k) ? now[k] : nlohmann::ordered_json();
    if (a != b) out.push_back(prefix + k + ": run had " + Show(a) + ", now " + Show(b));
  }
}

void DiffInput(const nlohmann::ordered_json& had, const nlohmann::ordered_json& now, std::vector<std::string>& out) {
  if (had.value("config.json", "") != now.value("config.json", ""))
    out.push_back("input config.json: SHA-256 differs");
  if (had.value("index", "") != now.value("index", ""))
    out.push_back("input model.safetensors.index.json: SHA-256 differs");
  std::map<std::string, nlohmann::ordered_json> a, b;
  for (const auto& f : had.value("files", nlohmann::ordered_json::array())) a[f.value("name", "")] = f;
  for (const auto& f : now.value("files", nlohmann::ordered_json::array())) b[f.value("name", "")] = f;
  for (const auto& [name, f] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      out.push_back("input shard " + name + ": missing now");
    } else if (f.value("size", uint64_t{0}) != it->second.value("size", uint64_t{0})) {
      out.push_back("input shard " + name + ": size was " + std::to_string(f.value("size", uint64_t{0})) + " bytes, now " +
                    std::to_string(it->second.value("size", uint64_t{0})));
    } else if (f.value("header_sha256", "") != it->second.value("header_sha256", "")) {
      out.push_back("input shard " + name + ": header SHA-256 differs");
    } else if (f.value("mtime_ns", int64_t{0}) != it->second.value("mtime_ns", int64_t{0})) {
      out.push_back("input shard " + name + ": modified (its modification time differs; the tensor data is not hashed)");
    }
  }
  for (const auto& [name, f] : b)
    if (!a.contains(name)) out.push_back("input shard " + name + ": not in the interrupted run's input");
}

const char* kKillEnv = "NIBBLE_QUANTIZE_KILL_AFTER_LAYER";
bool g_kill_armed = false;

}  // namespace

Result<nlohmann::ordered_json> InputFingerprint(const std::string& model_dir) {
  nlohmann::ordered_json fp;
  NIBBLE_ASSIGN_OR_RETURN(std::string config, ReadFileToString(JoinPath(model_dir, "config.json")));
  fp["config.json"] = Sha256Hex(config);
  const std::string index = JoinPath(model_dir, "model.safetensors.index.json");
  if (PathExists(index)) {
    NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index));
    fp["index"] = Sha256Hex(text);
  }
  std::vector<std::pair<std::string, uint64_t>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec))
      files.emplace_back(e.path().filename().string(), static_cast<uint64_t>(e.file_size(ec)));
  if (ec) return MakeErrorCode(ErrorCode::kIo, "cannot list ", model_dir, ": ", ec.message());
  std::sort(files.begin(), files.end());
  fp["files"] = nlohmann::ordered_json::array();
  for (const auto& [name, size] : files) {
    const std::string path = JoinPath(model_dir, name);
    NIBBLE_ASSIGN_OR_RETURN(std::string header, SafetensorsHeaderBytes(path, size));
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return MakeErrorCode(ErrorCode::kIo, path, ": cannot stat: ", std::strerror(errno));
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    fp["files"].push_back({{"name", name}, {"size", size}, {"header_sha256", Sha256Hex(header)}, {"mtime_ns", mtime}});
  }
  return fp;
}

std::vector<std::string> InputDifferences(const nlohmann::ordered_json& had, const nlohmann::ordered_json& now) {
  std::vector<std::string> out;
  DiffInput(had, now, out);
  return out;
}

std::vector<std::string> IdentityDifferences(const nlohmann::ordered_json& had, const nlohmann::ordered_json& now) {
  std::vector<std::string> out;
  if (had.value("nibble_version", "") != now.value("nibble_version", ""))
    out.push_back("nibble version: run had " + had.value("nibble_version", "?") + ", now " + now.value("nibble_version", "?"));
  DiffObject(had.value("settings", nlohmann::ordered_json::object()), now.value("settings", nlohmann::ordered_json::object()), "",
             out);
  DiffInput(had.value("input", nlohmann::ordered_json::object()), now.value("input", nlohmann::ordered_json::object()), out);
  if (had.value("dataset_sha256", "") != now.value("dataset_sha256", ""))
    out.push_back("--dataset: the calibration data's SHA-256 differs");
  return out;
}

Status WriteManifest(const std::string& staging_dir, const nlohmann::ordered_json& manifest) {
  const std::string text = manifest.dump(1) + "\n";
  NIBBLE_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging_dir, kResumeManifest), text.data(), text.size()));
  const int fd = ::open(staging_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return MakeErrorCode(ErrorCode::kIo, "cannot fsync ", staging_dir, ": ", why);
  }
  ::close(fd);
  return Status::Ok();
}

Result<nlohmann::ordered_json> ReadManifest(const std::string& staging_dir) {
  const std::string path = JoinPath(staging_dir, kResumeManifest);
  NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, path, ": not valid JSON (", PrintableBytes(e.what()), ")");
  }
}

Result<nlohmann::ordered_json> SaveActivations(const std::string& staging_dir, int64_t layer, std::span<const uint8_t> bytes,
                                               const std::string& dtype, const std::vector<int64_t>& shape) {
  const std::string name = "activations-" + std::to_string(layer) + ".bin";
  NIBBLE_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging_dir, name), bytes.data(), bytes.size()));
  return nlohmann::ordered_json{{"file", name}, {"dtype", dtype}, {"shape", shape}, {"size", bytes.size()},
                                {"sha256", Sha256Hex(Chars(bytes))}};
}

void RemoveOlderActivations(const std::string& staging_dir, const nlohmann::ordered_json& entry) {
  const std::string keep = entry.is_object() ? entry.value("file", "") : "";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(staging_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("activations-") && name != keep) fs::remove(e.path(), ec);
  }
}

Result<std::vector<uint8_t>> LoadActivations(const std::string& staging_dir, const nlohmann::ordered_json& entry) {
  const std::string path = JoinPath(staging_dir, entry.value("file", ""));
  auto text = ReadFileToString(path);
  if (!text.ok()) return MakeErrorCode(ErrorCode::kCorruptInput, "calibration activations ", path, ": ", text.error().message);
  if (text->size() != entry.value("size", uint64_t{0}))
    return MakeErrorCode(ErrorCode::kCorruptInput, "calibration activations ", path, ": ", text->size(),
                         " bytes, the manifest records ", entry.value("size", uint64_t{0}));
  if (Sha256Hex(*text) != entry.value("sha256", ""))
    return MakeErrorCode(ErrorCode::kCorruptInput, "calibration activations ", path,
                         ": SHA-256 differs from the manifest's (the file was changed or damaged)");
  return std::vector<uint8_t>(text->begin(), text->end());
}

void RemoveResumeFiles(const std::string& staging_dir) {
  std::error_code ec;
  fs::remove(JoinPath(staging_dir, kResumeManifest), ec);
  RemoveOlderActivations(staging_dir, nullptr);
}

void BoundaryForTest(int64_t layers_done) {
  const char* v = std::getenv(kKillEnv);
  if (v != nullptr && std::atoll(v) == layers_done) g_kill_armed = true;
}

void ExportForTest() {
  if (g_kill_armed) ::kill(::getpid(), SIGKILL);
}

}  // namespace nibble
