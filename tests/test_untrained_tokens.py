"""vime_ext/rollout/untrained_tokens.py on a tiny Qwen2 with the real Qwen tokenizer, its vocabulary's tail and the
two tool-call tokens given one shared vector in both matrices, as Qwen2.5-Coder-1.5B-Instruct has them."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from tests.conftest import make_tiny_hf_dir
from vime_ext.rollout.untrained_tokens import EMBEDDING, OUTPUT, checkpoint_to_train, find_untrained, main

CALL_CHAT = {
    "messages": [{"role": "user", "content": "Find the note about Paris."},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"type": "function", "function": {"name": "search", "arguments": {"query": "Paris"}}}]},
                 {"role": "tool", "content": "Paris is in France."},
                 {"role": "assistant", "content": "It says Paris is in France."}],
    "tools": [{"type": "function", "function": {"name": "search", "description": "Search the notes.",
                                                "parameters": {"type": "object", "properties": {
                                                    "query": {"type": "string"}}}}}]}
PLAIN_CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}


def untrained_model(tmp_path):
    """A tiny Qwen2 whose rows past the tokenizer's tokens and whose <tool_call> and </tool_call> rows share one
    vector, with the ids of those two tokens."""
    hf = make_tiny_hf_dir("qwen2", tmp_path / "base", seed=3)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    call, close = tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    tensors = load_file(hf / "model.safetensors")
    for name in (EMBEDDING, OUTPUT):
        vector = 0.02 * torch.randn(tensors[name].shape[1])
        tensors[name][151665:] = vector
        tensors[name][[call, close]] = vector
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    return hf, tensors, call, close


def test_untrained_rows_the_chats_train_on_start_from_their_spelling(tmp_path, capsys):
    hf, before, call, close = untrained_model(tmp_path)
    chats, plain = tmp_path / "chats.jsonl", tmp_path / "plain.jsonl"
    chats.write_text(json.dumps(CALL_CHAT) + "\n")
    plain.write_text(json.dumps(PLAIN_CHAT) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(hf)

    found = find_untrained(hf, str(chats))
    assert [(t.token_id, t.text) for t in found] == [(call, "<tool_call>"), (close, "</tool_call>")]
    assert tokenizer.convert_ids_to_tokens(list(found[0].spelling)) == ["<", "tool", "_call", ">"]
    assert tokenizer.decode(list(found[1].spelling)) == "</tool_call>"

    out = checkpoint_to_train(hf, str(chats), tmp_path / "started")
    assert out == tmp_path / "started" and (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    after = load_file(out / "model.safetensors")
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        if name not in (EMBEDDING, OUTPUT):
            assert torch.equal(after[name], tensor), name
            continue
        for token in found:
            assert torch.allclose(after[name][token.token_id], tensor[list(token.spelling)].mean(0))
        untouched = torch.ones(len(tensor), dtype=torch.bool)
        untouched[[call, close]] = False
        assert torch.equal(after[name][untouched], tensor[untouched])
    assert find_untrained(out, str(chats)) == []  # the started rows are the padding vector no more
    record = json.loads((out / "started_rows.json").read_text())
    assert record["from"] == str(hf) and [t["text"] for t in record["tokens"]] == ["<tool_call>", "</tool_call>"]
    (out / "model.safetensors").unlink()  # written once: a second call with the same source keeps the folder
    assert checkpoint_to_train(hf, str(chats), out) == out and not (out / "model.safetensors").exists()

    # chats that train on no untrained row (a plain reply), or a model without the padding signature: as it is
    assert checkpoint_to_train(hf, str(plain), tmp_path / "unused") == hf and not (tmp_path / "unused").exists()
    random = make_tiny_hf_dir("qwen2", tmp_path / "random", seed=4)
    assert checkpoint_to_train(random, str(chats), tmp_path / "unused") == random
    main(["--hf", str(hf), "--chats", str(plain), "--out", str(tmp_path / "unused")])
    assert capsys.readouterr().out.strip() == str(hf)
    bad = tmp_path / "bad.jsonl"  # a chat without an assistant turn: one line naming the file and line, no trace
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    with pytest.raises(SystemExit, match=f"untrained_tokens: {bad}:1: "):
        main(["--hf", str(hf), "--chats", str(bad), "--out", str(tmp_path / "unused")])
    with pytest.raises(SystemExit, match="holds the started rows of another checkpoint"):
        main(["--hf", str(random), "--chats", str(chats), "--out", str(out)])
