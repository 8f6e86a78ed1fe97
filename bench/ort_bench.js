// ONNX Runtime (onnxruntime-node, CPU EP) tokens/s of a nibble export-onnx decoder, measured as
// `nibble bench-model` measures nibble: pp<P> is one P-token prefill from an empty KV cache, tg<N>
// is N single-token greedy steps from an empty cache with present.* fed back as past_key_values.*.
// Ids are random from a fixed seed; one untimed warmup, then the median over the repetitions.
// Usage: node ort_bench.js MODEL_DIR P N THREADS REPS   (fp32 io, as export-onnx writes by default)
// Prints JSON {pp_ts, tg_ts, pp_samples, tg_samples}.
const ort = require('onnxruntime-node');
const fs = require('fs');

// Empty past_key_values.* for a new sequence: [1, kv_heads, 0, head_size] per layer.
function emptyPast(cfg) {
  const past = {};
  for (let i = 0; i < cfg.num_hidden_layers; ++i)
    for (const kind of ['key', 'value'])
      past[`past_key_values.${i}.${kind}`] =
        new ort.Tensor('float32', new Float32Array(0), [1, cfg.num_key_value_heads, 0, cfg.head_size]);
  return past;
}

// One decoder call on `ids` after `past` (total = tokens so far including ids); returns the
// argmax of the last position's logits and the new cache.
async function forward(session, cfg, past, ids, total) {
  const feeds = Object.assign({}, past, {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(total).fill(1n), [1, total]),
  });
  const r = await session.run(feeds);
  const vocab = r.logits.dims[2];
  const last = r.logits.data.subarray((ids.length - 1) * vocab, ids.length * vocab);
  let best = 0;
  for (let v = 1; v < vocab; ++v) if (last[v] > last[best]) best = v;
  const next = {};
  for (let i = 0; i < cfg.num_hidden_layers; ++i)
    for (const kind of ['key', 'value']) next[`past_key_values.${i}.${kind}`] = r[`present.${i}.${kind}`];
  return { best, past: next };
}

// Deterministic ids in [0, vocab) (xorshift32), the same for every run of the script.
function randomIds(n, vocab, seed) {
  let x = seed >>> 0 || 1;
  const ids = [];
  for (let i = 0; i < n; ++i) {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    ids.push(x % vocab);
  }
  return ids;
}

const median = (a) => { const s = [...a].sort((x, y) => x - y), m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const seconds = (t0) => Number(process.hrtime.bigint() - t0) / 1e9;

async function main() {
  const [dir, pText, nText, threadsText, repsText] = process.argv.slice(2);
  const p = Number(pText), n = Number(nText), reps = Number(repsText || 2);
  const cfg = JSON.parse(fs.readFileSync(dir + '/genai_config.json')).model.decoder;
  const vocab = JSON.parse(fs.readFileSync(dir + '/genai_config.json')).model.vocab_size;
  const opts = { executionProviders: ['cpu'], intraOpNumThreads: Number(threadsText), interOpNumThreads: 1 };
  const session = await ort.InferenceSession.create(dir + '/model.onnx', opts);
  const pp = [], tg = [];
  for (let rep = 0; rep <= reps; ++rep) {  // rep 0 is the warmup
    const prompt = randomIds(p, vocab, 1 + rep);
    let t0 = process.hrtime.bigint();
    await forward(session, cfg, emptyPast(cfg), prompt, p);
    if (rep > 0) pp.push(p / seconds(t0));
    let past = emptyPast(cfg), id = randomIds(1, vocab, 100 + rep)[0];
    t0 = process.hrtime.bigint();
    for (let step = 1; step <= n; ++step) ({ best: id, past } = await forward(session, cfg, past, [id], step));
    if (rep > 0) tg.push(n / seconds(t0));
  }
  process.stdout.write(JSON.stringify({ pp_ts: median(pp), tg_ts: median(tg), pp_samples: pp, tg_samples: tg }) + '\n');
}
main().catch((e) => { console.error(String(e)); process.exit(1); });
