#include "model/model_loader.h"

#include <set>

#include "model/config.h"
#include "model/int4_linear.h"
#include "model/output_projection.h"
#include "model/weight_cache.h"
#include "model/weights.h"

namespace nibble {

LinearLoader MakeLinearLoader(std::shared_ptr<const QuantizedFormat> format,
                              std::shared_ptr<std::atomic<int64_t>> act_order, std::shared_ptr<WeightCache> cache) {
  if (format == nullptr) return LoadDenseLinear;
  return [format, act_order, cache](const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                                    bool has_bias) -> Result<std::unique_ptr<Linear>> {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve(prefix));
    std::vector<float> bias;
    if (has_bias && plan.spec) {
      NIBBLE_ASSIGN_OR_RETURN(bias, LoadF32(store, prefix + ".bias", {n}));
    }
    std::unique_ptr<Int4Linear> linear;
    if (plan.spec && cache != nullptr && cache->hit()) linear = cache->Load(prefix, n, k, bias);
    const Int4Linear::PackedAllocator alloc = cache != nullptr && !cache->hit() ? cache->Allocator() : nullptr;
    // Codes stored transposed are repacked straight from the mapped words (no decoded copy).
    if (linear == nullptr) {
      NIBBLE_ASSIGN_OR_RETURN(std::optional<DeferredInt4> deferred, format->ImportDeferred(store, prefix, plan, n, k));
      if (deferred) linear = Int4Linear::FromTransposed(*deferred, bias, DescribeSpec(*plan.spec), alloc);
    }
    if (linear == nullptr) {
      NIBBLE_ASSIGN_OR_RETURN(std::optional<Int4Matrix> m, format->Import(store, prefix, plan, n, k));
      if (!m) return LoadDenseLinear(store, prefix, n, k, has_bias);
      // Readers keep a g_idx only when it is not the natural one.
      const std::string desc = DescribeSpec(*plan.spec) + (m->g_idx.empty() ? "" : " act-order");
      linear = std::make_unique<Int4Linear>(*m, std::move(bias), desc, alloc);
    }
    if (act_order && !linear->column_order().empty()) ++*act_order;
    if (alloc) cache->Record(prefix, *linear);  // kMapped: now over the entry's pages
    // The packed copy is what the model keeps: the mapping's pages of the module go.
    for (const std::string& suffix : format->TensorSuffixes())
      if (const TensorView* t = store.Find(prefix + "." + suffix)) store.Release(*t);
    return std::unique_ptr<Linear>(std::move(linear));
  };
}

namespace {

// A float tensor of `shape` (any float dtype), as the loader will read it.
Status CheckFloat(const TensorStore& store, const std::string& name, const std::vector<int64_t>& shape) {
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, GetShaped(store, name, shape));
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16)
    return MakeErrorCode(ErrorCode::kCorruptInput, t->file, ": tensor \"", name, "\" has dtype ", DTypeName(t->dtype),
                         ", expected a floating-point dtype (F32, F16 or BF16)");
  return Status::Ok();
}

// The layer indices the checkpoint stores tensors for ("model.layers.<i>.*"); bounded by the
// store, whatever config.json says.
std::set<int64_t> StoredLayers(const TensorStore& store) {
  static const std::string kPrefix = "model.layers.";
  std::set<int64_t> layers;
  for (const std::string& name : store.Names()) {
    if (!name.starts_with(kPrefix)) continue;
    const size_t dot = name.find('.', kPrefix.size());
    const std::string index = name.substr(kPrefix.size(), dot == std::string::npos ? dot : dot - kPrefix.size());
    if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos) continue;
    layers.insert(std::stoll(index));
  }
  return layers;
}

