#!/usr/bin/env python3
"""Finds the hot loops of the int4 decode kernels in GCC's assembly and writes them as llvm-mca
regions; then reads llvm-mca's reports back into one table. Driven by bench/mca.sh.

  mca_loops.py extract ASM_DIR OUT_DIR   OUT_DIR/<kernel>.s: the loop as a marked region
                                          (LLVM-MCA-BEGIN/END), and OUT_DIR/<kernel>.cpus
  mca_loops.py report  OUT_DIR           the table from OUT_DIR/<kernel>.<cpu>.txt

A kernel's loop is found by content, not by line numbers: the function (demangled name), then
among the cycles of its natural loops the shortest one whose counts of the kernel's
characteristic instructions are exactly those the source implies (e.g. 8 vpermps + 8 FMAs per
128-weight record). A cycle follows one path through the loop (asymmetric zero points, full
groups), so llvm-mca sees the instructions that path executes once per iteration. When the
compiler's code changes shape the kernel is reported as not found instead of guessed.
"""
import collections
import os
import re
import subprocess
import sys

# name, TU asm (the translation unit's file name without .cc), demangled function prefix (the decode loops in their prefetcht0
# instance: the same instructions as the prefetchnta one but the hint), weights of W per unit of work,
# activation rows, exact instruction counts of the hot path ('fma' = all vfmadd*, scalar too), CPUs
# (llvm-mca -mcpu) whose ISA has every instruction, and what one unit is. `parts`: (counts, times)
# for each path of the loop that one unit runs, e.g. 7 plain runs + 1 run with a group's broadcasts.
SPR, ZN4, SKX, CLX, HSW = "sapphirerapids", "znver4", "skylake-avx512", "cascadelake", "haswell"
KERNELS = [
    # W4A32, fp32 activations, AVX-512 (x86_avx512/int4_gemm_avx512.cc)
    ("fp32 GemvRow128 g128 M=1", "int4_gemm_avx512", "void nibble::(anonymous namespace)::GemvRow128<0, (nibble::StreamPrefetch)1>", 128, 1,
     [({"vpermps": 8, "fma": 8, "vpsrld": 7, "movzbl": 1}, 1)], [SPR, ZN4, SKX], "one 128-weight record"),
    ("fp32 GemvRow128 g32 M=1", "int4_gemm_avx512", "void nibble::(anonymous namespace)::GemvRow128<2, (nibble::StreamPrefetch)1>", 128, 1,
     [({"vpermps": 8, "fma": 8, "vpsrld": 7, "movzbl": 4}, 1)], [SPR, ZN4, SKX], "one record, 4 groups"),
    ("fp32 Tile128<1,8> g128 M=1 K>8192", "int4_gemm_avx512", "void nibble::(anonymous namespace)::Tile128<1, 8, 0>", 1024,
     1, [({"vpermps": 64, "fma": 64, "movzbl": 8}, 1)], [SPR, ZN4, SKX], "one record of 8 rows"),
    ("fp32 Tile128<2,4> g128 M=2", "int4_gemm_avx512", "void nibble::(anonymous namespace)::Tile128<2, 4, 0>", 512, 2,
     [({"vpermps": 32, "fma": 64, "movzbl": 4}, 1)], [SPR, ZN4, SKX], "one record of 4 rows"),
    ("fp32 Tile128<4,4> g128 M=4", "int4_gemm_avx512", "void nibble::(anonymous namespace)::Tile128<4, 4, 0>", 512, 4,
     [({"vpermps": 32, "fma": 128, "movzbl": 4}, 1)], [SPR, ZN4, SKX], "one record of 4 rows"),
    # W4A32, AVX2 (x86_avx2/int4_gemm_avx2.cc): the decode loop at g128 (per record 16 converts,
    # 14 shifts, 12 FMAs + 4 products + the scale's FMA + the zero point's scalar FMA; unrolled by
    # four records); the tiles' run
    # loop over 16 weights of one row, whose zero point and scale are broadcast at the first run of
    # each group (1 run in 4 at g64).
    ("fp32 avx2 DecodeRowG128 g128 M=1", "int4_gemm_avx2", "void nibble::GemmW4A32Avx2<(nibble::StreamPrefetch)1>", 512, 1,
     [({"fma": 56, "vcvtdq2ps": 64, "vpsrld": 56}, 1)], [SPR, ZN4, SKX, HSW], "4 records (unrolled)"),
    ("fp32 avx2 Tile<1,4> g64 M=1", "int4_gemm_avx2", "void nibble::(anonymous namespace)::Rows<1>", 64, 1,
     [({"fma": 2, "vcvtdq2ps": 2, "vpsrld": 2, "vpbroadcastd": 0}, 3),
      ({"fma": 2, "vcvtdq2ps": 2, "vpsrld": 2, "vpbroadcastd": 1, "movzbl": 1}, 1)],
     [SPR, ZN4, SKX, HSW], "4 runs of 16 weights (3 + 1 with the group's broadcasts)"),
    ("fp32 avx2 Tile<2,4> g128 M=2", "int4_gemm_avx2", "void nibble::(anonymous namespace)::Tile<2, 4>", 128, 2,
     [({"fma": 4, "vcvtdq2ps": 2, "vpsrld": 2, "vpbroadcastd": 0}, 7),
      ({"fma": 4, "vcvtdq2ps": 2, "vpsrld": 2, "vpbroadcastd": 1, "movzbl": 1}, 1)],
     [SPR, ZN4, SKX, HSW], "8 runs of 16 weights (7 + 1 with the group's broadcasts)"),
    # W4A8, int8 activations, AVX-512 VNNI (x86_avx512vnni/int4_gemm_i8_vnni.cc)
    ("int8 RowsG128<1> g128 M=1", "int4_gemm_i8_vnni", "void nibble::(anonymous namespace)::RowsG128<1, false, (nibble::StreamPrefetch)1>", 512, 1,
     [({"vpdpbusd": 8, "fma": 4, "vcvtdq2ps": 4}, 1)], [SPR, ZN4, CLX], "4 records (unrolled)"),
    ("int8 RowsG128<8> g128 M=1 long rows", "int4_gemm_i8_vnni", "void nibble::(anonymous namespace)::RowsG128<8, false, (nibble::StreamPrefetch)1>", 512, 1,
     [({"vpdpbusd": 8, "fma": 4, "vcvtdq2ps": 4}, 1)], [SPR, ZN4, CLX], "4 records of one row's chunk (unrolled)"),
    ("int8 Tile<4,1> g128 M=2..5", "int4_gemm_i8_vnni", "void nibble::(anonymous namespace)::Tile<4, 1, false>", 128, 4,
     [({"vpdpbusd": 8, "fma": 4, "vcvtdq2ps": 4}, 1)], [SPR, ZN4, CLX], "one superblock"),
    ("int8 LaneRows g128 M>=6", "int4_gemm_i8_vnni", "nibble::(anonymous namespace)::LaneRows", 2048, 2,
     [({"vpdpbusd": 32, "fma": 16, "vpmulld": 2}, 1), ({"vpdpbusd": 32, "fma": 16, "vpmulld": 0}, 1)],
     [SPR, ZN4, CLX], "one block of 16 rows: lanes 0-7 + 8-15 (chunk transpose not counted)"),
    # W4A8, AVX2 (x86_avx2/int4_gemm_i8_avx2.cc): per record 4 vpmaddubsw + 2 vpmaddwd, unrolled by four
    ("int8 avx2 RowG128 g128 M=1", "int4_gemm_i8_avx2", "void nibble::(anonymous namespace)::RowG128<false, (nibble::StreamPrefetch)1>", 512, 1,
     [({"vpmaddubsw": 16, "vpmaddwd": 8, "fma": 8, "vcvtdq2ps": 8}, 1)], [SPR, ZN4, SKX, HSW], "4 records (unrolled)"),
    ("int8 avx2 Tile<4,1> g128 M=2..5", "int4_gemm_i8_avx2", "void nibble::(anonymous namespace)::Tile<4, 1, false>", 128, 4,
     [({"vpmaddubsw": 16, "vpmaddwd": 8, "fma": 8, "vcvtdq2ps": 8}, 1)], [SPR, ZN4, SKX, HSW], "one superblock"),
    # bf16 activations, AVX-512 BF16 + VBMI (x86_avx512bf16/int4_gemm_bf16.cc)
    ("bf16 RowsG128<1> g128 M=1", "int4_gemm_bf16", "void nibble::(anonymous namespace)::RowsG128<1, false, (nibble::StreamPrefetch)1, (nibble::W4Bf16Unpack)0>", 512, 1,
     [({"vdpbf16ps": 16, "vpmultishiftqb": 16, "fma": 4}, 1)], [SPR, ZN4], "4 records (unrolled)"),
    ("bf16 RowsG128<1> shift g128 M=1", "int4_gemm_bf16", "void nibble::(anonymous namespace)::RowsG128<1, false, (nibble::StreamPrefetch)1, (nibble::W4Bf16Unpack)1>", 512, 1,
     [({"vdpbf16ps": 16, "vpsrld": 12, "fma": 4}, 1)], [SPR, ZN4], "4 records (unrolled), shift unpack"),
    ("bf16 RowsG128<8> g128 M=1 long rows", "int4_gemm_bf16", "void nibble::(anonymous namespace)::RowsG128<8, false, (nibble::StreamPrefetch)1, (nibble::W4Bf16Unpack)0>", 512, 1,
     [({"vdpbf16ps": 16, "vpmultishiftqb": 16, "fma": 4}, 1)], [SPR, ZN4], "4 records of one row's chunk (unrolled)"),
    ("bf16 Tile<1> g32 M=1", "int4_gemm_bf16", "void nibble::(anonymous namespace)::Tile<1, false, 1>", 128, 1,
     [({"vdpbf16ps": 4, "vpmultishiftqb": 4, "fma": 4}, 1)], [SPR, ZN4], "4 groups of 32"),
    ("bf16 Block<2,2> g128 M=2", "int4_gemm_bf16", "void nibble::(anonymous namespace)::Block<2, 2, false>", 256, 2,
     [({"vdpbf16ps": 16, "vpmultishiftqb": 8, "fma": 4}, 1)], [SPR, ZN4], "one group of 2 rows"),
    ("bf16 Block<2,4> g128 M=4", "int4_gemm_bf16", "void nibble::(anonymous namespace)::Block<2, 4, false>", 256, 4,
     [({"vdpbf16ps": 32, "vpmultishiftqb": 8, "fma": 8}, 1)], [SPR, ZN4], "one group of 2 rows"),
]


