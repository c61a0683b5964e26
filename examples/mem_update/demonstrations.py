"""Demonstrations of good MemUpdate episodes, for a supervised warm start (``--loss-type sft_loss``) before RL.

For each QA item of the training conversations, an episode is played against the real store and tools
(``ToolBox``, the retriever of ``--retriever``), with calls chosen from what the data itself records: which
memories are the question's evidence (their ``evidence`` dia_ids are the QA item's) and which are noise (their
evidence is no QA item's of the conversation). What the calls say comes from what the chat shows: only memories
the search returned are acted on, by the ids and texts it returned. The calls, in Qwen's format, one per reply:

1. ``search_memory`` for the question (``top_k`` 10);
2. ``manage_memory`` update: each evidence memory the search showed, with its session's date (shown beside it)
   written into the text (dates are not part of a memory, so retrieval never reads them);
3. ``merge_memory``: those evidence memories into one, when there are several (multi-hop questions);
4. ``manage_memory`` create: a semantic memory that states the question and the evidence as now written, so a
   search for the question finds it first (an evidence memory alone can lose its place: a date written into it
   lengthens it, and a speaker's other trips or jobs compete with it);
   steps 2-4 only when the search showed all of the question's evidence (a part stated as the answer misleads);
   ``--no-answer-note`` leaves step 4 out: the 135M policy, trained on it, copies the wrong session's fact into
   the note on questions that name a month, and the reader then answers from that note (docs/mem_update.md);
5. ``delete_memory``: noise memories that the search returned (at most two);
6. a final reply without a call.

``--rationale`` puts one sentence before the first call after the search, in the same reply: the month the
question asks about (when it names one), then each evidence memory's date, id and text as the results showed
them ("The question asks about February 2023. Answering it, from 20 February, 2023: s4-andrew-1, "Andrew
travelled to Hanoi.""). Without it, the SFT policies (135M and 1.5B) learned to update the first search result:
on the validation questions that name a month, 30 of 30 updates (the demonstrations: 123 of 295), so a wrong
session's fact whenever another session ranked first (docs/mem_update.md). The sentence writes the date before
the id, so that the id follows from the date matching the question.

The tool results are the real ones, so the demonstration is what the policy would see in a rollout; the chat,
the system and user prompts and the tool list are ``rollout.py``'s. One chat per line (``--input-key messages``,
tools under ``tools``), from the training split only (``prepare_data.py``'s split and seed):

    python -m examples.mem_update.demonstrations --locomo data/mem_update/locomo_generated.json \\
        --out data/mem_update/sft.jsonl [--retriever embedding|bm25] [--n-test 3] [--seed 42] [--no-answer-note] \\
        [--rationale]

On fact lists (``prepare_data.py --generate-fact-lists``), ``--sweep-prompts train.jsonl`` writes instead the
consolidation sweep of ``sweep.py`` for each record: the searches the episode's budget holds, each followed by
deleting what its results show restated later (several calls in one reply), then a final reply; with
``--rationale`` each delete names the fact that restates it first (``sweep.delete_call``):

    python -m examples.mem_update.demonstrations --sweep-prompts data/fact_lists/train.jsonl \\
        --out data/fact_lists/sft.jsonl [--rationale]
"""

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from examples.mem_update.locomo import MONTHS, Conversation, load_locomo, session_day, split
from examples.mem_update.prompts import ANSWERING, ASKS_ABOUT, INCOMPLETE
from examples.mem_update.retrieval import make_retriever
from examples.mem_update.rollout import episode_messages
from examples.mem_update.settings import MemUpdateSettings
from examples.mem_update.store import STORE
from examples.mem_update.sweep import FINAL as SWEEP_FINAL
from examples.mem_update.sweep import play_sweep
from examples.mem_update.tools import TOOLS, ToolBox, ToolCall
from vime_ext.agent.sample import Sample
from vime_ext.agent.tool_calls import tool_message
from vime_ext.data.prompt_dataset import DataError, json_lines

FINAL = "The store is ready: the facts this question needs are stated with their dates, and the noise is gone."
ASKED_MONTH = re.compile(rf"\b({'|'.join(MONTHS)}),? (\d{{4}})\b")
MAX_DELETES = 2
SEARCH_K = 10  # the demonstrated search's top_k: what the episode can act on


@dataclass(frozen=True)
class Demonstration:
    messages: list[dict]
    calls: list[str]  # the tools called, in order
    namespace: str  # the played-out store, kept for a reward to read (STORE.drop it after)


