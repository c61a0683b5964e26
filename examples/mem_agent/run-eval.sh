#!/usr/bin/env bash
# RULER-HQA with the MemAgent loop, each LENGTH in turn, on a served model.
#   MODEL_PATH=/models/RL-MemAgent-14B DATA_ROOT=/data/ruler_hqa bash examples/mem_agent/run-eval.sh
#   CONVERT=1 SAVE_PATH=/ckpt/mem_agent HF_CKPT=/models/Qwen3-4B bash examples/mem_agent/run-eval.sh
# With CONVERT=1 the iteration SINGLE_ITER (default: the latest) of SAVE_PATH is converted to HF first and
# evaluated. Results: SAVE_DIR/ruler_hqa_N/SAVE_FILE.jsonl (+ .summary.json) and SAVE_DIR/ruler_hqa_sub_em.png.
set -euo pipefail
source "$(dirname "$0")/common.sh"

DATA_ROOT=${DATA_ROOT:-/data/ruler_hqa}
LENGTH=${LENGTH:-"50 200 800"}
SAVE_DIR=${SAVE_DIR:-results/ruler_hqa}
N_PROC=${N_PROC:-16} TEMPERATURE=${TEMPERATURE:-0.7} TOP_P=${TOP_P:-0.95} TP=${TP:-1}
NUM_ENGINES=${NUM_ENGINES:-1}  # data-parallel engines, each on TP GPUs of its own (behind vllm-router)
ENGINE_BACKEND=${ENGINE_BACKEND:-vllm}
if [ "${CONVERT:-0}" = "1" ]; then
  MODEL_PATH=$(bash tools/convert_iteration_to_hf.sh | tail -1)
fi
MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to an HF checkpoint, or CONVERT=1 with SAVE_PATH and HF_CKPT}
need "${MODEL_PATH}/config.json" MODEL_PATH
need "${DATA_ROOT}" DATA_ROOT
SAVE_FILE=${SAVE_FILE:-$(basename "${MODEL_PATH}")}
EXTRA=()
[ "${FORCE:-0}" = "1" ] && EXTRA+=(--force)
[ "${LENGTHS_AT_ONCE:-0}" = "1" ] && EXTRA+=(--lengths-at-once)
[ -n "${AT_ONCE_MAX_DOCS:-}" ] && EXTRA+=(--at-once-max-docs "${AT_ONCE_MAX_DOCS}")
[ -n "${MAX_MODEL_LEN:-}" ] && EXTRA+=(--max-model-len "${MAX_MODEL_LEN}")
[ -n "${ENGINE_DTYPE:-}" ] && EXTRA+=(--engine-dtype "${ENGINE_DTYPE}")
# shellcheck disable=SC2086
python -m examples.mem_agent.eval_ruler_hqa --model-path "${MODEL_PATH}" --data-root "${DATA_ROOT}" \
  --length ${LENGTH} --save-dir "${SAVE_DIR}" --save-file "${SAVE_FILE}" --n-proc "${N_PROC}" \
  --temperature "${TEMPERATURE}" --top-p "${TOP_P}" --tp "${TP}" --num-engines "${NUM_ENGINES}" --engine-backend "${ENGINE_BACKEND}" \
  --custom-config-path "${MEM_CONFIG}" "${EXTRA[@]}" "$@"
