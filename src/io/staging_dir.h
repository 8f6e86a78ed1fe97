// Atomic output directories: write a whole checkpoint into a temporary sibling directory, then
// rename it onto the target in one step, so a failed or interrupted run never leaves a
// half-written output and never removes a directory that is not a model directory.
#pragma once

#include <filesystem>
#include <string>

#include "base/result.h"

namespace nibble {

/// A temporary sibling directory "<parent>/.<name>.nibble-<kind>-<pid>" of a target directory
/// "<parent>/<name>". It is removed on destruction unless Commit() renamed it onto the target.
/// Stale ones left by killed runs (same name and kind, their pid no longer running) are removed
/// when a new one is created. Two StagingDirs for the same target in one process need different
/// `kind`s.
class StagingDir {
 public:
  /// Creates the staging directory for `target`. Errors (naming the path): empty target, the
  /// target's parent directory missing, the staging directory not creatable.
  static Result<StagingDir> Create(const std::string& target, const std::string& kind = "tmp");

  StagingDir() = default;
  StagingDir(StagingDir&& o) noexcept;
  StagingDir& operator=(StagingDir&& o) noexcept;
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir();

  /// A staging directory left by a run of `target` / `kind` that is no longer running and holds
  /// the file `marker` (a resumable run's manifest); "" when there is none (the newest when
  /// several).
  static std::string FindInterrupted(const std::string& target, const std::string& kind, const std::string& marker);
  /// Takes over `path` (FindInterrupted's) as this process's staging directory for `target`: it is
  /// renamed to this process's name, so later runs see it as live. Errors name both paths.
  static Result<StagingDir> Adopt(const std::string& target, const std::string& kind, const std::string& path);
  /// Keep the directory when this object is destroyed without Commit (a resumable run stopped).
  void Keep(bool keep = true) { keep_ = keep; }

  /// The staging directory's path (empty after Commit()).
  std::string path() const { return path_.string(); }
  /// The absolute, normalised target path.
  std::string target() const { return target_.string(); }

  /// Renames the staging directory onto the target (fsync of the staging directory first, of
  /// the parent after). An existing target is replaced only when `overwrite` is set and it is an
  /// empty directory or a model directory (holds config.json); the old one is moved aside, then
  /// removed. Errors (naming the path): target exists without `overwrite`; target is a file or a
  /// non-empty directory without config.json; a rename fails (the target is then unchanged).
  Status Commit(bool overwrite);

 private:
  std::filesystem::path target_, path_;
  bool keep_ = false;
};

/// A cancelled (kCancelled) write's error with "; nothing was written to <target>" appended (the
/// staging directory is gone once the writer is); any other error unchanged.
Error NoteOutputUntouched(const Error& e, const std::string& target);

/// Whether a writer may put its output at `target`: absent, or (with `overwrite`) an empty
/// directory or a model directory (one with config.json). Refuses a file, a non-model directory
/// (even with `overwrite`) and an existing one without it, naming which (kInvalidArgument: the
/// caller picks another path). The writers ask it before any work; StagingDir::Commit applies it
/// again (kIo there: the target appeared during the run).
Status CheckOutputReplaceable(const std::string& target, bool overwrite);

}  // namespace nibble
