"""Per-token cost of nibble's Model.stream against Model.generate (docs/PERFORMANCE.md).

    PYTHONPATH=build/release/python python3 bench/python_stream_overhead.py MODEL_DIR [THREADS]

Median process CPU time of 7 interleaved runs of 400 greedy tokens each."""
import statistics, sys, time
import nibble
m = nibble.Model(sys.argv[1], threads=int(sys.argv[2]) if len(sys.argv) > 2 else None)
N = 400
kw = dict(max_new_tokens=N, temperature=0.0)
m.generate("Once upon a time", **kw)
gen, stream, stream_ev = [], [], []
for _ in range(7):
    t = time.process_time(); text = m.generate("Once upon a time", **kw); gen.append(time.process_time() - t)
    t = time.process_time(); s = m.stream("Once upon a time", **kw); pieces = list(s); stream.append(time.process_time() - t)
    t = time.process_time(); ev = list(m.stream("Once upon a time", events=True, **kw)); stream_ev.append(time.process_time() - t)
    assert "".join(pieces) == text
n = s.stats["generated_tokens"]
g, st, se = statistics.median(gen), statistics.median(stream), statistics.median(stream_ev)
print(f"{n} tokens: generate {g/n*1e3:.3f} ms/token, stream {st/n*1e3:.3f} ms/token ({(st/g-1)*100:+.2f} %), "
      f"stream events {se/n*1e3:.3f} ms/token ({(se/g-1)*100:+.2f} %)")
