// nibble.open_checkpoint: a checkpoint's linears as NumPy arrays (<nibble/checkpoint.h>), for
// checking a quantization: the dequantized weight and the int4 codes, scales, zero points, g_idx.
#include "model.h"

namespace nibble_py {

namespace {

using namespace pybind11::literals;

struct PyCheckpoint {
  std::unique_ptr<nibble::Checkpoint> ck;
};

std::shared_ptr<PyCheckpoint> Open(const std::string& path) {
  auto c = std::make_shared<PyCheckpoint>();
  c->ck = TakeOrThrow(RunCancellable<nibble::Result<std::unique_ptr<nibble::Checkpoint>>>(
      0, [&](const nibble::CancellationToken*) { return nibble::Checkpoint::Open(path); }));
  return c;
}

nibble::QuantizedWeight Quantized(const PyCheckpoint& c, const std::string& name) {
  return TakeOrThrow(RunCancellable<nibble::Result<nibble::QuantizedWeight>>(
      0, [&](const nibble::CancellationToken*) { return c.ck->Quantized(name); }));
}

py::ssize_t Groups(const nibble::QuantizedWeight& w) {
  return static_cast<py::ssize_t>(w.group_size > 0 ? w.in_features / w.group_size : 0);
}

}  // namespace

void RegisterCheckpoint(py::module_& m) {
  py::class_<PyCheckpoint, std::shared_ptr<PyCheckpoint>>(m, "Checkpoint", R"(A checkpoint's linears, read without loading the model.

w[n, k] = (codes[n, k] - zero_points[n, g]) * scales[n, g], g = g_idx[k] (or k // group_size);
codes and zero points are 0..15 (a symmetric int4 code q is q + 8, its zero points 8), whatever
format the checkpoint is stored in.)")
      .def_property_readonly("format", [](const PyCheckpoint& c) { return c.ck->format(); },
                             "\"dense\", \"quark\", \"compressed-tensors\", \"autoawq\" or \"gptq\".")
      .def_property_readonly("linears", [](const PyCheckpoint& c) {
        py::list out;
        for (const nibble::CheckpointLinear& l : c.ck->linears())
          out.append(py::dict("name"_a = l.name, "out_features"_a = l.out_features, "in_features"_a = l.in_features,
                              "quantized"_a = l.quantized, "scheme"_a = l.scheme));
        return out;
      }, "Every linear in model order: name, out_features, in_features, quantized, scheme.")
      .def("dequantize", [](const PyCheckpoint& c, const std::string& name) {
        std::vector<float> w = TakeOrThrow(RunCancellable<nibble::Result<std::vector<float>>>(
            0, [&](const nibble::CancellationToken*) { return c.ck->Dequantize(name); }));
        for (const nibble::CheckpointLinear& l : c.ck->linears())
          if (l.name == name) return ToNumpy(std::move(w), {static_cast<py::ssize_t>(l.out_features),
                                                             static_cast<py::ssize_t>(l.in_features)});
        ThrowError(nibble::MakeErrorCode(nibble::ErrorCode::kInternal, "dequantize: ", name, " vanished"));
      }, py::arg("name"), "float32 [out_features, in_features]: the weight as the model uses it.")
      .def("codes", [](const PyCheckpoint& c, const std::string& name) {
        nibble::QuantizedWeight w = Quantized(c, name);
        return ToNumpy(std::move(w.codes), {static_cast<py::ssize_t>(w.out_features), static_cast<py::ssize_t>(w.in_features)});
      }, py::arg("name"), "uint8 [out_features, in_features], 0..15.")
      .def("scales", [](const PyCheckpoint& c, const std::string& name) {
        nibble::QuantizedWeight w = Quantized(c, name);
        const py::ssize_t g = Groups(w);
        return ToNumpy(std::move(w.scales), {static_cast<py::ssize_t>(w.out_features), g});
      }, py::arg("name"), "float32 [out_features, groups].")
      .def("zero_points", [](const PyCheckpoint& c, const std::string& name) {
        nibble::QuantizedWeight w = Quantized(c, name);
        const py::ssize_t g = Groups(w);
        return ToNumpy(std::move(w.zero_points), {static_cast<py::ssize_t>(w.out_features), g});
      }, py::arg("name"), "uint8 [out_features, groups], 0..15 (all 8 when symmetric).")
      .def("g_idx", [](const PyCheckpoint& c, const std::string& name) -> py::object {
        nibble::QuantizedWeight w = Quantized(c, name);
        if (w.g_idx.empty()) return py::none();
        const auto k = static_cast<py::ssize_t>(w.g_idx.size());
        return ToNumpy(std::move(w.g_idx), {k});
      }, py::arg("name"), "int32 [in_features]: each column's group, or None for natural groups (k // group_size).")
      .def("quantization", [](const PyCheckpoint& c, const std::string& name) {
        nibble::QuantizedWeight w = Quantized(c, name);
        return py::dict("group_size"_a = w.group_size, "symmetric"_a = w.symmetric,
                        "out_features"_a = w.out_features, "in_features"_a = w.in_features);
      }, py::arg("name"), "group_size, symmetric, out_features, in_features of an int4 linear.")
      .def("__repr__", [](const PyCheckpoint& c) {
        return "<nibble.Checkpoint " + c.ck->format() + ", " + std::to_string(c.ck->linears().size()) + " linears>";
      });
  m.def("open_checkpoint", &Open, py::arg("path"),
        "Opens a checkpoint directory (any format nibble reads, dense included) for reading its linears.");
}

}  // namespace nibble_py
