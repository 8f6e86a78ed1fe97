// `nibble bench` / `inspect --kernels` / `nibble synth` back end (include/nibble/bench.h): DRAM
// read bandwidth, W4A32 GEMV/GEMM timings through Int4Linear (the model's path), the dispatch
// report, and random-weight checkpoints with real shapes for end-to-end tokens/s.
#include "support/bench.h"

#include <omp.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "base/half.h"
#include "base/memory.h"
#include "base/page_buffer.h"
#include "base/result.h"
#include "formats/int4_matrix.h"
#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/checkpoint_writer.h"
#include "base/check.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_dispatch.h"
#include "kernels/int4_gemm.h"
#include "kernels/int4_packed.h"
#include "kernels/x86_avx512bf16/bf16_peak.h"
#include "model/config.h"
#include "model/int4_linear.h"

namespace nibble {

namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The time-stamp counter (constant rate: the nominal frequency on every x86 CPU of the last decade),
// 0 on other architectures.
uint64_t Tsc() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return 0;
#endif
}

// The first "model name" line of /proc/cpuinfo (x86 and most Linux hosts), "" where there is none.
std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return "";
    const size_t first = line.find_first_not_of(" \t", colon + 1);
    return first == std::string::npos ? "" : line.substr(first);
  }
  return "";
}
}  // namespace

KernelDispatchReport DescribeKernels() {
  const W4Dispatch& d = ActiveW4Dispatch();
  const CpuFeatures cpu = DetectCpuFeatures();
  KernelDispatchReport r;
  r.chosen = IsaName(d.kernels.isa);
  r.cpu_vendor = cpu.vendor;
  r.cpu_family = cpu.family;
  r.cpu_name = CpuModelName();
  const std::pair<bool, const char*> flags[] = {
      {cpu.avx, "avx"},           {cpu.avx2, "avx2"},         {cpu.fma, "fma"},           {cpu.f16c, "f16c"},
      {cpu.avx512f, "avx512f"},   {cpu.avx512bw, "avx512bw"}, {cpu.avx512vl, "avx512vl"}, {cpu.avx512dq, "avx512dq"},
      {cpu.avx512vnni, "avx512vnni"}, {cpu.avx512vbmi, "avx512vbmi"}, {cpu.avx512bf16, "avx512bf16"},
      {cpu.amx_tile, "amx_tile"}, {cpu.amx_bf16, "amx_bf16"},
      {cpu.osxsave, "osxsave"},   {cpu.os_ymm, "os:ymm"},     {cpu.os_zmm, "os:zmm"}, {cpu.os_amx, "os:amx"}};
  for (const auto& [on, name] : flags)
    if (on) r.cpu_flags += (r.cpu_flags.empty() ? "" : " ") + std::string(name);
  r.override_value = d.override_value;
  r.override_message = d.message;
  for (const IsaCandidate& c : d.candidates)
    r.candidates.push_back({IsaName(c.isa), c.compiled, c.supported, c.chosen, c.reason});
  r.int8_kernel = d.kernels.gemm_i8_name;
  r.int8_reason = d.gemm_i8_reason;
  r.bf16_act_kernel = d.kernels.gemm_bf16_name;
  r.bf16_act_reason = d.gemm_bf16_reason;
  r.row_prefetch = StreamPrefetchName(d.kernels.row_prefetch);
  r.row_prefetch_reason = d.prefetch_reason;
  r.row_prefetch_message = d.prefetch_message;
  r.bf16_matmul_min_rows = Int4Linear::Bf16MatmulMinRows();
  r.l1d_bytes = L1DataCacheBytes();
  r.bf16_decode_chunk_min_k = W4DecodeChunkMinK(r.l1d_bytes, kW4Bf16ActBytesPerGroup);
  r.int8_decode_chunk_min_k = W4DecodeChunkMinK(r.l1d_bytes, kW4I8ActBytesPerGroup);
  r.decode_chunk_rows = kW4DecodeChunkRows;
  r.decode_chunk_weights = 128 * kW4DecodeChunkGroups;
  r.bf16_matmul_amx = DenseGemmHasAmx();
  r.bf16_prefill_sgemm = d.kernels.bf16_prefill_sgemm;
  r.bf16_dense = d.kernels.gemv_bf16 != nullptr ? "kept bf16, " + std::string(IsaName(d.kernels.isa)) + " bf16 GEMV at M = 1"
                                                : "widened to fp32 at load (no bf16 GEMV for " +
                                                      std::string(IsaName(d.kernels.isa)) + ")";
  r.vec_ops = d.kernels.vec.name;
  return r;
}

