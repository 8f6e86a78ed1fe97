#!/usr/bin/env bash
# Sums of every quantize output, to show that a change leaves them byte-identical:
#   scripts/export_sums.sh NIBBLE OUTROOT SUMSFILE   (once with each build, then diff the sums)
#   scripts/export_sums.sh --hash-only OUTROOT SUMSFILE     (sums of an existing OUTROOT)
#   CALIB_ARGS="--calib_dtype fp32" scripts/export_sums.sh ...  (extra flags of every awq / gptq run)
# Quantizes the shipped models with rtn, awq, gptq and awq,gptq into every export format, plus
# flag combinations (overrides, exclusions, --misaligned, act-order, clip, --tp), with a small
# calibration (4 x 64 tokens; about 4 minutes on 2 cores). Sums: every output file as written,
# each --report without its timings, memory and plan, each log with OUTROOT, every duration and
# RSS replaced and without its memory and plan lines (memory and disk figures vary run to run).
set -u
NIB=$1; ROOT=$(realpath -m "$2"); SUMS=$3
SHARED=$(cd "$(dirname "$0")/../../shared" && pwd)
M=$SHARED/models; D=$SHARED/data/prose-calib.txt
if [ "$NIB" != --hash-only ]; then
rm -rf "$ROOT"; mkdir -p "$ROOT"; : > "$ROOT/failures"
CAL="--dataset $D --num_calib_data 4 --seq_len 64 ${CALIB_ARGS:-}"
run() {  # name, args...: the quantized output, its --report and its log under $ROOT
  local name=$1; shift
  "$NIB" quantize "$@" --output_dir "$ROOT/$name" --report "$ROOT/$name.report.json" > "$ROOT/$name.log" 2>&1 ||
    echo "FAIL $name: $(tail -1 "$ROOT/$name.log")" >> "$ROOT/failures"
}
for model in prose-llama-7m prose-llama-7m-outliers; do
  for algo in rtn awq gptq awq,gptq; do
    cal=""; [ "$algo" != rtn ] && cal="$CAL"
    for fmt in hf_format compressed-tensors awq gptq; do
      run "$model-${algo/,/+}-$fmt" --model_dir $M/$model --quant_algo $algo --model_export $fmt $cal
    done
  done
done
m=$M/prose-llama-7m
run v-override --model_dir $m --layer_quant_config "*down_proj:group_size=64" --layer_quant_config "lm_head:group_size=32"
run v-exclude-none --model_dir $m --exclude_layers "" --quant_scheme w_int4_per_group_sym --model_export compressed-tensors
run v-exclude-re --model_dir $m --exclude_layers "re:.*layers\.0\..*" --exclude_layers lm_head --model_export gptq
run v-perchannel --model_dir $m --quant_scheme w_uint4_per_channel_asym --pack_method order
run v-misaligned-ex --model_dir $m --group_size 96 --misaligned exclude
run v-misaligned-pc --model_dir $m --group_size 96 --misaligned per_channel --model_export compressed-tensors
run v-gptq-group --model_dir $m --quant_algo gptq $CAL --actorder group --model_export gptq --gptq_format v2
run v-gptq-static-ts --model_dir $m --quant_algo gptq $CAL --actorder static --true_sequential --propagate fp
run v-awq-clip --model_dir $m --quant_algo awq $CAL --awq_clip --duo_scaling both --n_grid 8 --model_export awq
run v-awqgptq-fp --model_dir $m --quant_algo awq,gptq $CAL --propagate fp --model_export compressed-tensors
run v-tp --model_dir $m --tp 2 --quant_algo rtn --model_export gptq
fi
# Sums: every output file as written; each report without its timings, memory figures and plan
# (the plan counts the process's memory before the run and the free disk); each log with the
# path of $ROOT, every duration and every progress line's RSS replaced, without the memory and
# plan lines.
: > "$SUMS"
cat "$ROOT/failures" >> "$SUMS"
for d in $(cd "$ROOT" && find . -mindepth 1 -maxdepth 1 -type d | sort); do
  name=${d#./}
  (cd "$ROOT/$name" && find . -type f | sort | xargs sha256sum) | sed "s|  \./|  $name/|" >> "$SUMS"
  sed "s|$ROOT|ROOT|g" "$ROOT/$name.report.json" | python3 -c '
import json,sys,hashlib
def strip(o):
    if isinstance(o,dict): return {k:strip(v) for k,v in o.items() if k not in ("seconds", "memory", "plan")}
    if isinstance(o,list): return [strip(x) for x in o]
    return o
print(hashlib.sha256(json.dumps(strip(json.load(sys.stdin)),sort_keys=True).encode()).hexdigest()+"  '$name'.report.json")' >> "$SUMS"
  sed -E -e "s|$ROOT|ROOT|g" -e 's/[0-9]+(\.[0-9]+)? s\b/T s/g' -e 's/RSS [0-9.]+ [kMGT]?B/RSS R/g' -e '/^memory: /d' -e '/^plan: /d' "$ROOT/$name.log" | sha256sum | sed "s|-|$name.log|" >> "$SUMS"
done
