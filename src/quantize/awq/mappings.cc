#include "quantize/awq/mappings.h"

#include <algorithm>

#include "model/llama.h"

namespace nibble {

namespace {

int SlotOf(const std::string& rel) {
  const auto& names = DecoderLinearNames();
  for (int i = 0; i < kNumLinears; ++i)
    if (names[i] == rel) return i;
  return -1;
}

// prev_op → (kind, linear slot, the input it feeds), or an error.
Status ResolvePrevOp(const AwqMapping& m, const std::string& what, ResolvedMapping& r, LayerInput* feeds) {
  if (m.prev_op == "input_layernorm") {
    r.prev_op = AwqPrevOp::kInputLayernorm;
    *feeds = LayerInput::kAttnIn;
  } else if (m.prev_op == "post_attention_layernorm") {
    r.prev_op = AwqPrevOp::kPostAttentionLayernorm;
    *feeds = LayerInput::kMlpIn;
  } else if (m.prev_op == "self_attn.v_proj" || m.prev_op == "mlp.up_proj") {
    r.prev_op = AwqPrevOp::kLinear;
    r.prev_linear = m.prev_op == "self_attn.v_proj" ? kV : kUp;
    *feeds = m.prev_op == "self_attn.v_proj" ? LayerInput::kAttnConcat : LayerInput::kMlpAct;
  } else {
    return MakeErrorCode(ErrorCode::kUnsupported, what, ": prev_op \"", m.prev_op, "\" is not supported (input_layernorm, post_attention_layernorm, "
                     "self_attn.v_proj, mlp.up_proj: the ops whose output feeds projections linearly)");
  }
  return Status::Ok();
}

Status ResolveInspect(const AwqMapping& m, const std::string& what, ResolvedMapping& r) {
  const bool attn = r.src == LayerInput::kAttnIn || r.src == LayerInput::kAttnConcat;
  if (m.module2inspect.empty()) {
    if (r.balance.size() == 1) {
      r.inspect = AwqInspect::kLinear;
      r.inspect_linear = r.balance[0];
    } else {
      r.inspect = attn ? AwqInspect::kSelfAttn : AwqInspect::kMlp;
    }
  } else if (m.module2inspect == "self_attn" || m.module2inspect == "mlp") {
    if ((m.module2inspect == "self_attn") != attn)
      return MakeError(what, ": module2inspect \"", m.module2inspect, "\" does not contain the balance layers");
    r.inspect = attn ? AwqInspect::kSelfAttn : AwqInspect::kMlp;
  } else if (r.balance.size() == 1 && m.module2inspect == m.layers[0]) {
    r.inspect = AwqInspect::kLinear;
    r.inspect_linear = r.balance[0];
  } else {
    return MakeErrorCode(ErrorCode::kUnsupported, what, ": module2inspect \"", m.module2inspect, "\" is not supported (self_attn, mlp, or the single layer)");
  }
  return Status::Ok();
}

}  // namespace

std::string Describe(const AwqMapping& m) {
  std::string s = m.prev_op + " -> ";
  for (size_t i = 0; i < m.layers.size(); ++i) s += (i ? "/" : "") + m.layers[i];
  return s;
}

Result<ResolvedMapping> ResolveMapping(const AwqMapping& m) {
  ResolvedMapping r;
  r.mapping = m;
  const std::string what = "AWQ scaling_layers entry " + Describe(m);
  if (m.layers.empty()) return MakeError(what, ": \"layers\" is empty");
  for (const auto& l : m.layers) {
    const int i = SlotOf(l);
    if (i < 0) return MakeError(what, ": unknown layer \"", l, "\" (expected self_attn.{q,k,v,o}_proj or mlp.{gate,up,down}_proj)");
    if (!r.balance.empty() && InputOf(i) != InputOf(r.balance[0]))
      return MakeError(what, ": layers ", m.layers[0], " and ", l, " do not take the same input");
    r.balance.push_back(i);
  }
  r.src = InputOf(r.balance[0]);
  if (!m.inp.empty()) {
    const int i = SlotOf(m.inp);
    if (i < 0 || InputOf(i) != r.src) return MakeError(what, ": inp \"", m.inp, "\" does not take the balance layers' input");
  }
  LayerInput feeds;
  NIBBLE_RETURN_IF_ERROR(ResolvePrevOp(m, what, r, &feeds));
  if (feeds != r.src) return MakeError(what, ": prev_op ", m.prev_op, " does not feed ", m.layers[0]);
  NIBBLE_RETURN_IF_ERROR(ResolveInspect(m, what, r));
  return r;
}

bool ChangesAttention(const ResolvedMapping& r) {
  auto attn = [](int i) { return i == kQ || i == kK || i == kV || i == kO; };
  if (r.prev_op == AwqPrevOp::kInputLayernorm || (r.prev_op == AwqPrevOp::kLinear && attn(r.prev_linear))) return true;
  return std::any_of(r.balance.begin(), r.balance.end(), attn);
}

std::vector<int> RescaledLinears(const ResolvedMapping& r) {
  std::vector<int> out = r.balance;
  if (r.prev_op == AwqPrevOp::kLinear) out.push_back(r.prev_linear);
  return out;
}

LayerStop SearchStop(const ResolvedMapping& r) {
  const LayerStop s = StopFor(r.src);
  return r.inspect == AwqInspect::kMlp ? std::max(s, LayerStop::kMlpIn) : s;
}

}  // namespace nibble