struct ReadBandwidthProbe::Impl {
  PageBuffer buf;
  int64_t words = 0;
};

ReadBandwidthProbe::ReadBandwidthProbe(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ReadBandwidthProbe::ReadBandwidthProbe(ReadBandwidthProbe&&) noexcept = default;
ReadBandwidthProbe& ReadBandwidthProbe::operator=(ReadBandwidthProbe&&) noexcept = default;
ReadBandwidthProbe::~ReadBandwidthProbe() = default;

Result<ReadBandwidthProbe> ReadBandwidthProbe::Create(int64_t bytes) {
  if (bytes < (int64_t{1} << 20)) return MakeError("bandwidth buffer of ", bytes, " bytes is below 1 MiB");
  auto impl = std::make_unique<Impl>();
  impl->words = bytes / 8;
  // Same allocation as the packed weights (huge pages when the kernel grants them) and the widest
  // loads the CPU has, so the roofline is what a read-only stream can reach.
  try {
    impl->buf = PageBuffer(static_cast<size_t>(impl->words) * 8);
  } catch (const std::bad_alloc&) {
    return MakeError("cannot allocate ", bytes, " bytes for the bandwidth buffer");
  }
  uint64_t* p = reinterpret_cast<uint64_t*>(impl->buf.data());
  const int64_t words = impl->words;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < words; ++i) p[i] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  return ReadBandwidthProbe(std::move(impl));
}

BandwidthResult ReadBandwidthProbe::Measure(int passes) const {
  if (passes < 1) passes = 1;
  const int64_t words = impl_->words;
  const uint64_t* p = reinterpret_cast<const uint64_t*>(impl_->buf.data());
  const StreamReadKernel read = ActiveW4Dispatch().kernels.stream_read;
  BandwidthResult r;
  r.bytes = words * 8;
  r.passes = passes;
  r.seconds = 1e30;
  uint64_t sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const double t0 = Now();
    uint64_t sum = 0;
#pragma omp parallel reduction(+ : sum)
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = words * t / nt, hi = words * (t + 1) / nt;
      sum += read(p + lo, hi - lo);
    }
    r.seconds = std::min(r.seconds, Now() - t0);
    sink += sum;
  }
  if (sink == 42) std::fputc(' ', stderr);  // keeps the reads observable
  r.gb_per_s = static_cast<double>(r.bytes) / r.seconds / 1e9;
  return r;
}

Result<BandwidthResult> MeasureReadBandwidth(int64_t bytes, int passes) {
  auto probe = ReadBandwidthProbe::Create(bytes);
  if (!probe.ok()) return probe.error();
  return probe->Measure(passes);
}

Result<PeakResult> MeasureBf16DotPeak(double seconds) {
  const auto loop = ActiveW4Dispatch().kernels.bf16_dot_peak;
  if (loop == nullptr) return MakeError("no AVX-512 BF16 kernels on this CPU (", ActiveW4Dispatch().gemm_bf16_reason, ")");
  PeakResult r;
  r.threads = omp_get_max_threads();
  float sink = 0;
  const auto round = [&](int64_t iters) {
    const double t0 = Now();
    float sum = 0;
#pragma omp parallel reduction(+ : sum)
    sum += loop(iters, static_cast<float>(omp_get_thread_num()));
    sink += sum;
    return Now() - t0;
  };
  int64_t iters = 1 << 14;
  while (round(iters) < seconds / 3 && iters < (int64_t{1} << 40)) iters *= 2;
  for (int i = 0; i < 3; ++i)
    r.gflop_per_s = std::max(r.gflop_per_s, static_cast<double>(iters * kBf16DotPeakFlopsPerIter) * r.threads /
                                                round(iters) / 1e9);
  if (sink == 42.f) std::fputc(' ', stderr);
  r.per_thread_gflop_per_s = r.gflop_per_s / r.threads;
  return r;
}

