"""Build a megatron-core ``GPTModel`` for a ``ModelShape`` on this rank's pipeline stage."""

import torch

from vime_ext.models.model_config import (ATTENTION_KINDS, ModelShape, ParallelConfig, default_attention,
                                          padded_vocab_size, transformer_config)
from vime_ext.trainer import cpu_shim


def layer_spec(shape: ModelShape, attention: str):
    """The layer spec for ``attention``: "te", "sdpa" (local spec, SDPA core attention) or "local"."""
    from megatron.core.models.gpt import gpt_layer_specs

    if attention == "te":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=shape.qk_layernorm)
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention {attention!r} is not one of {ATTENTION_KINDS}")
    spec = gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=shape.qk_layernorm, normalization="RMSNorm")
    if attention == "sdpa":
        from vime_ext.trainer.sdpa_attention import SDPAAttention

        spec.submodules.self_attention.submodules.core_attention = SDPAAttention
    return spec


def build_gpt_model(
    shape: ModelShape,
    parallel: ParallelConfig,
    dtype: torch.dtype = torch.float32,
    init_weights: bool = True,
    recompute: str | None = None,
    attention: str | None = None,
    recompute_num_layers: int | None = None,
    rope_fusion: bool | None = None,
):
    """The model chunk of this rank; ``megatron.core.parallel_state`` must already be initialised.

    ``attention=None`` picks ``default_attention()``; ``rope_fusion=None`` fuses RoPE on CUDA with the SDPA spec
    (``fused_rope.py``; TE's own with the TE spec is not switched on here).
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    cpu_shim.install()
    attention = attention or default_attention()
    if parallel.sequence_parallel and attention != "te":
        raise ValueError("sequence_parallel needs Transformer Engine layers: megatron-core's local layer spec "
                         "normalises with torch norms, which do not support it")
    if rope_fusion is None:
        rope_fusion = attention == "sdpa" and torch.cuda.is_available()
    if rope_fusion:
        from vime_ext.trainer import fused_rope

        fused_rope.install()
    config = transformer_config(shape, parallel, dtype=dtype, recompute=recompute, init_weights=init_weights,
                                recompute_num_layers=recompute_num_layers, rope_fusion=rope_fusion)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(shape, attention),
        vocab_size=padded_vocab_size(shape, parallel.tensor_model_parallel_size),
        max_sequence_length=shape.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,  # logits stay vocab-sharded under TP; losses use vocab-parallel kernels
        share_embeddings_and_output_weights=shape.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(shape.rope_theta),
    )
    if dtype != torch.float32:
        norms_in_model_dtype(model, dtype)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def norms_in_model_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """megatron-core's local spec builds its torch norms in fp32 whatever ``params_dtype`` says (megatron casts
    them later, in ``Float16Module``, which vime_ext does not use). A bf16 input with an fp32 weight keeps
    ``torch.rms_norm`` off its fused kernel (about six elementwise kernels instead of one, each way), so the
    norms take the model's dtype; the optimizer keeps fp32 master copies, as for every other bf16 weight."""
    for module in model.modules():
        if isinstance(module, (torch.nn.RMSNorm, torch.nn.LayerNorm)):
            module.to(dtype)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP/Float16Module-style wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model
