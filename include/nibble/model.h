// A loaded model: a Hugging Face Llama-family checkpoint (dense or quantized, any supported
// checkpoint format) with its tokenizer. A Model is immutable after Load and shared read-only:
// any number of threads may use one Model at the same time, through their own Sessions
// (<nibble/session.h>), evaluations and const calls here. The Model holds the weights and the
// tokenizer only; every buffer a forward pass writes (KV cache, activations, dequantized weight
// tiles) belongs to the call's Session or to the call itself (Logits), so memory does not grow
// with the number of threads that ran forwards. The Model must outlive its Sessions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nibble/cancel.h>
#include <nibble/error.h>
#include <nibble/tokenizer.h>

namespace nibble {

/// The most worker threads a call, session or server may ask for: every `threads` field and
/// `--threads` takes 0 (all cores; for a call or session, the calling thread's setting) to this;
/// other values are refused with an error naming them.
inline constexpr int kMaxThreads = 1024;
/// Sets the number of worker threads of the calling thread's compute (0 = all cores); calls and
/// sessions that name their own thread count use theirs. Default: all cores. n is clamped to
/// [0, kMaxThreads].
void SetNumThreads(int n);
/// Threads compute on the calling thread currently uses.
int NumThreads();

/// The activations the int4 linears compute with (weights stay int4; dense linears stay fp32).
enum class ActivationType {
  kAuto,  // the default: kBf16 for every int4 linear it serves (W4A16 as vLLM / ORT GenAI run
          // it, and nibble's fastest correct path), fp32 for the rest (dense models, group sizes
          // not a multiple of 32); the same bf16 numerics on every CPU up to summation order
  kFp32,  // W4A32: fp32 activations
  kBf16,  // activations rounded to bf16; AVX-512 BF16 kernels where the CPU has avx512_bf16 and
          // avx512_vbmi, oneDNN's bf16 matmul from 16 rows with AMX (64 without); group sizes that
          // are multiples of 32
  kInt8,  // W4A8: activations quantized to int8 per block of 128 (llama.cpp's Q8 dot products);
          // group sizes 32, 64 or multiples of 128; costs perplexity
};
/// "auto" | "fp32" | "bf16" | "int8".
const char* ActivationTypeName(ActivationType a);
/// The type named `name` ("auto" | "fp32" | "bf16" | "int8"); false for any other string.
bool ParseActivationType(const std::string& name, ActivationType* out);

/// How a session's KV cache stores keys and values: bf16 (half the bytes; each K/V value rounded
/// to nearest even once, widened exactly by the attention) or fp32.
enum class KvDtype { kBf16, kFp32 };
/// "bf16" | "fp32".
const char* KvDtypeName(KvDtype d);
/// The dtype named `name` ("bf16" | "fp32"); false for any other string.
bool ParseKvDtype(const std::string& name, KvDtype* out);

/// Where the int4 weights of a packed-weight cache entry live once loaded (LoadOptions). kMapped:
/// the entry's page-cache pages themselves (no copy: an 8B loads in about a second; shared
/// between processes, evictable under memory pressure and then read again from disk). kOwned
/// (llama.cpp's --no-mmap): copies in owned memory on transparent huge pages, read from the entry
/// at a hit and written to it at a miss; the load pays for fresh memory. Both decode at the same
/// speed (docs/PERFORMANCE.md "Packed-weight cache").
enum class WeightCachePages { kMapped, kOwned };

struct LoadOptions {
  ActivationType activations = ActivationType::kAuto;
  KvDtype kv_dtype = KvDtype::kBf16;  // of every KV cache the model's sessions and evaluations use
  int threads = 0;  // threads used while loading (0 = the calling thread's setting)
  TokenizerType tokenizer = TokenizerType::kAuto;  // which tokenizer file to read
  /// Packed-weight cache: an int4 checkpoint's weights are repacked into the kernels' layout once,
  /// into a file in `weight_cache_dir`, and later loads of the unchanged checkpoint read that file
  /// instead of repacking (seconds for a 7B; weight_cache_pages). Entries are keyed by the
  /// checkpoint's path and its files' sizes and times; a changed checkpoint gets a new entry and
  /// its old one is removed.
  bool weight_cache = true;
  /// "" = $NIBBLE_CACHE_DIR/weights, else $XDG_CACHE_HOME/nibble/weights, else ~/.cache/nibble/weights.
  std::string weight_cache_dir;
  /// Checkpoints whose safetensors files total less are never cached (they repack in well under a second).
  int64_t weight_cache_min_bytes = int64_t{256} << 20;
  WeightCachePages weight_cache_pages = WeightCachePages::kMapped;
};

/// What was loaded (config.json numbers and how the weights are stored).
struct ModelInfo {
  std::string dir;
  std::string architecture;  // "LlamaForCausalLM", ...
  std::string model_type;
  std::string torch_dtype;
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
          num_key_value_heads = 0, head_dim = 0, vocab_size = 0, max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  int64_t num_parameters = 0;  // logical weight count (embeddings, norms, linears, lm_head if untied)
  std::string weight_format;   // "dense" | a checkpoint format's name ("quark")
  int64_t int4_linears = 0;    // linears (projections and lm_head) stored as int4
  /// What ran: as requested in LoadOptions, kAuto resolved (kBf16 when it serves any int4
  /// linear, else kFp32).
  ActivationType activations = ActivationType::kFp32;
  KvDtype kv_dtype = KvDtype::kBf16;
  /// int4 linears that run those activations (the others, whose group size that path does not
  /// serve, keep fp32 activations); equals int4_linears for kFp32.
  int64_t activation_linears = 0;
  /// What loaded but may not be what the checkpoint's author meant (tensors nibble does not
  /// read, a tied lm_head that differs from the embedding), one sentence each; a sentence that
  /// starts with "note: " says how the model is run (act-order linears sorted at load).
  std::vector<std::string> warnings;
  /// Wall time of Model::Load (checkpoint, checks, repacking, tokenizer), seconds.
  double load_seconds = 0;
  /// Bytes of the weights the model holds (embeddings, norms, linears as stored in memory:
  /// packed int4, bf16 or fp32; a tied lm_head counted once). bf16 tables are read zero-copy
  /// from the mapped checkpoint, so their pages are resident only once read.
  int64_t weight_bytes = 0;
  /// The packed-weight cache entry (LoadOptions::weight_cache) the int4 weights were read from
  /// (weight_cache_hit) or packed into at this load; "" when none was used.
  std::string weight_cache;
  bool weight_cache_hit = false;
};

/// "loaded in 3.2 s, weights 4.6 GiB resident": ModelInfo's load_seconds and weight_bytes in
/// one line (what `generate` and `perplexity` print on stderr), then the weight-cache entry
/// ("; int4 weights read from FILE" or "; int4 weights packed into FILE") when one was used.
std::string LoadSummary(const ModelInfo& info);

/// The model's special-token ids: config.json's bos_token_id / eos_token_id / pad_token_id over
/// the tokenizer's own (tokenizer.model's ids; tokenizer.json's post-processor and
/// tokenizer_config.json's bos_token / eos_token / pad_token). A chat template's end-of-turn ids
/// (`<|eot_id|>`, `<|im_end|>`, ...) come with the template: EndOfTurnFor in <nibble/chat.h>.
struct SpecialTokenIds {
  int32_t bos_id = -1;           // -1: none
  std::vector<int32_t> eos_ids;  // generation ends at any of them (Llama 3: <|end_of_text|>, <|eot_id|>, ...)
  int32_t pad_id = -1;           // -1: none; a server pads batches with it, it is never generated
  bool add_bos = true;           // Tokenize prepends bos_id (tokenizer_config.json add_bos_token)
  bool add_eos = false;          // Tokenize appends eos_ids[0] (add_eos_token)
};

class Model {
 public:
  /// Loads `dir` (config.json, model.safetensors or a sharded index, tokenizer.model or
  /// tokenizer.json as LoadOptions::tokenizer says).
  /// Errors: missing / malformed files, unsupported architecture or checkpoint format, tensors
  /// whose shape or dtype disagree with config.json, PyTorch pickles (refused).
  static Result<std::unique_ptr<Model>> Load(const std::string& dir, const LoadOptions& options = LoadOptions());
  ~Model();
  const ModelInfo& info() const;

  /// Tokenizes like the HF tokenizer's default call (BOS prepended when add_bos_token); with
  /// add_special_tokens false, the text's own tokens only (HF's add_special_tokens=False).
  Result<std::vector<int32_t>> Tokenize(const std::string& text, bool add_special_tokens = true) const;
  std::string Detokenize(const std::vector<int32_t>& ids) const;
  /// BOS / EOS / pad ids and whether Tokenize adds BOS / EOS.
  SpecialTokenIds special_tokens() const;

  /// fp32 logits for every position of `ids` run as one sequence from position 0: [T, vocab].
  /// Its KV cache and scratch are the call's own, freed on return. kCancelled when `cancel` is
  /// cancelled (from any thread; checked before each decoder layer).
  Result<std::vector<float>> Logits(const std::vector<int32_t>& ids, const CancellationToken* cancel = nullptr) const;

 private:
  friend struct ModelAccess;  // the library's own access to the runtime behind the handle
  struct Impl;
  Model();
  std::unique_ptr<Impl> impl_;
};

}  // namespace nibble
