"""Demonstrations of MemAgent's own format, for a supervised warm start (``--loss-type sft_loss``) before RL.

Each generated question (``data.generate_item``: work -> author -> birthplace among distractors) is read the way
the rollout reads it: the document cut into the same chunks (``rollout.split_chunks`` with the same tokenizer and
``--chunk-tokens``), one chat per chunk with the same prompt, then the final chat. The replies are those of a
reader that knows only what it has read (what a model could learn; replies written from the generator's knowledge
of the answer would keep the author's birthplace before anything says who the author is):

- a sentence counts as read in the chunk where it ends;
- until the sentence naming the question's novel is read, the author is unknown. With ``--keep recent`` the memory
  keeps every writer's birthplace read so far, the most recent ones that fit ``--memory-tokens``; with ``--keep
  relevant`` it keeps nothing (a reply that says so), which answers only the items whose birthplace comes after
  the novel's sentence, but asks the model for two targeted copies instead of some twenty look-alike sentences;
- once the novel's sentence is read, the memory keeps it and the author's birthplace (from the notes or the chunk
  in view, or later when it is read), and nothing else;
- the final answer restates the two facts and gives the answer in ``\\boxed{}`` (or, with ``--answer-format
  answer_is``, as "The answer is ..."). A question whose author's birthplace was dropped from a full memory before
  the author was known cannot be answered by such a reader: its memory chats are kept, its final chat is not.

The share of items such a reader can answer is the task's ceiling for a memory of that size (``--ceiling``; the
``recent`` reader's is the higher one).

One chat per JSONL line, as the SFT reader expects (``--input-key messages``):

    python -m examples.mem_agent.demonstrations --tokenizer /models/SmolLM2 --num 512 --num-docs 8 \\
        --chunk-tokens 256 --out data/mem_agent_sft.jsonl [--memory-tokens 256] [--hops 2] [--seed 0]
        [--answer-format boxed] [--entities train]
    python -m examples.mem_agent.demonstrations --tokenizer /models/SmolLM2 --chunk-tokens 2048 \\
        --memory-tokens 256 --ceiling data/ruler_hqa     # per eval file: the share such a reader answers
"""

import argparse
import json
import random
import re
from bisect import bisect_right
from dataclasses import replace
from pathlib import Path

from examples.mem_agent.data import (ALL_ENTITIES, ENTITY_POOLS, PERSON_SENTENCE, QUESTION_2HOP, WORK_SENTENCE,
                                     Entities, QAItem, form_pattern, generate_item, read_eval_file)
from examples.mem_agent.prompts import NO_MEMORY, final_prompt, memory_prompt
from examples.mem_agent.rollout import split_chunks

NOTHING_YET = "Nothing relevant to the question yet."
KEEPS = ("recent", "relevant")  # what the memory keeps before the author is known (the module's docstring)


WRITER = re.compile("^" + form_pattern(PERSON_SENTENCE), re.MULTILINE)  # any writer's birthplace


def memory_after_each_chunk(item: QAItem, chunks: list[str], tokenizer, memory_tokens: int,
                            keep: str = "recent") -> list[str]:
    """The memory after each chunk of a reader that knows only what it has read (the module's docstring)."""
    if keep not in KEEPS:
        raise ValueError(f"keep {keep!r} is not one of {KEEPS}")
    work, author = item.supporting[0], (item.supporting[1] if len(item.supporting) > 1 else None)
    work_end = item.context.index(work) + len(work)
    writers = list(WRITER.finditer(item.context)) if author else []
    ends = [m.end() for m in writers]
    notes: list[str] = []
    memories, start, known = [], 0, False
    for chunk in chunks:
        end = start + len(chunk)
        in_view = notes + [m.group() for m in writers[bisect_right(ends, start):bisect_right(ends, end)]]
        if known:
            notes = notes + [author] if author in in_view and author not in notes else notes
        elif work_end <= end:
            known = True
            notes = [work] + ([author] if author in in_view else [])
        elif keep == "recent":
            notes = most_recent_that_fit(in_view, tokenizer, memory_tokens)
        memories.append(" ".join(notes) or NOTHING_YET)
        start = end
    return memories


def most_recent_that_fit(sentences: list[str], tokenizer, memory_tokens: int) -> list[str]:
    kept: list[str] = []
    for sentence in reversed(sentences):
        if len(tokenizer(" ".join([sentence] + kept), add_special_tokens=False)["input_ids"]) > memory_tokens:
            break
        kept.insert(0, sentence)
    return kept


def answerable(item: QAItem, memory: str) -> bool:
    """Whether the final memory holds every fact the answer rests on."""
    return all(sentence in memory for sentence in item.supporting)


def final_reply(item: QAItem, answer_format: str) -> str:
    chain, answer = " ".join(item.supporting), item.answers[0]
    return f"{chain} \\boxed{{{answer}}}" if answer_format == "boxed" else f"{chain} The answer is {answer}."


