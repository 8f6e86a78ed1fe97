// The neutral engines report: its summary lines and vLLM's tensor-parallel readiness rule.
#include "formats/engines.h"

#include <map>

namespace nibble {

namespace {

bool EndsWith(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

std::string EngineSpecText(const std::optional<QuantSpec>& s, int64_t k) {
  if (!s) return "float";
  QuantSpec e = *s;
  if (e.granularity == Granularity::kPerGroup && e.group_size > k) e.group_size = k;  // one group
  return DescribeSpec(e);
}

EngineReading EngineCell(const EngineRead& got, const std::optional<QuantSpec>& meant, int64_t k,
                         const std::string& tied_avoid) {
  EngineReading r;
  r.text = got.fails.empty() ? EngineSpecText(got.spec, k) : "fails to load";
  r.agrees = got.fails.empty() && got.why.empty() && SameEngineSpec(got.spec, meant, k);
  if (!r.agrees) {
    r.why = !got.fails.empty() ? got.fails : !got.why.empty() ? got.why : "tie_word_embeddings is true: runs the embedding";
    r.avoid = got.avoid.empty() ? tied_avoid : got.avoid;
  }
  return r;
}

std::vector<std::string> FusedShards(const std::string& name, std::string* fused) {
  const size_t dot = name.rfind('.');
  const std::string prefix = name.substr(0, dot + 1), leaf = name.substr(dot + 1);
  if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj") {
    *fused = prefix + "qkv_proj";
    return {prefix + "q_proj", prefix + "k_proj", prefix + "v_proj"};
  }
  if (leaf == "gate_proj" || leaf == "up_proj") {
    *fused = prefix + "gate_up_proj";
    return {prefix + "gate_proj", prefix + "up_proj"};
  }
  return {};
}

bool SameEngineSpec(const std::optional<QuantSpec>& a, const std::optional<QuantSpec>& b, int64_t k) {
  if (!a || !b) return !a && !b;
  return a->symmetric == b->symmetric && a->granularity == b->granularity &&
         a->EffectiveGroupSize(k) == b->EffectiveGroupSize(k);
}

namespace {

// An engine that fails to load every linear does not read the checkpoint at all (ORT GenAI and
// compressed-tensors): that is one statement about the format, not a misreading of each linear.
bool ReadsNothing(const EnginesReport& r, size_t e) {
  if (r.linears.empty()) return false;
  for (const auto& l : r.linears)
    if (l.readings[e].agrees || l.readings[e].text != "fails to load") return false;
  return true;
}

}  // namespace

std::vector<std::string> EngineNotReadingLines(const EnginesReport& r) {
  std::vector<std::string> out;
  for (size_t e = 1; e < r.engines.size(); ++e)
    if (ReadsNothing(r, e))
      out.push_back(r.engines[e] + " does not read this checkpoint: " + r.linears[0].readings[e].why + "; instead: " +
                    r.linears[0].readings[e].avoid);
  return out;
}

std::vector<std::string> EngineDisagreementLines(const EnginesReport& r) {
  struct Group {
    int64_t count = 0;
    std::string first, avoid;
  };
  std::map<std::pair<std::string, std::string>, Group> groups;
  std::vector<std::pair<std::string, std::string>> order;
  for (const auto& l : r.linears)
    for (size_t e = 0; e < l.readings.size(); ++e) {
      const EngineReading& x = l.readings[e];
      if (x.agrees || ReadsNothing(r, e)) continue;
      const auto key = std::make_pair(r.engines[e], x.why);
      Group& g = groups[key];
      if (g.count++ == 0) {
        order.push_back(key);
        g.first = l.shape.name + " (" + x.text + ", the file means " + l.meant + ")";
        g.avoid = x.avoid;
      }
    }
  std::vector<std::string> out;
  for (const auto& key : order) {
    const Group& g = groups[key];
    out.push_back(key.first + " misreads " + std::to_string(g.count) + (g.count == 1 ? " linear" : " linears") + ", e.g. " +
                  g.first + ": " + key.second + "; avoid: " + g.avoid);
  }
  return out;
}

Result<std::string> TensorParallelFailure(const SpecResolver& resolve, const std::vector<LinearShapeInfo>& linears, int tp) {
  for (const LinearShapeInfo& l : linears) {
    NIBBLE_ASSIGN_OR_RETURN(std::optional<QuantSpec> spec, resolve(l.name));
    if (!spec) continue;
    const std::string at = l.name + " (N = " + std::to_string(l.n) + ", K = " + std::to_string(l.k) + "): ";
    if (EndsWith(l.name, "o_proj") || EndsWith(l.name, "down_proj")) {  // row-parallel: K is split
      const int64_t g = spec->EffectiveGroupSize(l.k);
      if (l.k % tp != 0) return at + "K is not divisible by " + std::to_string(tp);
      if ((l.k / tp) % g != 0)
        return at + "input_size_per_partition " + std::to_string(l.k / tp) + " is not a multiple of group_size " +
               std::to_string(g) + " (vLLM: the input size is not aligned with the quantized weight shape)";
    } else if (tp > 1) {  // column-parallel: N is split; one shard pads its last word only at TP 1
      if (l.n % tp != 0 || (l.n / tp) % 8 != 0)
        return at + "output_size_per_partition " + std::to_string(l.n) + "/" + std::to_string(tp) +
               " is not a whole multiple of 8 (the packed int32 words)";
    }
  }
  return std::string();
}

Status CheckTensorParallel(const SpecResolver& resolve, const std::vector<LinearShapeInfo>& linears, int tp) {
  if (tp < 1) return MakeError("--tp ", tp, " must be at least 1");
  NIBBLE_ASSIGN_OR_RETURN(std::string failure, TensorParallelFailure(resolve, linears, tp));
  if (failure.empty()) return Status::Ok();
  std::string working;
  for (int t : {1, 2, 4, 8}) {
    NIBBLE_ASSIGN_OR_RETURN(std::string f, TensorParallelFailure(resolve, linears, t));
    if (f.empty()) working += (working.empty() ? "" : ", ") + std::to_string(t);
  }
  return MakeError("--tp ", tp, ": ", failure, "; tensor-parallel sizes that work: ",
                   working.empty() ? std::string("none of 1, 2, 4, 8") : working);
}

Result<std::vector<EnginesReport::Tp>> TensorParallelTable(const SpecResolver& resolve,
                                                           const std::vector<LinearShapeInfo>& linears) {
  std::vector<EnginesReport::Tp> out;
  for (int tp : {1, 2, 4, 8}) {
    NIBBLE_ASSIGN_OR_RETURN(std::string f, TensorParallelFailure(resolve, linears, tp));
    out.push_back({tp, f.empty(), f});
  }
  return out;
}

}  // namespace nibble
