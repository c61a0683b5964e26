"""MemAgent's generate plug-in (``--custom-generate-function-path examples.mem_agent.rollout.generate``).

The document (``sample.metadata["context"]``) is cut into chunks of ``mem_chunk_tokens`` tokens. The memory
starts as "No previous memory"; for each chunk the policy sees the question, its memory and the chunk in a fresh
chat and writes the new memory (at most ``mem_max_memory`` tokens; an empty reply keeps the old one). A last
chat asks for the answer from the memory alone (at most ``mem_max_final`` tokens), optionally starting the reply
with ``mem_answer_prefix`` for the policy (a small model that ignores the format instruction still answers in it). Every chat is one training
sequence, so ``generate`` returns one Sample per chat; the reward judges the last. In an evaluation the item's
chunk and memory are saved after each chunk (``args.save_progress``), and a rerun goes on from there.

Settings (``--custom-config-path``; the launch scripts fill them from ``MEM_*`` variables): see ``MemSettings``.
"""

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import NamedTuple

from examples.mem_agent.prompts import NO_MEMORY, final_prompt, memory_prompt
from examples.mem_agent.scoring import holds_answer
from vime_ext.agent.settings import settings_from_args
from vime_ext.agent.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemSettings:
    chunk_tokens: int = 2048
    max_memory: int = 1024  # new tokens per memory update
    max_final: int = 256  # new tokens of the answer
    max_chunks: int | None = 64  # training cap; longer documents lose their tail (logged)
    eval_max_chunks: int | None = None  # evaluation reads the whole document unless this is set
    answer_format: str = "boxed"  # "boxed" (MemAgent's training reward) or "answer_is"; the reward reads the same
    answer_prefix: str = ""  # text the final answer starts with, written for the policy (e.g. "The answer is")

    @classmethod
    def from_args(cls, args) -> "MemSettings":
        settings = settings_from_args(cls, args, "mem_")
        if settings.chunk_tokens < 1 or settings.max_memory < 1 or settings.max_final < 1:
            raise ValueError(f"mem_chunk_tokens, mem_max_memory and mem_max_final must be positive: {settings}")
        if settings.answer_format not in ("boxed", "answer_is"):
            raise ValueError(f"mem_answer_format {settings.answer_format!r}: choose boxed or answer_is")
        return settings


class Chunks(NamedTuple):
    texts: list[str]
    cut: int  # tokens the cap left unread
    tokens: int  # the whole document's


def split_chunks(tokenizer, text: str, chunk_tokens: int, max_chunks: int | None) -> Chunks:
    """The text in chunks of ``chunk_tokens`` tokens (the last one shorter), at most ``max_chunks`` of them;
    also how many tokens the cap cut off, and how many the document has."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = [ids[i:i + chunk_tokens] for i in range(0, len(ids), chunk_tokens)]
    cut = 0
    if max_chunks is not None and len(pieces) > max_chunks:
        cut = sum(len(p) for p in pieces[max_chunks:])
        pieces = pieces[:max_chunks]
    return Chunks([tokenizer.decode(p) for p in pieces], cut, len(ids))


def resume_point(sample, chunks: int, chunk_tokens: int) -> tuple[int, str, list[str]]:
    """Where an evaluation item starts: (chunk, memory, trace) saved by an earlier run of the same evaluation
    (``sample.metadata["resume"]``), or the beginning when there is none or it was saved for another chunking."""
    state = sample.metadata.get("resume")
    if not state:
        return 0, NO_MEMORY, []
    if state.get("chunks") != chunks or state.get("chunk_tokens") != chunk_tokens or \
            not 0 < int(state.get("chunk", 0)) <= chunks:
        log.warning("sample %s: the saved progress (%s of %s chunks of %s tokens) does not fit this document "
                    "(%d chunks of %d); starting it again", sample.index, state.get("chunk"), state.get("chunks"),
                    state.get("chunk_tokens"), chunks, chunk_tokens)
        return 0, NO_MEMORY, []
    return int(state["chunk"]), str(state["memory"]), list(state.get("trace", ""))


async def generate(args, sample, sampling_params, evaluation: bool = False):
    settings = MemSettings.from_args(args)
    context = sample.metadata.get("context")
    if not isinstance(context, str):
        raise ValueError(f"sample {sample.index}: metadata['context'] must hold the document text "
                         f"(prepare the data with examples/mem_agent/prepare_data.py)")
    cap = settings.eval_max_chunks if evaluation else settings.max_chunks
    # In a thread: a million-token document takes seconds to tokenize, and on the event loop that would stall
    # every other item in flight (an evaluation of several lengths at once waited minutes before its first turn).
    chunks, cut, doc_tokens = await asyncio.to_thread(split_chunks, args.tokenizer, context, settings.chunk_tokens,
                                                      cap)
    if cut:
        log.warning("sample %s: document cut after %d chunks of %d tokens; %d tokens unread", sample.index,
                    len(chunks), settings.chunk_tokens, cut)
    question, memory, out = str(sample.prompt), NO_MEMORY, []
    trace = []  # evaluation: after each chunk, whether the memory holds a gold answer (where it came and went)
    first = 0
    if evaluation:  # an item an earlier run of the evaluation stopped in goes on from the chunk it reached
        first, memory, trace = resume_point(sample, len(chunks), settings.chunk_tokens)
    save = getattr(args, "save_progress", None) if evaluation else None
    memory_params = replace(sampling_params, max_new_tokens=settings.max_memory)
    for k, chunk in enumerate(chunks[first:], first):
        chat = Trajectory(args.tokenizer, [{"role": "user", "content": memory_prompt(question, memory, chunk)}])
        reply = await chat.generate(args.rollout_client, memory_params, session_id=f"{sample.index}")
        if reply is None:  # the engine failed: the trajectory is marked failed or aborted
            return out + [chat.to_sample(sample)]
        if not evaluation:  # training sequences; an evaluation scores the final answer alone (and at a million
            out.append(chat.to_sample(sample))  # tokens, 500 kept chats an item would be gigabytes)
        memory = reply.strip() or memory
        if evaluation:
            trace.append("1" if holds_answer(memory, sample.label) else "0")
        if save is not None:
            save(sample, {"chunk": k + 1, "chunks": len(chunks), "chunk_tokens": settings.chunk_tokens,
                          "memory": memory, "trace": "".join(trace)})
    chat = Trajectory(args.tokenizer, [{"role": "user",
                                        "content": final_prompt(question, memory, settings.answer_format)}])
    if settings.answer_prefix:
        chat.prefill(settings.answer_prefix)
    await chat.generate(args.rollout_client, replace(sampling_params, max_new_tokens=settings.max_final),
                        session_id=f"{sample.index}")
    final = chat.to_sample(sample)
    final.metadata.update(memory=memory, chunks=len(chunks), tokens_cut=cut, doc_tokens=doc_tokens)
    if evaluation:
        final.metadata.update(answer_trace="".join(trace), resumed_at=first)
    final.metrics.update(chunks=float(len(chunks)), tokens_cut=float(cut),
                         memory_tokens=float(len(args.tokenizer(memory, add_special_tokens=False)["input_ids"])))
    return out + [final]
