#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "api/model_impl.h"
#include "base/memory.h"
#include "model/int4_linear.h"
#include "model/model_loader.h"

namespace nibble {

void SetNumThreads(int n) { omp_set_num_threads(n > 0 ? std::min(n, kMaxThreads) : omp_get_num_procs()); }

Status CheckThreads(int n) {
  if (n < 0 || n > kMaxThreads)
    return MakeError("--threads ", n, " must be in [0, ", kMaxThreads, "] (0 = all cores)");
  return Status::Ok();
}
int NumThreads() { return omp_get_max_threads(); }

ScopedThreads::ScopedThreads(int n) : saved_(n > 0 ? omp_get_max_threads() : 0) {
  if (n > 0) omp_set_num_threads(n);
}
ScopedThreads::~ScopedThreads() {
  if (saved_ > 0) omp_set_num_threads(saved_);
}

const char* ActivationTypeName(ActivationType a) {
  switch (a) {
    case ActivationType::kAuto: return "auto";
    case ActivationType::kFp32: return "fp32";
    case ActivationType::kBf16: return "bf16";
    default: return "int8";
  }
}

const char* KvDtypeName(KvDtype d) { return d == KvDtype::kFp32 ? "fp32" : "bf16"; }

bool ParseKvDtype(const std::string& name, KvDtype* out) {
  for (KvDtype d : {KvDtype::kBf16, KvDtype::kFp32})
    if (name == KvDtypeName(d)) return *out = d, true;
  return false;
}

bool ParseActivationType(const std::string& name, ActivationType* out) {
  for (ActivationType a : {ActivationType::kAuto, ActivationType::kFp32, ActivationType::kBf16, ActivationType::kInt8})
    if (name == ActivationTypeName(a)) return *out = a, true;
  return false;
}

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;
const ModelInfo& Model::info() const { return impl_->info; }

namespace {

// config.json numbers, the stored format and the parameter / int4 linear counts.
ModelInfo DescribeModel(const std::string& dir, const LlamaModel& llama, const std::string& format) {
  const ModelConfig& c = llama.config();
  ModelInfo i;
  i.dir = dir;
  i.architecture = c.architecture;
  i.model_type = c.model_type;
  i.torch_dtype = c.torch_dtype;
  i.hidden_size = c.hidden_size;
  i.intermediate_size = c.intermediate_size;
  i.num_hidden_layers = c.num_hidden_layers;
  i.num_attention_heads = c.num_attention_heads;
  i.num_key_value_heads = c.num_key_value_heads;
  i.head_dim = c.head_dim;
  i.vocab_size = c.vocab_size;
  i.max_position_embeddings = c.max_position_embeddings;
  i.tie_word_embeddings = c.tie_word_embeddings;
  i.weight_format = format;
  int64_t params = c.vocab_size * c.hidden_size + c.hidden_size;
  for (const auto& layer : llama.layers()) {
    params += 2 * c.hidden_size;
    for (const Linear* l : {layer.q_proj.get(), layer.k_proj.get(), layer.v_proj.get(), layer.o_proj.get(),
                            layer.gate_proj.get(), layer.up_proj.get(), layer.down_proj.get()}) {
      params += l->in_features() * l->out_features();
      i.int4_linears += dynamic_cast<const Int4Linear*>(l) != nullptr ? 1 : 0;
    }
  }
  i.int4_linears += dynamic_cast<const Int4Linear*>(&llama.lm_head()) != nullptr ? 1 : 0;
  if (!c.tie_word_embeddings) params += c.vocab_size * c.hidden_size;
  i.num_parameters = params;
  i.weight_bytes = llama.WeightBytes();
  return i;
}

}  // namespace

std::string LoadSummary(const ModelInfo& info) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", info.load_seconds);
  std::string s = std::string("loaded in ") + seconds + " s, weights " +
                  FormatBytes(static_cast<double>(info.weight_bytes)) + " resident";
  if (!info.weight_cache.empty())
    s += std::string("; int4 weights ") + (info.weight_cache_hit ? "read from " : "packed into ") + info.weight_cache;
  return s;
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& dir, const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  NIBBLE_RETURN_IF_ERROR(CheckThreads(options.threads));
  ScopedThreads threads(options.threads);
  std::unique_ptr<Model> m(new Model());
  LoadReport report;
  WeightCacheOptions cache;
  if (options.weight_cache) {
    cache.dir = options.weight_cache_dir.empty() ? DefaultWeightCacheDir() : options.weight_cache_dir;
    cache.min_bytes = options.weight_cache_min_bytes;
    cache.pages = options.weight_cache_pages;
  }
  auto llama = LoadAnyModel(dir, &report, cache);
  if (!llama.ok()) return llama.error().WithContext("loading model " + dir);
  auto tok = Tokenizer::Load(dir, ToTokenizerKind(options.tokenizer));
  if (!tok.ok()) return tok.error().WithContext("loading tokenizer of " + dir);
  m->impl_->llama = std::move(llama).value();
  m->impl_->tokenizer = std::move(tok).value();
  const ModelConfig& c = m->impl_->llama->config();
  if (m->impl_->tokenizer->vocab_size() > c.vocab_size)
    return MakeErrorCode(ErrorCode::kCorruptInput, dir, ": the tokenizer (", m->impl_->tokenizer->kind_name(), ") has ",
                         m->impl_->tokenizer->vocab_size(), " tokens but config.json vocab_size is ", c.vocab_size);
  ModelInfo& i = m->impl_->info;
  i = DescribeModel(dir, *m->impl_->llama, report.format_name);
  i.warnings = std::move(report.warnings);
  i.weight_cache = report.weight_cache;
  i.weight_cache_hit = report.weight_cache_hit;
  i.activations = options.activations;
  i.kv_dtype = options.kv_dtype;
  m->impl_->llama->SetKvBf16(options.kv_dtype == KvDtype::kBf16);
  switch (options.activations) {
    case ActivationType::kFp32: i.activation_linears = i.int4_linears; break;
    case ActivationType::kAuto:
    case ActivationType::kBf16: i.activation_linears = m->impl_->llama->SetBf16Activations(true); break;
    case ActivationType::kInt8: i.activation_linears = m->impl_->llama->SetInt8Activations(true); break;
  }
  if (options.activations == ActivationType::kAuto) {
    i.activations = i.activation_linears > 0 ? ActivationType::kBf16 : ActivationType::kFp32;
    if (i.activation_linears == 0) i.activation_linears = i.int4_linears;
  }
  i.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

Result<std::vector<int32_t>> Model::Tokenize(const std::string& text, bool add_special_tokens) const {
  return impl_->tokenizer->Encode(text, add_special_tokens);
}

std::string Model::Detokenize(const std::vector<int32_t>& ids) const { return impl_->tokenizer->Decode(ids); }

SpecialTokenIds Model::special_tokens() const {
  const SpecialTokens& s = impl_->tokenizer->special_tokens();
  return SpecialTokenIds{s.bos_id, s.eos_ids, s.pad_id, s.add_bos, s.add_eos};
}

Result<std::vector<float>> Model::Logits(const std::vector<int32_t>& ids, const CancellationToken* cancel) const {
  const LlamaModel& llama = *impl_->llama;
  if (ids.empty()) return MakeError("Logits: empty token sequence");
  NIBBLE_ASSIGN_OR_RETURN(KvCache cache, llama.NewCache(static_cast<int64_t>(ids.size())));
  std::vector<float> logits(ids.size() * static_cast<size_t>(llama.config().vocab_size));
  NIBBLE_RETURN_IF_ERROR(llama.Forward(ids.data(), static_cast<int64_t>(ids.size()), cache, logits.data(), true, cancel));
  return logits;
}

}  // namespace nibble
