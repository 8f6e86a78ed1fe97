// The compiled part of `import nibble` (nibble._nibble); python/nibble/__init__.py re-exports it.
#include "model.h"

PYBIND11_MODULE(_nibble, m) {
  m.doc() = "nibble: int4 quantization (RTN, AWQ, GPTQ) and CPU inference of Llama-family models";
  m.attr("__version__") = NIBBLE_VERSION;
  nibble_py::RegisterErrors(m);
  nibble_py::RegisterModel(m);
  nibble_py::RegisterSession(m);
  nibble_py::RegisterTools(m);
  nibble_py::RegisterCheckpoint(m);
}
