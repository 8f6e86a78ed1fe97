// Public API: a checkpoint's linears read as `verify` reads them (api/checkpoint_side.h).
#include <nibble/checkpoint.h>

#include <algorithm>

#include "api/checkpoint_side.h"
#include "model/llama.h"

namespace nibble {

struct Checkpoint::Impl {
  CheckpointSide side;
  std::string format;
  std::vector<CheckpointLinear> linears;
};

Checkpoint::Checkpoint() : impl_(std::make_unique<Impl>()) {}
Checkpoint::~Checkpoint() = default;

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  Result<CheckpointSide> side = OpenCheckpointSide(dir);
  if (!side.ok()) return side.error().WithContext("opening checkpoint " + dir);
  c->impl_->side = std::move(side).value();
  const CheckpointSide& s = c->impl_->side;
  c->impl_->format = s.format ? s.format->name() : "dense";
  for (const std::string& m : s.linears) {
    CheckpointLinear l;
    l.name = m;
    std::tie(l.out_features, l.in_features) = LinearShape(s.config, m);
    NIBBLE_ASSIGN_OR_RETURN(std::optional<Int4Matrix> q, LinearInt4(s, m));
    l.quantized = q.has_value();
    if (q) {
      NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, s.format->Resolve(m));
      l.scheme = DescribeSpec(*plan.spec) + (q->g_idx.empty() ? "" : " g_idx");
    } else {
      NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, FloatLinearTensor(s, m, &l.scheme));
      (void)t;
    }
    c->impl_->linears.push_back(std::move(l));
  }
  return c;
}

const std::string& Checkpoint::format() const { return impl_->format; }
const std::vector<CheckpointLinear>& Checkpoint::linears() const { return impl_->linears; }

namespace {

Status CheckName(const std::vector<CheckpointLinear>& linears, const std::string& name) {
  if (std::any_of(linears.begin(), linears.end(), [&](const CheckpointLinear& l) { return l.name == name; }))
    return Status::Ok();
  return MakeErrorCode(ErrorCode::kNotFound, "no linear named \"", name, "\" (", linears.size(),
                       " linears, e.g. \"", linears.empty() ? "" : linears.front().name, "\")");
}

}  // namespace

Result<std::vector<float>> Checkpoint::Dequantize(const std::string& name) const {
  NIBBLE_RETURN_IF_ERROR(CheckName(impl_->linears, name));
  std::string how;
  return LinearWeight(impl_->side, name, &how);
}

Result<QuantizedWeight> Checkpoint::Quantized(const std::string& name) const {
  NIBBLE_RETURN_IF_ERROR(CheckName(impl_->linears, name));
  NIBBLE_ASSIGN_OR_RETURN(std::optional<Int4Matrix> q, LinearInt4(impl_->side, name));
  if (!q) return MakeError(name, " is stored in float (", impl_->format, "): it has no codes, scales or zero points");
  QuantizedWeight w;
  w.out_features = q->n;
  w.in_features = q->k;
  w.group_size = q->group_size;
  w.symmetric = q->symmetric;
  w.codes = std::move(q->codes);
  w.scales = std::move(q->scales);
  w.zero_points = std::move(q->zero_points);
  w.g_idx = std::move(q->g_idx);
  return w;
}

}  // namespace nibble
