#!/usr/bin/env python3
"""Prefill throughput: nibble vs. an fp32 PyTorch Llama forward on the same tokens and threads.

The PyTorch side is an independent, plain-torch implementation of the HF Llama forward (no
`transformers`), checked against the model's goldens before it is timed. It runs in a subprocess
so that OPENBLAS_CORETYPE / thread variables are in place before torch (and OpenBLAS) load.

Both sides time one prefill of L tokens whose lm_head covers only the last position (that is what
`nibble generate --warmup 2` measures: both sides warmed up). Benchmark, not a test: exits 0 unless the setup itself is broken.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------
# PyTorch worker (runs in a subprocess; imports torch only here)
# ----------------------------------------------------------------------------------------------

def load_safetensors(path):
    """Parse safetensors by hand: 8-byte LE header length, JSON header, raw little-endian data."""
    import numpy as np
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "BF16":  # bf16 is the top half of an fp32: shift it up, exact
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            arr = np.frombuffer(raw, np.float16).astype(np.float32)
        elif t["dtype"] == "F32":
            arr = np.frombuffer(raw, np.float32).copy()
        else:
            raise SystemExit(f"unsupported dtype {t['dtype']} for {name}")
        out[name] = arr.reshape(t["shape"])
    return out


class TorchLlama:
    def __init__(self, model_dir):
        import torch
        self.torch = torch
        c = json.load(open(os.path.join(model_dir, "config.json")))
        self.H = c["num_attention_heads"]
        self.KV = c.get("num_key_value_heads", self.H)
        self.D = c.get("head_dim") or c["hidden_size"] // self.H
        self.eps = c["rms_norm_eps"]
        self.max_pos = c["max_position_embeddings"]
        if c.get("rope_scaling"):
            raise SystemExit("rope_scaling is not implemented in this baseline")
        w = {k: torch.from_numpy(v).contiguous() for k, v in
             load_safetensors(os.path.join(model_dir, "model.safetensors")).items()}
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed)  # tied embeddings: reuse embed_tokens
        self.norm = w["model.norm.weight"]
        self.layers = []
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            g = lambda s: w[p + s]
            self.layers.append(dict(
                in_norm=g("input_layernorm.weight"), post_norm=g("post_attention_layernorm.weight"),
                q=g("self_attn.q_proj.weight"), k=g("self_attn.k_proj.weight"),
                v=g("self_attn.v_proj.weight"), o=g("self_attn.o_proj.weight"),
                gate=g("mlp.gate_proj.weight"), up=g("mlp.up_proj.weight"),
                down=g("mlp.down_proj.weight")))
        # RoPE tables and the causal mask are per-model constants (nibble builds its tables at load
        # too), so they are made once here rather than inside the timed forward.
        theta = c.get("rope_theta", 10000.0)
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.D, 2, dtype=torch.float32) / self.D))
        freqs = torch.outer(torch.arange(self.max_pos, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # HF rotate_half layout: halves, not interleaved
        self.cos, self.sin = emb.cos(), emb.sin()
        self.mask = torch.full((self.max_pos, self.max_pos), float("-inf")).triu(1)

    def rms(self, x, w):
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, cos, sin):  # x: (heads, T, D)
        half = x.shape[-1] // 2
        rot = self.torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def forward(self, ids, all_logits):
        torch, F = self.torch, self.torch.nn.functional
        T, H, KV, D = len(ids), self.H, self.KV, self.D
        rep = H // KV
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        x = self.embed[ids]
        for L in self.layers:
            h = self.rms(x, L["in_norm"])
            q = self.rope(F.linear(h, L["q"]).view(T, H, D).transpose(0, 1), cos, sin)
            k = self.rope(F.linear(h, L["k"]).view(T, KV, D).transpose(0, 1), cos, sin)
            v = F.linear(h, L["v"]).view(T, KV, D).transpose(0, 1)
            # GQA without copying K/V: query head i uses kv head i // rep (HF repeat_kv), so group
            # the rep query heads of each kv head into one (rep*T, D) matrix per kv head.
            qg = q.reshape(KV, rep * T, D)
            s = torch.bmm(qg, k.transpose(1, 2)).view(KV, rep, T, T) * (D ** -0.5) + mask
            a = torch.bmm(torch.softmax(s, dim=-1).view(KV, rep * T, T), v)
            a = a.view(H, T, D).transpose(0, 1).reshape(T, H * D)
            x = x + F.linear(a, L["o"])
            h = self.rms(x, L["post_norm"])
            x = x + F.linear(F.silu(F.linear(h, L["gate"])) * F.linear(h, L["up"]), L["down"])
        x = self.rms(x if all_logits else x[-1:], self.norm)
        return F.linear(x, self.lm_head)


def golden_check(m, model_dir):
    """Every position's top-8 ids / logits must match the goldens (tolerances from goldens/README)."""
    path = os.path.join(model_dir, "goldens", "logits_once_upon_a_time.json")
    if not os.path.exists(path):
        return "skipped (no goldens)"
    g = json.load(open(path))
    ids = m.torch.tensor(g["sequence_ids"])
    logits = m.forward(ids, all_logits=True)
    worst = 0.0
    for p in g["positions"]:
        row = logits[p["position"]]
        gl = p["top_logits"]
        for i, (gid, gv) in enumerate(zip(p["top_ids"], gl)):
            worst = max(worst, abs(row[gid].item() - gv))
            # An id swap is only meaningful where the golden neighbours are more than 1e-3 apart.
            close = (i > 0 and gl[i - 1] - gv <= 1e-3) or (i + 1 < len(gl) and gv - gl[i + 1] <= 1e-3)
            top = row.topk(len(gl)).indices.tolist()
            if top[i] != gid and not close:
                raise SystemExit(f"golden mismatch at position {p['position']}: top ids {top} vs {p['top_ids']}")
        if abs(row.norm().item() - p["l2_norm"]) > 1e-4 * p["l2_norm"]:
            raise SystemExit(f"golden L2 norm mismatch at position {p['position']}")
    if worst > 1e-3:
        raise SystemExit(f"golden logits off by {worst:.2e} (> 1e-3)")
    return f"ok ({len(g['positions'])} positions, max |dlogit| {worst:.1e})"


