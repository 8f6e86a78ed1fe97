// nibble.Model: load, tokenize, logits, score, generate, stream, chat, perplexity. Every call
// that runs the model runs on a worker thread with the GIL released (RunCancellable), so other
// Python threads run meanwhile and Ctrl-C cancels it.
#include "model.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>

namespace nibble_py {

nibble::SamplingOptions MakeSampling(double temperature, int64_t top_k, double top_p, double min_p, double repeat_penalty,
                                     int64_t repeat_last_n, const std::optional<uint64_t>& seed, double presence_penalty,
                                     double frequency_penalty) {
  nibble::SamplingOptions s;
  s.temperature = static_cast<float>(temperature);
  s.top_k = top_k;
  s.top_p = static_cast<float>(top_p);
  s.min_p = static_cast<float>(min_p);
  s.repeat_penalty = static_cast<float>(repeat_penalty);
  s.repeat_last_n = repeat_last_n;
  s.presence_penalty = static_cast<float>(presence_penalty);
  s.frequency_penalty = static_cast<float>(frequency_penalty);
  s.seed = seed ? *seed : std::random_device{}();
  ThrowIfError(nibble::ValidateSamplingOptions(s));
  return s;
}

Prompt ToPrompt(const py::handle& prompt) {
  Prompt p;
  if (py::isinstance<py::str>(prompt)) {
    p.text = prompt.cast<std::string>();
    return p;
  }
  try {
    p.ids = prompt.cast<std::vector<int32_t>>();
  } catch (const py::cast_error&) {
    ThrowError(nibble::MakeError("prompt: expected a str or a sequence of token ids (int), found ",
                                 py::str(prompt.get_type()).cast<std::string>()));
  }
  p.is_ids = true;
  return p;
}

py::dict EventDict(const nibble::TokenEvent& ev) {
  py::list top;
  for (const nibble::TokenLogprob& t : ev.top_logprobs)
    top.append(py::dict(py::arg("id") = t.id, py::arg("text") = py::bytes(t.text).attr("decode")("utf-8", "replace"),
                        py::arg("logprob") = t.logprob));
  return py::dict(py::arg("id") = ev.id, py::arg("text") = ev.text, py::arg("logprob") = ev.logprob,
                  py::arg("top_logprobs") = top);
}

py::dict StatsDict(const nibble::GenerateStats& s) {
  return py::dict(py::arg("finish_reason") = nibble::FinishReason(s.stop_reason),
                  py::arg("stop_reason") = nibble::StopReasonName(s.stop_reason),
                  py::arg("stop_string") = s.stop_string, py::arg("stop_token") = s.stop_token,
                  py::arg("prompt_tokens") = s.prompt_tokens, py::arg("cached_tokens") = s.cached_tokens,
                  py::arg("generated_tokens") = s.generated_tokens, py::arg("prefill_seconds") = s.prefill_seconds,
                  py::arg("decode_seconds") = s.decode_seconds);
}

namespace {

using Clock = std::chrono::steady_clock;

py::dict InfoDict(const nibble::ModelInfo& i) {
  py::dict d;
  d["dir"] = i.dir;
  d["architecture"] = i.architecture;
  d["model_type"] = i.model_type;
  d["torch_dtype"] = i.torch_dtype;
  d["hidden_size"] = i.hidden_size;
  d["intermediate_size"] = i.intermediate_size;
  d["num_hidden_layers"] = i.num_hidden_layers;
  d["num_attention_heads"] = i.num_attention_heads;
  d["num_key_value_heads"] = i.num_key_value_heads;
  d["head_dim"] = i.head_dim;
  d["vocab_size"] = i.vocab_size;
  d["max_position_embeddings"] = i.max_position_embeddings;
  d["tie_word_embeddings"] = i.tie_word_embeddings;
  d["num_parameters"] = i.num_parameters;
  d["weight_format"] = i.weight_format;
  d["int4_linears"] = i.int4_linears;
  d["activations"] = nibble::ActivationTypeName(i.activations);
  d["kv_dtype"] = nibble::KvDtypeName(i.kv_dtype);
  d["activation_linears"] = i.activation_linears;
  d["warnings"] = i.warnings;
  d["load_seconds"] = i.load_seconds;
  d["weight_bytes"] = i.weight_bytes;
  return d;
}

std::shared_ptr<PyModel> LoadModel(const std::string& path, std::optional<int> threads, const std::string& activations,
                                   std::optional<int64_t> ctx_size, std::optional<std::string> kv_dtype,
                                   const std::string& tokenizer, std::optional<std::string> max_memory,
                                   bool weight_cache, const std::string& weight_cache_dir, bool no_mmap) {
  nibble::LoadOptions o;
  o.weight_cache = weight_cache;
  o.weight_cache_dir = weight_cache_dir;
  o.weight_cache_pages = no_mmap ? nibble::WeightCachePages::kOwned : nibble::WeightCachePages::kMapped;
  if (!nibble::ParseActivationType(activations, &o.activations))
    ThrowError(nibble::MakeError("activations \"", activations, "\": expected auto, fp32, bf16 or int8"));
  if (kv_dtype && !nibble::ParseKvDtype(*kv_dtype, &o.kv_dtype))
    ThrowError(nibble::MakeError("kv_dtype \"", *kv_dtype, "\": expected bf16 or fp32"));
  if (!nibble::ParseTokenizerType(tokenizer, &o.tokenizer))
    ThrowError(nibble::MakeError("tokenizer \"", tokenizer, "\": expected auto, hf or spm"));
  if (threads && *threads < 0) ThrowError(nibble::MakeError("threads ", *threads, " must be >= 0 (0 = all cores)"));
  if (ctx_size && *ctx_size < 1) ThrowError(nibble::MakeError("ctx_size ", *ctx_size, " must be >= 1"));
  auto pm = std::make_shared<PyModel>();
  pm->threads = ThreadsArg(threads);
  pm->ctx_size = ctx_size.value_or(0);
  if (max_memory) pm->max_memory = TakeOrThrow(nibble::ParseMemorySize(*max_memory));
  o.threads = pm->threads;
  pm->model = TakeOrThrow(RunCancellable<nibble::Result<std::unique_ptr<nibble::Model>>>(
      pm->threads, [&](const nibble::CancellationToken*) { return nibble::Model::Load(path, o); }));
  return pm;
}

py::array_t<float> Logits(const PyModel& pm, const std::vector<int32_t>& ids) {
  std::vector<float> out = TakeOrThrow(RunCancellable<nibble::Result<std::vector<float>>>(
      pm.threads, [&](const nibble::CancellationToken* cancel) { return pm.model->Logits(ids, cancel); }));
  const auto vocab = static_cast<py::ssize_t>(pm.model->info().vocab_size);
  const auto rows = static_cast<py::ssize_t>(ids.size());
  return ToNumpy(std::move(out), {rows, vocab});
}

// log p(ids[i] | ids[0, i)) for i >= 1: what lm-eval's loglikelihood sums (PromptLogprobs).
py::array_t<float> Score(const PyModel& pm, const py::handle& text_or_ids) {
  const Prompt p = ToPrompt(text_or_ids);
  const std::vector<int32_t> ids = p.is_ids ? p.ids : TakeOrThrow(pm.model->Tokenize(p.text));
  if (ids.size() < 2) ThrowError(nibble::MakeError("score: ", ids.size(), " token(s); at least 2 are needed"));
  std::vector<nibble::TokenEvent> events = TakeOrThrow(RunCancellable<nibble::Result<std::vector<nibble::TokenEvent>>>(
      pm.threads, [&](const nibble::CancellationToken* cancel) { return nibble::PromptLogprobs(*pm.model, ids, 0, cancel); }));
  std::vector<float> lp(events.size() - 1);
  for (size_t i = 1; i < events.size(); ++i) lp[i - 1] = events[i].logprob;
  const auto n = static_cast<py::ssize_t>(lp.size());
  return ToNumpy(std::move(lp), {n});
}

nibble::GenerateOptions MakeGenerate(const py::handle& prompt, int64_t max_new_tokens, nibble::SamplingOptions sampling,
                                     const std::vector<std::string>& stop, bool logprobs, int top_logprobs) {
  nibble::GenerateOptions g;
  const Prompt p = ToPrompt(prompt);
  if (p.is_ids) g.prompt_ids = p.ids;
  else g.prompt = p.text;
  g.max_new_tokens = max_new_tokens;
  g.sampling = sampling;
  g.stop = stop;
  g.logprobs = logprobs || top_logprobs > 0;
  g.top_logprobs = top_logprobs;
  ThrowIfError(nibble::ValidateGenerateOptions(g));
  return g;
}

// The text a Generate call streams, and its stats.
std::pair<std::string, nibble::GenerateStats> RunGenerate(const PyModel& pm, nibble::GenerateOptions g) {
  std::string text;
  nibble::GenerateStats stats = TakeOrThrow(RunCancellable<nibble::Result<nibble::GenerateStats>>(
      pm.threads, [&](const nibble::CancellationToken* cancel) {
        g.cancel = cancel;
        return nibble::Generate(*pm.model, g, [&text](const nibble::TokenEvent& ev) {
          text += ev.text;
          return true;
        });
      }));
  return {std::move(text), stats};
}

// m.stream(...): Generate on a worker thread, its token events queued for the Python iterator.
// Closing the iterator early (break, del) cancels the call and waits for the worker.
class TokenStream {
 public:
  TokenStream(std::shared_ptr<PyModel> pm, nibble::GenerateOptions g, bool events) : pm_(std::move(pm)), events_(events) {
    g.cancel = &token_;
    const int64_t call = BeginCall(token_);
    worker_ = std::thread([this, call, g = std::move(g)] {
      nibble::SetNumThreads(pm_->threads);
      nibble::Result<nibble::GenerateStats> r = nibble::Generate(*pm_->model, g, [this](const nibble::TokenEvent& ev) {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(ev);
        cv_.notify_one();
        return true;
      });
      {
        std::lock_guard<std::mutex> lock(mu_);
        result_.emplace(std::move(r));
        cv_.notify_one();
      }
      EndCall(call);
    });
  }
  ~TokenStream() { Close(); }

