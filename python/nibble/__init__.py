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