def blas_info(torch):
    cfg = torch.__config__.show()
    line = " ".join(re.findall(r"(?:BLAS_INFO|LAPACK_INFO)=[^,]*", cfg))
    # BLAS_INFO=generic only says "libblas.so.3"; ask the library actually mapped what it is.
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l.lower() and "/" in l})
    core = ""
    for p in libs:
        try:
            import ctypes
            lib = ctypes.CDLL(p)
            lib.openblas_get_config.restype = ctypes.c_char_p
            core = lib.openblas_get_config().decode()
            break
        except (OSError, AttributeError):
            pass
    return line, libs, core


def worker(a):
    """Load, check, warm up, report; then time one forward per stdin line ("last" or "all")."""
    import torch
    torch.set_num_threads(a.threads)
    with torch.inference_mode():
        m = TorchLlama(a.model)
        golden = golden_check(m, a.model)
        ids = torch.tensor(json.loads(a.ids))
        t0 = time.perf_counter()
        logits = m.forward(ids, all_logits=False)
        first = time.perf_counter() - t0
        for _ in range(a.warmup):
            m.forward(ids, all_logits=False)
            m.forward(ids, all_logits=True)
        cfg, libs, core = blas_info(torch)
        print(json.dumps(dict(golden=golden, next_id=int(logits[-1].argmax()), first=first,
                              threads=torch.get_num_threads(), blas=cfg, blas_libs=libs, openblas=core)),
              flush=True)
        for line in sys.stdin:
            t0 = time.perf_counter()
            m.forward(ids, all_logits=line.strip() == "all")
            print(time.perf_counter() - t0, flush=True)


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------

