#!/usr/bin/env bash
# Both examples' SmolLM2 learning recipes (run-smollm2-gpu.sh `all`) at once on one machine of 4 GPUs, as one
# background job (a device lease is 30 minutes): MemAgent's seeds (SEEDS, default "0 1 2") a GPU each on
# MEM_AGENT_GPUS (default 0,1,2), its base model's evaluation beside the first seed; MemUpdate's seeds
# (MEM_UPDATE_SEEDS, default "0") on MEM_UPDATE_GPUS (default 3), its base model's evaluation after them.
# MEM_AGENT_ENV / MEM_UPDATE_ENV hold one example's variables ("RL_ROLLOUTS=16 RL_LR=2e-5 RL_MINUTES=9": GRPO
# stops and saves after 9 minutes, so that the evaluation after it fits a 30-minute lease); variables set
# around this script reach both; EXAMPLES (default "mem_agent mem_update") picks the examples run. Two recipes on
# one GPU compete for it (a trainer's memory churn can spoil an engine's start): give each GPUs of its own.
# Everything goes under VIME_EXT_OUT (default runs/learning)/<example>:
#   bash tools/gpu_learning.sh run         # both at once; start/end lines in VIME_EXT_OUT/learning.log
#   bash tools/gpu_learning.sh pack FILE   # what a person reads, no weights and no generated data: eval JSONL
#                                          # and summaries, tables, training metrics, logs; FILE.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${VIME_EXT_OUT:-runs/learning}
mkdir -p "${OUT_DIR}"

log() { echo "$(date +%T) $*" | tee -a "${OUT_DIR}/learning.log"; }

# recipe EXAMPLE GPUS SEEDS ENV: the example's `all` stage, logged to OUT_DIR/EXAMPLE.log
recipe() {
  local example=$1 gpus=$2 seeds=$3 status=0
  log "start ${example} (GPUs ${gpus}, seeds ${seeds}) ${4}"
  # shellcheck disable=SC2086  # ENV is a list of NAME=VALUE words
  env ${4} CUDA_VISIBLE_DEVICES="${gpus}" SEEDS="${seeds}" VIME_EXT_OUT="${OUT_DIR}/${example}" \
    bash "examples/${example}/run-smollm2-gpu.sh" all >"${OUT_DIR}/${example}.log" 2>&1 || status=$?
  log "end ${example}: exit ${status}"
  return "${status}"
}

run() {
  local pids=() status=0 pid
  if command -v nvidia-smi >/dev/null; then  # the machine, for the record beside the figures
    log "machine: $(nvidia-smi -L | wc -l) x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  fi
  local examples=" ${EXAMPLES:-mem_agent mem_update} "
  if [[ "${examples}" == *" mem_agent "* ]]; then
    recipe mem_agent "${MEM_AGENT_GPUS:-0,1,2}" "${SEEDS:-0 1 2}" "${MEM_AGENT_ENV:-}" & pids+=($!)
  fi
  if [[ "${examples}" == *" mem_update "* ]]; then
    recipe mem_update "${MEM_UPDATE_GPUS:-3}" "${MEM_UPDATE_SEEDS:-0}" "${MEM_UPDATE_ENV:-}" & pids+=($!)
  fi
  for pid in "${pids[@]}"; do wait "${pid}" || status=1; done
  log "done: exit ${status}"
  return "${status}"
}

# pack FILE: the readable results so far (the run may still be going), weights and generated data left out
pack() {
  local file=${1:?usage: gpu_learning.sh pack FILE}
  (cd "${OUT_DIR}" && find . \( -path '*/data' -o -name 'iter_*' -o -name 'hf' \) -prune -o \
    -type f \( -name '*.jsonl' -o -name '*.json' -o -name '*.md' -o -name '*.png' -o -name '*.log' \
    -o -name 'events.out.tfevents.*' -o -name 'latest_checkpointed_iteration.txt' \) -print0 |
    tar --null -czf - -T -) >"${file}.tar.gz"
  echo "${file}.tar.gz: $(du -h "${file}.tar.gz" | cut -f1)"
}

case "${1:-}" in
  run) run ;;
  pack) pack "${2:-}" ;;
  *) echo "usage: gpu_learning.sh run|pack FILE" >&2; exit 2 ;;
esac
