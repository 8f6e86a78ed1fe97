// Runs an exported decoder (nibble export-onnx) in ONNX Runtime (onnxruntime-node, CPU):
// prefill of the prompt ids, then greedy decode with the KV cache fed back.
// Usage: node ort_decode.js MODEL_DIR '[ids]' STEPS [THREADS] [fp32|fp16 (the export's --io_dtype)]
// Prints JSON {ids: [generated ids], prefill_logits: [last position's logits]}.
const ort = require('onnxruntime-node');
const fs = require('fs');

// IEEE half bits -> number (ONNX Runtime hands fp16 tensors over as Uint16Array).
function halfToFloat(h) {
  const e = (h >> 10) & 31, f = h & 1023, s = h & 32768 ? -1 : 1;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

async function main() {
  const [dir, idsText, stepsText, threadsText, dtype] = process.argv.slice(2);
  const fp16 = dtype === 'fp16';
  const cfg = JSON.parse(fs.readFileSync(dir + '/genai_config.json')).model.decoder;
  const opts = { executionProviders: ['cpu'], intraOpNumThreads: Number(threadsText || 1) };
  const session = await ort.InferenceSession.create(dir + '/model.onnx', opts);
  let ids = JSON.parse(idsText).map(BigInt);
  const steps = Number(stepsText);
  const kv = cfg.num_key_value_heads, hs = cfg.head_size;
  let past = {};
  for (let i = 0; i < cfg.num_hidden_layers; ++i)
    for (const kind of ['key', 'value'])
      past[`past_key_values.${i}.${kind}`] = fp16 ? new ort.Tensor('float16', new Uint16Array(0), [1, kv, 0, hs])
                                                     : new ort.Tensor('float32', new Float32Array(0), [1, kv, 0, hs]);
  let total = 0, out = [], prefill = null, input = ids;
  for (let step = 0; step < steps; ++step) {
    total += input.length;
    const feeds = Object.assign({}, past, {
      input_ids: new ort.Tensor('int64', BigInt64Array.from(input), [1, input.length]),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(total).fill(1n), [1, total]),
    });
    const r = await session.run(feeds);
    const vocab = r.logits.dims[2];
    let last = r.logits.data.subarray((input.length - 1) * vocab, input.length * vocab);
    if (fp16) last = Float32Array.from(last, halfToFloat);
    if (step === 0) prefill = Array.from(last);
    let best = 0;
    for (let v = 1; v < vocab; ++v) if (last[v] > last[best]) best = v;
    out.push(best);
    for (let i = 0; i < cfg.num_hidden_layers; ++i)
      for (const kind of ['key', 'value']) past[`past_key_values.${i}.${kind}`] = r[`present.${i}.${kind}`];
    input = [BigInt(best)];
  }
  process.stdout.write(JSON.stringify({ ids: out, prefill_logits: prefill }) + '\n');
}
main().catch((e) => { console.error(String(e)); process.exit(1); });
