"""Demonstrations of MemAgent's own format, for a supervised warm start (``--loss-type sft_loss``) before RL.

Each generated question (``data.generate_item``: work -> author -> birthplace among distractors) is read the way
the rollout reads it: the document cut into the same chunks (``rollout.split_chunks`` with the same tokenizer and
``--chunk-tokens``), one chat per chunk with the same prompt, then the final chat. The replies are written from the
generator's own knowledge of the facts the answer needs:

- a memory update keeps the supporting sentences read so far, and only them, in reading order (a sentence that
  runs past the end of a chunk is kept as far as it was read, and completed from the next chunk); before any is
  found it says so;
- the final answer restates the chain of facts, in answer order, and gives the answer in ``\\boxed{}`` (or, with
  ``--answer-format answer_is``, as "The answer is ...").

One chat per JSONL line, as the SFT reader expects (``--input-key messages``):

    python -m examples.mem_agent.demonstrations --tokenizer /models/SmolLM2 --num 512 --num-docs 8 \\
        --chunk-tokens 256 --out data/mem_agent_sft.jsonl [--hops 2] [--seed 0] [--answer-format boxed]
        [--entities train]
"""

import argparse
import json
import random
from pathlib import Path

from examples.mem_agent.data import ALL_ENTITIES, ENTITY_POOLS, Entities, QAItem, generate_item
from examples.mem_agent.prompts import NO_MEMORY, final_prompt, memory_prompt
from examples.mem_agent.rollout import split_chunks

NOTHING_YET = "Nothing relevant to the question yet."


def memory_after_each_chunk(item: QAItem, chunks: list[str]) -> list[str]:
    """The demonstrated memory after each chunk: every supporting sentence begun so far, as far as it was read."""
    starts = [item.context.index(sentence) for sentence in item.supporting]
    order = sorted(range(len(starts)), key=starts.__getitem__)
    memories, read = [], 0
    for chunk in chunks:
        read += len(chunk)
        kept = [item.supporting[i][:max(0, read - starts[i])] for i in order if starts[i] < read]
        memories.append(" ".join(k.strip() for k in kept) or NOTHING_YET)
    return memories


def final_reply(item: QAItem, answer_format: str) -> str:
    chain, answer = " ".join(item.supporting), item.answers[0]
    return f"{chain} \\boxed{{{answer}}}" if answer_format == "boxed" else f"{chain} The answer is {answer}."


def demonstration_chats(item: QAItem, tokenizer, chunk_tokens: int, answer_format: str = "boxed") -> list[list]:
    """The chats of one question as the rollout would hold them, each with its demonstrated reply."""
    chunks = split_chunks(tokenizer, item.context, chunk_tokens, None).texts
    if "".join(chunks) != item.context:
        raise ValueError(f"item {item.index}: the tokenizer's chunks do not join back into the document")
    chats, memory = [], NO_MEMORY
    for chunk, new_memory in zip(chunks, memory_after_each_chunk(item, chunks)):
        chats.append([{"role": "user", "content": memory_prompt(item.question, memory, chunk)},
                      {"role": "assistant", "content": new_memory}])
        memory = new_memory
    chats.append([{"role": "user", "content": final_prompt(item.question, memory, answer_format)},
                  {"role": "assistant", "content": final_reply(item, answer_format)}])
    return chats


def write_demonstrations(path: str | Path, tokenizer, num: int, num_docs: int, chunk_tokens: int, seed: int = 0,
                         hops: int = 2, answer_format: str = "boxed",
                         entities: Entities = ALL_ENTITIES) -> tuple[Path, int]:
    """``num`` generated questions' chats to ``path``; returns the path and the number of chats."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w") as f:
        for i in range(num):
            item = generate_item(rng, num_docs, f"demo-{seed}-{i}", hops, entities)
            for k, chat in enumerate(demonstration_chats(item, tokenizer, chunk_tokens, answer_format)):
                f.write(json.dumps({"messages": chat, "metadata": {"index": item.index, "chat": k}}) + "\n")
                count += 1
    return path, count


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="MemAgent demonstrations (SFT chats) from generated questions")
    parser.add_argument("--tokenizer", required=True, help="the HF directory whose tokenizer cuts the chunks")
    parser.add_argument("--out", required=True)
    parser.add_argument("--num", type=int, default=256, help="generated questions (each gives chunks + 1 chats)")
    parser.add_argument("--num-docs", type=int, default=8)
    parser.add_argument("--chunk-tokens", type=int, default=2048, help="as MEM_CHUNK_TOKENS in the RL run")
    parser.add_argument("--hops", type=int, choices=[1, 2], default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answer-format", choices=["boxed", "answer_is"], default="boxed")
    parser.add_argument("--entities", choices=sorted(ENTITY_POOLS), default="all",
                        help="names the questions draw from (train: none of the heldout eval files' names)")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    path, count = write_demonstrations(args.out, AutoTokenizer.from_pretrained(args.tokenizer), args.num,
                                       args.num_docs, args.chunk_tokens, args.seed, args.hops, args.answer_format,
                                       ENTITY_POOLS[args.entities])
    print(f"{path}: {count} chats from {args.num} questions")


if __name__ == "__main__":
    main()
