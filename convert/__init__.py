"""HF <-> Megatron weight mapping, one file per model family."""

from vime_ext.convert import llama, qwen2, qwen3
from vime_ext.convert.mapping import Family, WeightMapping
from vime_ext.models.model_config import ModelShape

FAMILIES: dict[str, Family] = {f.FAMILY.name: f.FAMILY for f in (qwen3, qwen2, llama)}


def mapping_for(shape: ModelShape) -> WeightMapping:
    return WeightMapping(FAMILIES[shape.family], shape)
