#!/usr/bin/env bash
# MemUpdate GRPO on Qwen3-4B with LoCoMo (prepare it first: python -m examples.mem_update.prepare_data --locomo
# locomo10.json --out-dir $DATA_ROOT). Set the variables below; every one has a default. Extra arguments go to
# train.py.
#   HF_CKPT=/models/Qwen3-4B DATA_ROOT=/data/mem_update SAVE_PATH=/ckpt/mem_update \
#     bash examples/mem_update/run-qwen3-4b-train.sh
set -euo pipefail
source "$(dirname "$0")/common.sh"

DATA_ROOT=${DATA_ROOT:-/data/mem_update}
TRAIN_DATA=${TRAIN_DATA:-${DATA_ROOT}/train.jsonl}
SAVE_PATH=${SAVE_PATH:-/ckpt/mem_update_qwen3-4b}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-16} GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-128}
TURN_TOKENS=${TURN_TOKENS:-512}

need "${MEMUP_CONFIG}" MEMUP_CONFIG
grpo_qwen3_4b_train "${MEMUP_PLUGIN_ARGS[@]}" --eps-clip-high 0.28 --rollout-max-response-len "${TURN_TOKENS}" "$@"
