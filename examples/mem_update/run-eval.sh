#!/usr/bin/env bash
# QA before and after the agent's edits on held-out conversations, for a served model.
#   MODEL_PATH=/models/Qwen3-4B TEST_DATA=/data/mem_update/test.jsonl bash examples/mem_update/run-eval.sh
#   CONVERT=1 SAVE_PATH=/ckpt/mem_update HF_CKPT=/models/Qwen3-4B bash examples/mem_update/run-eval.sh
# With CONVERT=1 the iteration SINGLE_ITER (default: the latest) of SAVE_PATH is converted to HF first. Results:
# RESULTS/SAVE_FILE.json. Extra arguments go to eval_mem_update.py (--vllm-X flags to the engine).
set -euo pipefail
source "$(dirname "$0")/common.sh"

TEST_DATA=${TEST_DATA:-/data/mem_update/test.jsonl}
RESULTS=${RESULTS:-results/mem_update}
if [ "${CONVERT:-0}" = "1" ]; then
  MODEL_PATH=$(bash tools/convert_iteration_to_hf.sh | tail -1)
fi
MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to an HF checkpoint, or CONVERT=1 with SAVE_PATH and HF_CKPT}
need "${MODEL_PATH}/config.json" MODEL_PATH
need "${TEST_DATA}" TEST_DATA
python -m examples.mem_update.eval_mem_update --model-path "${MODEL_PATH}" --test-data "${TEST_DATA}" \
  --save-dir "${RESULTS}" --save-file "${SAVE_FILE:-$(basename "${MODEL_PATH}")}" \
  --custom-config-path "${MEMUP_CONFIG}" "$@"