@dataclass(frozen=True)
class Played:
    calls: list[tuple[ToolCall, dict]]  # each call and its real result, in order
    rationale: str  # the sentence --rationale puts before the first call after the search


def _day(memory) -> str:
    """The date shown beside a memory, without its time."""
    return session_day(str(memory.metadata.get("date", "")))


def rationale(question: str, evidence: list) -> str:
    """What the first reply after the search says: the month asked about, then each evidence memory as the results
    showed it, its date first; or that the results lack part of what the question needs (``evidence`` empty)."""
    if not evidence:
        return INCOMPLETE
    month = ASKED_MONTH.search(question)
    asked = f"{ASKS_ABOUT}{month.group(1)} {month.group(2)}. " if month else ""
    found = "; and ".join(f"from {_day(m)}: {m.id}, {json.dumps(m.content, ensure_ascii=False)}" if _day(m)
                          else f"{m.id}, {json.dumps(m.content, ensure_ascii=False)}" for m in evidence)
    return f"{asked}{ANSWERING}{found}"  # each text quoted with its own full stop


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(name, arguments)


def _evidence(memory) -> set[str]:
    """The dia_ids a memory records as its evidence."""
    return set(memory.metadata.get("evidence", []))


def plan_and_play(item: dict, asked: set[str], box: ToolBox, answer_note: bool = True, where: str = "") -> Played:
    """The calls for ``item`` (its ``question`` and ``evidence``; chosen as the module says, step 4 only with
    ``answer_note``; ``asked``: the dia_ids any question of the conversation names, a memory of none being noise),
    each one's real result, and the rationale of what the search showed. ``where`` names the item in errors."""
    played = []

    def play(call: ToolCall) -> dict:
        result = box.run(call)
        if result.error:
            raise ValueError(f"{where}: demonstration call {call} failed: {result.content}")
        played.append((call, result.content))
        return result.content

    found = play(_call("search_memory", query=item["question"], top_k=SEARCH_K))["results"]
    # Only memories the search showed are acted on: an id the chat never showed is one the policy cannot know
    # (the first demonstrations updated evidence memories that no result had shown; the model trained on them
    # called ids that did not exist).
    shown = [box.namespace.get(hit["id"]) for hit in found]
    evidence = [m for m in shown if _evidence(m) & set(item["evidence"])]
    # Part of the evidence shown (the other part out of the results): stating that part as the answer misleads
    # the reader, so the episode leaves the evidence as it is.
    if len(evidence) < sum(1 for m in box.namespace.memories() if _evidence(m) & set(item["evidence"])):
        evidence = []
    why = rationale(item["question"], evidence)
    kept, text = [], {}
    for memory in evidence:
        day = _day(memory)
        text[memory.id] = memory.content
        if day and day not in memory.content:
            text[memory.id] = play(_call("manage_memory", operation="update", memory_id=memory.id,
                                         content=f"{memory.content} This was on {day}."))["updated"]["content"]
        kept.append(memory.id)
    if len(kept) > 1:
        merged = play(_call("merge_memory", memory_ids=kept, strategy="concatenate"))["merged"]
        kept, text = [merged["id"]], {merged["id"]: merged["content"]}
    if kept and answer_note:  # the answer in the question's words, from what the chat shows (the evidence as written)
        play(_call("manage_memory", operation="create", memory_type="semantic",
                   content=f"Asked \"{item['question']}\", the conversation says: {text[kept[0]]}"))
    noise = [m.id for m in shown if m.id in box.namespace and not _evidence(m) & asked]  # merges removed some
    for memory_id in noise[:MAX_DELETES]:
        play(_call("delete_memory", memory_id=memory_id, reason="says nothing any question needs"))
    return Played(played, why)


def demonstration(conversation: Conversation, item: dict, settings: MemUpdateSettings,
                  answer_note: bool = True, with_rationale: bool = False) -> Demonstration:
    """One episode for ``item``: its chat (system, user, then a call and its result per turn, then the final
    reply; ``with_rationale``: the rationale opens the reply after the search's result), played on a fresh
    namespace of the conversation's memories."""
    namespace = STORE.create(conversation.memories)
    box = ToolBox(namespace, make_retriever(settings.retriever))
    slot = Sample(prompt=item["question"], metadata={"memories": conversation.memories})
    messages = episode_messages(slot, settings, len(namespace))
    try:
        played = plan_and_play(item, set(conversation.asked_evidence), box, answer_note, conversation.sample_id)
    except BaseException:
        STORE.drop(namespace.name)
        raise
    texts = [None] * len(played.calls) + [FINAL]  # each reply's words before its call (the last: no call)
    if with_rationale:
        texts[1] = played.rationale if texts[1] is None else f"{played.rationale} {texts[1]}"
    for played_call, text in zip(played.calls, texts):
        messages += reply_messages(text, [played_call])
    messages.append({"role": "assistant", "content": texts[-1]})
    return Demonstration(messages, [call.name for call, _ in played.calls], namespace.name)


