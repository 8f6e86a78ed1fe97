// Load for `nibble serve` (bench/serve.sh): S concurrent streamed completions of random token-id
// prompts (distinct first ids: no prefix-cache hits), R rounds; prints one JSON line with the
// time to first token (p50, p99 over every stream of every round) and the aggregate decode rate
// with every stream decoding: the tokens all streams received after the last stream's first
// token, over the time from then to the last token (the rows of the round before that point
// mix in other streams' prefill chunks). No dependencies (Node's fetch).
// Usage: node serve_bench.cjs BASE_URL STREAMS PROMPT_TOKENS MAX_TOKENS ROUNDS
'use strict';
const [, , base, S, P, N, R] = process.argv.map((x, i) => (i >= 3 ? Number(x) : x));

let seed = 12345;
const rand = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };

async function one(prompt) {
  const t0 = performance.now();
  const res = await fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    // logprobs: a chunk per token, also for tokens whose text is empty (ids a random model's
    // tokenizer has no text for).
    body: JSON.stringify({ prompt, max_tokens: N, temperature: 0, logprobs: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) throw new Error('HTTP ' + res.status + ': ' + (await res.text()));
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let first = null, buf = '', tokens = 0;
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
      if (j.usage) tokens = j.usage.completion_tokens;
      if (j.choices.length && j.choices[0].logprobs) {
        times.push(performance.now());
        if (first === null) first = times[0];
      }
    }
  }
  return { ttft: first - t0, first, end: times[times.length - 1], tokens, times };
}

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

(async () => {
  const ttfts = [], rates = [];
  for (let r = 0; r < R; r++) {
    const prompts = [];
    for (let s = 0; s < S; s++) {
      const ids = [1, 100 + r * 64 + s];
      while (ids.length < P) ids.push(100 + Math.floor(rand() * 3900));
      prompts.push(ids);
    }
    const out = await Promise.all(prompts.map(one));
    for (const o of out) ttfts.push(o.ttft);
    const start = Math.max(...out.map((o) => o.first)), end = Math.max(...out.map((o) => o.end));
    const after = out.reduce((a, o) => a + o.times.filter((t) => t > start).length, 0);
    rates.push(after / ((end - start) / 1000));
  }
  console.log(JSON.stringify({ streams: S, prompt_tokens: P, max_tokens: N, rounds: R,
    decode_tok_s: pct(rates, 50), ttft_ms_p50: pct(ttfts, 50), ttft_ms_p99: pct(ttfts, 99) }));
})().catch((e) => { console.error(String(e)); process.exit(1); });