std::string OptInGroupSizeRefusal(bool int8_activations, bool bf16_activations, int64_t group_size) {
  const std::string g = std::to_string(group_size);
  if (int8_activations && !W4Int8ServesGroupSize(group_size))
    return "--int8_activations: group_size " + g + " is not 32, 64 or a multiple of 128";
  if (bf16_activations && !W4Bf16ServesGroupSize(group_size))
    return "--bf16_activations: group_size " + g + " is not a multiple of 32";
  return "";
}

Result<GemmBenchResult> BenchW4Gemm(const GemmBenchCase& s, int64_t min_total_bytes, double min_seconds) {
  if (s.k < 1 || s.n < 1 || s.m < 1 || s.group_size < 1 || s.k % s.group_size != 0)
    return MakeError("bench shape K=", s.k, " N=", s.n, " M=", s.m, " g=", s.group_size,
                     ": need positive sizes and K % g == 0");
  if (s.int8_activations && s.bf16_activations) return MakeError("bench: int8 and bf16 activations are exclusive");
  const std::string refusal = OptInGroupSizeRefusal(s.int8_activations, s.bf16_activations, s.group_size);
  if (!refusal.empty()) return MakeError("bench: ", refusal);
  std::mt19937 rng(1234);
  Int4Matrix w;
  w.n = s.n;
  w.k = s.k;
  w.group_size = s.group_size;
  w.codes.resize(static_cast<size_t>(s.n * s.k));
  for (auto& c : w.codes) c = static_cast<uint8_t>(rng() & 15);
  w.scales.resize(static_cast<size_t>(s.n * (s.k / s.group_size)));
  w.zero_points.resize(w.scales.size());
  std::uniform_real_distribution<float> sc(1e-3f, 2e-2f);
  for (auto& v : w.scales) v = sc(rng);
  for (auto& z : w.zero_points) z = static_cast<uint8_t>(rng() & 15);
  const Int4Linear proto(w, {}, "bench");
  w = Int4Matrix();
  const W4PackedWeight& geo = proto.packed();
  const int64_t bytes = proto.WeightBytes();
  const int64_t count = std::max<int64_t>(1, (min_total_bytes + bytes - 1) / bytes);
  std::vector<std::unique_ptr<Int4Linear>> mats;
  mats.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    mats.push_back(std::make_unique<Int4Linear>(geo.data, static_cast<size_t>(bytes), geo,
                                                std::vector<float>{}, "bench"));
  for (auto& m : mats) {  // served: OptInGroupSizeRefusal checked the group size above
    if (s.int8_activations) NIBBLE_CHECK(m->SetInt8Activations(true));
    if (s.bf16_activations) NIBBLE_CHECK(m->SetBf16Activations(true));
  }
  std::vector<float> x(static_cast<size_t>(s.m * s.k)), y(static_cast<size_t>(s.m * s.n));
  std::normal_distribution<float> xd(0.f, 1.f);
  for (auto& v : x) v = xd(rng);
  // Warm-up: one pass over every matrix for small M (pages, dispatch, thread team), one call else.
  const int64_t warm = s.m < 16 ? count : 1;
  Workspace ws;  // one caller's scratch, as a session's forward passes reuse theirs
  for (int64_t i = 0; i < warm; ++i) mats[static_cast<size_t>(i)]->Forward(x.data(), s.m, y.data(), &ws);
  GemmBenchResult r;
  r.shape = s;
  r.isa = IsaName(ActiveW4Dispatch().kernels.isa);
  r.path = s.int8_activations   ? std::string("w4a8:") + ActiveW4Dispatch().kernels.gemm_i8_name
           : s.bf16_activations ? std::string("bf16:") + (s.m >= Int4Linear::Bf16MatmulMinRows(s.group_size) ? "dequant+matmul"
                                                          : !mats[0]->Bf16KernelServes(s.m) ? "rounded+fused"
                                                          : W4Bf16AmxServes(geo, s.m)       ? "amx_bf16"
                                                              : ActiveW4Dispatch().kernels.gemm_bf16_name)
                                : (s.m < Int4Linear::kDequantGemmMinRows ? "fused" : "dequant+sgemm");
  r.matrices = count;
  r.weight_bytes = bytes;
  // Rounds of one full cycle over the matrices (M < 16) or one call (larger M), repeated for at
  // least `min_seconds` and 3 rounds; the best round is reported (like the bandwidth test: other
  // processes on a shared machine only ever make a round slower) along with the mean.
  const int64_t round_calls = s.m < 16 ? count : 1;
  double best = 1e30, total = 0, best_tsc = 0, total_tsc = 0;
  int64_t rounds = 0, next = 0;
  do {
    const double t0 = Now();
    const uint64_t c0 = Tsc();
    for (int64_t c = 0; c < round_calls; ++c)
      mats[static_cast<size_t>(next++ % count)]->Forward(x.data(), s.m, y.data(), &ws);
    const double ticks = static_cast<double>(Tsc() - c0);
    const double t = (Now() - t0) / static_cast<double>(round_calls);
    if (t < best) best_tsc = ticks / static_cast<double>(round_calls);
    best = std::min(best, t);
    total += t * static_cast<double>(round_calls);
    total_tsc += ticks;
    ++rounds;
  } while (rounds < 3 || total < min_seconds);
  r.tsc_per_call = best_tsc;
  r.tsc_ghz = total > 0 ? total_tsc / total / 1e9 : 0;
  r.threads = NumThreads();
  r.calls = rounds * round_calls;
  r.seconds_per_call = best;
  r.mean_seconds_per_call = total / static_cast<double>(r.calls);
  r.weight_gb_per_s = static_cast<double>(bytes) / r.seconds_per_call / 1e9;
  r.gflop_per_s = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) /
                  r.seconds_per_call / 1e9;
  return r;
}

}  // namespace nibble

