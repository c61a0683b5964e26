#!/usr/bin/env bash
# Run the test suite's GPU-relevant part on an offline CUDA machine whose Python already has torch and
# transformers: installs the wheels found in WHEELS_DIR (megatron-core, psutil) without an index, then runs
# pytest with the `gpu` tests enabled. Writes the pytest report to ${OUT:-.}/gpu_pytest.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS_DIR=${WHEELS_DIR:-.gpu_wheels}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip install -q --no-index --no-deps "$WHEELS_DIR"/*.whl 2>&1 | tail -2
python3 -W ignore -c "import torch, transformers, megatron.core; print('torch', torch.__version__, \
'| transformers', transformers.__version__, '| megatron-core', megatron.core.__version__)"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1
python3 -m pytest -q -rs -p no:cacheprovider -m "not slow" "$@" 2>&1 | tee "${OUT:-.}/gpu_pytest.txt" | tail -60
