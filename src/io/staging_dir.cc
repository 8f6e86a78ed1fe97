#include "io/staging_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

namespace nibble {

namespace fs = std::filesystem;

namespace {

void FsyncDir(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// The absolute, normalised target and the prefix of its staging directories' names.
Result<std::pair<fs::path, std::string>> TargetAndPrefix(const std::string& target, const std::string& kind) {
  if (target.empty()) return MakeErrorCode(ErrorCode::kIo, "output directory is empty");
  std::error_code ec;
  fs::path t = fs::absolute(fs::path(target), ec).lexically_normal();
  if (ec) return MakeErrorCode(ErrorCode::kIo, "output directory \"", target, "\": ", ec.message());
  if (t.filename().empty()) t = t.parent_path();
  return std::make_pair(t, "." + t.filename().string() + ".nibble-" + kind + "-");
}

bool PidRunning(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

std::string StagingDir::FindInterrupted(const std::string& target, const std::string& kind, const std::string& marker) {
  auto tp = TargetAndPrefix(target, kind);
  if (!tp.ok()) return "";
  const auto& [t, prefix] = *tp;
  std::error_code ec;
  std::string best;
  fs::file_time_type best_time{};
  for (const auto& e : fs::directory_iterator(t.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;  // before reading past the prefix: names may be shorter
    // This process's own directory counts too: a host that stopped a run may resume it itself.
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + prefix.size()));
    if (pid != ::getpid() && PidRunning(pid)) continue;
    std::error_code mec;
    const auto when = fs::last_write_time(e.path() / marker, mec);
    if (mec) continue;
    if (best.empty() || when > best_time) best = e.path().string(), best_time = when;
  }
  return best;
}

Result<StagingDir> StagingDir::Adopt(const std::string& target, const std::string& kind, const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(auto tp, TargetAndPrefix(target, kind));
  StagingDir s;
  s.target_ = tp.first;
  s.path_ = tp.first.parent_path() / (tp.second + std::to_string(::getpid()));
  std::error_code ec;
  if (fs::path(path) != s.path_) {
    fs::remove_all(s.path_, ec);
    fs::rename(path, s.path_, ec);
    if (ec) {
      s.path_.clear();
      return MakeErrorCode(ErrorCode::kIo, "cannot take over staging directory ", path, " as ", (tp.first.parent_path() / (tp.second + std::to_string(::getpid()))).string(), ": ", ec.message());
    }
  }
  return s;
}

Result<StagingDir> StagingDir::Create(const std::string& target, const std::string& kind) {
  if (target.empty()) return MakeErrorCode(ErrorCode::kIo, "output directory is empty");
  std::error_code ec;
  fs::path t = fs::absolute(fs::path(target), ec).lexically_normal();
  if (ec) return MakeErrorCode(ErrorCode::kIo, "output directory \"", target, "\": ", ec.message());
  if (t.filename().empty()) t = t.parent_path();
  const fs::path parent = t.parent_path();
  if (!fs::is_directory(parent, ec)) return MakeErrorCode(ErrorCode::kIo, "output directory's parent ", parent.string(), " does not exist");
  const std::string prefix = "." + t.filename().string() + ".nibble-" + kind + "-";
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + prefix.size()));
    if (pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM)) continue;  // still running
    std::error_code rec;
    fs::remove_all(e.path(), rec);
  }
  StagingDir s;
  s.target_ = t;
  s.path_ = parent / (prefix + std::to_string(::getpid()));
  fs::remove_all(s.path_, ec);
  if (!fs::create_directory(s.path_, ec))
    return MakeErrorCode(ErrorCode::kIo, "cannot create staging directory ", s.path_.string(), ": ", ec.message());
  return s;
}

StagingDir::StagingDir(StagingDir&& o) noexcept
    : target_(std::move(o.target_)), path_(std::move(o.path_)), keep_(o.keep_) {
  o.path_.clear();
}

StagingDir& StagingDir::operator=(StagingDir&& o) noexcept {
  if (this != &o) {
    std::error_code ec;
    if (!path_.empty() && !keep_) fs::remove_all(path_, ec);
    target_ = std::move(o.target_);
    path_ = std::move(o.path_);
    keep_ = o.keep_;
    o.path_.clear();
  }
  return *this;
}

StagingDir::~StagingDir() {
  std::error_code ec;
  if (!path_.empty() && !keep_) fs::remove_all(path_, ec);
}

Status StagingDir::Commit(bool overwrite) {
  if (path_.empty()) return MakeErrorCode(ErrorCode::kIo, "staging directory for ", target_.string(), " was already committed");
  std::error_code ec;
  const bool exists = fs::exists(target_, ec);
  // (Checked before the run too: here the target appeared or changed meanwhile.)
  if (const Status s = CheckOutputReplaceable(target_.string(), overwrite); !s.ok()) return s.error().WithCode(ErrorCode::kIo);
  FsyncDir(path_);  // the staging directory's entries are durable before the rename
  fs::path old;
  if (exists) {
    old = target_.parent_path() / ("." + target_.filename().string() + ".nibble-old-" + std::to_string(::getpid()));
    fs::rename(target_, old, ec);
    if (ec) return MakeErrorCode(ErrorCode::kIo, "cannot move existing ", target_.string(), " aside: ", ec.message());
  }
  fs::rename(path_, target_, ec);
  if (ec) {
    std::error_code back;
    if (!old.empty()) fs::rename(old, target_, back);  // put the previous output back
    return MakeErrorCode(ErrorCode::kIo, "cannot rename ", path_.string(), " to ", target_.string(), ": ", ec.message());
  }
  path_.clear();
  if (!old.empty()) fs::remove_all(old, ec);
  FsyncDir(target_.parent_path());
  return Status::Ok();
}

Status CheckOutputReplaceable(const std::string& target, bool overwrite) {
  std::error_code ec;
  const fs::path t(target);
  if (!fs::exists(t, ec)) return Status::Ok();
  if (!fs::is_directory(t, ec))
    return MakeError("output path ", target, " exists and is not a directory; refusing to replace it");
  if (!fs::is_empty(t, ec) && !fs::exists(t / "config.json", ec))
    return MakeError("output directory ", target,
                     " is not empty and holds no config.json (not a model directory); refusing to replace it");
  if (!overwrite) return MakeError("output directory ", target, " exists; pass --overwrite to replace it");
  return Status::Ok();
}

Error NoteOutputUntouched(const Error& e, const std::string& target) {
  if (e.code != ErrorCode::kCancelled) return e;
  return Error{e.message + "; nothing was written to " + target, e.code};
}

}  // namespace nibble