def make_prompt(model_dir, text_path, L):
    """A prompt string that tokenizes to exactly L ids (BOS + L-1 pieces) and those ids."""
    try:
        import sentencepiece as spm
    except ImportError:
        raise SystemExit("needs the sentencepiece Python module (Debian: apt-get install python3-sentencepiece)")
    sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "tokenizer.model"))
    text = open(text_path, encoding="utf-8").read()[: 40 * L]
    pieces = sp.encode(text)
    n = L - 1
    # decode(encode(.)[:cut]) may re-tokenize differently at the cut (merges across it, byte
    # fallback); try a few cuts until the round trip gives exactly n pieces.
    for cut in range(n, max(n - 16, 0), -1):
        prompt = sp.decode(pieces[:cut])
        ids = sp.encode(prompt)
        if len(ids) == n:
            return prompt, [sp.bos_id()] + ids, sp
    raise SystemExit(f"could not cut the text at exactly {n} pieces")


def run_nibble(exe, model, prompt, threads):
    r = subprocess.run([exe, "generate", "--model", model, "--prompt", prompt, "-n", "1",
                        "--temperature", "0", "--threads", str(threads), "--warmup", "2"],
                       capture_output=True, text=True)
    m = re.search(r"prefill: (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\)", r.stderr)
    if r.returncode != 0 or not m:
        raise SystemExit(f"nibble failed (rc {r.returncode}):\n{r.stderr}")
    n, tps = int(m.group(1)), float(m.group(3))
    return n, n / tps, r.stdout  # seconds from tokens/s: more digits than the printed "%.3f s"


