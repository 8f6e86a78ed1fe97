"""Per-token cost of nibble's Model.stream against the CLI's decode (docs/PERFORMANCE.md).

    PYTHONPATH=build/release/python python3 bench/python_stream_overhead.py MODEL_DIR \\
        [--threads 2] [--tokens 64] [--runs 7] [--cli build/release/nibble]

Interleaved runs of the same greedy generation (same prompt, tokens, thread count): the CLI's
`generate` (its own decode clock, printed on stderr), Model.stream yielding text pieces, and
Model.stream with token events (a dict per token). For the streams, two clocks: the library's
decode time (GenerateStats, the CLI's clock) and what the Python consumer sees (wall time of the
whole iteration less the prefill); and the consuming thread's CPU time per token. Prints the
medians in ms per decoded token and the ratios."""
import argparse
import os
import re
import statistics
import subprocess
import time

import nibble

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--tokens", type=int, default=64)
p.add_argument("--runs", type=int, default=7)
p.add_argument("--prompt", default="Once upon a time")
p.add_argument("--cli", default=os.path.join(os.path.dirname(__file__), "..", "build", "release", "nibble"))
a = p.parse_args()

DECODE = re.compile(r"decode: (\d+) tokens in ([0-9.]+) s")


def cli_run():
    proc = subprocess.run([a.cli, "generate", "--model", a.model, "--prompt", a.prompt, "-n", str(a.tokens),
                           "--temperature", "0", "--threads", str(a.threads)], capture_output=True, text=True,
                          check=True)
    n, seconds = DECODE.search(proc.stderr).groups()
    return int(n), float(seconds) / int(n)


m = nibble.Model(a.model, threads=a.threads)
kw = dict(max_new_tokens=a.tokens, temperature=0.0)


def stream_run(events):
    start, cpu = time.perf_counter(), time.thread_time()
    s = m.stream(a.prompt, events=events, **kw)
    for _ in s:
        pass
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    st = s.stats
    n = st["generated_tokens"] - 1  # decoded tokens: the first comes from the prefill, as the CLI counts
    return n, st["decode_seconds"] / n, (wall - st["prefill_seconds"]) / n, cpu / (n + 1)


m.generate(a.prompt, **kw)  # first-call costs out of the way, as the CLI's weight cache is warm
cli, text_lib, text_wall, ev_lib, ev_wall, text_cpu, ev_cpu = [], [], [], [], [], [], []
counts = set()
with open("/proc/loadavg") as f:
    load_before = f.read().split()[:3]
for _ in range(a.runs):
    n, ms = cli_run()
    cli.append(ms)
    counts.add(n)
    n, lib, wall, cpu = stream_run(False)
    text_lib.append(lib)
    text_wall.append(wall)
    text_cpu.append(cpu)
    counts.add(n)
    n, lib, wall, cpu = stream_run(True)
    ev_lib.append(lib)
    ev_wall.append(wall)
    ev_cpu.append(cpu)
    counts.add(n)
with open("/proc/loadavg") as f:
    load_after = f.read().split()[:3]
assert len(counts) == 1, f"the runs decoded different token counts: {counts}"
base = statistics.median(cli)


def show(name, xs):
    med = statistics.median(xs)
    print(f"{name:34s} median {med * 1e3:8.3f} ms/token ({(med / base - 1) * 100:+6.2f} % vs CLI)  "
          f"runs: {' '.join(f'{x * 1e3:.2f}' for x in xs)}")


print(f"{counts.pop()} decoded tokens, {a.runs} interleaved runs each, threads {a.threads}, "
      f"load average {' '.join(load_before)} -> {' '.join(load_after)}")
show("CLI generate (decode clock)", cli)
show("stream text (library clock)", text_lib)
show("stream text (consumer wall)", text_wall)
show("stream events (library clock)", ev_lib)
show("stream events (consumer wall)", ev_wall)
# The Python side's own work per token (the consuming thread's CPU time: waking, taking the GIL,
# building the str or dict), which is all a stream adds to the decode the CLI runs.
print(f"consumer thread CPU per token: text {statistics.median(text_cpu) * 1e6:.1f} us, "
      f"events {statistics.median(ev_cpu) * 1e6:.1f} us")
