"""MemUpdate's demonstrations (SFT chats): episodes played on the real store and tools from what the data records
(evidence and noise), in the rollout's own chat. Every call succeeds, the five editing tools all appear, only
training conversations are used, the chat masks to the policy's replies as <tool_call> blocks the rollout parses,
and the demonstrated edits raise the example's own QA score."""

import asyncio
import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from examples.mem_update.demonstrations import FINAL, demonstration, write_demonstrations
from examples.mem_update.locomo import generate_locomo, load_locomo, split
from examples.mem_update.reward import reward
from examples.mem_update.rollout import episode_messages
from examples.mem_update.settings import MemUpdateSettings
from examples.mem_update.store import STORE
from examples.mem_update.tools import TOOLS
from vime_ext.agent.chat_mask import ChatMasker
from vime_ext.agent.sample import Sample
from vime_ext.agent.tool_calls import parse_tool_calls
from vime_ext.data.chat_dataset import read_chats
from vime_ext.rollout.plugins import PluginArgs

SETTINGS = MemUpdateSettings(retriever="bm25")


@pytest.fixture(scope="module")
def locomo(tmp_path_factory):
    path = tmp_path_factory.mktemp("locomo") / "locomo_generated.json"
    path.write_text(json.dumps(generate_locomo(6, seed=0)))
    return path


def test_the_file_covers_the_tools_and_only_training_conversations(locomo, tmp_path):
    path, counts = write_demonstrations(locomo, tmp_path / "sft.jsonl", SETTINGS, n_test=2, n_val=1)
    assert {"search_memory", "manage_memory", "merge_memory", "delete_memory"} <= set(counts)
    train = split(load_locomo(locomo)[0], 2, 42, n_val=1).train  # neither test nor validation conversations
    assert len(train) == 3
    records = read_chats(path)
    assert len(records) == sum(len(c.qa) for c in train) and len(STORE) == 0
    assert {r.metadata["sample_id"] for r in records} == {c.sample_id for c in train}
    assert records[0].metadata["tools"] == TOOLS
    operations = {json.dumps(m["tool_calls"][0]["function"]["arguments"].get("operation"))
                  for r in records for m in r.prompt if m.get("tool_calls")}
    assert {'"create"', '"update"'} <= operations


def test_the_chat_is_the_rollouts_and_masks_to_parseable_calls(locomo, tiny_hf_dirs):
    # the first multi-hop item whose search showed both of its evidence memories (else it is left as it was)
    for conversation, item in ((c, q) for c in load_locomo(locomo)[0] for q in c.qa if q["category"] == 1):
        demo = demonstration(conversation, item, SETTINGS)
        STORE.drop(demo.namespace)
        if "merge_memory" in demo.calls:
            break
    slot = Sample(prompt=item["question"], metadata={"memories": conversation.memories})
    assert demo.messages[:2] == episode_messages(slot, SETTINGS, len(conversation.memories))
    assert demo.calls[:5] == ["search_memory", "manage_memory", "manage_memory", "merge_memory", "manage_memory"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["qwen3"])  # Qwen's real tokenizer
    (sequence,) = ChatMasker(tokenizer)(demo.messages, TOOLS).sequences
    replies = tokenizer.decode([t for t, m in zip(sequence.tokens, sequence.mask) if m]).split("<|im_end|>")[:-1]
    assert [c.name for r in replies for c in parse_tool_calls(r)] == demo.calls
    assert replies[-1] == FINAL and "results" not in "".join(replies)  # tool output is never trained


def test_the_demonstrated_edits_raise_the_qa_score(locomo):
    args = PluginArgs(memup_retriever="bm25")
    deltas, rewards = [], []
    for conversation in load_locomo(locomo)[0][:3]:
        for item in conversation.qa:
            demo = demonstration(conversation, item, SETTINGS)
            sample = Sample(prompt=item["question"], label=item["answer"],
                            metadata={"memory_namespace": demo.namespace, "finished": True})
            result = asyncio.run(reward(args, sample))
            deltas.append(result["performance_delta"])
            rewards.append(result["reward"])
    assert len(STORE) == 0  # the reward dropped every played-out namespace
    # Not every episode gains: deleting noise re-ranks the retrieval, and an item whose evidence the search did not
    # all show is left as it was. On average the edits raise the score.
    assert np.mean(deltas) > 0.1 and np.mean(rewards) > 0.1 and np.mean(np.array(deltas) < 0) < 0.05, deltas


def test_every_call_uses_only_what_the_chat_has_shown(locomo):
    """An id a call names was in an earlier tool result, and an update's or a create's text is made of what the
    results showed (and the date shown beside a memory): the demonstrated policy knows nothing the chat does not
    say. The first demonstrations updated memories by ids no result had shown."""
    import re

    checked = 0
    for conversation in load_locomo(locomo)[0]:
        for item in conversation.qa:
            demo = demonstration(conversation, item, SETTINGS)
            STORE.drop(demo.namespace)
            seen = ""
            for message in demo.messages[2:]:
                if message["role"] == "tool":
                    seen += message["content"]
                    continue
                for call in message.get("tool_calls") or []:
                    arguments = call["function"]["arguments"]
                    for memory_id in [arguments.get("memory_id")] + list(arguments.get("memory_ids", [])):
                        assert memory_id is None or f'"{memory_id}"' in seen, (memory_id, item["question"])
                    if arguments.get("operation") == "update":
                        body, day = re.fullmatch(r"(.*) This was on (.*)\.", arguments["content"]).groups()
                        assert json.dumps(body)[1:-1] in seen and day in seen
                    if arguments.get("operation") == "create":
                        assert arguments["content"].split("says: ", 1)[1] in seen.replace('\\"', '"')
                    checked += 1
    assert checked > 100


