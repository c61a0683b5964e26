#!/usr/bin/env bash
# MemAgent's GRPO loop (examples/mem_agent/run-qwen3-4b-train.sh) on a Qwen3-4B-shaped model with random weights,
# on every GPU of this machine: the trainer on half of them (TP 2 from 2 trainer GPUs on), vLLM engines behind
# vllm-router on the other half, weights pushed over NCCL; a few rollouts of generated HotpotQA-style data, no
# checkpoint (bf16 weights, fp32 masters and two moments: 14 bytes a parameter, 56 GB for 4B). Prints the row.
# Run it on machines of 2, 4 and 8 GPUs, then pass the run folders to tools/scaling_table.py for how each phase
# scales. Needs the GPU wheel set of tools/gpu_wheels.py (vLLM, Ray, megatron-core); extra arguments go to train.py.
#   VIME_EXT_OUT=/tmp/scaling NUM_ROLLOUT=3 NUM_DOCS=200 bash tools/bench_mem_agent_scaling.sh
#   python tools/scaling_table.py /tmp/scaling/mem_agent_scaling_{2,4,8}gpu --out scaling.json
set -euo pipefail
source "$(dirname "$0")/../_common.sh"
cd "${VIME_EXT_ROOT}"
if (( NUM_GPUS < 2 )); then
  echo "$(basename "$0"): needs 2 or more GPUs (trainer and engines on GPUs of their own); found ${NUM_GPUS}" >&2
  exit 1
fi
ROOT=${VIME_EXT_OUT:-/tmp}/mem_agent_scaling_${NUM_GPUS}gpu
ACTOR_GPUS=$((NUM_GPUS / 2))
ROLLOUT_GPUS=$((NUM_GPUS - ACTOR_GPUS))
TP=$((ACTOR_GPUS >= 2 ? 2 : 1))
mkdir -p "${ROOT}"
# The 8 GB model and its torch_dist copy live outside VIME_EXT_OUT (which may be copied back) and are made once.
MODEL_DIR=${MODEL_DIR:-/tmp/qwen3-4b-random}
if [ ! -f "${MODEL_DIR}/config.json" ]; then
  python tools/make_random_hf.py --shape qwen3-4b --out "${MODEL_DIR}"
fi
# 200 generated documents are ~8.7k Qwen tokens: 5 chunks of MEM_CHUNK_TOKENS=2048, each a turn that (random
# weights rarely stop early) writes a full 1024-token memory, then the answer turn.
python -m examples.mem_agent.prepare_data --generate --num 64 --num-docs "${NUM_DOCS:-200}" --out "${ROOT}/train.jsonl"
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
printf '{"gpus": %d, "actor_gpus": %d, "rollout_gpus": %d, "tp": %d, "device": "%s"}\n' \
  "${NUM_GPUS}" "${ACTOR_GPUS}" "${ROLLOUT_GPUS}" "${TP}" "${DEVICE}" > "${ROOT}/run.json"
rm -f "${ROOT}/tb/metrics.jsonl"  # the table reads this run's rollouts only
HF_CKPT="${MODEL_DIR}" TORCH_DIST="${MODEL_DIR}_torch_dist" TRAIN_DATA="${ROOT}/train.jsonl" SAVE_PATH="${ROOT}/ckpt" \
  NUM_ROLLOUT=${NUM_ROLLOUT:-3} ACTOR_GPUS=${ACTOR_GPUS} ROLLOUT_GPUS=${ROLLOUT_GPUS} TP=${TP} SAVE_INTERVAL=0 \
  bash examples/mem_agent/run-qwen3-4b-train.sh --tensorboard-dir "${ROOT}/tb" "$@"
python tools/scaling_table.py "${ROOT}"
