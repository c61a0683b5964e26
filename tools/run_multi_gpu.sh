#!/usr/bin/env bash
# What needs several GPUs of one machine, one part per call (a device call runs at most 10 minutes); reports go
# under ${VIME_EXT_OUT:-/tmp/multi_gpu}. Needs the GPU wheel set (tools/gpu_wheels.py; `source /tmp/gpu_site/env.sh`).
#   bash tools/run_multi_gpu.sh tests      the pytest cases that need 2 GPUs: TP 2, PP 2, DP 2 and DP 2 with the
#                                          sharded optimizer against the one-GPU step, and the 2-rank resume
#                                          (PYTEST_K: pytest's -k, to run some of them)
#   bash tools/run_multi_gpu.sh nccl       Qwen3-4B-shaped weights pushed over NCCL to a vLLM engine on GPU 1,
#                                          timed, then the engine's log-probs against the trainer's
#   bash tools/run_multi_gpu.sh scaling    MemAgent's loop on every GPU (tools/bench_mem_agent_scaling.sh)
#   bash tools/run_multi_gpu.sh colocate   the GRPO smoke run with trainer and engines on every GPU, the engines
#                                          asleep while the trainer trains (tools/gpu_train_smoke.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
source _common.sh
VIME_EXT_OUT=${VIME_EXT_OUT:-/tmp/multi_gpu}
export VIME_EXT_OUT
mkdir -p "${VIME_EXT_OUT}"
if (( NUM_GPUS < 2 )); then
  echo "$(basename "$0"): needs 2 or more GPUs; found ${NUM_GPUS}" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "${VIME_EXT_OUT}/gpus.txt"
case "${1:-}" in
  tests)
    VIME_EXT_TINY_WITHOUT_TOKENIZER=1 python -m pytest -v -rs --durations=0 -p no:cacheprovider \
      ${PYTEST_K:+-k "${PYTEST_K}"} tests/train/test_actor_layouts.py tests/train/test_optimizer_resume.py 2>&1 | tee "${VIME_EXT_OUT}/multi_gpu_pytest.txt"
    ;;
  nccl)
    python tools/bench_weight_sync.py --shape qwen3-4b --transport nccl --pushes 3 --out "${VIME_EXT_OUT}/weight_sync_nccl.json"
    ;;
  scaling)
    bash tools/bench_mem_agent_scaling.sh
    ;;
  colocate)
    NUM_ROLLOUT=${NUM_ROLLOUT:-4} bash tools/gpu_train_smoke.sh --actor-num-gpus-per-node "${NUM_GPUS}"
    ;;
  *)
    echo "usage: $(basename "$0") tests|nccl|scaling|colocate" >&2
    exit 2
    ;;
esac
