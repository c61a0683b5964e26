"""MemAgent's data formats: its HotpotQA training rows, RULER-HQA eval files, the training JSONL vime_ext reads,
and a generator of HotpotQA-style multi-hop data for offline use and tests.

- Training rows (MemAgent's parquet, or the same rows as JSONL): ``data_source``, ``prompt`` (a list with one user
  message holding the question), ``context`` (documents), ``ability``, ``reward_model.ground_truth`` (list of
  answers), ``extra_info`` (``index``, ``question``, ``num_docs``).
- RULER-HQA ``eval_{N}.json`` (N documents): a JSON array of ``{"index", "input", "answers", "context",
  "num_docs"}``. Documents are ``"Document {i}:\\n{title}\\n{text}"`` blocks joined by blank lines. Some very long
  files hold the context as a list of document indices instead of text; those items are refused.
- The training JSONL (``--prompt-data``): ``{"prompt": question, "label": [answers], "metadata": {"context",
  "num_docs", "index", "data_source"}}``.
"""

import json
import random
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DataError(ValueError):
    pass


@dataclass(frozen=True)
class QAItem:
    index: Any
    question: str
    answers: list[str]
    context: str
    num_docs: int
    data_source: str = "hotpotqa"
    supporting: tuple[str, ...] = ()  # the sentences the answer rests on, in answer order (generated items only)

    def training_row(self) -> dict:
        return {"prompt": self.question, "label": self.answers,
                "metadata": {"context": self.context, "num_docs": self.num_docs, "index": self.index,
                             "data_source": self.data_source}}


def format_documents(docs: list[tuple[str, str]]) -> str:
    return "\n\n".join(f"Document {i}:\n{title}\n{text}" for i, (title, text) in enumerate(docs, start=1))


def _answers(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, str) and a.strip() for a in value):
        raise DataError(f"{where}: answers must be a non-empty list of non-empty strings, got {str(value)[:80]!r}")
    return list(value)


def _context(value: Any, where: str, closed_book: bool = False) -> str:
    """The document text; ``closed_book`` (an item of 0 documents, the reference row without any document) asks
    for an empty one."""
    if isinstance(value, list):
        raise DataError(f"{where}: field 'context' is a list of document indices ({len(value)} entries), not text; "
                        "this loader needs the documents themselves (rebuild the file with its text)")
    if closed_book:
        if value != "":
            raise DataError(f"{where}: an item of num_docs 0 (closed book) must have an empty 'context'")
        return value
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field 'context' must be non-empty text (num_docs 0 for a closed-book item)")
    return value