  void Close() {
    token_.Cancel();
    WithoutGil([this] {
      std::lock_guard<std::mutex> lock(close_mu_);  // atexit and a consumer thread may close at once
      if (worker_.joinable()) worker_.join();
    });
  }

  py::object Next() {
    for (;;) {
      std::optional<nibble::TokenEvent> ev;
      bool finished = false;
      WithoutGil([&] {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return !queue_.empty() || result_.has_value(); });
        if (!queue_.empty()) {
          ev = std::move(queue_.front());
          queue_.pop_front();
        } else {
          finished = result_.has_value();
        }
      }, [this] {
        token_.Cancel();
        std::lock_guard<std::mutex> lock(close_mu_);
        if (worker_.joinable()) worker_.join();
      });
      if (ev) {
        if (events_) return EventDict(*ev);
        if (!ev->text.empty()) return py::str(ev->text);
        continue;
      }
      if (finished) return Finish();
      if (PyErr_CheckSignals() != 0) {
        py::error_already_set interrupt;
        Close();
        throw interrupt;
      }
    }
  }

  py::object stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!result_ || !result_->ok()) return py::none();
    return StatsDict(result_->value());
  }

 private:
  py::object Finish() {
    Close();
    if (!result_->ok()) ThrowError(result_->error());
    throw py::stop_iteration();
  }

  std::shared_ptr<PyModel> pm_;
  bool events_;
  nibble::CancellationToken token_;
  mutable std::mutex mu_;
  std::mutex close_mu_;
  std::condition_variable cv_;
  std::deque<nibble::TokenEvent> queue_;
  std::optional<nibble::Result<nibble::GenerateStats>> result_;
  std::thread worker_;
};