// ---- nibble synth --------------------------------------------------------------------------

namespace nibble {

namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The bf16 checkpoint a config makes, from its sizes alone, against the free disk space where it
// is staged and its largest tensor against the available memory: an implausible config is refused
// before any tensor list or file is made.
Status CheckSynthSize(const ModelConfig& c, const std::string& out_dir) {
  const double h = static_cast<double>(c.hidden_size), i = static_cast<double>(c.intermediate_size),
               v = static_cast<double>(c.vocab_size), q = static_cast<double>(c.num_attention_heads * c.head_dim),
               kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double params = v * h * (c.tie_word_embeddings ? 1 : 2) +
                        static_cast<double>(c.num_hidden_layers) * (h * (2 * q + 2 * kv + 3 * i) + 2 * h);
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::absolute(out_dir, ec).parent_path();
  const std::filesystem::space_info disk = std::filesystem::space(parent, ec);
  if (!ec && 2 * params > static_cast<double>(disk.available))
    return MakeError(c.path, ": these sizes make a bf16 checkpoint of ", FormatBytes(2 * params), ", more than the ",
                     FormatBytes(static_cast<double>(disk.available)), " free in ", parent.string());
  return CheckMemoryFor(2 * std::max({v * h, i * h, q * h}), c.path + ": the largest tensor these sizes make");
}

// One tensor of a synthetic checkpoint: name, shape, and whether it holds ones (RMSNorm weights)
// instead of random values; `index` seeds its values.
struct SynthTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool ones;
  uint64_t index;
};

