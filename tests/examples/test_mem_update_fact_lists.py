"""Generated fact lists (examples/mem_update/fact_lists.py) in the real fact consolidation format, split into
prompt data, and the sweep demonstrations trained on them (demonstrations.py --sweep-prompts)."""

import json

import pytest

from examples.mem_update.demonstrations import main as demonstrations
from examples.mem_update.fact_consolidation import FACT_LINE, slot, superseded
from examples.mem_update.fact_lists import generate_fact_list
from examples.mem_update.prepare_data import main as prepare
from examples.mem_update.prompts import wrote_rationale
from examples.mem_update.store import STORE


def test_a_list_restates_slots_later_and_asks_for_their_latest_values():
    lists = [generate_fact_list(k, facts=120, restated=40, questions=30) for k in range(2)]
    for facts in lists:
        texts = [m["content"] for m in facts.memories]
        assert [int(FACT_LINE.fullmatch(t).group(1)) for t in texts] == list(range(120))  # numbered in order
        assert all(slot(t) is not None for t in texts)  # every fact in a template slot.py reads
        assert len(superseded(facts.memories)) == 40  # each restated slot: one older statement
        latest = {slot(t): t for t in texts}  # each slot's last statement (later ones overwrite)
        restated = {slot(m["content"]) for m in facts.memories if m["id"] in superseded(facts.memories)}
        asked = 0
        for item in facts.qa:
            assert item["category"] == 4
            # the question names the slot's subject; its answer is the value of the slot's last statement
            named = [w for w in item["question"].rstrip("?").split()[1:] if w[0].isupper()]
            matches = [s for s, t in latest.items()
                       if t.endswith(f" {item['answer']}.") and all(w in s for w in named)]
            assert matches, item
            asked += any(s in restated for s in matches)
        assert len(facts.qa) == 30 and asked >= round(30 * 0.82)
    assert lists[0].memories != lists[1].memories
    assert generate_fact_list(0, facts=120, restated=40, questions=30) == lists[0]  # reproducible
    with pytest.raises(ValueError, match="restated 70: a list of 120 facts restates between 0 and 60"):
        generate_fact_list(0, facts=120, restated=70)


def test_prepare_data_refuses_list_sizes_that_cannot_be_made(tmp_path):
    with pytest.raises(SystemExit, match="prepare_data: --facts: restated 70: a list of 120 facts restates"):
        prepare(["--generate-fact-lists", "--facts", "120", "70", "--out-dir", str(tmp_path)])