std::vector<nibble::ChatMessage> ToMessages(const py::iterable& messages) {
  std::vector<nibble::ChatMessage> out;
  for (const py::handle& m : messages) {
    if (!py::isinstance<py::dict>(m)) ThrowError(nibble::MakeError("messages: each message must be a dict with role and content"));
    const py::dict d = py::reinterpret_borrow<py::dict>(m);
    if (!d.contains("role") || !d.contains("content"))
      ThrowError(nibble::MakeError("messages[", out.size(), "]: needs \"role\" and \"content\""));
    out.push_back({py::str(d["role"]).cast<std::string>(), py::str(d["content"]).cast<std::string>()});
  }
  if (out.empty()) ThrowError(nibble::MakeError("messages: empty"));
  return out;
}

// m.chat(messages, ...): one OpenAI chat completion through the model's chat template, on a
// fresh session of the model's ctx_size; stops at the template's end-of-turn markers.
py::dict Chat(const PyModel& pm, const py::iterable& messages, nibble::GenerateOptions g, const std::string& chat_template,
              const std::optional<py::dict>& chat_template_kwargs) {
  const std::vector<nibble::ChatMessage> msgs = ToMessages(messages);
  const std::string extra =
      chat_template_kwargs ? py::module_::import("json").attr("dumps")(*chat_template_kwargs).cast<std::string>() : "";
  ThrowIfError(nibble::ValidateChatTemplateVars(extra));
  nibble::ChatTemplate tmpl = TakeOrThrow(nibble::LoadChatTemplate(pm.model->info().dir, chat_template));
  std::string reply;
  nibble::GenerateStats stats = TakeOrThrow(RunCancellable<nibble::Result<nibble::GenerateStats>>(
      pm.threads, [&](const nibble::CancellationToken* cancel) -> nibble::Result<nibble::GenerateStats> {
        nibble::SessionOptions so;
        so.context = pm.ctx_size;
        so.max_memory = pm.max_memory;
        nibble::Result<std::unique_ptr<nibble::Session>> session = nibble::Session::Create(*pm.model, so);
        if (!session.ok()) return session.error();
        const nibble::EndOfTurn eot = nibble::EndOfTurnFor(*pm.model, tmpl);
        nibble::ChatTurns turns(**session, tmpl, extra);
        nibble::Result<nibble::ChatTurns::Prompt> p = turns.NextPrompt(msgs);
        if (!p.ok()) return p.error();
        g.prompt.clear();
        g.prompt_ids = p->ids;
        g.stop_ids.insert(g.stop_ids.end(), eot.ids.begin(), eot.ids.end());
        g.stop.insert(g.stop.end(), eot.markers.begin(), eot.markers.end());
        g.cancel = cancel;
        return nibble::Generate(**session, g, [&reply](const nibble::TokenEvent& ev) {
          reply += ev.text;
          return true;
        });
      }));
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  py::dict message(py::arg("role") = "assistant", py::arg("content") = reply);
  py::dict choice(py::arg("index") = 0, py::arg("message") = message,
                  py::arg("finish_reason") = nibble::FinishReason(stats.stop_reason));
  py::dict usage(py::arg("prompt_tokens") = stats.prompt_tokens + stats.cached_tokens,
                 py::arg("completion_tokens") = stats.generated_tokens,
                 py::arg("total_tokens") = stats.prompt_tokens + stats.cached_tokens + stats.generated_tokens);
  py::list choices;
  choices.append(choice);
  return py::dict(py::arg("id") = "chatcmpl-nibble-" + std::to_string(now.count()), py::arg("object") = "chat.completion",
                  py::arg("created") = now.count(), py::arg("model") = pm.model->info().dir, py::arg("choices") = choices,
                  py::arg("usage") = usage);
}

