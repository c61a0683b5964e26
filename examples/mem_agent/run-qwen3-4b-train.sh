#!/usr/bin/env bash
# MemAgent GRPO on Qwen3-4B: vime's recipe (KL low_var_kl 0.001, eps-clip 0.2/0.3, lr 1e-6 constant, TP 2, full
# recompute). Set the variables below; every one has a default. Extra arguments go to train.py.
#   HF_CKPT=/models/Qwen3-4B TRAIN_DATA=/data/hotpotqa_train.jsonl SAVE_PATH=/ckpt/mem_agent \
#     bash examples/mem_agent/run-qwen3-4b-train.sh
set -euo pipefail
source "$(dirname "$0")/common.sh"

DATA_ROOT=${DATA_ROOT:-/data/mem_agent}
TRAIN_DATA=${TRAIN_DATA:-${DATA_ROOT}/hotpotqa_train.jsonl}
SAVE_PATH=${SAVE_PATH:-/ckpt/mem_agent_qwen3-4b}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-8} GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-64}

need "${MEM_CONFIG}" MEM_CONFIG
grpo_qwen3_4b_train "${MEM_PLUGIN_ARGS[@]}" "${ADVANTAGE_ARGS[@]}" --eps-clip-high 0.3 \
  --rollout-max-response-len "${MEM_MAX_MEMORY}" "$@"
