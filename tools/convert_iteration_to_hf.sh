#!/usr/bin/env bash
# One trained iteration of SAVE_PATH -> an HF checkpoint (printed on the last line); the examples' CONVERT=1.
#   SAVE_PATH=/ckpt/mem_agent HF_CKPT=/models/Qwen3-4B [SINGLE_ITER=iter_0000050] [HF_OUT=DIR] \
#     bash tools/convert_iteration_to_hf.sh
set -euo pipefail
source "$(dirname "$0")/../_common.sh"
cd "${VIME_EXT_ROOT}"
SAVE_PATH=${SAVE_PATH:?set SAVE_PATH to the training save directory}
HF_CKPT=${HF_CKPT:?set HF_CKPT to the HF checkpoint training started from (config and tokenizer come from it)}
need "${SAVE_PATH}" SAVE_PATH
need "${HF_CKPT}/config.json" HF_CKPT
SINGLE_ITER=${SINGLE_ITER:-$(latest_iteration "${SAVE_PATH}" SAVE_PATH)}
need "${SAVE_PATH}/${SINGLE_ITER}" SINGLE_ITER
HF_OUT=${HF_OUT:-${SAVE_PATH}/hf/${SINGLE_ITER}}
if [ ! -f "${HF_OUT}/config.json" ]; then
  python tools/convert_torch_dist_to_hf.py --input-dir "${SAVE_PATH}/${SINGLE_ITER}" --output-dir "${HF_OUT}" \
    --origin-hf-dir "${HF_CKPT}" >&2
fi
echo "${HF_OUT}"
