"""Which memories a MemUpdate policy edits, read from its evaluation episodes: does it update the memory that
answers the question, or the first search result whatever its date?

    python -m examples.mem_update.edit_audit SFT=eval/sft_s0.samples.jsonl "SFT + RL=eval/rl_s0.samples.jsonl" \
        [--out audit]

Each ``NAME=FILE`` is one row: an evaluation's ``*.samples.jsonl`` (gzipped as the records keep them, or not),
one episode a line with its reply text and the data's labels in ``metadata`` (``evidence``: the dialogue turns
that answer the shown question; ``asked_evidence``: those of any question of the conversation; ``memories``: the
store before the episode, each memory with the turns it came from and its date). Per row:

- calls written per episode (search, update, create, delete), malformed ones included;
- the rationale (``demonstrations.py --rationale``: "The question asks about <month>. Answering it, from <date>:
  <id>"): how many episodes write it, and where the question names a month, how many name that month's date;
- of the episodes that update a memory, the first memory updated: one the shown question's answer comes from
  (its evidence), the first search result, and, where the question names a month, a memory of that month;
- deletions per episode, and those of a memory that some question of the conversation needs (asked evidence;
  "-" for data prepared before it was kept);
- on fact lists (``prepare_data.py --generate-fact-lists`` or ``--fact-consolidation``), the distinct facts deleted
  per episode by what they were (``fact_consolidation.statement_kinds``): superseded (a later fact restates them:
  what consolidating deletes), the latest statement of a restated slot (an answer lost), a fact stated once, or an
  id not in the store; and the share that were superseded. Can a policy that writes the sweep's calls tell which
  fact is the older?

Printed as a table, and with ``--out`` written to OUT.md and OUT.json.
"""

import argparse
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from examples.mem_update.fact_consolidation import statement_kinds
from examples.mem_update.prompts import ANSWERING, ASKS_ABOUT
from vime_ext.agent.tool_calls import ToolCall, parse_tool_calls
from vime_ext.data.prompt_dataset import json_lines
from vime_ext.reports import report

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
MONTH_YEAR = re.compile(rf"\b({'|'.join(MONTHS)}) (\d{{4}})\b")
# the month the rationale says the question asks about, and the date it answers from
RATIONALE = re.compile(rf"{re.escape(ASKS_ABOUT)}(.+?)\. {re.escape(ANSWERING)}from ([^:]+):")
RESULTS = '{"results": '  # how search_memory's answer begins (tools.py)
FACT_KINDS = ("superseded", "latest", "single", "absent")  # statement_kinds' kinds, and an id not in the store


@dataclass
class Audit:
    episodes: int = 0
    calls: dict[str, float] = field(default_factory=lambda: {"search": 0.0, "update": 0.0, "create": 0.0,
                                                             "delete": 0.0})
    with_rationale: int = 0
    month_rationales: int = 0  # rationales on a question that names a month
    rationale_month_asked: int = 0
    updated: int = 0  # episodes that update a memory
    updated_evidence: int = 0
    updated_first_result: int = 0
    month_updated: int = 0  # of them, the question names a month
    updated_month_asked: int = 0
    evidence_deletions: float | None = 0.0  # None: data prepared before asked_evidence was kept
    # fact lists: distinct facts deleted per episode by statement_kinds' kind, "absent" for an id not in the store;
    # and those the episode's searches showed (what deleting shown facts at random would hit: the chance row)
    fact_deletions: dict[str, float] | None = None
    fact_shown: dict[str, float] | None = None

    @staticmethod
    def superseded_share(counts: dict[str, float] | None) -> str:
        """The share of ``counts`` (fact_deletions or fact_shown) that were superseded facts ("-" for none)."""
        total = sum((counts or {}).values())
        return f"{counts['superseded'] / total:.1%}" if total else "-"


def month_of(text: str) -> tuple[str, str] | None:
    """The first "<Month> <year>" in ``text``, or "<day> <Month>, <year>" read as its month and year."""
    found = MONTH_YEAR.search(text.replace(",", ""))
    return (found.group(1), found.group(2)) if found else None


def read_episodes(path: Path) -> list[dict]:
    episodes = []
    for where, row in json_lines(path):
        try:
            episodes.append({"response": row["response"], "question": str(row["prompt"]),
                             "metadata": row["metadata"]})
        except KeyError as err:
            raise ValueError(f"{where}: no field {err.args[0]!r} (an evaluation's samples file?)") from None
    return episodes


def search_results(response: str) -> list[list[str]]:
    """The ids each search's results showed, search by search, read from the tools' answers in the response
    (whichever way the chat template wrapped them: Qwen's <tool_response> tags, SmolLM2's "tool" turns)."""
    decoder, shown, at = json.JSONDecoder(), [], response.find(RESULTS)
    while at != -1:
        try:
            answer, end = decoder.raw_decode(response, at)
        except json.JSONDecodeError:
            end = at + len(RESULTS)
        else:
            if isinstance(answer.get("results"), list):
                shown.append([str(r.get("id")) for r in answer["results"] if isinstance(r, dict)])
        at = response.find(RESULTS, end)
    return shown


def first_results(response: str) -> list[str]:
    """The ids of the first search's results, in their order ([] when no search answered)."""
    return next(iter(search_results(response)), [])


