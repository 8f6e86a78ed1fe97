#!/usr/bin/env bash
# Prefill tokens/s of nibble vs. an fp32 PyTorch Llama forward; see bench/prefill_vs_torch.py.
# Usage: bench/prefill_vs_torch.sh [--model DIR] [--tokens 512] [--threads 1 2] [--reps 7]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# Debian's python3-torch lives in the system interpreter; a pyenv/venv python3 first on PATH lacks it.
py="${PYTHON:-/usr/bin/python3}"
[ -x "$py" ] || py=python3
nibble="$here/../build/release/nibble"
if [ ! -x "$nibble" ]; then
  (cd "$here/.." && cmake --build --preset release)
fi
exec "$py" "$here/prefill_vs_torch.py" "$@"
