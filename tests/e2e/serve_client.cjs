// Drives a running `nibble serve` with the official OpenAI client (npm `openai`) and fetch.
// Usage: node serve_client.cjs CASE BASE_URL API_KEY   (NODE_PATH = build/npm/node_modules)
// Each case checks what it can alone and exits 1 with the reason on a failure; it prints one
// JSON object on its last line for the checks the calling test makes (serve_test.cc).
'use strict';
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;

const [, , kase, base, key] = process.argv;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 60000 });
const model = 'served';

function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
}
function eq(a, b, what) {
  check(JSON.stringify(a) === JSON.stringify(b), what + ': ' + JSON.stringify(a) + ' != ' + JSON.stringify(b));
}

const chatReq = { model, messages: [{ role: 'user', content: 'Tell me about the sea.' }], max_tokens: 16, temperature: 0 };

async function streamChat(req) {
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null, first = true, afterFinish = 0;
  for await (const chunk of stream) {
    if (chunk.choices.length === 0) { usage = chunk.usage; continue; }
    const c = chunk.choices[0];
    if (first) { eq(c.delta.role, 'assistant', 'first chunk carries the role'); first = false; }
    if (finish !== null) afterFinish++;
    text += c.delta.content || '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  eq(afterFinish, 0, 'no choice chunk after the one with finish_reason');
  check(usage !== null, 'a usage chunk with include_usage');
  return { text, usage, finish };
}

async function streamCompletion(req) {
  const stream = await client.completions.create({ ...req, stream: true });
  let text = '', finish = null;
  for await (const chunk of stream) { text += chunk.choices[0].text; if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason; }
  return { text, finish };
}

const cases = {
  async chat() {
    const r = await client.chat.completions.create(chatReq);
    eq(r.object, 'chat.completion', 'object');
    eq(r.choices[0].message.role, 'assistant', 'role');
    check(r.choices[0].message.content.length > 0, 'some content');
    check(['stop', 'length'].includes(r.choices[0].finish_reason), 'finish_reason');
    eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, 'total_tokens');
    const models = await client.models.list();
    eq(models.data[0].id, model, 'the alias in /v1/models');
    return { content: r.choices[0].message.content, usage: r.usage };
  },
  async stream_equal() {
    const whole = await client.chat.completions.create(chatReq);
    const s = await streamChat(chatReq);
    eq(s.text, whole.choices[0].message.content, 'streamed text equals the whole response');
    eq(s.finish, whole.choices[0].finish_reason, 'finish_reason');
    eq([s.usage.prompt_tokens, s.usage.completion_tokens, s.usage.total_tokens],
       [whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens], 'usage');
    // The same conversation again: its prompt comes from the prefix cache.
    check(s.usage.prompt_tokens_details.cached_tokens >= s.usage.prompt_tokens - 1, 'cached_tokens of a repeated prompt');
    return { text: s.text, usage: s.usage };
  },
  async stop() {
    const req = { model, prompt: 'The old lighthouse keeper', max_tokens: 40, temperature: 0, logprobs: 1 };
    const full = await client.completions.create(req);
    const text = full.choices[0].text, toks = full.choices[0].logprobs.tokens;
    eq(toks.join(''), text, 'logprobs tokens concatenate to the text');
    eq(toks.length, full.usage.completion_tokens, 'one logprobs entry per token');
    check(full.choices[0].logprobs.token_logprobs.every((x) => x <= 0), 'logprobs <= 0');
    check(full.choices[0].logprobs.top_logprobs.every((t) => Object.keys(t).length >= 1), 'top_logprobs');
    // A stop string across a token boundary: from the middle of token k into token k + 1.
    let k = 2;
    while (k + 1 < toks.length && (toks[k].length < 2 || toks[k + 1].length < 1)) k++;
    const off = toks.slice(0, k).join('').length;
    const stop = text.slice(off + 1, off + toks[k].length + Math.min(2, toks[k + 1].length));
    const want = text.slice(0, text.indexOf(stop));
    const cut = await client.completions.create({ ...req, stop: [stop] });
    eq(cut.choices[0].text, want, 'text before the stop string, nothing of it');
    eq(cut.choices[0].finish_reason, 'stop', 'finish_reason stop');
    const cutStream = await streamCompletion({ ...req, logprobs: undefined, stop: [stop] });
    eq(cutStream.text, want, 'streamed: text before the stop string');
    // A stop string whose start is the text's tail never completes: the tail comes out at the end.
    const tailStop = text.slice(-2) + '\u00a7\u00a7';
    const tail = await streamCompletion({ ...req, logprobs: undefined, stop: [tailStop] });
    eq(tail.text, text, 'the held-back tail is not lost');
    return { text, stop, want };
  },
  async echo() {
    const ids = JSON.parse(process.env.SERVE_PROMPT_IDS);
    const r = await client.completions.create({ model, prompt: ids, echo: true, logprobs: 0, max_tokens: 0 });
    const lp = r.choices[0].logprobs;
    eq(lp.tokens.length, ids.length, 'one entry per prompt token');
    eq(lp.token_logprobs[0], null, 'the first token has no logprob');
    eq(r.usage.completion_tokens, 0, 'no completion tokens');
    eq(lp.tokens.join(''), r.choices[0].text, 'echoed text');
    return { token_logprobs: lp.token_logprobs };
  },
  async n2() {
    const req = { model, prompt: 'Once upon a time', max_tokens: 12, temperature: 1, n: 2, seed: 7 };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    eq(a.choices.map((c) => c.index), [0, 1], 'two choices');
    eq(a.choices.map((c) => c.text), b.choices.map((c) => c.text), 'same seed, same choices');
    const c = await client.completions.create({ ...req, seed: 8 });
    check(JSON.stringify(c.choices.map((x) => x.text)) !== JSON.stringify(a.choices.map((x) => x.text)), 'another seed differs');
    return { texts: a.choices.map((x) => x.text) };
  },
  async concurrent() {
    const prompts = ['The king', 'A small boat', 'In the morning', 'She opened the door', 'The forest was',
                     'He said that', 'Long ago', 'The children ran'];
    const req = (p) => ({ model, prompt: p, max_tokens: 24, temperature: 0 });
    const alone = [];
    for (const p of prompts) alone.push((await client.completions.create(req(p))).choices[0].text);
    const together = await Promise.all(prompts.map((p) => streamCompletion(req(p))));
    eq(together.map((t) => t.text), alone, '8 concurrent streams equal the same requests one at a time');
    return { alone };
  },
  async disconnect() {
    const ac = new AbortController();
    const stream = await client.completions.create(
      { model, prompt: 'The story', max_tokens: 400, temperature: 0, stream: true }, { signal: ac.signal });
    let n = 0;
    try {
      for await (const chunk of stream) { if (chunk.choices[0].text && ++n === 3) ac.abort(); }
    } catch (e) { /* aborted */ }
    const t0 = Date.now();
    let m = '';
    for (;;) {
      m = await (await fetch(base + '/metrics', { headers: { Authorization: 'Bearer ' + key } })).text();
      if (/^nibble_active_slots 0$/m.test(m)) break;
      check(Date.now() - t0 < 3000, 'the slot is freed after a disconnect:\n' + m);
      await new Promise((r) => setTimeout(r, 20));
    }
    check(/^nibble_cancelled_total [1-9]/m.test(m), 'the cancel is counted');
    return { freed_ms: Date.now() - t0 };
  },
  // The same, for a whole (non-streamed) response: nothing is written until the end, so the
  // server watches the connection; the abort closes it and frees the slot within a step.
  async disconnect_whole() {
    const metrics = async () => (await fetch(base + '/metrics', { headers: { Authorization: 'Bearer ' + key } })).text();
    const num = (m, name) => Number((new RegExp('^' + name + ' ([0-9.e+-]+)$', 'm').exec(m) || [])[1]);
    const before = num(await metrics(), 'nibble_cancelled_total');
    const ac = new AbortController();
    const req = client.completions.create({ model, prompt: 'The story', max_tokens: 480, temperature: 0 }, { signal: ac.signal })
      .catch(() => null);
    let t0 = Date.now();
    while (!/^nibble_active_slots 1$/m.test(await metrics())) {
      check(Date.now() - t0 < 10000, 'the request holds a slot');
      await new Promise((r) => setTimeout(r, 5));
    }
    ac.abort();
    await req;
    t0 = Date.now();
    let m = '';
    for (;;) {
      m = await metrics();
      if (/^nibble_active_slots 0$/m.test(m)) break;
      check(Date.now() - t0 < 3000, 'the slot is freed after a disconnect:\n' + m);
      await new Promise((r) => setTimeout(r, 20));
    }
    eq(num(m, 'nibble_cancelled_total'), before + 1, 'the abort cancelled the request (it did not run to its end)');
    return { freed_ms: Date.now() - t0 };
  },
  // OpenAI's penalties: greedy, 0 leaves the text as without them; a strong frequency_penalty
  // changes it (the model repeats itself within 64 tokens), and so does presence_penalty.
  async penalties() {
    const req = { model, prompt: 'The old man said that the old man', max_tokens: 64, temperature: 0 };
    const text = async (extra) => (await client.completions.create({ ...req, ...extra })).choices[0].text;
    const plain = await text({});
    eq(await text({ presence_penalty: 0, frequency_penalty: 0 }), plain, 'penalties 0 change nothing');
    const freq = await text({ frequency_penalty: 2 });
    check(freq !== plain, 'frequency_penalty 2 changes the greedy text');
    const pres = await text({ presence_penalty: 2 });
    check(pres !== plain, 'presence_penalty 2 changes the greedy text');
    const chat = await client.chat.completions.create({ ...chatReq, max_tokens: 32, frequency_penalty: 2 });
    check(chat.choices[0].message.content.length > 0, 'chat with frequency_penalty');
    let status = 0, param = null;
    try { await client.completions.create({ ...req, presence_penalty: 2.5 }); } catch (e) { status = e.status; param = e.param; }
    eq([status, param], [400, 'presence_penalty'], 'presence_penalty outside [-2, 2]');
    return { plain, freq, pres };
  },
  // A bounded load: 32 requests, 12 at a time (more than the 8 slots: some queue), streamed and
  // whole, with logprobs: every token arrives once (the logprobs tokens make up the text and
  // match usage), and no slot or queue entry is left afterwards.
  async load() {
    const prompts = Array.from({ length: 32 }, (_, i) => 'Request ' + i + ' begins with');
    let next = 0, tokens = 0;
    const worker = async () => {
      while (next < prompts.length) {
        const i = next++;
        const req = { model, prompt: prompts[i], max_tokens: 8 + (i % 5) * 4, temperature: 0.7, seed: i, logprobs: 0 };
        if (i % 2 === 0) {
          const r = await client.completions.create(req);
          const c = r.choices[0];
          eq(c.logprobs.tokens.join(''), c.text, 'whole ' + i + ': tokens make the text');
          eq(c.logprobs.tokens.length, r.usage.completion_tokens, 'whole ' + i + ': one entry per token');
          tokens += r.usage.completion_tokens;
        } else {
          const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
          let text = '', pieces = '', n = 0, usage = null;
          for await (const chunk of stream) {
            if (chunk.usage) usage = chunk.usage;
            if (!chunk.choices.length) continue;
            text += chunk.choices[0].text;
            if (chunk.choices[0].logprobs) { n += chunk.choices[0].logprobs.tokens.length; pieces += chunk.choices[0].logprobs.tokens.join(''); }
          }
          eq(pieces, text, 'stream ' + i + ': tokens make the text');
          eq(n, usage.completion_tokens, 'stream ' + i + ': one chunk per token');
          tokens += n;
        }
      }
    };
    await Promise.all(Array.from({ length: 12 }, worker));
    // The last response can reach the client before the step that frees its slot: poll (a slot
    // still held after 3 s is a leak).
    const t0 = Date.now();
    for (;;) {
      const m = await (await fetch(base + '/metrics', { headers: { Authorization: 'Bearer ' + key } })).text();
      if (/^nibble_active_slots 0$/m.test(m) && /^nibble_queue_depth 0$/m.test(m)) break;
      check(Date.now() - t0 < 3000, 'no slot left:\n' + m);
      await new Promise((r) => setTimeout(r, 20));
    }
    return { tokens };
  },
  async auth() {
    const bad = new OpenAI({ baseURL: base + '/v1', apiKey: key + 'x', maxRetries: 0 });
    let status = 0;
    try { await bad.models.list(); } catch (e) { status = e.status; }
    eq(status, 401, 'a wrong key');
    const none = await fetch(base + '/v1/models');
    eq(none.status, 401, 'no key');
    eq((await none.json()).error.code, 'invalid_api_key', 'error code');
    const x = await fetch(base + '/v1/models', { headers: { 'X-Api-Key': key } });
    eq(x.status, 200, 'X-Api-Key');
    eq((await fetch(base + '/health')).status, 200, '/health is public');
    return {};
  },
  async bad_requests() {
    const post = (path, body, raw) => fetch(base + path, {
      method: 'POST', headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' },
      body: raw ? body : JSON.stringify(body) });
    const table = [
      ['/v1/completions', '{"prompt": "x",', true, 400, 'invalid_request_error', null],
      ['/v1/completions', '[1, 2]', true, 400, 'invalid_request_error', null],
      ['/v1/completions', { max_tokens: 3 }, false, 400, 'invalid_request_error', 'prompt'],
      ['/v1/completions', { prompt: 5 }, false, 400, 'invalid_request_error', 'prompt'],
      ['/v1/completions', { prompt: 'x', temperature: 'hot' }, false, 400, 'invalid_request_error', 'temperature'],
      ['/v1/completions', { prompt: 'x', n: 0 }, false, 400, 'invalid_request_error', 'n'],
      ['/v1/completions', { prompt: 'x', top_p: 0 }, false, 400, 'invalid_request_error', 'top_p'],
      ['/v1/completions', { prompt: [1, 999999] }, false, 400, 'invalid_request_error', 'prompt'],
      ['/v1/completions', { prompt: 'x', stop: [1] }, false, 400, 'invalid_request_error', 'stop[0]'],
      ['/v1/completions', { prompt: 'x', max_tokens: 100000 }, false, 400, 'invalid_request_error', 'prompt'],
      ['/v1/chat/completions', { messages: 'hi' }, false, 400, 'invalid_request_error', 'messages'],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], top_logprobs: 2 }, false, 400,
       'invalid_request_error', 'top_logprobs'],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], stream: 'yes' }, false, 400,
       'invalid_request_error', 'stream'],
      ['/v1/nothing', {}, false, 404, 'not_found_error', null],
      ['/v1/completions', 'x'.repeat(9 << 20), true, 413, 'invalid_request_error', null],
      ['/tokenize', { content: 7 }, false, 400, 'invalid_request_error', 'content'],
      ['/detokenize', { tokens: [-1] }, false, 400, 'invalid_request_error', 'tokens[0]'],
    ];
    for (const [path, body, raw, status, type, param] of table) {
      const r = await post(path, body, raw);
      const j = await r.json();
      eq([r.status, j.error.type, j.error.param], [status, type, param], path + ' ' + String(raw ? body : JSON.stringify(body)).slice(0, 60));
    }
    const ctx = await (await post('/v1/completions', { prompt: 'x', max_tokens: 100000 })).json();
    check(ctx.error.n_ctx > 0 && ctx.error.n_prompt_tokens > 0 && /n_ctx/.test(ctx.error.message), 'context error names n_ctx');
    const unknown = await post('/v1/completions', { prompt: 'x', max_tokens: 2, some_future_field: { a: 1 } });
    eq(unknown.status, 200, 'unknown fields are ignored');
    const tok = await (await post('/tokenize', { content: 'Hello there' })).json();
    const detok = await (await post('/detokenize', { tokens: tok.tokens })).json();
    eq(detok.content, 'Hello there', 'tokenize / detokenize round trip');
    eq((await fetch(base + '/health')).status, 200, '/health after the bad requests');
    return {};
  },
};

(async () => {
  const result = await cases[kase]();
  console.log(JSON.stringify(result));
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
