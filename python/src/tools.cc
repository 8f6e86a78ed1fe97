// nibble.quantize / convert / verify / inspect / export_onnx: the CLI's checkpoint commands as
// calls, on the same library requests (QuantizeRequest, ConvertRequest, ...). Results are the
// library's JSON forms as dicts. Progress callables run on the calling thread (the worker only
// records the latest numbers), so they may do anything Python allows.
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "model.h"

namespace nibble_py {

namespace {

using namespace pybind11::literals;

py::object JsonLoads(const std::string& text) { return py::module_::import("json").attr("loads")(text); }

// The latest (done, total) a worker reported, forwarded to a Python callable from the poll.
class ProgressRelay {
 public:
  explicit ProgressRelay(py::object callable) : callable_(std::move(callable)) {}
  std::function<void(int64_t, int64_t)> Recorder() {
    if (callable_.is_none()) return nullptr;
    return [this](int64_t done, int64_t total) {
      std::lock_guard<std::mutex> lock(mu_);
      latest_ = {done, total};
    };
  }
  void Forward() {
    std::pair<int64_t, int64_t> now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      now = latest_;
    }
    if (callable_.is_none() || now == sent_ || now.second < 0) return;
    sent_ = now;
    callable_(now.first, now.second);
  }

 private:
  py::object callable_;
  std::mutex mu_;
  std::pair<int64_t, int64_t> latest_{-1, -1}, sent_{-1, -1};
};

// quant_config: a dict (written to a temporary file the request names) or a path.
struct QuantConfigFile {
  std::string path;
  bool temporary = false;
  ~QuantConfigFile() {
    std::error_code ec;
    if (temporary) std::filesystem::remove(path, ec);
  }
};

void SetQuantConfig(const py::object& quant_config, QuantConfigFile& file) {
  if (quant_config.is_none()) return;
  if (!py::isinstance<py::dict>(quant_config)) {
    file.path = py::str(quant_config).cast<std::string>();
    return;
  }
  py::object tmp = py::module_::import("tempfile").attr("mkstemp")("suffix"_a = ".json", "prefix"_a = "nibble_quant_config_");
  file.path = tmp.attr("__getitem__")(1).cast<std::string>();
  file.temporary = true;
  py::module_::import("os").attr("close")(tmp.attr("__getitem__")(0));
  const std::string text = py::module_::import("json").attr("dumps")(quant_config).cast<std::string>();
  std::FILE* f = std::fopen(file.path.c_str(), "wb");
  if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0)
    ThrowError(nibble::MakeErrorCode(nibble::ErrorCode::kIo, "cannot write quant_config to ", file.path));
}

py::object Quantize(const std::string& model_dir, const std::string& output_dir, const std::string& quant_scheme,
                    int64_t group_size, const std::string& quant_algo, const std::string& dataset, int64_t num_calib_data,
                    int64_t seq_len, const std::optional<std::vector<std::string>>& exclude_layers,
                    const std::vector<std::string>& layer_quant_config, const py::object& quant_config,
                    const std::string& model_export, const py::dict& options, const py::object& progress,
                    std::optional<int> threads, bool overwrite) {
  nibble::QuantizeRequest r;
  r.model_dir = model_dir;
  r.output_dir = output_dir;
  r.quant_scheme = quant_scheme;
  r.group_size = group_size;
  r.quant_algo = quant_algo;
  r.dataset = dataset;
  r.num_calib_data = num_calib_data;
  r.seq_len = seq_len;
  if (exclude_layers) {
    r.exclude_layers = *exclude_layers;
    r.exclude_layers_given = true;
  }
  r.layer_quant_config = layer_quant_config;
  r.model_export = model_export;
  r.overwrite = overwrite;
  r.threads = ThreadsArg(threads);
  QuantConfigFile qc;
  SetQuantConfig(quant_config, qc);
  r.quant_config_file = qc.path;
  // The algorithms' finer settings, by their CLI flag names.
  for (const auto& [key, value] : options) {
    const std::string k = py::str(key).cast<std::string>();
    if (k == "seed") r.seed = value.cast<uint64_t>();
    else if (k == "awq_clip") r.awq_clip = value.cast<bool>();
    else if (k == "propagate") r.propagate = value.cast<std::string>();
    else if (k == "duo_scaling") r.duo_scaling = py::isinstance<py::bool_>(value) ? (value.cast<bool>() ? "true" : "false")
                                                                                 : value.cast<std::string>();
    else if (k == "n_grid") r.n_grid = value.cast<int64_t>();
    else if (k == "calib_dtype") r.calib_dtype = value.cast<std::string>();
    else if (k == "dampening_frac") r.dampening_frac = value.cast<double>();
    else if (k == "block_size") r.block_size = value.cast<int64_t>();
    else if (k == "gptq_scale_timing") r.gptq_scale_timing = value.cast<std::string>();
    else if (k == "actorder") r.actorder = value.cast<std::string>();
    else if (k == "true_sequential") r.true_sequential = value.cast<bool>();
    else if (k == "gptq_format") r.gptq_format = value.cast<std::string>();
    else if (k == "pack_method") r.pack_method = value.cast<std::string>();
    else if (k == "misaligned") r.misaligned = value.cast<std::string>();
    else if (k == "tp") r.tp = value.cast<int>();
    else if (k == "max_shard_size") r.max_shard_size = TakeOrThrow(nibble::ParseMemorySize(py::str(value).cast<std::string>()));
    else if (k == "max_memory") r.max_memory = TakeOrThrow(nibble::ParseMemorySize(py::str(value).cast<std::string>()));
    else if (k == "resumable") r.resumable = value.cast<bool>();
    else if (k == "resume") r.resume = value.cast<bool>();
    else ThrowError(nibble::MakeError("quantize: unknown keyword argument \"", k, "\""));
  }
  ProgressRelay relay(progress);
  r.progress = relay.Recorder();
  nibble::QuantizeSummary s = TakeOrThrow(RunCancellable<nibble::Result<nibble::QuantizeSummary>>(
      r.threads, [&](const nibble::CancellationToken* cancel) {
        r.cancel = cancel;
        return nibble::Quantize(r);
      }, [&relay] { relay.Forward(); }));
  relay.Forward();
  return JsonLoads(s.report_json);  // its "messages" hold the warnings and notes
}

