"""Library warnings that vime_ext knows to be harmless, silenced when ``vime_ext`` is imported (in every process
that runs its code: the driver, Ray workers, engine servers). Each entry says why it is harmless; any other
warning still shows.
"""

import logging
import re
import warnings

# (message pattern, category, why it is harmless)
WARNINGS = [
    (r".*(Transformer Engine|Apex) .*not installed", UserWarning,
     "megatron-core says at import that it falls back to torch layers and optimizers; vime_ext picks the layers "
     "it can run itself (SDPA + fused RoPE on CUDA, the local spec elsewhere)"),
    (r"full scope is deprecated", UserWarning,
     "megatron-core's own default for cuda_graph_modules triggers it; vime_ext captures no CUDA graphs"),
    (r"Please use DTensor instead and we are deprecating ShardedTensor", FutureWarning,
     "megatron-core's torch_dist format is built on ShardedTensor; the checkpoints load and save as tested"),
    (r"The argument order of load has been changed", UserWarning,
     "torch.distributed.checkpoint says so to every caller of load; megatron-core passes its arguments by name"),
    (r"MimoModelConfig is experimental", UserWarning,
     "printed when megatron-core's optimizer package is imported (it imports its multimodal models); vime_ext "
     "builds no MimoModel"),
    (r"torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a single "
     r"process", UserWarning,
     "the conversion tool reads a checkpoint in one process on purpose; that is the intent torch assumes"),
]
# (logger, message pattern, why it is harmless)
LOG_MESSAGES = [
    ("megatron.core.dist_checkpointing.strategies.torch", r"MCore's async save is deprecated",
     "logged on every torch_dist save from the strategy's default argument; vime_ext saves synchronously"),
    ("megatron.core.distributed.distributed_data_parallel", r"full_param_layout not provided",
     "megatron's DDP then computes the distributed optimizer's parameter layout itself, with the same function "
     "its callers are asked to call; vime_ext lets it (one place decides bucket sizes)"),
    ("megatron.core.models.gpt.gpt_model", r"GPTModel IS DEPRECATED",
     "logged for every model built; megatron-core 0.19 still maintains GPTModel, which vime_ext pins"),
]


def install() -> None:
    for pattern, category, _why in WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    for name, pattern, _why in LOG_MESSAGES:
        compiled = re.compile(pattern)
        logging.getLogger(name).addFilter(lambda record, p=compiled: not p.search(record.getMessage()))
