#!/usr/bin/env bash
# Installs the real ONNX Runtime the export tests (tests/e2e/onnx_export_test.cc) and
# bench/onnx_vs_nibble.sh run: onnxruntime-node into build/npm. Does nothing when it is there.
# Its install script would fetch GPU files, so it is skipped (the CPU runtime is in the package).
# Without npm, or when the install fails, it warns and exits 0: those tests then skip.
set -uo pipefail
cd "$(dirname "$0")/.."
version=1.30.0
[ -d build/npm/node_modules/onnxruntime-node ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
  echo "warning: npm not found; onnxruntime-node is not installed and the ONNX Runtime tests will be skipped" >&2
  exit 0
fi
mkdir -p build/npm
npm install --ignore-scripts --no-audit --no-fund --prefix build/npm "onnxruntime-node@$version" >/dev/null ||
  echo "warning: npm could not install onnxruntime-node; the ONNX Runtime tests will be skipped" >&2
exit 0
