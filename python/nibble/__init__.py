"""nibble: int4 quantization (RTN, AWQ, GPTQ) and CPU inference of Llama-family models.

    import nibble
    m = nibble.Model("models/prose-llama-7m")
    print(m.generate("Once upon a time", max_new_tokens=32, temperature=0))
    report = nibble.quantize("models/prose-llama-7m", "/tmp/q", quant_algo="rtn")

See docs/PYTHON.md for the whole API, its errors and its threading rules.
"""

import os as _os

# Waiting OpenMP threads spin briefly, then sleep, as the nibble CLI sets them (libgomp reads this
# when it is loaded, with the extension below); the user's own setting wins.
if "OMP_WAIT_POLICY" not in _os.environ:
    _os.environ.setdefault("GOMP_SPINCOUNT", "10000")


def _import_failure(what, error):
    """An ImportError that says which interpreter failed and what to do, not just a module name."""
    import glob
    import sys

    here = _os.path.dirname(_os.path.abspath(__file__))
    built = sorted(_os.path.basename(p) for p in glob.glob(_os.path.join(here, "_nibble*.so")))
    reason = f" ({error})" if what == "numpy" or built else ""
    if what == "numpy":
        hint = ("nibble returns NumPy arrays, and this interpreter has no NumPy: run the one the binding was "
                "built for (CMake's Python3_EXECUTABLE; Debian's /usr/bin/python3 when the python3 on PATH "
                "has no NumPy), or install numpy")
    elif built:
        hint = (f"{here} holds {', '.join(built)}, built for another Python or missing a library: run the "
                f"interpreter it was built for, or rebuild with -DPython3_EXECUTABLE={sys.executable}")
    else:
        hint = (f"{here} has no compiled module: build it with `cmake --build --preset release --target "
                "nibble_python` (CMake prints `Python binding: ...` or why it is off)")
    return ImportError(f"nibble: {sys.executable} (Python {sys.version.split()[0]}) cannot import {what}{reason}; "
                       f"{hint}. See docs/PYTHON.md.")


try:
    from . import _nibble  # noqa: E402
except ImportError as _e:
    raise _import_failure("nibble._nibble", _e) from None
try:
    import numpy as _numpy  # noqa: E402,F401  (the binding imports it at the first array)
except ImportError as _e:
    raise _import_failure("numpy", _e) from None

from ._nibble import (  # noqa: E402
    Cancelled,
    Checkpoint,
    CorruptInput,
    Error,
    InternalError,
    InvalidArgument,
    InvalidInput,
    IoError,
    Model,
    NotFound,
    ResourceExhausted,
    Session,
    TokenStream,
    Unsupported,
    __version__,
    convert,
    inspect,
    open_checkpoint,
    quantize,
    verify,
)
from ._nibble import _export_onnx_program, _shutdown  # noqa: E402

import atexit as _atexit  # noqa: E402

# Calls still running at exit (daemon threads, unfinished streams) are cancelled and waited for
# before the interpreter and the libraries they run in tear down.
_atexit.register(_shutdown)


def export_onnx(model_dir, output_dir, accuracy_level=4, io_dtype="fp32", overwrite=False):
    """Writes the ONNX Runtime GenAI model of a quantized checkpoint (`nibble export-onnx`).

    Runs the nibble-export-onnx program (ONNX's protobuf runtime cannot share a process with the
    tokenizer's): a copy beside this module (pip install, cmake --install), else the one it was
    built with, else the one on PATH. Raises nibble.Error with the program's message on failure;
    KeyboardInterrupt stops it with nothing written.
    """
    import shutil
    import subprocess

    beside = _os.path.join(_os.path.dirname(__file__), "nibble-export-onnx")
    program = next((p for p in (beside, _export_onnx_program) if _os.path.exists(p)), None)
    program = program or shutil.which("nibble-export-onnx")
    if program is None:
        raise NotFound("nibble-export-onnx not found (built with nibble, installed beside it)")
    cmd = [program, "--model", str(model_dir), "--out", str(output_dir),
           "--accuracy_level", str(accuracy_level), "--io_dtype", io_dtype]
    if overwrite:
        cmd.append("--overwrite")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        message = proc.stderr.strip().splitlines()
        text = message[-1] if message else f"nibble-export-onnx exited with {proc.returncode}"
        text = text.removeprefix("nibble: error: ").removeprefix("nibble: ")
        raise (InvalidArgument if proc.returncode == 2 else Error)(text)
    return {"output_dir": str(output_dir), "log": proc.stderr}


__all__ = [
    "Cancelled", "Checkpoint", "CorruptInput", "Error", "InternalError", "InvalidArgument", "InvalidInput", "IoError",
    "Model", "NotFound", "ResourceExhausted", "Session", "TokenStream", "Unsupported", "__version__",
    "convert", "export_onnx", "inspect", "open_checkpoint", "quantize", "verify",
]
