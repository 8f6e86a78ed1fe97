#include "quantize/calibrated.h"

#include <memory>

#include "quantize/awq/awq.h"
#include "quantize/gptq/gptq.h"

namespace nibble {

Result<CalibResult> RunCalibrated(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                                  const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len,
                                  const std::optional<AwqSettings>& awq, const std::optional<GptqSettings>& gptq,
                                  Propagation propagation, const LayerTensorSink& sink,
                                  const std::function<void(int64_t, int64_t)>& progress,
                                  const CancellationToken* cancel) {
  // The chain owns the algorithms; these pointers read their per-layer reports afterwards.
  std::vector<std::unique_ptr<LayerAlgorithm>> algos;
  const AwqAlgorithm* awq_algo = nullptr;
  const GptqAlgorithm* gptq_algo = nullptr;
  if (awq) {
    NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<AwqAlgorithm> a, AwqAlgorithm::Create(*awq));
    awq_algo = a.get();
    algos.push_back(std::move(a));
  }
  if (gptq) {
    NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<GptqAlgorithm> g, GptqAlgorithm::Create(*gptq));
    gptq_algo = g.get();
    algos.push_back(std::move(g));
  }
  AlgorithmChain chain(std::move(algos));
  PipelineOptions po;
  po.propagation = propagation;
  po.reuse_attention = awq ? awq->reuse_attention : true;
  po.progress = progress;
  po.cancel = cancel;
  NIBBLE_ASSIGN_OR_RETURN(PipelineResult pr, RunLayerPipeline(mc, store, plan, tokens, batch, seq_len, chain, po, sink));
  CalibResult res;
  res.seconds = pr.seconds;
  for (size_t l = 0; l < pr.layers.size(); ++l) {
    CalibLayerResult lr;
    lr.layer = pr.layers[l].layer;
    if (awq_algo) lr.mappings = awq_algo->mapping_reports()[l];
    lr.linears = std::move(pr.layers[l].linears);
    if (gptq_algo) lr.gptq = gptq_algo->infos()[l];
    lr.seconds = pr.layers[l].seconds;
    res.layers.push_back(std::move(lr));
  }
  res.messages = chain.Messages();
  if (awq_algo) res.awq_used = awq_algo->Used();
  if (gptq_algo) res.hessian_peak_bytes = gptq_algo->hessian_peak_bytes();
  return res;
}

}  // namespace nibble
