#!/usr/bin/env bash
# Builds nibble with warnings as errors and runs the whole test suite (installs what it needs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/check_includes.sh
cmake --preset ci >/dev/null
cmake --build --preset ci -j "$(nproc)"
# Tests run one at a time: the e2e and model tests use every core themselves.
ctest --preset ci -j 1 --timeout 900 "$@"