// num_hidden_layers, vocab_size and hidden_size against the stored tensors: the sizes the loaders
// build tables by (names per layer, embedding rows) are checked before anything is sized by them.
Status CheckDeclaredSizes(const ModelConfig& c, const TensorStore& store) {
  const std::set<int64_t> layers = StoredLayers(store);
  if (c.num_hidden_layers > static_cast<int64_t>(layers.size()))
    return MakeErrorCode(ErrorCode::kCorruptInput, c.path, ": num_hidden_layers is ", c.num_hidden_layers,
                         " but the checkpoint has tensors for ", layers.size(), " layers",
                         layers.empty() ? std::string(" (no model.layers.* tensor)")
                                        : " (model.layers." + std::to_string(*layers.begin()) + " .. model.layers." +
                                              std::to_string(*layers.rbegin()) + ")");
  const TensorView* e = store.Find("model.embed_tokens.weight");
  if (e == nullptr || e->shape.size() != 2) return Status::Ok();  // CheckFloat names it
  if (e->shape[0] != c.vocab_size)
    return MakeErrorCode(ErrorCode::kCorruptInput, c.path, ": vocab_size is ", c.vocab_size, " but ", e->name, " (",
                         e->file, ") has ", e->shape[0], " rows (shape ", e->ShapeString(), ")");
  if (e->shape[1] != c.hidden_size)
    return MakeErrorCode(ErrorCode::kCorruptInput, c.path, ": hidden_size is ", c.hidden_size, " but ", e->name, " (",
                         e->file, ") has ", e->shape[1], " columns (shape ", e->ShapeString(), ")");
  return Status::Ok();
}

// Which config.json keys give a linear's [out_features, in_features], for shape errors.
std::string ShapeKeys(const ModelConfig& c, const std::string& module) {
  auto key = [](const char* name, int64_t v) { return std::string(name) + " " + std::to_string(v); };
  const std::string h = key("hidden_size", c.hidden_size), i = key("intermediate_size", c.intermediate_size);
  const std::string q = key("num_attention_heads", c.num_attention_heads) + " x " + key("head_dim", c.head_dim);
  const std::string kv = key("num_key_value_heads", c.num_key_value_heads) + " x " + key("head_dim", c.head_dim);
  std::string out = h, in = h;
  if (module == "lm_head") out = key("vocab_size", c.vocab_size);
  else if (module.ends_with("q_proj")) out = q;
  else if (module.ends_with("k_proj") || module.ends_with("v_proj")) out = kv;
  else if (module.ends_with("o_proj")) in = q;
  else if (module.ends_with("gate_proj") || module.ends_with("up_proj")) out = i;
  else if (module.ends_with("down_proj")) in = i;
  return c.path + ": out_features = " + out + ", in_features = " + in;
}

// A shape error of `module` with the config keys its expected shape comes from.
Status WithShapeKeys(Status s, const ModelConfig& c, const std::string& module) {
  if (s.ok()) return s;
  return Error{s.error().message + " (" + ShapeKeys(c, module) + ")", s.error().code};
}

bool HasBias(const ModelConfig& c, const std::string& module) {
  if (module == "lm_head") return false;
  const bool qkv = module.ends_with("q_proj") || module.ends_with("k_proj") || module.ends_with("v_proj");
  return qkv ? c.qkv_bias : module.ends_with("o_proj") ? c.o_bias : c.mlp_bias;
}

}  // namespace

Status CheckCheckpointShapes(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format) {
  NIBBLE_RETURN_IF_ERROR(CheckDeclaredSizes(c, store));
  const int64_t h = c.hidden_size;
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(c, store));
  NIBBLE_RETURN_IF_ERROR(CheckFloat(store, "model.embed_tokens.weight", {c.vocab_size, h}));
  NIBBLE_RETURN_IF_ERROR(CheckFloat(store, "model.norm.weight", {h}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    NIBBLE_RETURN_IF_ERROR(CheckFloat(store, p + "input_layernorm.weight", {h}));
    NIBBLE_RETURN_IF_ERROR(CheckFloat(store, p + "post_attention_layernorm.weight", {h}));
    if (c.qk_norm) {
      for (const char* norm : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
        if (Status s = CheckFloat(store, p + norm, {c.head_dim}); !s.ok())
          return Error{s.error().message + " (" + c.path + ": head_dim " + std::to_string(c.head_dim) + ")",
                       s.error().code};
    }
  }
  for (const std::string& module : LinearModuleNames(c, proj.ReadsHeadModule())) {
    const auto [n, k] = LinearShape(c, module);
    if (HasBias(c, module)) NIBBLE_RETURN_IF_ERROR(WithShapeKeys(CheckFloat(store, module + ".bias", {n}), c, module));
    if (format == nullptr) {
      NIBBLE_RETURN_IF_ERROR(WithShapeKeys(CheckFloat(store, module + ".weight", {n, k}), c, module));
      continue;
    }
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve(module));
    NIBBLE_RETURN_IF_ERROR(WithShapeKeys(format->CheckLinear(store, module, plan, n, k), c, module));
  }
  return Status::Ok();
}

