#!/usr/bin/env bash
# Rejects #include directives that point upward in nibble's layering (docs: DESIGN.md "Layers").
#
#   src/<layer>/   may include "<layer>/..." only for the layers below it (table below);
#                  quantize and eval are siblings and never include each other; src/api may
#                  include anything under src/. Every layer may include public <nibble/...>
#                  headers and system / third-party headers.
#   include/nibble/ and tools/ may include only <nibble/...> and system / third-party headers:
#                  no "base/...", "model/...", ... (src/ is not on their include path); tools/
#                  may also include its own helpers "support/...".
#   tools/support/ (the CLI's helpers, not public API) may include any layer.
# Everywhere: no include path with a ".." component (it would step around the rule).
#
# Usage: scripts/check_includes.sh [repo_root]   (default: the repository holding this script)
#        scripts/check_includes.sh --self-test   (checks that the check rejects a bad tree)
# Exit 0 when clean; exit 1 listing every offending file:line; exit 2 on usage errors.
set -euo pipefail

# --self-test: proves the check can fail, on throw-away trees under /tmp (removed on exit).
if [[ "${1:-}" == --self-test ]]; then
  self="${BASH_SOURCE[0]}"
  tmp="$(mktemp -d /tmp/nibble_check_includes_XXXXXX)"
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src/base" "$tmp/src/io" "$tmp/src/api" "$tmp/src/eval" "$tmp/tools"
  printf '#include <vector>\n' > "$tmp/src/base/a.h"
  printf '#include "base/a.h"\n' > "$tmp/src/io/b.h"
  printf '#include "eval/c.h"\n#include "io/b.h"\n' > "$tmp/src/api/d.cc"
  printf '#include "io/b.h"\n' > "$tmp/src/eval/c.h"
  printf '#include <nibble/nibble.h>\n' > "$tmp/tools/main.cc"
  bash "$self" "$tmp" > /dev/null || { echo "self-test: clean tree rejected" >&2; exit 1; }
  printf '#include "io/b.h"\n' >> "$tmp/src/base/a.h"                # upward
  printf '#include "base/a.h"\n' >> "$tmp/tools/main.cc"            # tools into src/
  out="$(bash "$self" "$tmp" 2>/dev/null)" && { echo "self-test: bad tree accepted" >&2; exit 1; }
  n="$(grep -c -- ' -- ' <<< "$out")"
  [[ "$n" == 2 ]] || { echo "self-test: expected 2 offenders, got $n:" >&2; echo "$out" >&2; exit 1; }
  echo "check_includes: self-test ok"
  exit 0
fi

root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
if [[ ! -d "$root/src" ]]; then
  echo "check_includes: $root has no src/ directory" >&2
  exit 2
fi

# Layer -> the project layers its files may include (itself included).
declare -A allow=(
  [base]="base"
  [io]="base io"
  [formats]="base io formats"
  [kernels]="base kernels"
  [tokenizer]="base io tokenizer"
  [chat]="base io chat"
  [model]="base io formats kernels model"
  [onnx]="base io formats kernels model onnx"
  [eval]="base io formats kernels model tokenizer eval"
  [quantize]="base io formats kernels model tokenizer quantize"
  [api]="base io formats kernels model tokenizer chat onnx eval quantize api"
  [serve]="base io formats kernels model tokenizer chat onnx eval quantize api serve"
)
# Include-path prefixes that name a project layer (anything else is system / third-party).
layers=" base io formats kernels tokenizer chat model onnx eval quantize api serve "

offenders=0
report() {  # file line include why
  echo "${1#"$root"/}:$2: #include $3 -- $4"
  offenders=$((offenders + 1))
}

is_source() { [[ "$1" =~ \.(h|hh|hpp|cc|cpp|cxx|inc|ipp)$ ]]; }

# Who each file answers to: a layer name for src/<layer>/..., "public" for include/ and tools/.
declare -A who=()
while IFS= read -r -d '' file; do
  is_source "$file" || continue
  rel="${file#"$root"/src/}"
  if [[ "$rel" != */* ]]; then
    report "$file" 0 "(n/a)" "source directly under src/; put it in a layer directory"
    continue
  fi
  layer="${rel%%/*}"
  if [[ -z "${allow[$layer]+x}" ]]; then
    report "$file" 0 "(n/a)" "unknown layer directory src/$layer; add it to DESIGN.md and scripts/check_includes.sh"
    continue
  fi
  who[$file]="$layer"
done < <(find "$root/src" -type f -print0)
for dir in "$root/include" "$root/tools"; do
  [[ -d "$dir" ]] || continue
  while IFS= read -r -d '' file; do
    is_source "$file" && who[$file]=public
  done < <(find "$dir" -type f -not -path "$root/tools/support/*" -print0)
done
if [[ -d "$root/tools/support" ]]; then
  while IFS= read -r -d '' file; do
    is_source "$file" && who[$file]=api
  done < <(find "$root/tools/support" -type f -print0)
fi

directive='^[[:space:]]*#[[:space:]]*include[[:space:]]*([<"][^>"]*[>"])'
checked=0
if [[ ${#who[@]} -gt 0 ]]; then
  # One grep over every file: "path:line:text" (paths in this repository hold no ':').
  while IFS= read -r hit; do
    file="${hit%%:*}"; rest="${hit#*:}"; line="${rest%%:*}"; text="${rest#*:}"
    [[ "$text" =~ $directive ]] || continue
    target="${BASH_REMATCH[1]}"
    path="${target:1:${#target}-2}"
    checked=$((checked + 1))
    if [[ "/$path/" == */../* || "/$path/" == */./* ]]; then
      report "$file" "$line" "$target" "relative include path; write it from the include root"
      continue
    fi
    [[ "$path" == */* ]] || continue           # "foo.h" / <vector>: not a layer path
    first="${path%%/*}"
    [[ "$layers" == *" $first "* ]] || continue  # <nibble/...>, system, third-party
    w="${who[$file]}"
    if [[ "$w" == public ]]; then
      report "$file" "$line" "$target" "only <nibble/...> public headers and system headers are allowed here"
    elif [[ " ${allow[$w]} " != *" $first "* ]]; then
      report "$file" "$line" "$target" "layer '$w' may not include layer '$first' (allowed: ${allow[$w]})"
    fi
  done < <(printf '%s\0' "${!who[@]}" | sort -z | xargs -0 grep -HnE '^[[:space:]]*#[[:space:]]*include' || true)
fi

if [[ $offenders -gt 0 ]]; then
  echo "check_includes: $offenders include(s) point upward or around the layering (DESIGN.md \"Layers\")" >&2
  exit 1
fi
echo "check_includes: ${#who[@]} files, $checked includes ok"
