"""A consolidation sweep on a numbered fact list (fact consolidation data): the edit a policy could learn to make
with the tools alone, reading only what its searches show.

A fact list states some facts twice with different values, and the later statement (the larger number at the
start of its text) is the one that holds. An episode that sweeps:

1. searches for the question it was shown (``top_k`` 20), and then for the relation phrases of the list's
   templates ("was born in the city of", ...) in turn (``top_k`` 20), one search per reply, ``searches`` in all;
2. in the reply after each search, deletes every fact that the results show restated by a later fact of the same
   slot (``fact_consolidation.slot``: the fact without its value), before the next search in that reply; with
   ``rationale``, each delete names the fact that restates it before the one it deletes (its ``reason``, written
   first: ``{"reason": "restated by f240", "memory_id": "f12"}``), so that a policy learning the sweep writes
   the pair it found before its choice;
3. ends with a reply without a call.

No gold answer and no label is read: which fact is older comes from the numbers the results show, as a policy
would read them. ``searches`` (``memup_sweep_searches``, 5) is what fits the episode's token budget
(``memup_max_context_tokens``, 8192 by default): a search of 20 facts returns about 900 tokens beside the 1,500
of the prompt and tools. With the Qwen tokenizer five searches and their deletes take 6,800 to 7,100 tokens on
the real list (six went over on some questions) and 7,800 to 8,140 on generated lists (``fact_lists.py``, where
more conflicts show per search); SmolLM2's template renders the same chats to 8,350-8,600, so four fit it.
``consolidated`` (every superseded fact of the list deleted) is what a sweep over the whole list would reach.
"""

from dataclasses import dataclass

from examples.mem_update.fact_consolidation import FACT_LINE, VERB_PHRASES, restatements
from examples.mem_update.prompts import RESTATED_BY
from examples.mem_update.tools import ToolBox, ToolCall

SWEEP_K = 20  # the searches' top_k (the schema's largest)
SWEEP_QUERIES = VERB_PHRASES  # the relation phrases of the list's templates, searched in their order
FINAL = "The store is consolidated: each fact the searches showed restated later now holds its latest value only."


@dataclass(frozen=True)
class Reply:
    calls: list[tuple[ToolCall, dict]]  # each call of the reply and its real result, in order


def restated(results: list[dict], gone: set[str] = frozenset()) -> list[tuple[str, str]]:
    """(older, newer) id pairs of the shown facts: each shown fact that a later shown fact of the same slot
    restates, in the order of the facts that restate them (``gone``: ids deleted already, left out)."""
    return restatements([(int(match.group(1)), hit["id"], hit["content"]) for hit in results
                         if hit["id"] not in gone and (match := FACT_LINE.fullmatch(str(hit["content"]).strip()))])


def delete_call(older: str, newer: str, rationale: bool = False) -> ToolCall:
    """The sweep's delete of ``older``; with ``rationale`` the fact that restates it comes first, as its reason."""
    if rationale:
        return ToolCall("delete_memory", {"reason": f"{RESTATED_BY}{newer}", "memory_id": older})
    return ToolCall("delete_memory", {"memory_id": older, "reason": "restated later with another value"})


def play_sweep(question: str, box: ToolBox, searches: int, where: str = "", rationale: bool = False) -> list[Reply]:
    """The sweep's replies with calls (the final reply, ``FINAL``, has none), each call run on ``box``; with
    ``rationale`` each delete names the restating fact first."""
    if searches < 1:
        raise ValueError(f"{where}: a sweep needs at least one search")
    queries = [question, *SWEEP_QUERIES][:searches]
    replies, pending, gone = [], [], set()

    def play(call: ToolCall, calls: list) -> dict:
        result = box.run(call)
        if result.error:
            raise ValueError(f"{where}: sweep call {call} failed: {result.content}")
        calls.append((call, result.content))
        return result.content

    for query in [*queries, None]:
        calls: list[tuple[ToolCall, dict]] = []
        for older, newer in pending:
            play(delete_call(older, newer, rationale), calls)
            gone.add(older)
        if query is not None:
            pending = restated(play(ToolCall("search_memory", {"query": query, "top_k": SWEEP_K}), calls)["results"],
                               gone)
        if calls:
            replies.append(Reply(calls))
    return replies
