#!/usr/bin/env bash
# Static throughput analysis of the int4 decode kernels' hot loops with llvm-mca, for CPUs this
# machine may not be: Sapphire Rapids, Zen 4, Skylake-SP (cascadelake for VNNI), Haswell.
#
#   bash bench/mca.sh [BUILD_DIR] [OUT_DIR]      (defaults: build/release, build/mca)
#
# 1. Compiles each kernel translation unit to assembly (-S) with exactly the flags of BUILD_DIR's
#    compile_commands.json (the release build's code, nothing added to the sources).
# 2. bench/mca_loops.py finds each kernel's hot loop (by function and instruction counts) and
#    writes it as an LLVM-MCA-BEGIN/END region, OUT_DIR/<kernel>.s.
# 3. Runs llvm-mca -mcpu=CPU on each region for the CPUs whose ISA has the kernel's instructions
#    (OUT_DIR/<kernel>.<cpu>.txt, with the bottleneck analysis), and prints the table of cycles
#    per 64 weights and the busiest resources (OUT_DIR/table.md).
#
# Needs llvm-mca from LLVM 17 or newer (Sapphire Rapids and Zen 4 scheduling models; LLVM 14's
# has neither): Debian 12 `apt-get install -y llvm-19`. MCA=/path/to/llvm-mca overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
out=${2:-build/mca}
[[ -f $build/compile_commands.json ]] || { echo "mca.sh: $build/compile_commands.json not found (configure first: cmake --preset release)" >&2; exit 2; }

mca=${MCA:-}
if [[ -z $mca ]]; then
  for v in 21 20 19 18 17; do
    if command -v "llvm-mca-$v" >/dev/null; then mca=llvm-mca-$v; break; fi
  done
fi
[[ -n $mca ]] || { echo "mca.sh: no llvm-mca >= 17 found (Debian 12: apt-get install -y llvm-19; or MCA=...)" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out/asm"
# The kernel TUs' compile commands, rewritten to write assembly into $out/asm/<TU name>.s.
python3 - "$build" "$out/asm" <<'EOF'
import json, os, shlex, subprocess, sys
build, asm = sys.argv[1], os.path.abspath(sys.argv[2])
tus = {"x86_avx512/int4_gemm_avx512.cc", "x86_avx2/int4_gemm_avx2.cc", "x86_avx2/int4_gemm_i8_avx2.cc",
       "x86_avx512vnni/int4_gemm_i8_vnni.cc", "x86_avx512bf16/int4_gemm_bf16.cc"}
done = set()
for e in json.load(open(os.path.join(build, "compile_commands.json"))):
    tu = next((t for t in tus if e["file"].endswith("/src/kernels/" + t)), None)
    if tu is None or tu in done:
        continue
    args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
    o = args.index("-o")
    args[o + 1] = os.path.join(asm, os.path.basename(tu)[:-len(".cc")] + ".s")
    args = [a for a in args if a != "-c"]
    args.insert(1, "-S")
    subprocess.run(args, cwd=e["directory"], check=True)
    done.add(tu)
missing = tus - done
if missing:
    sys.exit("mca.sh: no compile command for " + ", ".join(sorted(missing)))
EOF

python3 bench/mca_loops.py extract "$out/asm" "$out" || echo "mca.sh: some loops were not found (above); the table leaves them out" >&2
for s in "$out"/*.s; do
  k=${s%.s}
  for cpu in $(cat "$k.cpus"); do
    "$mca" -mtriple=x86_64-unknown-linux-gnu -mcpu="$cpu" -iterations=200 -bottleneck-analysis "$s" >"$k.$cpu.txt" 2>&1 ||
      echo "mca.sh: llvm-mca failed on $(basename "$k") for $cpu (see $k.$cpu.txt)" >&2
  done
done
{
  echo "llvm-mca: $("$mca" --version | sed -n 's/.*LLVM version //p' | head -1); compiler: $(c++ --version | head -1); commit $(git rev-parse --short HEAD)"
  echo
  python3 bench/mca_loops.py report "$out"
} | tee "$out/table.md"
