// Reference encoder for the tokenizer.json tests and benchmark: @huggingface/tokenizers (an
// independent JavaScript implementation of the Hugging Face tokenizers library).
//
//   node reference_encode.mjs NPM_DIR TOKENIZER_DIR TEXTS_JSON OUT_JSON
//     TEXTS_JSON: a JSON array of strings; OUT_JSON gets one array of ids per string, as the
//     default call encodes them (add_special_tokens: the post-processor's template).
//   node reference_encode.mjs NPM_DIR TOKENIZER_DIR --bench TEXT_FILE
//     encodes TEXT_FILE (whole, after a warm-up) and prints {"bytes": N, "seconds": S, "tokens": T}.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [npmDir, tokDir, arg3, arg4] = process.argv.slice(2);
const mod = await import(pathToFileURL(join(npmDir, 'node_modules/@huggingface/tokenizers/dist/tokenizers.mjs')).href);
const tokenizerJson = JSON.parse(readFileSync(join(tokDir, 'tokenizer.json'), 'utf8'));
let tokenizerConfig = {};
try {
  tokenizerConfig = JSON.parse(readFileSync(join(tokDir, 'tokenizer_config.json'), 'utf8'));
} catch {
  // no tokenizer_config.json: the library's defaults
}
const tok = new mod.Tokenizer(tokenizerJson, tokenizerConfig);

if (arg3 === '--bench') {
  const text = readFileSync(arg4, 'utf8');
  tok.encode(text.slice(0, 100000));  // warm-up
  const t0 = process.hrtime.bigint();
  const tokens = tok.encode(text).ids.length;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ bytes: Buffer.byteLength(text, 'utf8'), seconds, tokens }));
} else {
  const texts = JSON.parse(readFileSync(arg3, 'utf8'));
  const out = texts.map((t) => tok.encode(t).ids);
  writeFileSync(arg4, JSON.stringify(out));
}
