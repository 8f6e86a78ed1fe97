// Load for an OpenAI-compatible server (bench/serve.sh): `nibble serve` or llama.cpp's
// `llama-server`, the same requests for both. No dependencies (Node's fetch). Two modes:
//
// burst: after one warm-up request, S concurrent streamed completions of random token-id prompts (distinct first ids: no
// prefix-cache hits), R rounds; prints one JSON line with the time to first token (p50, p99 over
// every stream of every round) and the aggregate decode rate with every stream decoding: the
// tokens all streams received after the last stream's first token, over the time from then to the
// last token (the rows of the round before that point mix in other streams' prefill chunks).
//   node serve_bench.cjs ENGINE BASE_URL STREAMS PROMPT_TOKENS MAX_TOKENS ROUNDS
//
// steady: the time to first token of a probe request while BUSY streams decode: first PROBES
// probes one after another on the idle server, then BUSY clients each issue request after request
// (BUSY_P-token prompts, BUSY_N tokens each, the first a random share of that) and, once every
// one of them has finished its first request, PROBES probes
// arrive one after another (a random 0-500 ms pause before each), as a new client would; prints
// one JSON line with the idle and busy TTFT (p50, p99), their ratios and the busy streams'
// aggregate decode rate over the probe window (tokens per second of wall time).
//   node serve_bench.cjs ENGINE BASE_URL steady BUSY BUSY_P BUSY_N PROBE_P PROBES
//
// ENGINE (nibble | llama.cpp) decides how a streamed token is recognised: nibble sends a chunk per
// token with `logprobs: 0` (also for tokens without text); llama.cpp sends a chunk per token
// without being asked (its logprobs would sort the vocabulary per token: not asked, a cost nibble
// does not pay). `ignore_eos` (llama.cpp's; nibble ignores it) keeps llama.cpp to max_tokens.
'use strict';
const [, , engine, base, ...rest] = process.argv;
if (engine !== 'nibble' && engine !== 'llama.cpp') {
  console.error('usage: node serve_bench.cjs nibble|llama.cpp BASE_URL (STREAMS P N ROUNDS | steady BUSY BUSY_P BUSY_N PROBE_P PROBES)');
  process.exit(2);
}

let seed = 12345;
const rand = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
let firstId = 100;
// A random prompt whose second id no earlier prompt had: no prefix shared beyond BOS.
function prompt(n) {
  const ids = [1, firstId++];
  while (ids.length < n) ids.push(100 + Math.floor(rand() * 3900));
  return ids;
}

const isToken = engine === 'nibble'
  ? (j) => j.choices.length > 0 && j.choices[0].logprobs != null
  : (j) => j.choices.length > 0 && j.choices[0].finish_reason == null && !j.usage;

// One streamed completion; `signal` aborts it (a busy client at the end of the run); each token's
// arrival time also goes to `sink` as it comes.
async function one(ids, maxTokens, signal, sink) {
  const t0 = performance.now();
  const body = { prompt: ids, max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true,
    stream_options: { include_usage: true } };
  if (engine === 'nibble') body.logprobs = 0;
  const res = await fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal,
  });
  if (res.status !== 200) throw new Error('HTTP ' + res.status + ': ' + (await res.text()));
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let first = null, buf = '';
  const times = [];
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.error) throw new Error(JSON.stringify(j.error));
      if (isToken(j)) {
        times.push(performance.now());
        if (sink) sink.push(times[times.length - 1]);
        if (first === null) first = times[0];
      }
    }
  }
  if (first === null) throw new Error('no token streamed');
  return { ttft: first - t0, first, end: times[times.length - 1], times };
}

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

async function burst(S, P, N, R) {
  await one(prompt(P), 2);  // warm-up: the server's first request pays one-time costs
  const ttfts = [], rates = [];
  for (let r = 0; r < R; r++) {
    const prompts = [];
    for (let s = 0; s < S; s++) prompts.push(prompt(P));
    const out = await Promise.all(prompts.map((ids) => one(ids, N)));
    for (const o of out) ttfts.push(o.ttft);
    const start = Math.max(...out.map((o) => o.first)), end = Math.max(...out.map((o) => o.end));
    const after = out.reduce((a, o) => a + o.times.filter((t) => t > start).length, 0);
    rates.push(after / ((end - start) / 1000));
  }
  return { streams: S, prompt_tokens: P, max_tokens: N, rounds: R,
    decode_tok_s: pct(rates, 50), ttft_ms_p50: pct(ttfts, 50), ttft_ms_p99: pct(ttfts, 99) };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function steady(B, BP, BN, PP, Q) {
  await one(prompt(PP), 2);  // warm-up: the server's first request pays one-time costs
  const idle = [];
  for (let q = 0; q < Q; q++) idle.push((await one(prompt(PP), 1)).ttft);
  const stop = new AbortController();
  const tokens = [];  // every busy token's arrival time
  const decoding = new Array(B).fill(false);
  const clients = [];
  for (let b = 0; b < B; b++) {
    // The first request of each client stops after a random share of BUSY_N tokens, so that the
    // clients' requests end at different steps (as independent users' do), not all together.
    let n = 1 + Math.floor(rand() * BN);
    clients.push((async () => {
      while (!stop.signal.aborted) {
        try {
          await one(prompt(BP), n, stop.signal, tokens);
          n = BN;
        } catch (e) {
          if (stop.signal.aborted) return;
          throw e;
        }
        decoding[b] = true;
      }
    })());
  }
  // Steady state: every busy client has finished one request (and issued the next).
  while (!decoding.every((d) => d)) await sleep(50);
  const busy = [];
  const t0 = performance.now();
  for (let q = 0; q < Q; q++) {
    await sleep(rand() * 500);
    busy.push((await one(prompt(PP), 1)).ttft);
  }
  const t1 = performance.now();
  stop.abort();
  await Promise.allSettled(clients);
  const inWindow = tokens.filter((t) => t >= t0 && t <= t1).length;
  return { busy_streams: B, busy_prompt_tokens: BP, busy_max_tokens: BN, probe_prompt_tokens: PP, probes: Q,
    idle_ttft_ms_p50: pct(idle, 50), idle_ttft_ms_p99: pct(idle, 99),
    busy_ttft_ms_p50: pct(busy, 50), busy_ttft_ms_p99: pct(busy, 99),
    ratio_p50: pct(busy, 50) / pct(idle, 50), ratio_p99: pct(busy, 99) / pct(idle, 99),
    busy_decode_tok_s: inWindow / ((t1 - t0) / 1000) };
}

(async () => {
  const n = rest.map(Number);
  const out = rest[0] === 'steady' ? await steady(n[1], n[2], n[3], n[4], n[5]) : await burst(n[0], n[1], n[2], n[3]);
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(String(e)); process.exit(1); });
