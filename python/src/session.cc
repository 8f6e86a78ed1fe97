// nibble.Session: a generator over one KV cache, as ONNX Runtime GenAI's Generator: append
// tokens, sample the next one, read the logits, rewind, fork. One call at a time: the library
// refuses a second call on a busy session, and the binding also refuses the accessors (logits,
// position, tokens) and fork while a call runs, which the C++ API leaves to the caller.
#include <atomic>

#include "model.h"

namespace nibble_py {

namespace {

struct PySession {
  std::shared_ptr<PyModel> pm;  // keeps the Model alive while the session exists
  std::unique_ptr<nibble::Session> session;
  std::atomic<const char*> busy{nullptr};  // the call running on the session, or nullptr
};

// Marks the session busy for the scope of one call; a second call raises as the library does.
class Hold {
 public:
  Hold(PySession& s, const char* call) : s_(s) {
    const char* expected = nullptr;
    if (!s_.busy.compare_exchange_strong(expected, call))
      ThrowError(nibble::MakeError(call, ": the session is in use by another call (", expected,
                                   "): one call at a time per session; use fork() or another session"));
  }
  ~Hold() { s_.busy.store(nullptr); }
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;

 private:
  PySession& s_;
};

}  // namespace

py::object NewSession(std::shared_ptr<PyModel> pm, std::optional<int64_t> ctx_size, std::optional<int> threads) {
  nibble::SessionOptions o;
  o.context = ctx_size.value_or(pm->ctx_size);
  o.threads = threads ? *threads : pm->threads;
  o.max_memory = pm->max_memory;
  auto s = std::make_shared<PySession>();
  s->session = TakeOrThrow(nibble::Session::Create(*pm->model, o));
  s->pm = std::move(pm);
  return py::cast(s);
}

namespace {

void AppendTokens(PySession& s, const std::vector<int32_t>& ids) {
  Hold hold(s, "append_tokens");
  ThrowIfError(RunCancellable<nibble::Status>(0, [&](const nibble::CancellationToken* c) {
    return s.session->Prefill(ids, c);
  }));
}

// Samples the next token from the current logits, appends it (one decode step) and returns it.
int32_t NextToken(PySession& s, double temperature, int64_t top_k, double top_p, double min_p, double repeat_penalty,
                  int64_t repeat_last_n, std::optional<uint64_t> seed, double presence_penalty, double frequency_penalty) {
  const nibble::SamplingOptions o = MakeSampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
                                                 seed ? seed : std::optional<uint64_t>(0), presence_penalty, frequency_penalty);
  Hold hold(s, "next_token");
  return TakeOrThrow(RunCancellable<nibble::Result<int32_t>>(0, [&](const nibble::CancellationToken* c)
                                                                    -> nibble::Result<int32_t> {
    nibble::Result<int32_t> id = s.session->Sample(o);
    if (!id.ok()) return id;
    if (nibble::Status st = s.session->Step(*id, c); !st.ok()) return st.error();
    return id;
  }));
}

// The session's logits buffer itself, read-only (the sampler reads it too): the array's base
// holds a reference that keeps it alive and unchanged, as a later step then writes a fresh buffer.
py::array_t<float> LogitsView(PySession& s) {
  Hold hold(s, "logits");
  using Buffer = std::shared_ptr<const std::vector<float>>;
  Buffer buf = s.session->shared_logits();
  if (buf == nullptr) return py::array_t<float>(0);
  auto* held = new Buffer(std::move(buf));
  py::capsule base(held, [](void* p) { delete static_cast<Buffer*>(p); });
  py::array_t<float> view({static_cast<py::ssize_t>((*held)->size())}, (*held)->data(), base);
  view.attr("flags").attr("writeable") = false;
  return view;
}

std::shared_ptr<PySession> Fork(PySession& s, int64_t position) {
  Hold hold(s, "fork");
  auto f = std::make_shared<PySession>();
  f->session = TakeOrThrow(s.session->Fork(position));
  f->pm = s.pm;
  return f;
}

// Truncate drops the logits; the kept context's last token is run again (one decode step) so that
// next_token can sample after it, as ORT GenAI's rewind_to allows.
void RewindTo(PySession& s, int64_t position) {
  Hold hold(s, "rewind_to");
  const int64_t now = s.session->position();
  if (position < 0 || position > now) ThrowError(nibble::MakeError("rewind_to(", position, "): outside [0, ", now, "]"));
  if (position == now) return;
  if (position == 0) return ThrowIfError(s.session->Truncate(0));
  const int32_t last = s.session->tokens()[static_cast<size_t>(position - 1)];
  ThrowIfError(s.session->Truncate(position - 1));
  ThrowIfError(RunCancellable<nibble::Status>(0, [&](const nibble::CancellationToken* c) { return s.session->Step(last, c); }));
}

std::string Generate(PySession& s, const py::object& prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
                     double top_p, double min_p, double repeat_penalty, int64_t repeat_last_n,
                     const std::vector<std::string>& stop, std::optional<uint64_t> seed, double presence_penalty,
                     double frequency_penalty) {
  nibble::GenerateOptions g;
  const Prompt p = ToPrompt(prompt);
  if (p.is_ids) g.prompt_ids = p.ids;
  else g.prompt = p.text;
  g.max_new_tokens = max_new_tokens;
  g.sampling = MakeSampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, presence_penalty,
                            frequency_penalty);
  g.stop = stop;
  ThrowIfError(nibble::ValidateGenerateOptions(g));
  Hold hold(s, "generate");
  std::string text;
  TakeOrThrow(RunCancellable<nibble::Result<nibble::GenerateStats>>(0, [&](const nibble::CancellationToken* c) {
    g.cancel = c;
    return nibble::Generate(*s.session, g, [&text](const nibble::TokenEvent& ev) {
      text += ev.text;
      return true;
    });
  }));
  return text;
}

}  // namespace

