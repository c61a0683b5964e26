"""MemAgent's demonstrations (SFT chats): the rollout's own chats with the replies of a reader that knows only what
it has read. Each memory holds whole sentences already read: before the novel's sentence, the most recent writers'
birthplaces that fit; after it, that sentence and the author's birthplace alone. The final reply earns the training
reward, an item the reader cannot answer gets no final chat, the ceiling counts those it can, and the file is
SFT-ready: it reads as chat data and masks under SmolLM2's template to the replies alone."""

import json
import random

import pytest

from examples.mem_agent.data import generate_item, write_eval_file
from examples.mem_agent.demonstrations import (NOTHING_YET, WRITER, ceiling, demonstration_chats,
                                               memory_after_each_chunk, write_demonstrations)
from examples.mem_agent.prompts import NO_MEMORY, final_prompt, memory_prompt
from examples.mem_agent.reward import reward
from examples.mem_agent.rollout import split_chunks
from vime_ext.agent.chat_mask import ChatMasker
from vime_ext.agent.sample import Sample
from vime_ext.data.chat_dataset import read_chats
from vime_ext.rollout.plugins import PluginArgs


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tests.conftest import real_tokenizer

    return real_tokenizer("llama", tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("answer_format", ["boxed", "answer_is"])
def test_chats_follow_the_rollout_and_the_answer_earns_the_reward(tokenizer, answer_format):
    rng = random.Random(5)
    for index in range(6):
        item = generate_item(rng, 8, index)
        chats = demonstration_chats(item, tokenizer, 48, answer_format)
        chunks = split_chunks(tokenizer, item.context, 48, None).texts
        assert len(chats) == len(chunks) + 1 >= 5  # at least 4 chunks per item: MemAgent's shape
        memory = NO_MEMORY
        for chat, chunk in zip(chats, chunks):  # the prompt the rollout builds, from the previous reply
            assert chat[0]["content"] == memory_prompt(item.question, memory, chunk)
            memory = chat[1]["content"]
        assert chats[-1][0]["content"] == final_prompt(item.question, memory, answer_format)
        assert memory == " ".join(item.supporting)  # both facts, in answer order (8 documents: nothing dropped)
        final = Sample(prompt=item.question, label=item.answers, response=chats[-1][1]["content"])
        assert reward(PluginArgs(mem_answer_format=answer_format), final) == {"reward": 1.0, "no_answer": 0.0}


def test_memories_hold_only_sentences_already_read(tokenizer):
    """Across items and two memory sizes: a memory never holds a sentence that ends after its chunk; before the
    novel's sentence it holds writers' birthplaces only (the most recent, within the size), after it the novel's
    sentence first and then at most the author's. A small memory drops writers, and then some items cannot be
    answered: they get no final chat, and the ceiling counts exactly the others."""
    rng, unanswerable = random.Random(11), {48: 0, 1000: 0}
    for index in range(30):
        item = generate_item(rng, 12, index)
        work, author = item.supporting
        chunks = split_chunks(tokenizer, item.context, 24, None).texts
        for size in (48, 1000):
            memories = memory_after_each_chunk(item, chunks, tokenizer, size)
            read = ""
            for chunk, memory in zip(chunks, memories):
                read += chunk
                if memory == NOTHING_YET:
                    assert not WRITER.search(read) and work not in read
                    continue
                if work in read:
                    assert memory in (work, f"{work} {author}") and (author in memory) <= (author in read)
                else:  # the most recent writers' sentences read so far, as many as fit
                    latest = [m.group() for m in WRITER.finditer(read)]
                    assert memory in [" ".join(latest[-k:]) for k in range(1, len(latest) + 1)]
                    assert len(tokenizer(memory, add_special_tokens=False)["input_ids"]) <= size
            chats = demonstration_chats(item, tokenizer, 24, memory_tokens=size)
            answered = author in memories[-1]
            assert len(chats) == len(chunks) + answered
            unanswerable[size] += not answered
    assert unanswerable[1000] == 0 < unanswerable[48]  # a memory for all writers answers all


def test_a_reader_that_keeps_only_the_novels_facts(tokenizer):
    """keep="relevant": nothing until the novel's sentence is read, then that sentence, and the author's birthplace
    when it ends in the novel's chunk or later (one read earlier was not kept). It answers no more items than the
    recent reader with the same memory."""
    rng, answered = random.Random(17), {"recent": 0, "relevant": 0}
    for index in range(30):
        item = generate_item(rng, 12, index)
        work, author = item.supporting
        chunks = split_chunks(tokenizer, item.context, 24, None).texts
        starts = [sum(len(c) for c in chunks[:k]) for k in range(len(chunks))]
        work_end = item.context.index(work) + len(work)
        author_end = item.context.index(author) + len(author)
        work_start = max(s for s in starts if s < work_end)  # the start of the chunk the novel's sentence ends in
        memories = memory_after_each_chunk(item, chunks, tokenizer, 48, keep="relevant")
        for start, chunk, memory in zip(starts, chunks, memories):
            end = start + len(chunk)
            if end < work_end:
                assert memory == NOTHING_YET
            else:
                assert memory == (f"{work} {author}" if work_start < author_end <= end else work)
        for keep in answered:
            answered[keep] += author in memory_after_each_chunk(item, chunks, tokenizer, 48, keep=keep)[-1]
    assert 0 < answered["relevant"] <= answered["recent"]
    with pytest.raises(ValueError, match="keep 'all' is not one of"):
        memory_after_each_chunk(item, chunks, tokenizer, 48, keep="all")


def test_the_ceiling_of_an_eval_file_is_the_share_the_reader_answers(tokenizer, tmp_path):
    """The eval file keeps no supporting sentences: the ceiling finds them again in each document, and gives the
    share the reader answers when it is handed the generator's own."""
    path = write_eval_file(tmp_path, 12, 20, seed=4)
    rng = random.Random(4 * 100_003 + 12)  # write_eval_file's stream: the same items, with their facts
    items = [generate_item(rng, 12, i) for i in range(20)]
    for size in (48, 1000):
        answered = [item.supporting[1] in memory_after_each_chunk(
            item, split_chunks(tokenizer, item.context, 24, None).texts, tokenizer, size)[-1] for item in items]
        assert ceiling(path, tokenizer, 24, size) == 100.0 * sum(answered) / 20
    assert ceiling(path, tokenizer, 24, 1000) == 100.0 and ceiling(path, tokenizer, 24, 48) < 100
    entries = json.loads(path.read_text())
    entries[0]["context"] = entries[0]["context"].replace(" is a novel written by ", " was written by ")
    path.write_text(json.dumps(entries))
    with pytest.raises(ValueError, match="item .* is not a generated 2-hop item"):
        ceiling(path, tokenizer, 24, 48)


def test_the_file_is_sft_ready(tokenizer, tmp_path):
    path, count = write_demonstrations(tmp_path / "demos.jsonl", tokenizer, 3, 6, 64, seed=2)
    records = read_chats(path)
    assert len(records) == count and all(r.metadata["chat"] >= 0 for r in records)
    masker = ChatMasker(tokenizer)
    for record in records:
        (sequence,) = masker(record.prompt).sequences
        trained = tokenizer.decode([t for t, m in zip(sequence.tokens, sequence.mask) if m])
        assert trained == record.prompt[-1]["content"] + "<|im_end|>"
    assert json.loads(path.read_text().splitlines()[-1])["messages"][-1]["content"].endswith("}")