def parse_functions(lines):
    funcs, cur = [], None
    for i, l in enumerate(lines):
        m = re.match(r"\s*\.type\s+([\w.$]+),\s*@function", l)
        if m:
            cur = {"name": m.group(1), "start": i}
            continue
        m = re.match(r"\s*\.size\s+([\w.$]+),", l)
        if m and cur and m.group(1) == cur["name"]:
            cur["end"] = i
            funcs.append(cur)
            cur = None
    dem = subprocess.run(["c++filt"], input="\n".join(f["name"] for f in funcs), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    for f, d in zip(funcs, dem):
        f["dem"] = d
    return funcs


def basic_blocks(lines, f):
    """Blocks of instruction lines (directives and comments dropped) with their successors."""
    blocks, cur = [], {"label": None, "ins": []}

    def close():
        nonlocal cur
        if cur["ins"] or cur["label"]:
            blocks.append(cur)
        cur = {"label": None, "ins": []}

    for i in range(f["start"], f["end"]):
        m = re.match(r"(\.L\w+):", lines[i])
        if m:
            close()
            cur["label"] = m.group(1)
            continue
        s = lines[i].split("#")[0].strip()
        if not s or s.startswith(".") or s.endswith(":"):
            continue
        cur["ins"].append(s)
        if s.split()[0].startswith(("j", "ret")):
            close()
    close()
    index = {b["label"]: k for k, b in enumerate(blocks) if b["label"]}
    for k, b in enumerate(blocks):
        last = b["ins"][-1].split() if b["ins"] else [""]
        succ = []
        if last[0].startswith("ret"):
            pass
        elif last[0] == "jmp":
            succ = [index[last[1]]] if len(last) > 1 and last[1] in index else []
        else:
            if last[0].startswith("j") and len(last) > 1 and last[1] in index:
                succ.append(index[last[1]])
            if k + 1 < len(blocks):
                succ.append(k + 1)
        b["succ"] = succ
    return blocks


def loop_cycles(blocks, limit=4096):
    """Simple cycles through the header of each natural loop (back edge k -> h, h <= k)."""
    pred = collections.defaultdict(list)
    for k, b in enumerate(blocks):
        for s in b["succ"]:
            pred[s].append(k)
    seen, out = set(), []
    for k, b in enumerate(blocks):
        for h in b["succ"]:
            if h > k:
                continue
            body, stack = {h, k}, [k]
            while stack:
                n = stack.pop()
                for p in pred[n]:
                    if p not in body:
                        body.add(p)
                        stack.append(p)
            stack, found = [(h, [h])], 0
            while stack and found < limit:
                n, path = stack.pop()
                for s in blocks[n]["succ"]:
                    if s == h:
                        key = tuple(sorted(path))
                        found += 1
                        if key not in seen:
                            seen.add(key)
                            out.append(path)
                    elif s in body and s not in path:
                        stack.append((s, path + [s]))
    return out


def counts(ins):
    c = collections.Counter(i.split()[0] for i in ins)
    c["fma"] = sum(v for k, v in c.items() if k.startswith("vfmadd"))
    return c


def find(asm_dir, tu, func, want):
    path = os.path.join(asm_dir, tu + ".s")
    lines = open(path).read().split("\n")
    best = None
    for f in parse_functions(lines):
        if not f["dem"].startswith(func + "("):
            continue
        blocks = basic_blocks(lines, f)
        for cyc in loop_cycles(blocks):
            ins = [i for k in cyc for i in blocks[k]["ins"]]
            c = counts(ins)
            if all(c[k] == v for k, v in want.items()) and (best is None or len(ins) < len(best)):
                best = ins
    return best


def slug(name):
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def extract(asm_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    missing = 0
    for name, tu, func, _w, _m, parts, cpus, _what in KERNELS:
        body = []
        for p, (want, _mult) in enumerate(parts):
            ins = find(asm_dir, tu, func, want)
            if ins is None:
                print(f"mca: {name}: loop not found in {tu}.s ({func}, {want})", file=sys.stderr)
                missing += 1
                break
            body.append(f"# LLVM-MCA-BEGIN {name} #{p}\n")
            # Branch targets to one local label: the region is analysed as a straight line.
            body += ["\t" + re.sub(r"^(j\w+)\s+\.L\w+$", r"\1\t.Lmca_target", i) + "\n" for i in ins]
            body.append("# LLVM-MCA-END\n")
        else:
            with open(os.path.join(out_dir, slug(name) + ".s"), "w") as o:
                o.write(f"# {name}: hot loop of {func} ({tu}), found by bench/mca_loops.py\n\t.text\n")
                o.write("".join(body) + ".Lmca_target:\n\tret\n")
            with open(os.path.join(out_dir, slug(name) + ".cpus"), "w") as o:
                o.write(" ".join(cpus) + "\n")
    return missing


def parse_mca(text):
    """Per region: iterations, total cycles, block rthroughput, resource pressure per iteration."""
    regions = {}
    for part in re.split(r"\n\[\d+\] Code Region - ", "\n" + text)[1:]:
        name = part.split("\n", 1)[0].strip()
        r = {}
        for key, pat in (("iter", r"Iterations:\s+(\d+)"), ("cycles", r"Total Cycles:\s+(\d+)"),
                         ("uops", r"Total uOps:\s+(\d+)"), ("rthru", r"Block RThroughput:\s+([\d.]+)")):
            m = re.search(pat, part)
            r[key] = float(m.group(1)) if m else None
        m = re.search(r"Resources:\n(.*?)\n\n", part, re.S)
        names = {}
        if m:
            for line in m.group(1).split("\n"):
                mm = re.match(r"\s*\[([\w.]+)\]\s+-\s+(\S+)", line)
                if mm:
                    names[mm.group(1)] = mm.group(2)
        m = re.search(r"Resource pressure per iteration:\n(.*?)\n(.*?)\n", part)
        press = {}
        if m:
            cols, vals = m.group(1).split(), m.group(2).split()
            for c, v in zip(cols, vals):
                key = c.strip("[]")
                press[names.get(key, key)] = 0.0 if v == "-" else float(v)
        r["pressure"] = press
        # Pressure of the 512-bit FMAs on each resource (for the Sapphire Rapids re-balance below).
        fma = collections.Counter()
        m = re.search(r"Resource pressure by instruction:\n(.*?)\n(.*?)(?:\n\n|\n?\Z)", part, re.S)
        if m:
            cols = [names.get(c.strip("[]"), c.strip("[]")) for c in m.group(1).split()[:-1]]
            for line in m.group(2).split("\n"):
                tok = line.split()
                ins = " ".join(tok[len(cols):])
                if ins.startswith("vfmadd") and "zmm" in ins:
                    for c, v in zip(cols, tok[:len(cols)]):
                        fma[c] += 0.0 if v == "-" else float(v)
        r["fma_pressure"] = fma
        regions[name] = r
    return regions


def report(mca_dir):
    data = collections.defaultdict(dict)
    for name, *_r in KERNELS:
        for cpu in (SPR, ZN4, SKX, CLX, HSW):
            p = os.path.join(mca_dir, f"{slug(name)}.{cpu}.txt")
            if os.path.exists(p):
                data[cpu].update(parse_mca(open(p).read()))
    print("Core cycles per 64 weights of W (for all M activation rows), llvm-mca steady state (Total Cycles /")
    print("Iterations; every load an L1 hit). cyc/unit: one unit of the loop (column 3). RThru: the Block")
    print("RThroughput bound. p05: sapphirerapids only, the port bound with 512-bit FMAs on port 0 or 5 (the")
    print("model puts them on port 0 alone). Busiest resources: cycles per unit.")
    print()
    print("| kernel | M | unit | CPU | cyc/unit | cyc/64 w | RThru/64 w | p05/64 w | busiest resources |")
    print("|---|---:|---|---|---:|---:|---:|---:|---|")
    for name, _tu, _f, weights, m, parts, kcpus, what in KERNELS:
        for cpu in kcpus:
            regs = [data[cpu].get(f"{name} #{p}") for p in range(len(parts))]
            if any(r is None or not r["iter"] for r in regs):
                print(f"| {name} | {m} | {what} | {cpu} | - | - | - | - | not analysed |")
                continue
            # Parts (paths run `mult` times per unit): cycles and pressure add up.
            per = sum(r["cycles"] / r["iter"] * mult for r, (_w, mult) in zip(regs, parts))
            rthru = sum(r["rthru"] * mult for r, (_w, mult) in zip(regs, parts))
            press = collections.Counter()
            for r, (_w, mult) in zip(regs, parts):
                for k, v in r["pressure"].items():
                    press[k] += v * mult
            # LLVM 19's sapphirerapids model issues 512-bit FMAs on port 0 only; Sapphire Rapids
            # Xeons run them on ports 0 and 5. Port bound with the FMAs free to take either port.
            p05 = "-"
            if cpu == SPR and any(r["fma_pressure"] for r in regs):
                fma = collections.Counter()
                for r, (_w, mult) in zip(regs, parts):
                    for k, v in r["fma_pressure"].items():
                        fma[k] += v * mult
                f = fma["SPRPort00"] + fma["SPRPort05"]
                p0, p5 = press["SPRPort00"] - fma["SPRPort00"], press["SPRPort05"] - fma["SPRPort05"]
                rest = max([v for k, v in press.items() if k not in ("SPRPort00", "SPRPort05")] + [0])
                p05 = f"{max(p0, p5, (p0 + p5 + f) / 2, rest) * 64 / weights:.2f}"
            top = sorted(press.items(), key=lambda kv: -kv[1])[:3]
            busy = ", ".join(f"{k} {v:.1f}" for k, v in top if v > 0)
            label = cpu + (" (Skylake-SP + VNNI)" if cpu == CLX else "")
            print(f"| {name} | {m} | {what} | {label} | {per:.1f} | {per * 64 / weights:.2f} | "
                  f"{rthru * 64 / weights:.2f} | {p05} | {busy} |")

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "extract":
        sys.exit(1 if extract(sys.argv[2], sys.argv[3]) else 0)
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__)