def openblas_coretype():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return "SKYLAKEX" if "avx512f" in flags else "HASWELL" if "avx2" in flags else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_model = os.path.join(REPO, "models", "prose-llama-7m")
    if not os.path.exists(os.path.join(default_model, "config.json")):
        default_model = os.path.join(REPO, "..", "shared", "models", "prose-llama-7m")
    ap.add_argument("--model", default=default_model)
    ap.add_argument("--tokens", "-L", type=int, default=512, help="prompt length incl. BOS")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=7, help="timed runs per side (median reported)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--nibble", default=os.path.join(REPO, "build", "release", "nibble"))
    ap.add_argument("--text", default=None, help="prompt source text (default: prose-val.txt)")
    ap.add_argument("--coretype", help="OPENBLAS_CORETYPE for torch (default: from /proc/cpuinfo)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        a.threads = a.threads[0]
        return worker(a)

    a.model = os.path.abspath(a.model)
    a.reps = max(a.reps, 5)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    if not 2 <= a.tokens <= cfg["max_position_embeddings"]:
        raise SystemExit(f"--tokens must be in [2, {cfg['max_position_embeddings']}]")
    text = a.text or next((p for p in (os.path.join(REPO, "data", "prose-val.txt"),
                                       os.path.join(REPO, "..", "shared", "data", "prose-val.txt"))
                           if os.path.exists(p)), None)
    if not text:
        raise SystemExit("no prose-val.txt found; pass --text")
    prompt, ids, sp = make_prompt(a.model, text, a.tokens)

    env = dict(os.environ)
    inherited = env.get("OPENBLAS_CORETYPE")
    ct = a.coretype or openblas_coretype()
    if ct:  # the widest kernels the CPU runs; an inherited value (e.g. a CI default) is overridden
        env["OPENBLAS_CORETYPE"] = ct
    print(f"model {a.model}\nprompt {len(ids)} tokens (BOS + {len(ids) - 1} pieces of {os.path.basename(text)}), "
          f"{a.warmup} warm-up + median of {a.reps} runs per side, interleaved\n"
          f"torch env: OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE')} (inherited: {inherited}), "
          f"OMP_WAIT_POLICY=PASSIVE; 1-min load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("prefill = one forward of all prompt tokens, lm_head on the LAST position only (both sides)\n")

    rows = []
    for t in a.threads:
        # Torch: intra-op threads via set_num_threads; the OpenBLAS pthread build reads its own
        # variable. PASSIVE: otherwise libgomp's idle workers spin after each parallel region and
        # steal the cores OpenBLAS's own threads need (measured: 2-thread prefill 4-5x slower).
        wenv = dict(env, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t), OMP_WAIT_POLICY="PASSIVE")
        torch_p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--model", a.model,
                                    "--threads", str(t), "--warmup", str(a.warmup), "--ids", json.dumps(ids)],
                                   env=wenv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        info = torch_p.stdout.readline()
        if not info:
            raise SystemExit("torch worker failed (see its stderr above)")
        w = json.loads(info)

        def torch_run(kind):
            torch_p.stdin.write(kind + "\n")
            torch_p.stdin.flush()
            return float(torch_p.stdout.readline())

        if t == a.threads[0]:
            print(f"torch BLAS: {w['blas']}; loaded {', '.join(w['blas_libs'])}\nOpenBLAS: {w['openblas']}")
            print(f"torch golden check: {w['golden']}")

        # nibble: a fresh process per run (the CLI is the only interface), so each timed prefill is
        # the first forward of its process; its warm-up runs only warm the page cache.
        for _ in range(a.warmup):
            run_nibble(a.nibble, a.model, prompt, t)
        # A BOS + 1 piece prompt shows nibble's fixed per-process cost inside its "prefill" time.
        tiny = sp.decode(ids[1:2])
        # Interleave the two sides so that load from other processes hits both alike.
        tt, ta, nt, n2, out = [], [], [], [], ""
        for _ in range(a.reps):
            n, sec, _ = run_nibble(a.nibble, a.model, tiny, t)
            n2.append(sec if n == 2 else float("nan"))
            tt.append(torch_run("last"))
            n, sec, out = run_nibble(a.nibble, a.model, prompt, t)
            if n != len(ids):
                raise SystemExit(f"nibble tokenized the prompt to {n} tokens, expected {len(ids)}")
            nt.append(sec)
            ta.append(torch_run("all"))
        torch_p.stdin.close()
        torch_p.wait()
        want = sp.decode(ids[1:] + [w["next_id"]])[len(sp.decode(ids[1:])):]
        out = out[len(prompt):] if out.startswith(prompt) else out  # nibble echoes the prompt
        if out.strip() != want.strip():
            print(f"  note: greedy next token differs at {t} threads: torch {want!r} vs nibble {out.strip()!r}")
        else:
            print(f"  {t} thread(s): greedy next token agrees ({want.strip()!r})")
        L, med = len(ids), statistics.median
        rows.append((t, L / med(tt), L / med(nt), min(tt) / min(nt), L / w["first"], L / med(ta), 1e3 * med(n2)))

    print(f"\n{'threads':>7} | {'torch tok/s':>11} | {'nibble tok/s':>12} | {'nibble/torch':>12} || "
          f"{'best/best':>9} | {'torch 1st call':>14} | {'torch all-pos lm_head':>21} | {'nibble 2-tok ms':>15}")
    for t, tt, nn, best, t1, ta, ms2 in rows:
        print(f"{t:>7} | {tt:>11.1f} | {nn:>12.1f} | {nn / tt:>12.2f} || {best:>9.2f} | {t1:>14.1f} | {ta:>21.1f}"
              f" | {ms2:>15.1f}")
    print("\ntokens/s are medians. Right of ||, for information: nibble/torch ratio of the fastest runs; "
          "torch's first (cold) forward in its process; torch with lm_head over every position (perplexity); "
          "nibble's prefill time for a 2-token prompt (its fixed per-process cost).")
    load = os.getloadavg()[0]
    if load > 0.5 * os.cpu_count():
        print(f"WARNING: 1-min load average {load:.1f} on {os.cpu_count()} CPUs: other processes compete; "
              "multi-thread numbers are unreliable.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