py::dict Perplexity(const PyModel& pm, const std::string& text, int64_t seq_len, int64_t max_windows) {
  ThrowIfError(nibble::ValidateWindowOptions(seq_len, max_windows, /*zero_is_default=*/true));
  nibble::PerplexityOptions o;
  o.seq_len = seq_len > 0 ? seq_len : std::min<int64_t>(2048, pm.model->info().max_position_embeddings);
  o.max_windows = max_windows;
  o.threads = pm.threads;
  const nibble::PerplexityReport p = TakeOrThrow(RunCancellable<nibble::Result<nibble::PerplexityReport>>(
      pm.threads, [&](const nibble::CancellationToken* cancel) {
        o.cancel = cancel;
        return nibble::EvaluatePerplexity(*pm.model, text, o);
      }));
  py::dict d = py::module_::import("json").attr("loads")(nibble::PerplexityJson(p));
  // JSON has no inf / nan (the library writes null): Python gets the float.
  for (const auto& [key, v] : {std::pair<const char*, double>{"ppl", p.ppl}, {"ppl_stderr", p.ppl_stderr}, {"mean_nll", p.mean_nll}})
    if (!std::isfinite(v)) d[key] = v;
  d["seconds"] = p.seconds;
  d["tokens_per_second"] = p.tokens_per_second;
  return d;
}

}  // namespace

