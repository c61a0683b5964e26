#!/usr/bin/env bash
# A few GRPO steps of SmolLM2-135M-Instruct on one GPU, the demo's task (one-word answers), colocated: the
# Megatron trainer and the engine share the GPU and the engine sleeps while the trainer trains.
#   ENGINE=vllm (default): through Ray, a vLLM engine behind vllm-router, weights over CUDA IPC. Needs the wheel
#                          set of tools/gpu_wheels.py installed (source /tmp/gpu_site/env.sh).
#   ENGINE=hf:             the transformers engine without Ray (wheels of tools/run_gpu_tests.sh suffice).
#   DTYPE=bf16 (default) or fp32: trainer and engine alike.
# Prints each rollout's metrics, including the step time split (time/*) and the trainer-vs-engine log-prob
# difference after each weight update (train/logprob_abs_diff_*). Extra arguments are passed to train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 VIME_EXT_CACHE=${VIME_EXT_CACHE:-/tmp/vime_ext_cache}
ENGINE=${ENGINE:-vllm} DTYPE=${DTYPE:-bf16} NUM_ROLLOUT=${NUM_ROLLOUT:-8}
OUT_DIR=${VIME_EXT_OUT:-/tmp}/gpu_train_${ENGINE}_${DTYPE}
mkdir -p "$OUT_DIR"
HF_DIR=$(source _common.sh && model_dir smollm2-135m)
python3 -m vime_ext.data.synthetic --task one_word --num 256 --out "$OUT_DIR/yesno.jsonl"
ARGS=(--engine-backend "$ENGINE")
case "$ENGINE" in
  vllm) ARGS+=(--engine-max-model-len 1024 --vllm-enforce-eager) ;;
  hf) ARGS+=(--no-ray) ;;
  *) echo "ENGINE=$ENGINE: choose vllm or hf" >&2; exit 2 ;;
esac
case "$DTYPE" in
  bf16) ARGS+=(--bf16 --engine-dtype bfloat16) ;;
  fp32) ARGS+=(--engine-dtype float32) ;;
  *) echo "DTYPE=$DTYPE: choose bf16 or fp32" >&2; exit 2 ;;
esac
python3 -m vime_ext.train --hf-checkpoint "$HF_DIR" --prompt-data "$OUT_DIR/yesno.jsonl" --colocate "${ARGS[@]}" \
  --rollout-batch-size 16 --n-samples-per-prompt 8 --rollout-max-response-len 32 --rollout-shuffle \
  --global-batch-size 64 --micro-batch-size 16 \
  --custom-rm-path vime_ext.agent.rewards.first_word_match --lr 1e-5 --use-kl-loss --kl-loss-coef 0.01 \
  --num-rollout "$NUM_ROLLOUT" --save "$OUT_DIR/ckpt" --tensorboard-dir "$OUT_DIR/tb" "$@" 2>&1 \
  | grep -v "it/s\]\|sample/s\]\|tensor/s\]\|s/it\]\|s/sample\]" | tail -40
cp "$OUT_DIR/tb/metrics.jsonl" "${VIME_EXT_OUT:-/tmp}/gpu_train_${ENGINE}_${DTYPE}_metrics.jsonl"