void RegisterSession(py::module_& m) {
  py::class_<PySession, std::shared_ptr<PySession>>(m, "Session", R"(One sequence's KV cache over a Model (Model.session()).

As ONNX Runtime GenAI's Generator: append_tokens, next_token, logits, rewind_to, fork. One
call at a time: a call while another runs on the same session (another thread) raises
nibble.InvalidArgument. Sessions over one Model run in parallel from different threads.)")
      .def("append_tokens", &AppendTokens, py::arg("ids"),
           "Runs ids at the current position (prefill); logits become those of the last one.")
      .def("next_token", &NextToken, py::arg("temperature") = 0.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0,
           py::arg("min_p") = 0.0, py::arg("repeat_penalty") = 1.0, py::arg("repeat_last_n") = 64,
           py::arg("seed") = 0, py::arg("presence_penalty") = 0.0, py::arg("frequency_penalty") = 0.0,
           "Samples a token from the current logits (greedy at temperature 0), appends it, returns its id.")
      .def("generate", &Generate, py::arg("prompt"), py::arg("max_new_tokens") = 128, py::arg("temperature") = 0.8,
           py::arg("top_k") = 40, py::arg("top_p") = 0.95, py::arg("min_p") = 0.0, py::arg("repeat_penalty") = 1.0,
           py::arg("repeat_last_n") = 64, py::arg("stop") = std::vector<std::string>(), py::arg("seed") = py::none(),
           py::arg("presence_penalty") = 0.0, py::arg("frequency_penalty") = 0.0,
           "Model.generate continuing this session's context (BOS only when the session is empty).")
      .def_property_readonly("logits", &LogitsView,
                             "float32 array [vocab_size], read-only: the last position's logits (empty before any),\n"
                             "the session's own buffer, not copied; later calls leave it unchanged.")
      .def_property_readonly("position", [](PySession& s) {
        Hold hold(s, "position");
        return s.session->position();
      }, "Positions filled.")
      .def_property_readonly("capacity", [](PySession& s) { return s.session->capacity(); }, "ctx_size.")
      .def_property_readonly("tokens", [](PySession& s) {
        Hold hold(s, "tokens");
        return s.session->tokens();
      }, "The token ids the context holds.")
      .def("rewind_to", &RewindTo, py::arg("position"),
           "Keeps the first `position` positions (0 empties the context); next_token continues after them.")
      .def("fork", &Fork, py::arg("position") = -1,
           "A new independent Session holding this one's first `position` positions (-1 = all).");
}

}  // namespace nibble_py
