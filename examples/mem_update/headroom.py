"""What the untouched store leaves a MemUpdate editor to gain, read from prepared data before any model runs:

    python -m examples.mem_update.headroom runs/mem_update_smollm2/data/val_eval.jsonl [--retriever embedding] \
        [--top-k 5] [--extra-questions 3] [--out headroom]

For the question each episode shows the agent and for the unseen ones the evaluation also scores
(``extra_qa``, the first ``--extra-questions``), on the store as prepared:

- how many have all their evidence (the dialogue turns the answer comes from) in the search's top k, the memories
  the reader is given: an edit can only add to what the reader sees where some is missing;
- how many memories of that top k come from turns no question of the conversation names (noise to the
  demonstrations, which delete it), and how many top k hold at least one;
- how many unseen questions share evidence with the shown one: an edit made for the shown question reaches an
  unseen one directly only through those; the rest it reaches only through what it deletes or adds beside them.

The data must come from ``prepare_data.py`` as it is now (each unseen question with its ``evidence``); older files
are refused with the line named. Printed as a table; with ``--out``, OUT.md and OUT.json too.
"""

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path

from examples.mem_update.retrieval import make_retriever
from examples.mem_update.store import Memory
from vime_ext.data.prompt_dataset import DataError, json_lines
from vime_ext.reports import report


@dataclass
class Headroom:
    questions: int = 0
    evidence_in_top: int = 0  # all of the question's evidence among the top k memories
    noise_in_top: int = 0  # memories of the top k from turns no question of the conversation names, summed
    tops_with_noise: int = 0
    shares_evidence: int = 0  # unseen questions whose evidence overlaps the shown question's

    def add(self, evidence: set[str], top: list[Memory], asked: set[str]) -> None:
        turns = [set(m.metadata.get("evidence", [])) for m in top]
        self.questions += 1
        self.evidence_in_top += evidence <= set().union(*turns)
        noise = sum(not (t & asked) for t in turns)
        self.noise_in_top += noise
        self.tops_with_noise += noise > 0


def _field(row: dict, key: str, where: str):
    if key not in row:
        raise DataError(f"{where}: no {key!r}; prepare the data again (examples/mem_update/prepare_data.py)")
    return row[key]


def headroom(path: Path, retriever: str = "embedding", top_k: int = 5,
             extra_questions: int = 3) -> dict[str, Headroom]:
    """The shown and the unseen questions' figures over every episode of a prepared data file."""
    search = make_retriever(retriever)
    shown, unseen = Headroom(), Headroom()
    for where, row in json_lines(path):
        meta = _field(row, "metadata", where)
        memories = [Memory.from_record(r, i) for i, r in enumerate(_field(meta, "memories", where))]
        asked = set(_field(meta, "asked_evidence", where))
        evidence = set(_field(meta, "evidence", where))
        questions = [(shown, str(row.get("prompt", "")), evidence)]
        for extra in _field(meta, "extra_qa", where)[:extra_questions]:
            other = set(_field(extra, "evidence", f"{where} (extra_qa)"))
            unseen.shares_evidence += bool(other & evidence)
            questions.append((unseen, str(extra["question"]), other))
        for counts, question, needs in questions:
            counts.add(needs, [m for m, _ in search.search(question, memories, top_k=top_k)], asked)
    return {"shown": shown, "unseen": unseen}


def table(rows: dict[str, Headroom], top_k: int) -> str:
    lines = [f"| questions | scored | all evidence in the top {top_k} | noise memories a top {top_k} (mean) | "
             f"a top {top_k} with noise | sharing evidence with the shown question |", "|---|---|---|---|---|---|"]
    for name, h in rows.items():
        mean = h.noise_in_top / h.questions if h.questions else 0.0
        sharing = "-" if name == "shown" else f"{h.shares_evidence} of {h.questions}"
        lines.append(f"| {name} | {h.questions} | {h.evidence_in_top} of {h.questions} | {mean:.2f} | "
                     f"{h.tops_with_noise} of {h.questions} | {sharing} |")
    return "\n".join(lines)


def main(argv=None) -> dict[str, Headroom]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a prepared split (prepare_data.py), e.g. data/val_eval.jsonl")
    parser.add_argument("--retriever", default="embedding", help="embedding or bm25 (memup_retriever)")
    parser.add_argument("--top-k", type=int, default=5, help="memories the reader is given (memup_top_k)")
    parser.add_argument("--extra-questions", type=int, default=3,
                        help="unseen questions scored (memup_extra_questions)")
    parser.add_argument("--out", type=Path, help="also write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    rows = headroom(args.data, args.retriever, args.top_k, args.extra_questions)
    report(table(rows, args.top_k), {k: asdict(v) for k, v in rows.items()}, args.out)
    return rows


if __name__ == "__main__":
    main()