Result<std::string> CheckUnreadTensors(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format) {
  std::set<std::string> known = {"model.embed_tokens.weight", "model.norm.weight"};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    known.insert({p + "input_layernorm.weight", p + "post_attention_layernorm.weight"});
    if (c.qk_norm) known.insert({p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"});
  }
  const std::vector<std::string> suffixes = format ? format->TensorSuffixes() : std::vector<std::string>{"weight"};
  const std::vector<std::string> modules = LinearModuleNames(c, true);
  for (const std::string& m : modules) {
    known.insert(m + ".bias");
    for (const std::string& s : suffixes) known.insert(m + "." + s);
  }
  std::vector<std::string> unread;
  for (const std::string& name : store.Names()) {
    if (known.count(name) != 0) continue;
    for (const std::string& m : modules) {
      if (format == nullptr || !name.starts_with(m + ".")) continue;
      NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve(m));
      if (!plan.spec) continue;
      std::string expected;
      for (const std::string& s : suffixes) expected += (expected.empty() ? "" : ", ") + s;
      return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": tensor ", name, " of quantized module ", m,
                           " is not one nibble reads (", format->name(), " module tensors: ", expected,
                           ", bias); it may change how the module is meant to be decoded");
    }
    unread.push_back(name);
  }
  if (unread.empty()) return std::string();
  std::string list;
  for (size_t i = 0; i < unread.size() && i < 8; ++i) list += (i ? ", " : "") + unread[i];
  if (unread.size() > 8) list += ", ... (" + std::to_string(unread.size() - 8) + " more)";
  return std::to_string(unread.size()) + (unread.size() == 1 ? " tensor" : " tensors") +
         " in the checkpoint not read by nibble: " + list;
}

Status CheckTiedLmHead(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format,
                       std::vector<std::string>* warnings) {
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(c, store));
  if (!proj.tied) return Status::Ok();
  if (format != nullptr && !proj.head_stored) {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve("lm_head"));
    if (plan.spec)
      return MakeErrorCode(ErrorCode::kCorruptInput, "config.json declares lm_head quantized (", plan.rule, ": ",
                           DescribeSpec(*plan.spec), ") but the checkpoint has no lm_head tensor (tie_word_embeddings "
                           "is true: the output projection is the float embedding); exclude lm_head in the config");
  }
  if (proj.stored_head_ignored) warnings->push_back(proj.IgnoredHeadWarning());
  return Status::Ok();
}

Result<std::unique_ptr<LlamaModel>> LoadAnyModel(const std::string& dir, LoadReport* report,
                                                 const WeightCacheOptions& cache_options) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> format, OpenCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  LoadReport r;
  r.format_name = format ? format->name() : "dense";
  NIBBLE_RETURN_IF_ERROR(CheckCheckpointShapes(config, store, format.get()));
  NIBBLE_ASSIGN_OR_RETURN(std::string unread, CheckUnreadTensors(config, store, format.get()));
  if (!unread.empty()) r.warnings.push_back(unread);
  NIBBLE_RETURN_IF_ERROR(CheckTiedLmHead(config, store, format.get(), &r.warnings));
  std::string cache_note;
  std::shared_ptr<WeightCache> cache;
  if (format != nullptr) cache = WeightCache::Open(dir, cache_options, &cache_note);
  auto act_order = std::make_shared<std::atomic<int64_t>>(0);
  auto m = LlamaModel::FromStore(config, store, MakeLinearLoader(std::move(format), act_order, cache));
  if (!m.ok()) return m;
  if (*act_order > 0)
    r.warnings.push_back("note: " + std::to_string(act_order->load()) + " int4 linears have an act-order g_idx: their columns are "
                         "sorted by group once at load and each input gathered to match (the kernels see natural groups)");
  if (cache != nullptr) {
    r.weight_cache_hit = cache->hit();
    if (cache->hit() || cache->Commit().ok()) r.weight_cache = cache->path();
    if (!cache->note().empty()) cache_note = cache->note();
  }
  if (!cache_note.empty()) r.warnings.push_back("note: " + cache_note);
  if (report != nullptr) *report = std::move(r);
  return m;
}

}  // namespace nibble
