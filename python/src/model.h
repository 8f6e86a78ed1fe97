// nibble.Model: a loaded model shared by any number of Python threads, and the argument
// conversions its calls and the Session's share.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"

namespace nibble_py {

struct PyModel {
  std::unique_ptr<nibble::Model> model;
  int threads = 0;          // compute threads of every call (0 = all cores)
  int64_t ctx_size = 0;     // sessions' and chat's KV positions (0 = DefaultContextSize)
  int64_t max_memory = 0;   // sessions' KV limit in bytes (0 = the library's default)
};

/// The sampling keyword arguments as SamplingOptions, checked with the library's rules (field
/// names as the keywords); seed None = a random one.
nibble::SamplingOptions MakeSampling(double temperature, int64_t top_k, double top_p, double min_p, double repeat_penalty,
                                     int64_t repeat_last_n, const std::optional<uint64_t>& seed,
                                     double presence_penalty = 0.0, double frequency_penalty = 0.0);

/// A prompt given as text or as token ids (a list of ints or an integer array).
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};
Prompt ToPrompt(const py::handle& prompt);

/// A TokenEvent as {"id", "text", "logprob", "top_logprobs": [{"id", "text", "logprob"}]}.
py::dict EventDict(const nibble::TokenEvent& ev);
/// GenerateStats as a dict: finish_reason (OpenAI's), stop_reason (nibble's), token counts, times.
py::dict StatsDict(const nibble::GenerateStats& s);

/// Model.session(ctx_size=None, threads=None): a new nibble.Session over the model.
py::object NewSession(std::shared_ptr<PyModel> pm, std::optional<int64_t> ctx_size, std::optional<int> threads);

void RegisterModel(py::module_& m);
void RegisterSession(py::module_& m);
void RegisterTools(py::module_& m);
void RegisterCheckpoint(py::module_& m);

}  // namespace nibble_py