// The checkpoint's tensors in HF order, as model/llama.cc reads them for config `c`: q/k/v
// (and o, MLP) biases where the config has them, Qwen3's q_norm / k_norm, lm_head unless tied.
std::vector<SynthTensor> SynthTensors(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, q_dim = c.num_attention_heads * c.head_dim,
                kv_dim = c.num_key_value_heads * c.head_dim;
  std::vector<SynthTensor> specs;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool ones) {
    specs.push_back({std::move(name), std::move(shape), ones, specs.size()});
  };
  auto linear = [&](const std::string& name, int64_t n, int64_t k, bool bias) {
    add(name + ".weight", {n, k}, false);
    if (bias) add(name + ".bias", {n}, false);
  };
  add("model.embed_tokens.weight", {c.vocab_size, hidden}, false);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden}, true);
    linear(p + "self_attn.q_proj", q_dim, hidden, c.qkv_bias);
    linear(p + "self_attn.k_proj", kv_dim, hidden, c.qkv_bias);
    linear(p + "self_attn.v_proj", kv_dim, hidden, c.qkv_bias);
    linear(p + "self_attn.o_proj", hidden, q_dim, c.o_bias);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim}, true);
      add(p + "self_attn.k_norm.weight", {c.head_dim}, true);
    }
    add(p + "post_attention_layernorm.weight", {hidden}, true);
    linear(p + "mlp.gate_proj", inter, hidden, c.mlp_bias);
    linear(p + "mlp.up_proj", inter, hidden, c.mlp_bias);
    linear(p + "mlp.down_proj", hidden, inter, c.mlp_bias);
  }
  add("model.norm.weight", {hidden}, true);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, hidden}, false);
  return specs;
}

// bf16 values ~ U(-0.035, 0.035) (or ones), from a counter-based generator: the same bytes for
// any thread count.
TensorToWrite RandomBf16Tensor(const SynthTensor& sp, uint64_t seed) {
  TensorToWrite tw;
  tw.name = sp.name;
  tw.dtype = DType::kBF16;
  tw.shape = sp.shape;
  int64_t count = 1;
  for (int64_t d : sp.shape) count *= d;
  tw.bytes.resize(static_cast<size_t>(count * 2));
  uint16_t* v = reinterpret_cast<uint16_t*>(tw.bytes.data());
  const uint64_t key = SplitMix(seed ^ SplitMix(sp.index + 1));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float u = static_cast<float>(SplitMix(key + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    v[i] = F32ToBf16(sp.ones ? 1.0f : (u - 0.5f) * 0.0693f);
  }
  return tw;
}

// The tokenizer files a model directory may hold; synth copies whichever exist.
const std::vector<std::string>& SynthTokenizerFiles() {
  static const std::vector<std::string> files = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                                 "special_tokens_map.json"};
  return files;
}

// A tokenizer taken from another model directory brings that model's special-token ids: its
// config.json's bos_token_id / eos_token_id replace the family config's (Llama 3's 128000 is no
// id of a 4096-token SentencePiece vocabulary). A tokenizer dir without config.json (the real
// family's tokenizer files) keeps the family's ids.
Status TakeTokenizerSpecialIds(const std::string& tokenizer_dir, nlohmann::json& config) {
  if (tokenizer_dir.empty() || !PathExists(JoinPath(tokenizer_dir, "config.json"))) return Status::Ok();
  NIBBLE_ASSIGN_OR_RETURN(const nlohmann::json tc, ReadJsonFile(JoinPath(tokenizer_dir, "config.json")));
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (tc.is_object() && tc.contains(key)) config[key] = tc[key];
    else config.erase(key);
  }
  return Status::Ok();
}

}  // namespace