def demonstration_chats(item: QAItem, tokenizer, chunk_tokens: int, answer_format: str = "boxed",
                        memory_tokens: int = 256, keep: str = "recent") -> list[list]:
    """The chats of one question as the rollout would hold them, each with its demonstrated reply (no final chat
    where the reader could not answer)."""
    chunks = split_chunks(tokenizer, item.context, chunk_tokens, None).texts
    if "".join(chunks) != item.context:
        raise ValueError(f"item {item.index}: the tokenizer's chunks do not join back into the document")
    chats, memory = [], NO_MEMORY
    for chunk, new_memory in zip(chunks, memory_after_each_chunk(item, chunks, tokenizer, memory_tokens, keep)):
        chats.append([{"role": "user", "content": memory_prompt(item.question, memory, chunk)},
                      {"role": "assistant", "content": new_memory}])
        memory = new_memory
    if answerable(item, memory):
        chats.append([{"role": "user", "content": final_prompt(item.question, memory, answer_format)},
                      {"role": "assistant", "content": final_reply(item, answer_format)}])
    return chats


def with_supporting(item: QAItem, where: str | Path) -> QAItem:
    """A generated eval item (its files keep no supporting sentences) with them found again in its document."""
    question = re.fullmatch(form_pattern(QUESTION_2HOP), item.question)
    work = question and re.search("^" + form_pattern(WORK_SENTENCE, work=question["work"]), item.context,
                                  re.MULTILINE)
    person = work and re.search("^" + form_pattern(PERSON_SENTENCE, person=work["person"]), item.context,
                                re.MULTILINE)
    if not person:
        raise ValueError(f"{where}: item {item.index} is not a generated 2-hop item (its novel's author or the "
                         "author's birthplace is not in its document)")
    return replace(item, supporting=(work.group(), person.group()))


def ceiling(eval_file: str | Path, tokenizer, chunk_tokens: int, memory_tokens: int, keep: str = "recent") -> float:
    """The share (%) of an eval file's generated items that the demonstrations' reader answers."""
    items = [with_supporting(item, eval_file) for item, _ in read_eval_file(eval_file)[0]]
    hits = 0
    for item in items:
        chunks = split_chunks(tokenizer, item.context, chunk_tokens, None).texts
        hits += answerable(item, memory_after_each_chunk(item, chunks, tokenizer, memory_tokens, keep)[-1])
    return 100.0 * hits / max(len(items), 1)


def write_demonstrations(path: str | Path, tokenizer, num: int, num_docs: int, chunk_tokens: int, seed: int = 0,
                         hops: int = 2, answer_format: str = "boxed", entities: Entities = ALL_ENTITIES,
                         memory_tokens: int = 256, keep: str = "recent") -> tuple[Path, int]:
    """``num`` generated questions' chats to ``path``; returns the path and the number of chats."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w") as f:
        for i in range(num):
            item = generate_item(rng, num_docs, f"demo-{seed}-{i}", hops, entities)
            for k, chat in enumerate(demonstration_chats(item, tokenizer, chunk_tokens, answer_format,
                                                         memory_tokens, keep)):
                f.write(json.dumps({"messages": chat, "metadata": {"index": item.index, "chat": k}}) + "\n")
                count += 1
    return path, count


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="MemAgent demonstrations (SFT chats) from generated questions")
    parser.add_argument("--tokenizer", required=True, help="the HF directory whose tokenizer cuts the chunks")
    parser.add_argument("--out", help="the chats' JSONL (required unless --ceiling)")
    parser.add_argument("--ceiling", metavar="EVAL_DIR",
                        help="instead: for each generated eval_{N}.json there, the share of items the reader answers")
    parser.add_argument("--memory-tokens", type=int, default=256, help="as MEM_MAX_MEMORY in the RL run")
    parser.add_argument("--keep", choices=KEEPS, default="recent",
                        help="what the memory keeps before the novel's author is known (the module's docstring)")
    parser.add_argument("--num", type=int, default=256, help="generated questions (each gives chunks + 1 chats)")
    parser.add_argument("--num-docs", type=int, default=8)
    parser.add_argument("--chunk-tokens", type=int, default=2048, help="as MEM_CHUNK_TOKENS in the RL run")
    parser.add_argument("--hops", type=int, choices=[1, 2], default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answer-format", choices=["boxed", "answer_is"], default="boxed")
    parser.add_argument("--entities", choices=sorted(ENTITY_POOLS), default="all",
                        help="names the questions draw from (train: none of the heldout eval files' names)")
    args = parser.parse_args(argv)
    if not (args.out or args.ceiling):
        parser.error("give --out (demonstrations) or --ceiling (the reader's share per eval file)")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.ceiling:
        files = sorted(Path(args.ceiling).glob("eval_*.json"), key=lambda p: int(p.stem.split("_")[1]))
        result = {int(f.stem.split("_")[1]): round(ceiling(f, tokenizer, args.chunk_tokens, args.memory_tokens,
                                                           args.keep), 2) for f in files}
        print(json.dumps({"chunk_tokens": args.chunk_tokens, "memory_tokens": args.memory_tokens, "keep": args.keep,
                          "sub_em_by_num_docs": result}))
        return
    path, count = write_demonstrations(args.out, tokenizer, args.num, args.num_docs, args.chunk_tokens, args.seed,
                                       args.hops, args.answer_format, ENTITY_POOLS[args.entities],
                                       args.memory_tokens, args.keep)
    print(f"{path}: {count} chats from {args.num} questions")


if __name__ == "__main__":
    main()
