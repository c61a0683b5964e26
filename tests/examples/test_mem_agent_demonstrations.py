"""MemAgent's demonstrations (SFT chats): the rollout's own chats with replies written from the generator's facts.
Each memory keeps exactly the supporting sentences read so far (a sentence cut by a chunk boundary kept as far as
it was read), the final reply earns the training reward, and the file is SFT-ready: it reads as chat data and
masks under SmolLM2's template to the replies alone."""

import json
import random

import pytest

from examples.mem_agent.data import generate_item
from examples.mem_agent.demonstrations import NOTHING_YET, demonstration_chats, write_demonstrations
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
        assert memory == " ".join(sorted(item.supporting, key=item.context.index))  # all facts, reading order
        final = Sample(prompt=item.question, label=item.answers, response=chats[-1][1]["content"])
        assert reward(PluginArgs(mem_answer_format=answer_format), final) == {"reward": 1.0, "no_answer": 0.0}


def test_memories_hold_what_was_read_of_the_supporting_sentences_and_nothing_else(tokenizer):
    rng, straddled = random.Random(11), 0
    for index in range(40):
        item = generate_item(rng, 6, index)
        chunks = split_chunks(tokenizer, item.context, 24, None).texts
        memories = [chat[1]["content"] for chat in demonstration_chats(item, tokenizer, 24)[:-1]]
        read = ""
        for chunk, memory in zip(chunks, memories):
            read += chunk
            begun = [s for s in item.supporting if item.context.index(s) < len(read)]
            if not begun:
                assert memory == NOTHING_YET
                continue
            for sentence in begun:
                seen = read[item.context.index(sentence):][:len(sentence)].strip()
                assert seen in memory
                straddled += seen != sentence
            assert "vol." not in memory and "Document" not in memory
    assert straddled > 0  # the case of a sentence cut by a chunk boundary did occur


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
