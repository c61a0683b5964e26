"""Build a megatron-core ``GPTModel`` for a ``ModelShape`` on this rank's pipeline stage."""

import importlib.util
import warnings

import torch

# megatron-core announces at import that TE/apex are absent; vime_ext already picks the layers it can run.
warnings.filterwarnings("ignore", message=r".*(Transformer Engine|Apex) .*not installed", category=UserWarning)

from vime_ext.trainer import cpu_shim
from vime_ext.trainer.model_config import ModelShape, ParallelConfig, padded_vocab_size, transformer_config


def transformer_engine_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


def layer_spec(shape: ModelShape, use_te: bool):
    """Transformer Engine layers, or megatron-core's local layers."""
    from megatron.core.models.gpt import gpt_layer_specs

    if use_te:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=shape.qk_layernorm)
    return gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=shape.qk_layernorm, normalization="RMSNorm")


def build_gpt_model(
    shape: ModelShape,
    parallel: ParallelConfig,
    dtype: torch.dtype = torch.float32,
    init_weights: bool = True,
    recompute: str | None = None,
    use_te: bool | None = None,
):
    """The model chunk of this rank; ``megatron.core.parallel_state`` must already be initialised.

    ``use_te=None`` picks Transformer Engine layers when TE imports and CUDA is present.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    cpu_shim.install()
    if use_te is None:
        use_te = transformer_engine_available()
    if parallel.sequence_parallel and not use_te:
        raise ValueError("sequence_parallel needs Transformer Engine layers: megatron-core's local layer spec "
                         "normalises with torch norms, which do not support it")
    config = transformer_config(shape, parallel, dtype=dtype, recompute=recompute, init_weights=init_weights)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(shape, use_te),
        vocab_size=padded_vocab_size(shape, parallel.tensor_model_parallel_size),
        max_sequence_length=shape.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,  # logits stay vocab-sharded under TP; losses use vocab-parallel kernels
        share_embeddings_and_output_weights=shape.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(shape.rope_theta),
    )
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP/Float16Module-style wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model