// The sampling keywords every generating call takes, in one place.
#define NIBBLE_PY_SAMPLING_ARGS                                                                             \
  py::arg("max_new_tokens") = 128, py::arg("temperature") = 0.8, py::arg("top_k") = 40, py::arg("top_p") = 0.95, \
      py::arg("min_p") = 0.0, py::arg("repeat_penalty") = 1.0, py::arg("repeat_last_n") = 64,                  \
      py::arg("stop") = std::vector<std::string>(), py::arg("seed") = py::none()
// OpenAI's penalties, last in every signature (so positional calls keep their meaning).
#define NIBBLE_PY_PENALTY_ARGS py::arg("presence_penalty") = 0.0, py::arg("frequency_penalty") = 0.0

void RegisterModel(py::module_& m) {
  py::class_<TokenStream>(m, "TokenStream", "Iterator over a generation's text pieces (or token events).")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &TokenStream::Next)
      .def("close", &TokenStream::Close, "Stops the generation (cancels it) and waits for it.")
      .def_property_readonly("stats", &TokenStream::stats,
                             "After the last piece: finish_reason, stop_reason, token counts and times; else None.");

  py::class_<PyModel, std::shared_ptr<PyModel>>(m, "Model", R"(A loaded model (dense or int4, any supported format).

Model(path, threads=None, activations="auto", ctx_size=None, kv_dtype=None, tokenizer="auto",
max_memory=None, weight_cache=True, weight_cache_dir="", no_mmap=False). Shared by any number of
threads: each call runs on its own state. Calls release the GIL; Ctrl-C cancels logits / score /
generate / stream / chat / perplexity. weight_cache: an int4 checkpoint's repacked weights are kept
in a cache file (weight_cache_dir, "" = $NIBBLE_CACHE_DIR/weights or ~/.cache/nibble/weights) that
later loads map, or with no_mmap copy into process memory (slower load).)")
      .def(py::init(&LoadModel), py::arg("path"), py::arg("threads") = py::none(), py::arg("activations") = "auto",
           py::arg("ctx_size") = py::none(), py::arg("kv_dtype") = py::none(), py::arg("tokenizer") = "auto",
           py::arg("max_memory") = py::none(), py::arg("weight_cache") = true, py::arg("weight_cache_dir") = "",
           py::arg("no_mmap") = false)
      .def_property_readonly("info", [](const PyModel& pm) { return InfoDict(pm.model->info()); },
                             "What was loaded: config numbers, weight format, activations, load time, bytes.")
      .def_property_readonly("special_tokens", [](const PyModel& pm) {
        const nibble::SpecialTokenIds s = pm.model->special_tokens();
        return py::dict(py::arg("bos_id") = s.bos_id, py::arg("eos_ids") = s.eos_ids, py::arg("pad_id") = s.pad_id,
                        py::arg("add_bos") = s.add_bos, py::arg("add_eos") = s.add_eos);
      })
      .def("tokenize", [](const PyModel& pm, const std::string& text, bool add_special) {
             return TakeOrThrow(pm.model->Tokenize(text, add_special));
           }, py::arg("text"), py::arg("add_special") = true,
           "Token ids of text as the HF tokenizer's call gives them (BOS when add_special and the model adds one).")
      .def("detokenize", [](const PyModel& pm, const std::vector<int32_t>& ids) {
             return py::bytes(pm.model->Detokenize(ids)).attr("decode")("utf-8", "replace");
           }, py::arg("ids"), "Text of token ids (special tokens render as nothing).")
      .def("logits", &Logits, py::arg("ids"),
           "float32 array [len(ids), vocab_size]: the logits of every position, ids run from position 0.")
      .def("score", &Score, py::arg("text_or_ids"),
           "float32 array [T - 1]: log p(token_i | tokens before it) for i >= 1 (text is tokenized with BOS).")
      .def("generate", [](const PyModel& pm, const py::object& prompt, int64_t max_new_tokens, double temperature,
                          int64_t top_k, double top_p, double min_p, double repeat_penalty, int64_t repeat_last_n,
                          const std::vector<std::string>& stop, std::optional<uint64_t> seed, double presence_penalty,
                          double frequency_penalty) {
             auto s = MakeSampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, presence_penalty,
                                   frequency_penalty);
             return RunGenerate(pm, MakeGenerate(prompt, max_new_tokens, s, stop, false, 0)).first;
           }, py::arg("prompt"), NIBBLE_PY_SAMPLING_ARGS, NIBBLE_PY_PENALTY_ARGS,
           "The continuation of prompt (text, or token ids run as given); the prompt is not echoed.")
      .def("stream", [](std::shared_ptr<PyModel> pm, const py::object& prompt, int64_t max_new_tokens, double temperature,
                        int64_t top_k, double top_p, double min_p, double repeat_penalty, int64_t repeat_last_n,
                        const std::vector<std::string>& stop, std::optional<uint64_t> seed, bool logprobs,
                        int top_logprobs, bool events, double presence_penalty, double frequency_penalty) {
             auto s = MakeSampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, presence_penalty,
                                   frequency_penalty);
             auto g = MakeGenerate(prompt, max_new_tokens, s, stop, logprobs, top_logprobs);
             return std::make_unique<TokenStream>(pm, std::move(g), events || logprobs || top_logprobs > 0);
           }, py::arg("prompt"), NIBBLE_PY_SAMPLING_ARGS, py::arg("logprobs") = false, py::arg("top_logprobs") = 0,
           py::arg("events") = false, NIBBLE_PY_PENALTY_ARGS,
           "Iterator of text pieces that concatenate to generate()'s text; with logprobs / top_logprobs / events,\n"
           "dicts {id, text, logprob, top_logprobs} per token instead.")
      .def("chat", [](const PyModel& pm, const py::iterable& messages, int64_t max_new_tokens, double temperature,
                      int64_t top_k, double top_p, double min_p, double repeat_penalty, int64_t repeat_last_n,
                      const std::vector<std::string>& stop, std::optional<uint64_t> seed, const std::string& chat_template,
                      std::optional<py::dict> chat_template_kwargs, double presence_penalty, double frequency_penalty) {
             auto s = MakeSampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, presence_penalty,
                                   frequency_penalty);
             return Chat(pm, messages, MakeGenerate(py::str(""), max_new_tokens, s, stop, false, 0), chat_template,
                         chat_template_kwargs);
           }, py::arg("messages"), NIBBLE_PY_SAMPLING_ARGS, py::arg("chat_template") = "",
           py::arg("chat_template_kwargs") = py::none(), NIBBLE_PY_PENALTY_ARGS,
           "An OpenAI chat.completion dict for messages [{role, content}, ...], rendered through the model's\n"
           "chat_template (tokenizer_config.json) or the Jinja file chat_template.")
      .def("perplexity", &Perplexity, py::arg("text"), py::arg("seq_len") = 0, py::arg("max_windows") = 0,
           "Perplexity of text, GPTQ/AWQ-paper protocol (non-overlapping windows of seq_len tokens; 0 =\n"
           "min(2048, max_position_embeddings)), as `nibble perplexity --json` reports it.")
      .def("session", &NewSession, py::arg("ctx_size") = py::none(), py::arg("threads") = py::none(),
           "A new Session (KV cache of ctx_size positions; None = the model's ctx_size, else\n"
           "min(max_position_embeddings, 8192)).")
      .def("__repr__", [](const PyModel& pm) {
        const nibble::ModelInfo& i = pm.model->info();
        return "<nibble.Model " + i.dir + " (" + i.architecture + ", " + i.weight_format + ")>";
      });
}

}  // namespace nibble_py