def item_from_training_row(row: Any, where: str) -> QAItem:
    """One of MemAgent's HotpotQA training rows; errors name the row and the field."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    for key in ("prompt", "context", "reward_model", "extra_info"):
        if key not in row:
            raise DataError(f"{where}: missing field {key!r}; fields: {sorted(row)}")
    prompt, extra, model = row["prompt"], row["extra_info"], row["reward_model"]
    if hasattr(prompt, "tolist"):  # parquet gives numpy arrays
        prompt = prompt.tolist()
    if not isinstance(extra, dict) or not isinstance(model, dict):
        raise DataError(f"{where}: fields 'extra_info' and 'reward_model' must be objects")
    question = extra.get("question")
    if not question and isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        question = prompt[0].get("content")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: no question in 'extra_info.question' or 'prompt[0].content'")
    truth = model.get("ground_truth")
    if hasattr(truth, "tolist"):
        truth = truth.tolist()
    context = _context(row["context"], where)
    num_docs = extra.get("num_docs") or context.count("Document ")
    return QAItem(extra.get("index", where), question.strip(), _answers(truth, f"{where}: reward_model.ground_truth"),
                  context, int(num_docs), str(row.get("data_source") or "hotpotqa"))


def item_from_eval_entry(entry: Any, where: str) -> QAItem:
    """One RULER-HQA eval item."""
    if not isinstance(entry, dict):
        raise DataError(f"{where}: expected an object, got {type(entry).__name__}")
    for key in ("input", "answers", "context"):
        if key not in entry:
            raise DataError(f"{where}: missing field {key!r}; fields: {sorted(entry)}")
    if not isinstance(entry["input"], str) or not entry["input"].strip():
        raise DataError(f"{where}: field 'input' (the question) must be non-empty text")
    closed_book = entry.get("num_docs") == 0
    context = _context(entry["context"], where, closed_book)
    num_docs = 0 if closed_book else int(entry.get("num_docs") or context.count("Document "))
    return QAItem(entry.get("index", where), entry["input"].strip(), _answers(entry["answers"], f"{where}: answers"),
                  context, num_docs, "ruler_hqa")


def read_eval_file(path: str | Path) -> tuple[list[tuple[QAItem, dict]], list[str]]:
    """(item, raw entry) pairs of an ``eval_{N}.json``, and a message per refused entry."""
    path = Path(path)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err
    if not isinstance(entries, list):
        raise DataError(f"{path}: expected a JSON array of items")
    items, refused = [], []
    for i, entry in enumerate(entries):
        try:
            items.append((item_from_eval_entry(entry, f"{path}[{i}]"), entry))
        except DataError as err:
            refused.append(str(err))
    return items, refused


# ---- a generator of HotpotQA-style multi-hop data ---------------------------------------------------------------

_FIRST = ["Alma", "Boris", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Lars",
          "Mira", "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wim", "Yara", "Zeno"]
_LAST = ["Adler", "Brandt", "Costa", "Dorn", "Engel", "Falk", "Gruber", "Hale", "Ivers", "Jansen", "Kern", "Lind",
         "Moreau", "Novak", "Ortiz", "Pike", "Quist", "Rahn", "Stein", "Torres", "Ueda", "Voss", "Wolff", "Zorn"]
_CITIES = ["Arden", "Belmont", "Corvale", "Dunmore", "Eastwick", "Fairholt", "Glenrock", "Harrow", "Ironbridge",
           "Juniper", "Kelso", "Lowfield", "Marsden", "Northam", "Oakridge", "Penrith", "Queensby", "Ravenna",
           "Stanmore", "Thornby", "Upton", "Valmont", "Westport", "Yarrow"]
_WORKS = ["The Silent Harbor", "Winter Lanterns", "A House of Glass", "The Last Orchard", "Paper Moons",
          "The Iron Garden", "Salt and Ember", "The Long Meridian", "Northern Letters", "The Quiet Engine",
          "Glass Rivers", "The Copper Bell", "Hollow Crowns", "The Tenth Summer", "Blue Cartography",
          "The Amber Road", "Distant Signals", "The Clockmaker's Son", "Fields of Chalk", "The Ninth Wave"]
_FILLER = ["It received mixed reviews on release and later gained a small following.",
           "Critics noted its unusual structure and careful pacing.",
           "The production was delayed twice because of funding problems.",
           "A restored edition was published many years afterwards.",
           "Several scenes were rewritten shortly before the premiere.",
           "The work is sometimes taught in introductory courses.",
           "Its title was changed late in development.",
           "The first print run sold out within a month."]


@dataclass(frozen=True)
class Entities:
    """The names a generated item draws from. ``train`` and ``heldout`` split every list in two (alternate
    entries), so that held-out questions ask about novels, people and cities no training item names."""

    first: tuple[str, ...]
    last: tuple[str, ...]
    cities: tuple[str, ...]
    works: tuple[str, ...]

    def half(self, which: int) -> "Entities":
        return Entities(*(names[which::2] for names in (self.first, self.last, self.cities, self.works)))


ALL_ENTITIES = Entities(tuple(_FIRST), tuple(_LAST), tuple(_CITIES), tuple(_WORKS))
ENTITY_POOLS = {"all": ALL_ENTITIES, "train": ALL_ENTITIES.half(0), "heldout": ALL_ENTITIES.half(1)}


def _person(rng: random.Random, used: set[str], names: Entities) -> str:
    while True:
        name = f"{rng.choice(names.first)} {rng.choice(names.last)}"
        if name not in used:
            used.add(name)
            return name


# The generator's sentences and questions; demonstrations.py finds an item's facts again by the same forms.
WORK_SENTENCE = "{work} is a novel written by {person}."
PERSON_SENTENCE = "{person} is a writer who was born in {city}."
QUESTION_2HOP = "In which city was the author of the novel {work} born?"
QUESTION_1HOP = "Who wrote the novel {work}?"


def form_pattern(form: str, **known: str) -> str:
    """A regex of one of the forms above: the fields given match their value, the others one line's text each
    (a named group)."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(form):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(re.escape(known[field]) if field in known else f"(?P<{field}>[^\n]+?)")
    return "".join(parts)


