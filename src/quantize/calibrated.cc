#include "quantize/calibrated.h"

#include <memory>

namespace nibble {

Result<CalibResult> RunCalibrated(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                                  const AlgorithmPlan& algorithms, const std::vector<int32_t>& tokens, int64_t batch,
                                  int64_t seq_len, const LayerTensorSink& sink,
                                  const std::function<void(int64_t, int64_t)>& progress,
                                  const CancellationToken* cancel) {
  // The chain owns the algorithms; these pointers read their reports afterwards.
  std::vector<std::unique_ptr<LayerAlgorithm>> owned;
  std::vector<const ChainAlgorithm*> algos;
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
  po.calib_dtype = algorithms.calib_dtype;
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