def reply_messages(text: str | None, calls: list[tuple[ToolCall, dict]]) -> list[dict]:
    """A reply (its words, then its calls) and a tool message with each call's result."""
    return [{"role": "assistant", "content": text, "tool_calls": [
                {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call, _ in calls]},
            *[tool_message(result) for _, result in calls]]


def sweep_demonstration(record: dict, settings: MemUpdateSettings, where: str = "",
                        searches: int | None = None, rationale: bool = False) -> Demonstration:
    """The consolidation sweep (``sweep.py``, ``searches`` or ``settings.sweep_searches`` of them; ``rationale``:
    each delete names the restating fact first) for a prompt record of fact list data: its chat, played on a
    namespace of the record's memories (dropped after)."""
    memories = record["metadata"]["memories"]
    namespace = STORE.create(memories)
    try:
        replies = play_sweep(str(record["prompt"]), ToolBox(namespace, make_retriever(settings.retriever)),
                             searches or settings.sweep_searches, where=where, rationale=rationale)
    finally:
        STORE.drop(namespace.name)
    messages = episode_messages(Sample(prompt=record["prompt"], metadata={"memories": memories}), settings,
                                len(memories))
    for reply in replies:
        messages += reply_messages(None, reply.calls)
    messages.append({"role": "assistant", "content": SWEEP_FINAL})
    return Demonstration(messages, [call.name for reply in replies for call, _ in reply.calls], namespace.name)


def chat_tokens(tokenizer, messages: list[dict]) -> int:
    """The chat's length as SFT counts it against ``--sft-max-len``: its longest training sequence under the
    policy's template, with the tools (``sft_rollout``'s masker)."""
    from vime_ext.rollout.sft_rollout import masker_for  # the rollout package: only where a tokenizer is given

    return max(len(sequence.tokens) for sequence in masker_for(tokenizer)(messages, TOOLS).sequences)


def write_sweep_demonstrations(prompts: str | Path, out: str | Path, settings: MemUpdateSettings, tokenizer=None,
                               max_tokens: int | None = None, rationale: bool = False) -> tuple[Path, dict[str, int]]:
    """A sweep chat for every record of a prompt file of fact lists (``prepare_data.py --generate-fact-lists``'s
    train.jsonl); returns the path and the calls per tool (and ``searches_<n>``: the chats of n searches). With
    a ``tokenizer``, a chat over ``max_tokens`` is played again with one search fewer until it fits: the searches
    the policy's context holds (SmolLM2's template renders the chats longer than Qwen's)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with out.open("w", encoding="utf-8") as f:
        for where, record in json_lines(prompts):
            if not any(m.get("source") == "fact_list" for m in record.get("metadata", {}).get("memories", [])):
                raise DataError(f"{where}: not fact list data (no memory of source 'fact_list'): --sweep-prompts "
                                "takes prepare_data.py --generate-fact-lists's records")
            for searches in range(settings.sweep_searches, 0, -1):
                demo = sweep_demonstration(record, settings, where, searches, rationale)
                if tokenizer is None or chat_tokens(tokenizer, demo.messages) <= max_tokens:
                    break
            else:
                raise DataError(f"{where}: even a sweep of one search renders to more than {max_tokens} tokens")
            for name in [*demo.calls, f"searches_{searches}"]:
                counts[name] = counts.get(name, 0) + 1
            f.write(json.dumps({"messages": demo.messages, "tools": TOOLS, "metadata": {
                "sample_id": record["metadata"].get("sample_id"), "where": where}}, ensure_ascii=False) + "\n")
    return out, counts


def write_demonstrations(locomo: str | Path, out: str | Path, settings: MemUpdateSettings, n_test: int = 3,
                         seed: int = 42, n_val: int = 0, answer_note: bool = True,
                         with_rationale: bool = False) -> tuple[Path, dict[str, int]]:
    """Demonstrations for every QA item of the training split (prepare_data.py's, from the same ``n_test``,
    ``seed`` and ``n_val``); returns the path and the calls per tool."""
    conversations, _ = load_locomo(locomo)
    train = split(conversations, n_test, seed, n_val).train
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with out.open("w", encoding="utf-8") as f:
        for conversation in train:
            for k, item in enumerate(conversation.qa):
                demo = demonstration(conversation, item, settings, answer_note, with_rationale)
                STORE.drop(demo.namespace)
                for name in demo.calls:
                    counts[name] = counts.get(name, 0) + 1
                f.write(json.dumps({"messages": demo.messages, "tools": TOOLS, "metadata": {
                    "sample_id": conversation.sample_id, "qa": k}}, ensure_ascii=False) + "\n")
    return out, counts


# The defaults of the flags of one source (--locomo or --sweep-prompts) alone: left None by argparse, so that one
# given with the other source is refused, then filled in from here.
DEFAULTS = {"n_test": 3, "n_val": 0, "seed": 42, "sweep_searches": MemUpdateSettings.sweep_searches,
            "max_tokens": 8192}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="MemUpdate demonstrations (SFT chats) of good episodes")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--locomo", help="a locomo10.json-format file (e.g. prepare_data's)")
    source.add_argument("--sweep-prompts", metavar="TRAIN_JSONL",
                        help="fact list prompt records (prepare_data.py --generate-fact-lists's train.jsonl): a "
                             "consolidation sweep (sweep.py) per record")
    parser.add_argument("--out", required=True)
    parser.add_argument("--retriever", choices=["embedding", "bm25"], default="embedding",
                        help="as memup_retriever in the RL run: the search results the chats show")
    parser.add_argument("--sweep-searches", type=int,
                        help=f"with --sweep-prompts: the sweep's searches (memup_sweep_searches, "
                             f"{DEFAULTS['sweep_searches']})")
    parser.add_argument("--tokenizer", help="with --sweep-prompts: the policy's HF dir; a chat over --max-tokens "
                        "is played with fewer searches")
    parser.add_argument("--max-tokens", type=int,
                        help=f"with --tokenizer: the policy's context ({DEFAULTS['max_tokens']})")
    parser.add_argument("--n-test", type=int,
                        help=f"with --locomo: held-out conversations (as prepare_data.py, {DEFAULTS['n_test']})")
    parser.add_argument("--n-val", type=int,
                        help=f"with --locomo: validation conversations (as prepare_data.py, {DEFAULTS['n_val']})")
    parser.add_argument("--seed", type=int, help=f"with --locomo: the split's seed (as prepare_data.py, "
                                                 f"{DEFAULTS['seed']})")
    parser.add_argument("--no-answer-note", dest="answer_note", action="store_false",
                        help="with --locomo: leave out the note that states the question and its evidence "
                             "(step 4)")
    parser.add_argument("--rationale", action="store_true",
                        help="open the reply after the search with the month asked about and the evidence's "
                             "dates, ids and texts; with --sweep-prompts, each delete names the fact that "
                             "restates it before the fact it deletes")
    args = parser.parse_args(argv)
    # a flag of the other source would be ignored without a word: refused instead
    locomo_only = {"--n-test": args.n_test, "--n-val": args.n_val, "--seed": args.seed,
                   "--no-answer-note": None if args.answer_note else True}
    sweep_only = {"--sweep-searches": args.sweep_searches, "--tokenizer": args.tokenizer,
                  "--max-tokens": args.max_tokens}
    other, source = (locomo_only, "--locomo") if args.sweep_prompts else (sweep_only, "--sweep-prompts")
    if given := [flag for flag, value in other.items() if value is not None]:
        parser.error(f"{', '.join(given)}: only with {source}")
    if args.max_tokens is not None and args.tokenizer is None:
        parser.error("--max-tokens: only with --tokenizer (the tokens of which policy?)")
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    settings = MemUpdateSettings(retriever=args.retriever, sweep_searches=args.sweep_searches)
    if args.sweep_prompts:
        tokenizer = None
        if args.tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        try:
            path, counts = write_sweep_demonstrations(args.sweep_prompts, args.out, settings, tokenizer,
                                                      args.max_tokens, args.rationale)
        except DataError as err:
            sys.exit(f"demonstrations: {err}")
    else:
        path, counts = write_demonstrations(args.locomo, args.out, settings, args.n_test, args.seed, args.n_val,
                                            args.answer_note, args.rationale)
    print(f"{path}: calls per tool {json.dumps(counts)}")


if __name__ == "__main__":
    main()