def _work_doc(rng, work: str, person: str) -> tuple[str, str]:
    return work, WORK_SENTENCE.format(work=work, person=person) + " " + " ".join(rng.sample(_FILLER, 2))


def _person_doc(rng, person: str, city: str) -> tuple[str, str]:
    return person, PERSON_SENTENCE.format(person=person, city=city) + " " + " ".join(rng.sample(_FILLER, 1))


def generate_item(rng: random.Random, num_docs: int, index: Any, hops: int = 2,
                  entities: Entities = ALL_ENTITIES) -> QAItem:
    """A question whose answer needs ``hops`` documents (2: work -> author -> birthplace; 1: work -> author),
    hidden at random places among distractors of the same kind; ``num_docs`` documents in all, every name drawn
    from ``entities``."""
    if hops not in (1, 2) or num_docs < hops:
        raise ValueError(f"hops must be 1 or 2 and num_docs at least hops, got hops={hops}, num_docs={num_docs}")
    used: set[str] = set()
    works = rng.sample(entities.works, len(entities.works))
    work, author, city = works[0], _person(rng, used, entities), rng.choice(entities.cities)
    gold = [_work_doc(rng, work, author)] + ([_person_doc(rng, author, city)] if hops == 2 else [])
    distractors, people = [], len(entities.first) * len(entities.last)
    other_cities = [c for c in entities.cities if c != city]
    # Past the name pool, distractors reuse names, but never the author's (a second birthplace for the author
    # would make the question ambiguous), and a reused writer keeps the birthplace first given: one world.
    born_in: dict[str, str] = {}
    for k in range(num_docs - len(gold)):
        other = _person(rng, used, entities) if len(used) < people else rng.choice(sorted(used - {author}))
        if k % 2 == 0:
            distractors.append(_work_doc(rng, f"{works[1 + (k // 2) % (len(works) - 1)]} (vol. {k // 2 + 1})", other))
        else:
            if other not in born_in:
                born_in[other] = rng.choice(other_cities)
            distractors.append(_person_doc(rng, other, born_in[other]))
    docs = distractors
    for doc in gold:
        docs.insert(rng.randint(0, len(docs)), doc)
    if hops == 2:
        question, answer = QUESTION_2HOP.format(work=work), city
    else:
        question, answer = QUESTION_1HOP.format(work=work), author
    supporting = tuple(text.split(". ")[0] + "." for _, text in gold)
    return QAItem(index, question, [answer], format_documents(docs), num_docs, supporting=supporting)


def write_training_jsonl(path: str | Path, num: int, num_docs: int, seed: int = 0, hops: int = 2,
                         max_docs: int | None = None, entities: Entities = ALL_ENTITIES) -> Path:
    """``num`` generated training rows of ``num_docs`` documents each, or, with ``max_docs``, of a log-uniform
    count in [num_docs, max_docs]: many short items and a few long ones, the long tail of chunk counts that real
    HotpotQA-based training sets have (and that makes a synchronous batch wait for its longest trajectory)."""
    if max_docs is not None and max_docs < num_docs:
        raise ValueError(f"max_docs {max_docs} is below num_docs {num_docs}")
    rng = random.Random(seed)
    sizes = random.Random(seed + 7_919)  # its own stream: without max_docs the rows are as before
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(num):
            n = num_docs if max_docs is None else round(num_docs * (max_docs / num_docs) ** sizes.random())
            f.write(json.dumps(generate_item(rng, n, f"gen-{seed}-{i}", hops, entities).training_row()) + "\n")
    return path


def write_eval_file(folder: str | Path, num_docs: int, num: int, seed: int = 1, hops: int = 2,
                    entities: Entities = ALL_ENTITIES) -> Path:
    """``eval_{num_docs}.json`` in RULER-HQA's format."""
    rng = random.Random(seed * 100_003 + num_docs)
    items = [generate_item(rng, num_docs, i, hops, entities) for i in range(num)]
    return write_eval_items(Path(folder) / f"eval_{num_docs}.json", items)


def write_eval_items(path: str | Path, items: list[QAItem]) -> Path:
    """``items`` as a RULER-HQA eval file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{"index": it.index, "input": it.question, "answers": it.answers,
                                 "context": it.context, "num_docs": it.num_docs} for it in items], indent=1))
    return path
