"""What the memories of an evaluation hold, beside its score: for every model and length, how many final replies
box an answer, how often the gold answer is in the memory the reply was read from, and how much of each memory
was copied from the document (its sentences found there word for word) rather than written by the model. A model
that scores 0 can fail at any of these steps; this says which. Rows with an ``answer_trace`` (the memory after
each chunk held a gold answer or not) also say whether a missing answer never reached the memory or was
overwritten after it had.

    python -m examples.mem_agent.memory_audit --save-dir SAVE_DIR --data-root DATA_ROOT [--out audit.json]

Reads the rows ``run-eval.sh`` wrote (``SAVE_DIR/ruler_hqa_{N}/{SAVE_FILE}.jsonl``, which carry the memory) and
the files they came from (``DATA_ROOT/eval_{N}.json``), matched by item index; prints a Markdown table.
"""

import argparse
import json
import re
import statistics
from pathlib import Path

from examples.mem_agent.data import QAItem, read_eval_file
from examples.mem_agent.scoring import extract_answer, holds_answer

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
COLUMNS = (("items", "items", 0), ("boxed", "boxed answer %", 1), ("answer_in_memory", "answer in memory %", 1),
           ("answer_ever", "answer ever in memory %", 1), ("answer_lost", "answer lost after it was kept %", 1),
           ("sentences", "memory sentences", 1), ("copied", "copied from the document %", 1))


def audit_rows(rows: list[dict], items: dict[str, QAItem], where: Path) -> dict:
    """The audit of one model at one length (``where``); ``items``: the eval file's, by index."""
    boxed = answer_kept = 0
    sentences, copied, traces = [], [], []
    for line, row in enumerate(rows, 1):
        item = items.get(str(row["index"]))
        if item is None or list(item.answers) != list(row["answers"]):
            raise ValueError(f"{where}:{line}: item {row['index']} is not the eval file's (--data-root): "
                             f"another eval file made these rows")
        context = item.context
        memory = row.get("memory") or ""
        boxed += extract_answer(row.get("response") or "", "boxed") is not None
        answer_kept += holds_answer(memory, row["answers"])
        if row.get("answer_trace"):  # rows of evaluations before the trace existed have none
            traces.append(row["answer_trace"])
        written = [s.strip() for s in SENTENCE_END.split(memory) if s.strip()]
        sentences.append(len(written))
        copied += [s in context for s in written]
    n = len(rows)
    ever = [t for t in traces if "1" in t]
    return {"items": n, "boxed": 100 * boxed / n, "answer_in_memory": 100 * answer_kept / n,
            # of the items with a trace: the answer reached the memory at some chunk; and of those, it was gone
            # from the memory at the end (overwritten rather than never written)
            "answer_ever": 100 * len(ever) / len(traces) if traces else None,
            "answer_lost": 100 * sum(t[-1] == "0" for t in ever) / len(ever) if ever else None,
            "sentences": statistics.fmean(sentences), "copied": 100 * statistics.fmean(copied) if copied else None}


def audit(save_dir: Path, data_root: Path) -> dict[str, dict[str, dict]]:
    """save_file -> number of documents -> its audit, for every length folder with an eval file beside it."""
    result: dict[str, dict[str, dict]] = {}
    folders = sorted((p for p in save_dir.glob("ruler_hqa_*") if p.is_dir()),
                     key=lambda p: int(p.name.rsplit("_", 1)[1]))
    for folder in folders:
        num_docs = folder.name.rsplit("_", 1)[1]
        data_file = data_root / f"eval_{num_docs}.json"
        if not data_file.is_file():
            raise FileNotFoundError(f"{data_file}: the eval file of {folder} is missing (--data-root)")
        items, _ = read_eval_file(data_file)
        by_index = {str(entry["index"]): item for item, entry in items}
        for rows_file in sorted(folder.glob("*.jsonl")):
            if rows_file.name.endswith(".failed.jsonl"):
                continue
            rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
            if rows:
                result.setdefault(rows_file.stem, {})[num_docs] = audit_rows(rows, by_index, rows_file)
    return result


def markdown(result: dict[str, dict[str, dict]]) -> str:
    lines = ["| model | documents | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for save_file, by_length in result.items():
        for num_docs, cells in by_length.items():
            values = ["-" if cells[key] is None else f"{cells[key]:.{digits}f}" for key, _, digits in COLUMNS]
            lines.append(f"| {save_file} | {num_docs} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save-dir", type=Path, required=True, help="run-eval.sh's SAVE_DIR")
    parser.add_argument("--data-root", type=Path, required=True, help="the folder of the eval_{N}.json files")
    parser.add_argument("--out", type=Path, help="also write the audit here as JSON")
    args = parser.parse_args(argv)
    result = audit(args.save_dir, args.data_root)
    print(markdown(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
