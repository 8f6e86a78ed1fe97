// Resuming an interrupted `nibble quantize` (--resume). A resumable run keeps its staging
// directory (io/staging_dir.h) and writes there, at every decoder-layer boundary, a manifest
// (kResumeManifest) with what decides the output's bytes and the state needed to go on:
//   identity    nibble version, the flags that decide the bytes (by flag name), the input's
//               fingerprint (config.json's SHA-256; per safetensors file its size, the SHA-256
//               of its header and its modification time) and the calibration data's SHA-256;
//   progress    layers done of how many;
//   writer      CheckpointWriter::SaveState: finished shards (size, SHA-256, tensors), the open
//               shard's entries, the spool's length; laid out (an RTN run), the tensors written
//               and the open shard's length and SHA-256 so far;
//   export      the ordered export's position, the tensors spooled before their turn, the
//               per-linear report lines so far;
//   calibrated  the pipeline's layer reports and each algorithm's accumulated state;
//   activations the next layer's calibration input: a file "activations-<layer>.bin" of raw
//               bytes with its dtype, shape, size and SHA-256 (only the latest boundary's kept).
// Every file of a boundary is durable before the manifest that names it replaces the previous
// one (temporary file, fsync, rename), so a SIGKILL or power loss leaves the last boundary whole.
// A resumed run checks the identity field by field and every staged byte it reuses by its SHA-256
// and refuses, naming what differs, rather than write an output another run would not.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace nibble {

/// The manifest's file name in the staging directory.
inline constexpr char kResumeManifest[] = "resume.json";

/// config.json's SHA-256 and each *.safetensors file's size, header SHA-256 and modification time
/// (sorted by name), plus the index's SHA-256 when there is one. Errors name the file.
Result<nlohmann::ordered_json> InputFingerprint(const std::string& model_dir);
/// Each way two InputFingerprints differ, one line each naming the file.
std::vector<std::string> InputDifferences(const nlohmann::ordered_json& had, const nlohmann::ordered_json& now);

/// Each way the identity `had` (a manifest's) and `now` differ, one line each, naming the field:
/// "--group_size: run had 128, now 64", "input model-00002.safetensors: header SHA-256 differs".
std::vector<std::string> IdentityDifferences(const nlohmann::ordered_json& had, const nlohmann::ordered_json& now);

/// Writes the manifest atomically (temporary file, fsync, rename, fsync of the directory).
Status WriteManifest(const std::string& staging_dir, const nlohmann::ordered_json& manifest);
/// Reads it. Errors: missing, unreadable or not JSON (naming the file).
Result<nlohmann::ordered_json> ReadManifest(const std::string& staging_dir);

/// Writes the calibration activations after `layer` (fsync'd) and returns the manifest's entry
/// for them. Errors name the file (a full disk among them).
Result<nlohmann::ordered_json> SaveActivations(const std::string& staging_dir, int64_t layer, std::span<const uint8_t> bytes,
                                               const std::string& dtype, const std::vector<int64_t>& shape);
/// Removes the activations files other than the one `entry` names (after its manifest is durable).
void RemoveOlderActivations(const std::string& staging_dir, const nlohmann::ordered_json& entry);
/// Reads the activations `entry` names, checked against its size and SHA-256.
Result<std::vector<uint8_t>> LoadActivations(const std::string& staging_dir, const nlohmann::ordered_json& entry);

/// Removes the manifest and the activations (the run is past its last boundary).
void RemoveResumeFiles(const std::string& staging_dir);

/// Fault injection for the resume tests: with NIBBLE_QUANTIZE_KILL_AFTER_LAYER=K in the
/// environment, the process SIGKILLs itself at the first tensor it exports after boundary K was
/// written (so the staged files already run past the boundary, as after a real crash).
/// BoundaryForTest: boundary `layers_done` is written; ExportForTest: a tensor is exported.
void BoundaryForTest(int64_t layers_done);
void ExportForTest();

}  // namespace nibble