py::object Convert(const std::string& input_dir, const std::string& output_dir, const std::string& to,
                   const std::string& pack_method, const std::string& gptq_format, bool overwrite) {
  nibble::ConvertRequest r;
  r.input_dir = input_dir;
  r.output_dir = output_dir;
  r.to = to;
  r.pack_method = pack_method;
  r.gptq_format = gptq_format;
  r.overwrite = overwrite;
  nibble::ConvertSummary s = TakeOrThrow(RunCancellable<nibble::Result<nibble::ConvertSummary>>(
      0, [&](const nibble::CancellationToken* cancel) {
        r.cancel = cancel;
        return nibble::Convert(r);
      }));
  return py::dict("from"_a = s.from, "to"_a = s.to, "quantized_linears"_a = s.quantized_linears,
                  "float_tensors"_a = s.float_tensors, "shards"_a = s.shards, "total_bytes"_a = s.total_bytes,
                  "copied_files"_a = s.copied_files, "messages"_a = s.messages,
                  "quantization_config"_a = s.quantization_config_json.empty() ? py::object(py::none())
                                                                              : JsonLoads(s.quantization_config_json),
                  "seconds"_a = s.seconds);
}

py::dict Verify(const std::string& a, const std::string& b) {
  nibble::VerifyRequest r{a, b};
  nibble::VerifyReport rep = TakeOrThrow(RunCancellable<nibble::Result<nibble::VerifyReport>>(
      0, [&](const nibble::CancellationToken*) { return nibble::Verify(r); }));
  py::list entries;
  for (const nibble::VerifyEntry& e : rep.entries)
    entries.append(py::dict("name"_a = e.name, "linear"_a = e.linear, "identical"_a = e.identical,
                            "max_abs_diff"_a = e.max_abs_diff, "differing"_a = e.differing, "total"_a = e.total,
                            "a"_a = e.a, "b"_a = e.b));
  return py::dict("identical"_a = rep.identical(), "a_format"_a = rep.a_format, "b_format"_a = rep.b_format,
                  "entries"_a = entries);
}

py::object Inspect(const std::string& path, bool engines) {
  nibble::InspectReport rep = TakeOrThrow(RunCancellable<nibble::Result<nibble::InspectReport>>(
      0, [&](const nibble::CancellationToken*) { return nibble::Inspect(path); }));
  return JsonLoads(nibble::InspectJson(rep, engines));
}

}  // namespace

void RegisterTools(py::module_& m) {
  m.def("quantize", &Quantize, py::arg("model_dir"), py::arg("output_dir"),
        py::arg("quant_scheme") = "w_uint4_per_group_asym", py::arg("group_size") = 128, py::arg("quant_algo") = "rtn",
        py::arg("dataset") = "", py::arg("num_calib_data") = 128, py::arg("seq_len") = 512,
        py::arg("exclude_layers") = py::none(), py::arg("layer_quant_config") = std::vector<std::string>(),
        py::arg("quant_config") = py::none(), py::arg("model_export") = "hf_format", py::kw_only(),
        py::arg("options") = py::dict(), py::arg("progress") = py::none(), py::arg("threads") = py::none(),
        py::arg("overwrite") = false,
        R"(Quantizes the float checkpoint model_dir into output_dir (`nibble quantize`, AMD Quark's flags).

quant_algo: "rtn" | "awq" | "gptq" | "awq,gptq" (dataset: a text or JSONL file); exclude_layers: None
= the default ["lm_head"], a list replaces it; quant_config: a Quark quantization_config dict or a
JSON file path, applied as written; model_export: "hf_format" | "compressed-tensors" | "awq" | "gptq";
options: the finer CLI flags by name (seed, awq_clip, propagate, duo_scaling, n_grid, calib_dtype,
dampening_frac, block_size, gptq_scale_timing, actorder, true_sequential, gptq_format, pack_method,
misaligned, tp, max_shard_size, max_memory: "20GB" refuses a run whose planned peak memory is above
it, default 90 % of MemAvailable; resumable: True keeps a stopped run's staging directory with a
manifest per decoder layer, resume: True continues it, as `nibble quantize --resume`);
progress(done, total) is called from this thread. Returns the report (`nibble quantize --report`,
with the memory and disk "plan") as a dict. Ctrl-C cancels: no output directory is left.)");
  m.def("convert", &Convert, py::arg("input_dir"), py::arg("output_dir"), py::arg("to"), py::arg("pack_method") = "",
        py::arg("gptq_format") = "", py::arg("overwrite") = false,
        "Re-writes a quantized checkpoint in another format, codes untouched (`nibble convert`).");
  m.def("verify", &Verify, py::arg("a"), py::arg("b"),
        "Whether two checkpoints hold the same model (`nibble verify`): per linear and tensor, identical or not.");
  m.def("inspect", &Inspect, py::arg("path"), py::arg("engines") = true,
        "What `nibble inspect --json [--engines]` prints, as a dict.");
  m.attr("_export_onnx_program") = NIBBLE_EXPORT_ONNX_PROGRAM;
}

}  // namespace nibble_py