def audit(episodes: list[dict], where: str) -> Audit:
    result = Audit(episodes=len(episodes))
    for number, episode in enumerate(episodes, start=1):
        metadata = episode["metadata"]
        try:
            memories = {m["id"]: m for m in metadata["memories"]}
            evidence, asked = set(metadata["evidence"]), metadata.get("asked_evidence")
        except (KeyError, TypeError) as err:
            raise ValueError(f"{where}, episode {number}: its metadata lacks the data's labels ({err}); prepare "
                             "the data again (examples/mem_update/prepare_data.py)") from None
        turns = lambda memory_id: set(memories.get(memory_id, {}).get("metadata", {}).get("evidence", []))  # noqa: E731
        date = lambda memory_id: str(memories.get(memory_id, {}).get("metadata", {}).get("date", ""))  # noqa: E731
        asked_month = month_of(episode["question"])
        calls = [c for c in parse_tool_calls(episode["response"]) if isinstance(c, ToolCall)]
        updates = [str(c.arguments.get("memory_id")) for c in calls if c.name == "manage_memory"
                   and c.arguments.get("operation") == "update"]
        deletes = [str(c.arguments.get("memory_id")) for c in calls if c.name == "delete_memory"]
        result.calls["search"] += sum(c.name == "search_memory" for c in calls)
        result.calls["update"] += len(updates)
        result.calls["create"] += sum(c.name == "manage_memory" and c.arguments.get("operation") == "create"
                                      for c in calls)
        result.calls["delete"] += len(deletes)
        if asked is None:
            result.evidence_deletions = None
        elif result.evidence_deletions is not None:
            result.evidence_deletions += sum(bool(turns(m) & set(asked)) for m in deletes)
        if kinds := statement_kinds(list(memories.values())):
            if result.fact_deletions is None:
                result.fact_deletions, result.fact_shown = ({kind: 0.0 for kind in FACT_KINDS} for _ in range(2))
            for memory_id in dict.fromkeys(deletes):  # a fact deleted twice is one deletion (the second fails)
                result.fact_deletions[kinds.get(memory_id, "absent")] += 1
            for memory_id in {i for shown in search_results(episode["response"]) for i in shown}:
                result.fact_shown[kinds.get(memory_id, "absent")] += 1
        if (said := RATIONALE.search(episode["response"])) is not None:
            result.with_rationale += 1
            if asked_month is not None:
                result.month_rationales += 1
                result.rationale_month_asked += month_of(said.group(2)) == asked_month
        if updates:
            first = updates[0]
            result.updated += 1
            result.updated_evidence += bool(turns(first) & evidence)
            results = first_results(episode["response"])
            result.updated_first_result += bool(results) and results[0] == first
            if asked_month is not None:
                result.month_updated += 1
                result.updated_month_asked += month_of(date(first)) == asked_month
    for name in result.calls:
        result.calls[name] /= max(result.episodes, 1)
    if result.evidence_deletions is not None:
        result.evidence_deletions /= max(result.episodes, 1)
    for counts in (result.fact_deletions, result.fact_shown):
        for kind in counts or {}:
            counts[kind] /= max(result.episodes, 1)
    return result


def share(part: int, whole: int) -> str:
    return f"{part} of {whole}" if whole else "-"


def table(rows: dict[str, Audit]) -> str:
    lines = ["| row | episodes | search / update / create / delete an episode | rationale (month asked) | "
             "first update: evidence | first search result | month asked | deletions an episode (of evidence) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, a in rows.items():
        calls = " / ".join(f"{a.calls[k]:.2f}" for k in ("search", "update", "create", "delete"))
        of_evidence = "-" if a.evidence_deletions is None else f"{a.evidence_deletions:.2f}"
        lines.append(f"| {name} | {a.episodes} | {calls} | {a.with_rationale} "
                     f"({share(a.rationale_month_asked, a.month_rationales)}) | "
                     f"{share(a.updated_evidence, a.updated)} | {share(a.updated_first_result, a.updated)} | "
                     f"{share(a.updated_month_asked, a.month_updated)} | {a.calls['delete']:.2f} ({of_evidence}) |")
    facts = {name: a for name, a in rows.items() if a.fact_deletions is not None}
    if facts:
        lines += ["", "Fact lists, distinct facts deleted an episode, and the share superseded of those its searches "
                  "showed (deleting shown facts at random):", "",
                  "| row | superseded (right) | latest statement (an answer lost) | stated once | not in the store | "
                  "share superseded | shown: facts, share superseded |", "|---|---|---|---|---|---|---|"]
        for name, a in facts.items():
            kinds = " | ".join(f"{a.fact_deletions[k]:.2f}" for k in FACT_KINDS)
            lines.append(f"| {name} | {kinds} | {a.superseded_share(a.fact_deletions)} | "
                         f"{sum(a.fact_shown.values()):.1f}, {a.superseded_share(a.fact_shown)} |")
    return "\n".join(lines)


def main(argv=None) -> dict[str, Audit]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="+", metavar="NAME=FILE", help="a row: its name and its samples file")
    parser.add_argument("--out", type=Path, help="also write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    rows = {}
    for spec in args.rows:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            parser.error(f"{spec!r}: a row is NAME=FILE")
        path = Path(file)
        if not path.is_file():
            parser.error(f"{name}: no file {path}")
        rows[name] = audit(read_episodes(path), f"{path}")
    report(table(rows), {k: asdict(v) for k, v in rows.items()}, args.out)
    return rows


if __name__ == "__main__":
    main()
