// `nibble verify A B`: two checkpoints compared as the model sees them. Each linear is turned
// into its fp32 weight [N, K] (dequantized through the format's reader, or the float tensor of a
// dense one) and compared value by value; every other tensor (embeddings, norms, biases, float
// linears' siblings) is compared by dtype, shape and value. A lossless conversion is identical
// everywhere.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include <nibble/quantize.h>

#include "api/checkpoint_side.h"
#include "formats/checkpoint_format.h"
#include "formats/float_dtype.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/model_loader.h"
#include "model/weights.h"

namespace nibble {

namespace {

// Value-by-value comparison of two equally long fp32 arrays into `e`.
void CompareValues(const std::vector<float>& a, const std::vector<float>& b, VerifyEntry& e) {
  e.total = static_cast<int64_t>(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    ++e.differing;
    e.max_abs_diff = std::max(e.max_abs_diff, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  e.identical = e.differing == 0;
}

Result<VerifyEntry> CompareLinear(const CheckpointSide& a, const CheckpointSide& b, const std::string& module) {
  VerifyEntry e;
  e.name = module;
  e.linear = true;
  const auto shape_a = LinearShape(a.config, module), shape_b = LinearShape(b.config, module);
  if (shape_a != shape_b)
    return MakeError("linear ", module, " is [", shape_a.first, ", ", shape_a.second, "] in A and [", shape_b.first, ", ",
                     shape_b.second, "] in B (config.json): these are not the same model");
  NIBBLE_ASSIGN_OR_RETURN(std::vector<float> wa, LinearWeight(a, module, &e.a));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<float> wb, LinearWeight(b, module, &e.b));
  CompareValues(wa, wb, e);
  return e;
}

// A tensor outside the linears: identical when dtype, shape and bytes agree; a float tensor
// stored in two dtypes or differing in bytes is compared by value.
Result<VerifyEntry> CompareTensor(const TensorView* ta, const TensorView* tb, const std::string& name) {
  VerifyEntry e;
  e.name = name;
  auto how = [](const TensorView* t) {
    return t ? std::string(DTypeName(t->dtype)) + " " + t->ShapeString() : std::string("absent");
  };
  e.a = how(ta);
  e.b = how(tb);
  if (!ta || !tb || ta->shape != tb->shape) return e;
  if (ta->dtype == tb->dtype && ta->nbytes == tb->nbytes && std::memcmp(ta->data, tb->data, ta->nbytes) == 0) {
    e.identical = true;
    e.total = ta->numel();
    return e;
  }
  if (!IsFloatScaleDType(ta->dtype) || !IsFloatScaleDType(tb->dtype)) {
    e.total = e.differing = ta->numel();
    return e;
  }
  NIBBLE_ASSIGN_OR_RETURN(std::vector<float> va, TensorToF32(*ta));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<float> vb, TensorToF32(*tb));
  CompareValues(va, vb, e);
  e.identical = e.identical && ta->dtype == tb->dtype;
  return e;
}

}  // namespace

Result<VerifyReport> Verify(const VerifyRequest& r) {
  auto open = [](const std::string& dir, const char* which) -> Result<CheckpointSide> {
    Result<CheckpointSide> s = OpenCheckpointSide(dir);
    if (!s.ok()) return s.error().WithContext(which);
    return s;
  };
  NIBBLE_ASSIGN_OR_RETURN(CheckpointSide a, open(r.a_dir, "A"));
  NIBBLE_ASSIGN_OR_RETURN(CheckpointSide b, open(r.b_dir, "B"));
  VerifyReport rep;
  rep.a_format = a.format ? a.format->name() : "dense";
  rep.b_format = b.format ? b.format->name() : "dense";
  const std::set<std::string> b_linears(b.linears.begin(), b.linears.end());
  for (const std::string& m : a.linears) {
    if (!b_linears.count(m)) {
      rep.entries.push_back({m, true, false, 0, 0, 0, "stored", "absent"});
      continue;
    }
    NIBBLE_ASSIGN_OR_RETURN(VerifyEntry e, CompareLinear(a, b, m));
    rep.entries.push_back(std::move(e));
  }
  for (const std::string& m : b.linears)
    if (std::find(a.linears.begin(), a.linears.end(), m) == a.linears.end())
      rep.entries.push_back({m, true, false, 0, 0, 0, "absent", "stored"});
  std::set<std::string> names;
  for (const CheckpointSide* s : {&a, &b})
    for (const std::string& n : s->store.Names())
      if (!a.linear_tensors.count(n) && !b.linear_tensors.count(n)) names.insert(n);
  for (const std::string& n : names) {
    NIBBLE_ASSIGN_OR_RETURN(VerifyEntry e, CompareTensor(a.store.Find(n), b.store.Find(n), n));
    rep.entries.push_back(std::move(e));
  }
  return rep;
}

}  // namespace nibble
