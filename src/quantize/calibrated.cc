#include "quantize/calibrated.h"

#include <memory>

#include "io/json.h"

namespace nibble {

namespace {

nlohmann::ordered_json LayerReportsJson(const std::vector<LayerReport>& layers) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const LayerReport& l : layers) {
    nlohmann::ordered_json lin = nlohmann::ordered_json::array();
    for (const LinearErrorReport& e : l.linears)
      lin.push_back({{"name", e.name}, {"quantized", e.quantized}, {"rtn_error", DoubleJson(e.rtn_error)},
                     {"method_error", DoubleJson(e.method_error)}});
    out.push_back({{"layer", l.layer}, {"linears", lin}, {"seconds", DoubleJson(l.seconds)}});
  }
  return out;
}

Result<std::vector<LayerReport>> LayerReportsFromJson(const nlohmann::ordered_json& j) {
  std::vector<LayerReport> out;
  try {
    for (const auto& l : j) {
      LayerReport r;
      r.layer = l.at("layer").get<int64_t>();
      r.seconds = DoubleFromJson(l.at("seconds"));
      for (const auto& e : l.at("linears"))
        r.linears.push_back({e.at("name").get<std::string>(), e.at("quantized").get<bool>(), DoubleFromJson(e.at("rtn_error")),
                             DoubleFromJson(e.at("method_error"))});
      out.push_back(std::move(r));
    }
  } catch (const std::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, "the saved layer reports: ", e.what());
  }
  return out;
}

}  // namespace

Result<CalibResult> RunCalibrated(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                                  const AlgorithmPlan& algorithms, const std::vector<int32_t>& tokens, int64_t batch,
                                  int64_t seq_len, const LayerTensorSink& sink,
                                  const std::function<void(int64_t, int64_t)>& progress,
                                  const CancellationToken* cancel,
                                  const std::function<void(int64_t layer, const char* stage)>& on_stage,
                                  CalibCheckpoint* checkpoint) {
  // The chain owns the algorithms; these pointers read their reports afterwards.
  std::vector<std::unique_ptr<LayerAlgorithm>> owned;
  std::vector<ChainAlgorithm*> algos;
  for (std::unique_ptr<ChainAlgorithm>& a : algorithms.MakeAlgorithms()) {
    algos.push_back(a.get());
    owned.push_back(std::move(a));
  }
  AlgorithmChain chain(std::move(owned));
  PipelineOptions po;
  po.propagation = algorithms.propagation();
  po.reuse_attention = algorithms.ReuseAttention();
  po.progress = progress;
  po.cancel = cancel;
  po.on_stage = on_stage;
  if (checkpoint != nullptr) {
    if (checkpoint->start_layer > 0) {
      const nlohmann::ordered_json& st = checkpoint->state;
      if (!st.contains("algorithms") || st["algorithms"].size() != algos.size() || !st.contains("layers"))
        return MakeErrorCode(ErrorCode::kCorruptInput, "the saved calibrated state does not match the chain ", algorithms.Name());
      for (size_t i = 0; i < algos.size(); ++i)
        NIBBLE_RETURN_IF_ERROR(algos[i]->LoadState(st["algorithms"][i]));
      NIBBLE_ASSIGN_OR_RETURN(po.start_reports, LayerReportsFromJson(st["layers"]));
      po.start_layer = checkpoint->start_layer;
      po.start_input = std::move(checkpoint->input);
      po.start_input_dtype = checkpoint->input_dtype;
    }
    if (checkpoint->on_boundary)
      po.on_boundary = [&algos, checkpoint](int64_t layer, const std::vector<LayerReport>& reports,
                                            std::span<const uint8_t> x, const std::string& dtype) -> Status {
        nlohmann::ordered_json st;
        st["layers"] = LayerReportsJson(reports);
        st["algorithms"] = nlohmann::ordered_json::array();
        for (const ChainAlgorithm* a : algos) st["algorithms"].push_back(a->SaveState());
        return checkpoint->on_boundary(layer, st, x, dtype);
      };
  }
  po.calib_dtype = algorithms.calib_dtype;
  po.chunked = algorithms.ChunkedLayers(mc);
  NIBBLE_ASSIGN_OR_RETURN(PipelineResult pr, RunLayerPipeline(mc, store, plan, tokens, batch, seq_len, chain, po, sink));
  CalibResult res;
  res.seconds = pr.seconds;
  for (size_t l = 0; l < pr.layers.size(); ++l) {
    CalibLayerResult lr;
    lr.layer = pr.layers[l].layer;
    lr.linears = std::move(pr.layers[l].linears);
    lr.seconds = pr.layers[l].seconds;
    for (const ChainAlgorithm* a : algos) a->ReportLayer(l, lr);
    res.layers.push_back(std::move(lr));
  }
  res.messages = chain.Messages();
  for (const ChainAlgorithm* a : algos) a->ReportRun(res);
  return res;
}

}  // namespace nibble
