#!/usr/bin/env bash
# Builds nibble and runs the whole test suite (installs what it needs first):
#   1. include-layering check
#   2. release build + every test (CI: warnings are errors, preset `ci`)
#   3. AddressSanitizer + UndefinedBehaviorSanitizer build (clang, preset asan) + the unit and kernel
#      tests not labelled slow (no e2e)
#   4. fuzz targets, linked in the same build (its libraries are compiled once for both stages):
#      seed corpora as regression tests, then FUZZ_SECONDS (default 30) each
# NIBBLE_TEST_STAGES selects stages (default "release asan fuzz"); extra arguments go to the
# release-stage ctest (e.g. -R Quark).
set -euo pipefail
cd "$(dirname "$0")/.."
stages="${NIBBLE_TEST_STAGES:-release asan fuzz}"
jobs="$(nproc)"
# Prints how long the step since the previous call took: "== <what>: N s".
took() { echo "== $1: $((SECONDS - mark)) s"; mark=$SECONDS; }
bash scripts/setup.sh
bash scripts/check_includes.sh
bash scripts/install_node_packages.sh   # JavaScript references (ONNX Runtime, tokenizers, Jinja)
mark=$SECONDS
if [[ " $stages " == *" release "* ]]; then
  preset=release
  [ "${CI:-}" = "true" ] && preset=ci   # CI builds with -Werror
  echo "== release tests (preset $preset)"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  took "release build"
  # One test at a time: the model and e2e tests use every core themselves.
  # The slowest test runs about 23 min on a 2-core machine busy with other jobs.
  ctest --preset "$preset" -j 1 --timeout 1800 "$@"
  took "release tests"
fi
if [[ " $stages " == *" asan "* ]]; then
  echo "== ASan + UBSan: unit and kernel tests"
  cmake --preset asan >/dev/null
  # The test binaries the stage runs and the CLI some of them drive (e2e tests are not built).
  cmake --build --preset asan -j "$jobs" --target nibble test_base test_io test_formats test_kernels test_model \
    test_tokenizer test_quantize test_eval test_api
  took "asan build"
  # Tests labelled slow (minutes in release, far longer under ASan; CMakeLists.txt
  # NIBBLE_SLOW_TESTS) run in the release stage only; every other unit and kernel test runs here.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --preset asan -L 'unit|kernel' -LE slow -j "$jobs" --timeout 1800
  took "asan tests"
fi
if [[ " $stages " == *" fuzz "* ]]; then
  echo "== fuzz"
  FUZZ_SECONDS="${FUZZ_SECONDS:-30}" bash scripts/fuzz.sh
  took "fuzz"
fi