// --format quark: synth quantizes every linear but lm_head with --group_size, so it must divide
// each one's in_features (quantize's --misaligned / --exclude_layers are not synth's flags).
static Status CheckSynthGroupSize(const std::vector<SynthTensor>& specs, int64_t group_size, const std::string& config) {
  int64_t common = 0;
  std::string first_bad;
  for (const SynthTensor& t : specs) {
    if (t.shape.size() != 2 || !t.name.ends_with("_proj.weight")) continue;
    common = std::gcd(common, t.shape[1]);
    if (first_bad.empty() && t.shape[1] % group_size != 0)
      first_bad = t.name + " (in_features " + std::to_string(t.shape[1]) + ")";
  }
  if (first_bad.empty()) return Status::Ok();
  std::string fits;
  for (int64_t d = 1; d <= common; ++d)
    if (common % d == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(d);
  return MakeError("synth: --group_size ", group_size, " does not divide ", first_bad, " of ", config,
                   "; group sizes that divide every linear's in_features: ", fits);
}

Status WriteSyntheticCheckpoint(const SynthRequest& q) {
  if (q.format != "dense" && q.format != "quark")
    return MakeError("synth: unknown format \"", q.format, "\" (expected dense or quark)");
  // Checked before anything is written: a checkpoint without its tokenizer cannot be run.
  namespace fs = std::filesystem;
  if (!q.tokenizer_dir.empty() && !fs::is_regular_file(fs::path(q.tokenizer_dir) / "tokenizer.model") &&
      !fs::is_regular_file(fs::path(q.tokenizer_dir) / "tokenizer.json"))
    return MakeError("synth: --tokenizer_dir ", q.tokenizer_dir, ": no tokenizer.model or tokenizer.json there (expected "
                     "a model directory with a SentencePiece tokenizer.model or a Hugging Face tokenizer.json, e.g. "
                     "models/prose-llama-7m of the source tree: pass --tokenizer_dir DIR, or '' to write none)");
  std::string text;
  {
    std::ifstream f(q.config_path, std::ios::binary);
    if (!f) return MakeError(q.config_path, ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  nlohmann::json c = nlohmann::json::parse(text, nullptr, false);
  if (c.is_discarded() || !c.is_object()) return MakeError(q.config_path, ": not a JSON object");
  NIBBLE_RETURN_IF_ERROR(TakeTokenizerSpecialIds(q.tokenizer_dir, c));
  // The shapes come from the model's own config parser: what synth writes is what loads.
  NIBBLE_ASSIGN_OR_RETURN(const ModelConfig mc, ParseModelConfig(c, q.config_path));
  std::error_code ec;
  if (q.out_dir.empty()) return MakeError("synth: --out is empty");
  if (fs::exists(fs::path(q.out_dir), ec) && !q.overwrite)
    return MakeError("synth: output ", q.out_dir, " exists (use --overwrite)");
  NIBBLE_RETURN_IF_ERROR(CheckSynthSize(mc, q.out_dir));  // before anything sized by the config
  const std::vector<SynthTensor> specs = SynthTensors(mc);
  if (q.format == "quark") NIBBLE_RETURN_IF_ERROR(CheckSynthGroupSize(specs, q.group_size, q.config_path));
  // The dense checkpoint goes to a staging directory beside the output (io/checkpoint_writer.h):
  // renamed onto it for "dense", the quantizer's input for "quark" (which stages and commits its
  // own output) and removed afterwards. A failed run leaves no partial output, and an existing
  // output is replaced only once the new one is complete — and only if it is a model directory.
  auto created = CheckpointWriter::Create(q.out_dir, q.max_shard_bytes, q.format == "dense" ? "tmp" : "synth-dense");
  if (!created.ok()) return created.error().WithContext("synth");
  CheckpointWriter out = std::move(created).value();
  for (size_t i = 0; i < specs.size(); ++i) {
    NIBBLE_RETURN_IF_ERROR(out.Add(RandomBf16Tensor(specs[i], q.seed)));
    if (q.progress) q.progress("synth", static_cast<int64_t>(i + 1), static_cast<int64_t>(specs.size()));
  }
  NIBBLE_RETURN_IF_ERROR(out.Finish());
  c["torch_dtype"] = "bfloat16";
  NIBBLE_RETURN_IF_ERROR(out.WriteFile("config.json", c.dump(2)));
  if (!q.tokenizer_dir.empty()) {
    NIBBLE_RETURN_IF_ERROR(out.CopyFiles(q.tokenizer_dir, SynthTokenizerFiles()));
  }
  if (q.format == "dense") {
    const Status committed = out.Commit(q.overwrite);
    if (!committed.ok()) return committed.error().WithContext("synth");
    return Status::Ok();
  }
  QuantizeRequest qr;
  qr.model_dir = out.path();
  qr.output_dir = q.out_dir;
  qr.group_size = q.group_size;
  qr.overwrite = q.overwrite;
  if (q.progress) qr.progress = [&q](int64_t done, int64_t total) { q.progress("quantize", done, total); };
  auto summary = Quantize(qr);
  if (!summary.ok()) return summary.error().WithContext("synth: quantizing the synthetic checkpoint");
  return Status::Ok();
}

}  // namespace nibble
