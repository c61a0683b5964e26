"""The shape of a decoder-only transformer, read from an HF ``config.json``, and its Megatron config."""

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

# HF ``model_type`` -> family name used by ``convert/``.
SUPPORTED_MODEL_TYPES = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama"}


@dataclass(frozen=True)
class ModelShape:
    """Everything needed to build the Megatron model and map its weights; independent of parallelism."""

    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool

    @classmethod
    def from_hf_config(cls, config: dict, source: str = "config") -> "ModelShape":
        """Build from an HF config dict; ``source`` names the file in error messages."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{source}: model_type={model_type!r} is not supported; "
                f"supported: {sorted(SUPPORTED_MODEL_TYPES)}"
            )

        def field(name: str, default=None):
            if name in config and config[name] is not None:
                return config[name]
            if default is None:
                raise ValueError(f"{source}: required field {name!r} is missing")
            return default

        rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"{source}: rope scaling {rope} is not supported (only plain RoPE)")
        if config.get("mlp_bias"):
            raise ValueError(f"{source}: mlp_bias=true is not supported")
        if field("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act={config['hidden_act']!r} is not supported (only silu)")
        if config.get("attention_bias") and model_type != "qwen2":
            raise ValueError(f"{source}: attention_bias=true is only supported for qwen2")

        hidden = field("hidden_size")
        heads = field("num_attention_heads")
        return cls(
            family=SUPPORTED_MODEL_TYPES[model_type],
            num_layers=field("num_hidden_layers"),
            hidden_size=hidden,
            ffn_hidden_size=field("intermediate_size"),
            num_attention_heads=heads,
            num_query_groups=field("num_key_value_heads", heads),
            head_dim=field("head_dim", hidden // heads),
            vocab_size=field("vocab_size"),
            max_position_embeddings=field("max_position_embeddings", 4096),
            rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            norm_eps=float(field("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_layernorm=model_type == "qwen3",
        )

    @classmethod
    def from_hf_dir(cls, hf_dir: str | Path) -> "ModelShape":
        path = Path(hf_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json in the HF checkpoint directory")
        return cls.from_hf_config(json.loads(path.read_text()), source=str(path))


@dataclass(frozen=True)
class ParallelConfig:
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    sequence_parallel: bool = False

    @property
    def model_parallel_size(self) -> int:
        """Ranks that hold one copy of the model (TP x PP)."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size


def padded_vocab_size(shape: ModelShape, tp: int) -> int:
    """Vocab rows rounded up so the embedding splits evenly across TP ranks; extra rows are sliced off logits."""
    return -(-shape.vocab_size // tp) * tp


def transformer_config(
    shape: ModelShape,
    parallel: ParallelConfig,
    dtype: torch.dtype = torch.float32,
    recompute: Optional[str] = None,
    init_weights: bool = True,
    recompute_num_layers: Optional[int] = None,
    rope_fusion: bool = False,
):
    """The megatron-core ``TransformerConfig`` for this shape; dropout off (RL fine-tuning does not use it).

    ``recompute="full"`` recomputes every layer, or with ``recompute_num_layers=N`` the first N layers of each
    pipeline stage (megatron's "block" method: memory for speed in between)."""
    from megatron.core.transformer import TransformerConfig

    if parallel.sequence_parallel and parallel.tensor_model_parallel_size == 1:
        raise ValueError("sequence_parallel needs tensor_model_parallel_size > 1")
    if shape.num_layers % parallel.pipeline_model_parallel_size:
        raise ValueError(
            f"num_layers={shape.num_layers} is not divisible by "
            f"pipeline_model_parallel_size={parallel.pipeline_model_parallel_size}"
        )
    for name, value in (("num_attention_heads", shape.num_attention_heads),
                        ("num_query_groups", shape.num_query_groups)):
        if value % parallel.tensor_model_parallel_size:
            raise ValueError(
                f"{name}={value} is not divisible by tensor_model_parallel_size="
                f"{parallel.tensor_model_parallel_size}"
            )
    on_cpu = not torch.cuda.is_available()
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # On CUDA, megatron's SwiGLU autograd function: one kernel each way, and only its input kept for
        # backward. Off on the CPU, where its TorchScript fuser buys nothing.
        bias_activation_fusion=not on_cpu,
        bias_dropout_fusion=False,
        apply_rope_fusion=rope_fusion,  # needs a fused kernel in megatron's slot (TE's, or fused_rope.install())
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        sequence_parallel=parallel.sequence_parallel,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        pipeline_dtype=dtype,
        use_cpu_initialization=on_cpu,
        perform_initialization=init_weights,
        recompute_granularity=recompute,
        recompute_method=("block" if recompute_num_layers else "uniform") if recompute == "full" else None,
        recompute_num_layers=(recompute_num_layers or 1) if recompute == "full" else None,
    )


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str, hf_dir: str | Path | None = None) -> torch.dtype:
    """``float32`` / ``bfloat16`` / ``float16``, or ``auto``: the dtype recorded in the HF ``config.json``."""
    if name == "auto":
        config = json.loads((Path(hf_dir) / "config.json").read_text()) if hf_dir else {}
        name = config.get("dtype") or config.get("torch_dtype") or "float32"
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; choose from auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


def transformer_engine_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


ATTENTION_KINDS = ("te", "sdpa", "local")


def default_attention(packed: bool = False) -> str:
    """Transformer Engine layers when TE imports on CUDA, SDPA attention on CUDA without TE, megatron-core's
    local layers on the CPU (where the parity tests pin them) unless sequences are ``packed``, which the local
    layers cannot attend over (SDPA then, which runs on the CPU too)."""
    if transformer_engine_available():
        return "te"
    return "sdpa" if torch.cuda.is_available() or packed else "local"