def test_prepared_lists_give_sweep_demonstrations_that_delete_only_older_statements(tmp_path):
    # lists of 60 facts (the real size, 455, makes each chat about 7,000 tokens), 40 slots: 40 questions each
    summary = prepare(["--generate-fact-lists", "--num-conversations", "4", "--n-test", "1", "--n-val", "1",
                       "--facts", "60", "20", "--out-dir", str(tmp_path), "--extra-questions", "2"])
    assert summary["train"]["prompts"] == 80 and summary["test"]["prompts"] == 40
    assert summary["train"]["memories_per_conversation"] == [60, 60]
    demonstrations(["--sweep-prompts", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "sft.jsonl"),
                    "--retriever", "bm25"])
    chats = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(chats) == 80 and len(STORE) == 0
    for chat, record in zip(chats, records):
        messages = chat["messages"]
        assert messages[1]["content"].startswith(f"Question to prepare for: {record['prompt']}")
        calls = [c["function"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert calls[0] == {"name": "search_memory", "arguments": {"query": record["prompt"], "top_k": 20}}
        assert sum(c["name"] == "search_memory" for c in calls) == 5 and messages[-1]["role"] == "assistant"
        deleted = {c["arguments"]["memory_id"] for c in calls if c["name"] == "delete_memory"}
        # every delete is an older statement of a restated slot; with 60 facts and 20 per search most are seen
        assert deleted and deleted <= set(superseded(record["metadata"]["memories"]))
        assert sum(m["role"] == "tool" for m in messages) == len(calls)
    with pytest.raises(SystemExit, match="--sweep-prompts takes"):  # LoCoMo-format records are refused by line
        (tmp_path / "locomo.jsonl").write_text(json.dumps({"prompt": "Q?", "metadata": {"memories": [
            {"id": "m1", "content": "Ada lives in Oslo.", "source": "observation"}]}}) + "\n")
        demonstrations(["--sweep-prompts", str(tmp_path / "locomo.jsonl"), "--out", str(tmp_path / "x.jsonl")])


@pytest.mark.parametrize("flags, message", [
    (["--sweep-prompts", "train.jsonl", "--n-test", "2", "--seed", "1"], "--n-test, --seed: only with --locomo"),
    (["--sweep-prompts", "train.jsonl", "--no-answer-note"], "--no-answer-note: only with --locomo"),
    (["--locomo", "locomo.json", "--sweep-searches", "3"], "--sweep-searches: only with --sweep-prompts"),
    (["--sweep-prompts", "train.jsonl", "--max-tokens", "4096"], "--max-tokens: only with --tokenizer"),
])
def test_a_flag_of_the_other_source_is_refused_not_ignored(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        demonstrations([*flags, "--out", str(tmp_path / "sft.jsonl")])
    assert message in capsys.readouterr().err and not (tmp_path / "sft.jsonl").exists()


def test_a_sweep_chat_over_the_policys_context_is_played_with_fewer_searches(tmp_path, tiny_hf_dirs):
    """--tokenizer/--max-tokens: each chat within the policy's context (SmolLM2's template renders the real-size
    chats of five searches past its 8,192 tokens), the searches it holds counted; none fits: a clear error."""
    from transformers import AutoTokenizer

    from examples.mem_update.demonstrations import chat_tokens

    prepare(["--generate-fact-lists", "--num-conversations", "3", "--n-test", "1", "--facts", "60", "20",
             "--out-dir", str(tmp_path)])
    train = tmp_path / "train.jsonl"
    demonstrations(["--sweep-prompts", str(train), "--out", str(tmp_path / "full.jsonl"), "--retriever", "bm25"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["qwen3"])
    full = [chat_tokens(tokenizer, json.loads(line)["messages"]) for line in (tmp_path / "full.jsonl").open()]
    limit = min(full) - 1  # every chat of five searches is over it
    demonstrations(["--sweep-prompts", str(train), "--out", str(tmp_path / "fit.jsonl"), "--retriever", "bm25",
                    "--tokenizer", str(tiny_hf_dirs["qwen3"]), "--max-tokens", str(limit)])
    fit = [json.loads(line)["messages"] for line in (tmp_path / "fit.jsonl").open()]
    assert len(fit) == len(full) and all(chat_tokens(tokenizer, chat) <= limit for chat in fit)
    searches = [sum(c["function"]["name"] == "search_memory" for m in chat if m["role"] == "assistant"
                    for c in m.get("tool_calls") or []) for chat in fit]
    assert max(searches) == 4  # one fewer was enough for the longest
    with pytest.raises(SystemExit, match="even a sweep of one search renders to more than 500 tokens"):
        demonstrations(["--sweep-prompts", str(train), "--out", str(tmp_path / "none.jsonl"), "--retriever", "bm25",
                        "--tokenizer", str(tiny_hf_dirs["qwen3"]), "--max-tokens", "500"])


def test_with_the_rationale_each_delete_names_the_fact_that_restates_it_first(tmp_path, tiny_hf_dirs):
    """--rationale on sweep chats: the same calls and the same facts deleted, each delete's reason, written before
    its memory_id and so rendered before it by the policy's template, naming a later fact of the same slot."""
    from transformers import AutoTokenizer

    from examples.mem_update.tools import TOOLS
    from vime_ext.rollout.sft_rollout import masker_for

    prepare(["--generate-fact-lists", "--num-conversations", "3", "--n-test", "1", "--facts", "60", "20",
             "--out-dir", str(tmp_path)])
    chats = {}
    for name, flags in (("plain", []), ("rationale", ["--rationale"])):
        demonstrations(["--sweep-prompts", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / f"{name}.jsonl"),
                        "--retriever", "bm25", *flags])
        chats[name] = [json.loads(line)["messages"] for line in (tmp_path / f"{name}.jsonl").open()]
    records = [json.loads(line) for line in (tmp_path / "train.jsonl").open()]

    def calls(chat):
        return [c["function"] for m in chat if m["role"] == "assistant" for c in m.get("tool_calls") or []]

    for plain, reasoned, record in zip(chats["plain"], chats["rationale"], records):
        texts = {m["id"]: m["content"] for m in record["metadata"]["memories"]}
        assert [(c["name"], c["arguments"].get("memory_id")) for c in calls(plain)] == \
            [(c["name"], c["arguments"].get("memory_id")) for c in calls(reasoned)]
        deletes = [c["arguments"] for c in calls(reasoned) if c["name"] == "delete_memory"]
        assert deletes
        for arguments in deletes:
            assert list(arguments) == ["reason", "memory_id"]
            newer = arguments["reason"].removeprefix("restated by ")
            older = arguments["memory_id"]
            assert slot(texts[newer]) == slot(texts[older])
            assert int(FACT_LINE.fullmatch(texts[newer]).group(1)) > int(FACT_LINE.fullmatch(texts[older]).group(1))
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["qwen3"])
    sequences = masker_for(tokenizer)(chats["rationale"][0], TOOLS).sequences
    text = tokenizer.decode(max(sequences, key=lambda s: len(s.tokens)).tokens)
    first = next(c["arguments"] for c in calls(chats["rationale"][0]) if c["name"] == "delete_memory")
    assert text.index(f'"reason": "{first["reason"]}"') < text.index(f'"memory_id": "{first["memory_id"]}"')
    # the rollout's rationale metric (rollout/rationale, the sweep table's column) counts such a chat, not the plain
    plain = max(masker_for(tokenizer)(chats["plain"][0], TOOLS).sequences, key=lambda s: len(s.tokens))
    assert wrote_rationale(text) and not wrote_rationale(tokenizer.decode(plain.tokens))