def test_without_the_answer_note_the_episode_is_the_same_less_its_create(locomo, tmp_path):
    """--no-answer-note (step 4 left out): the same calls with the same results, less the note's create; the file
    written by the command line holds no create at all."""
    from examples.mem_update.demonstrations import main

    compared = 0
    for conversation in load_locomo(locomo)[0][:2]:
        for item in conversation.qa:
            with_note, without = (demonstration(conversation, item, SETTINGS, note) for note in (True, False))
            STORE.drop(with_note.namespace), STORE.drop(without.namespace)
            kept = with_note.messages
            creates = [i for i, m in enumerate(kept) if m.get("tool_calls")
                       and m["tool_calls"][0]["function"]["arguments"].get("operation") == "create"]
            if creates:  # the note's call and its result
                kept, compared = kept[:creates[0]] + kept[creates[0] + 2:], compared + 1
            assert [m.get("tool_calls") for m in without.messages] == [m.get("tool_calls") for m in kept]
    assert compared > 3
    out = tmp_path / "sft.jsonl"
    main(["--locomo", str(locomo), "--out", str(out), "--retriever", "bm25", "--n-test", "2", "--n-val", "1",
          "--no-answer-note"])
    calls = [m["tool_calls"][0]["function"] for r in read_chats(out) for m in r.prompt if m.get("tool_calls")]
    assert calls and not any(c["arguments"].get("operation") == "create" for c in calls)
    assert len(STORE) == 0


def test_the_rationale_names_the_asked_month_then_each_evidence_by_its_date(locomo, tiny_hf_dirs, tmp_path):
    """--rationale: the same calls, and the reply after the search opens with the month the question names and
    each evidence memory's date, id and text as the results showed them (or that the results lack part of what
    it needs). Among questions that name a month are some whose evidence is not the first result: there the
    sentence carries what the first-result habit of the SFT policies misses. The rationale is trained and the
    calls after it still parse."""
    from examples.mem_update.demonstrations import ASKED_MONTH, INCOMPLETE, main
    from examples.mem_update.prompts import wrote_rationale

    months = not_first = incomplete = 0
    for conversation in load_locomo(locomo)[0]:
        for item in conversation.qa:
            plain, said = (demonstration(conversation, item, SETTINGS, with_rationale=w) for w in (False, True))
            STORE.drop(plain.namespace), STORE.drop(said.namespace)
            assert [m.get("tool_calls") for m in said.messages] == [m.get("tool_calls") for m in plain.messages]
            opening = said.messages[4]["content"]  # system, user, the search, its result, then this reply
            # the rollout's `rationale` metric finds every opening, and none in the episode without it
            assert wrote_rationale(opening) and not any(wrote_rationale(m.get("content") or "")
                                                        for m in plain.messages if m["role"] == "assistant")
            differ = [i for i, (a, b) in enumerate(zip(said.messages, plain.messages)) if a != b]
            assert differ == [4] and opening.endswith(plain.messages[4]["content"] or "")  # the rest as it was
            results = json.loads(said.messages[3]["content"])["results"]
            updated = [c["function"]["arguments"]["memory_id"] for m in said.messages for c in m.get("tool_calls") or []
                       if c["function"]["arguments"].get("operation") == "update"]
            if not updated:
                incomplete += opening.startswith(INCOMPLETE)
                continue
            month = ASKED_MONTH.search(item["question"])
            assert opening.startswith("The question asks about ") == bool(month)
            assert not month or opening.startswith(f"The question asks about {month.group(1)} {month.group(2)}. ")
            shown = {r["id"]: r for r in results}
            for memory_id in updated:
                day = shown[memory_id]["date"].split(" on ")[-1]
                assert f"from {day}: {memory_id}, {json.dumps(shown[memory_id]['content'])}" in opening
                if month:
                    assert month.group(1) in day and month.group(2) in day  # the evidence is of the month asked
            months += bool(month)
            not_first += bool(month) and results[0]["id"] != updated[0]
    assert months > 10 and not_first > 3 and incomplete > 0, (months, not_first, incomplete)

    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["qwen3"])  # Qwen's real tokenizer
    (sequence,) = ChatMasker(tokenizer)(said.messages, TOOLS).sequences
    trained = tokenizer.decode([t for t, m in zip(sequence.tokens, sequence.mask) if m])
    assert [c.name for r in trained.split("<|im_end|>")[:-1] for c in parse_tool_calls(r)] == said.calls
    assert said.messages[4]["content"] in trained
    out = tmp_path / "sft.jsonl"
    main(["--locomo", str(locomo), "--out", str(out), "--retriever", "bm25", "--n-test", "2", "--n-val", "1",
          "--rationale"])
    assert all(r.prompt[4]["content"] for r in read_chats(out)) and len(STORE) == 0
