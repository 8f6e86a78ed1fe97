#!/usr/bin/env python3
"""Quantize a float model with AWQ, compare its perplexity with the float one, generate, score a
continuation, read back a dequantized weight, and plot the per-linear output error (RTN against
AWQ) when matplotlib is there.

    PYTHONPATH=build/release/python python3 python/examples/quantize_and_eval.py \\
        --model models/prose-llama-7m --dataset ../shared/data/prose-calib.txt \\
        --text ../shared/data/prose-val.txt --out /tmp/prose-awq
"""

import argparse
import shutil

import numpy as np

import nibble


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="float HF model directory")
    p.add_argument("--dataset", required=True, help="calibration text (or JSONL with a text field)")
    p.add_argument("--text", required=True, help="evaluation text")
    p.add_argument("--out", required=True, help="output directory (replaced)")
    p.add_argument("--num_calib_data", type=int, default=32)
    p.add_argument("--calib_seq_len", type=int, default=512)
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--max_windows", type=int, default=20)
    p.add_argument("--n_grid", type=int, default=20, help="AWQ grid points")
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: all cores)")
    p.add_argument("--plot", default="", help="PNG of the per-linear output error (needs matplotlib)")
    a = p.parse_args()

    shutil.rmtree(a.out, ignore_errors=True)
    report = nibble.quantize(a.model, a.out, quant_algo="awq", dataset=a.dataset, num_calib_data=a.num_calib_data,
                             seq_len=a.calib_seq_len, threads=a.threads, options={"n_grid": a.n_grid},
                             progress=lambda done, total: None)
    print(f"AWQ: {len(report['linears'])} linears in {report['seconds']:.1f} s")

    text = open(a.text, encoding="utf-8").read()
    ppl = {}
    for name, path in (("float", a.model), ("awq", a.out)):
        m = nibble.Model(path, threads=a.threads)
        ppl[name] = m.perplexity(text, seq_len=a.seq_len, max_windows=a.max_windows)["ppl"]
        print(f"{name:5s} perplexity {ppl[name]:.4f} ({m.info['weight_format']})")
        if name == "awq":
            print("generate:", repr(m.generate("Once upon a time", max_new_tokens=24, temperature=0, stop=["."])))
            # lm-eval's loglikelihood of a continuation: the sum of its tokens' log-probs.
            ctx, cont = m.tokenize("The old man"), m.tokenize(" walked to the sea", add_special=False)
            print(f"log p(continuation | context) = {m.score(ctx + cont)[len(ctx) - 1:].sum():.3f}")

    ck, fp = nibble.open_checkpoint(a.out), nibble.open_checkpoint(a.model)
    first = next(lin for lin in ck.linears if lin["quantized"])
    w, w_fp = ck.dequantize(first["name"]), fp.dequantize(first["name"])
    rel = float(np.linalg.norm(w - w_fp) / np.linalg.norm(w_fp))
    print(f"{first['name']}: {w.shape} {first['scheme']}, relative weight error {rel:.4f}")

    errors = [(lin["name"], lin["rtn_output_error"], lin["method_output_error"])
              for layer in report["calib_layers"] for lin in layer["linears"] if lin["quantized"]]
    better = sum(method <= rtn for _, rtn, method in errors)
    print(f"AWQ output error <= RTN's in {better} of {len(errors)} linears")
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot")
        else:
            x = np.arange(len(errors))
            plt.figure(figsize=(10, 4))
            plt.semilogy(x, [e[1] for e in errors], "o-", label="RTN")
            plt.semilogy(x, [e[2] for e in errors], "o-", label="AWQ")
            plt.xlabel("linear (model order)")
            plt.ylabel("relative output error")
            plt.legend()
            plt.savefig(a.plot, dpi=100)
            print("wrote", a.plot)
    return ppl


if __name__ == "__main__":
    main()
