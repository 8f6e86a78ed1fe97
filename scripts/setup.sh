#!/usr/bin/env bash
# Installs nibble's build and test dependencies from Debian packages (idempotent).
set -euo pipefail
# libpcre2-dev, libutf8proc-dev: tokenizer.json regexes and NFC normalization.
# libcpp-httplib-dev: the HTTP server of `nibble serve`.
# python3: tests/reference/dequantize.py, the standard-library reference loader the e2e tests run.
# pybind11-dev python3-dev python3-numpy python3-pytest: the Python binding (python/) and its tests.
# ocl-icd-opencl-dev: Debian's libdnnl-dev is built with the OpenCL GPU runtime, so its CMake
# package looks for OpenCL and fails without it; apt only recommends it, and recommends are off.
pkgs=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libsentencepiece-dev
      libcli11-dev libdnnl-dev ocl-icd-opencl-dev libgtest-dev libgmock-dev libssl-dev
      clang libclang-rt-14-dev libcairo2-dev libre2-dev liblapacke-dev libopenblas0-serial
      libonnx-dev libprotobuf-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev python3
      pybind11-dev python3-dev python3-numpy python3-pytest)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
