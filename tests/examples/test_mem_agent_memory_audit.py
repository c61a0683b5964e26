"""examples/mem_agent/memory_audit.py on a generated eval file and rows written as run-eval.sh writes them."""

import json
import re

import pytest

from examples.mem_agent.data import write_eval_file
from examples.mem_agent.memory_audit import main


def test_it_counts_boxed_answers_kept_answers_and_copied_sentences(tmp_path):
    data = write_eval_file(tmp_path / "data", num_docs=20, num=2, seed=3)
    items = json.loads(data.read_text())
    first, second = items
    gold = first["answers"][0]
    kept = re.search(r"[^.]*born in " + re.escape(gold) + r"\.", first["context"]).group(0).strip()
    rows = [
        # a memory of 2 sentences, one from the document (with the answer), one made up; a boxed reply
        # (kept from the second chunk on)
        {"index": first["index"], "answers": first["answers"], "memory": f"{kept} Nobody wrote this here.",
         "response": f"So the answer is \\boxed{{{gold}}}.", "answer_trace": "011"},
        # an empty memory and a reply without a box (the answer was in the memory after chunk 2, then lost)
        {"index": second["index"], "answers": second["answers"], "memory": "", "response": "I do not know.",
         "answer_trace": "010"},
    ]
    folder = tmp_path / "eval" / "ruler_hqa_20"
    folder.mkdir(parents=True)
    (folder / "sft_s0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "sft_s0.failed.jsonl").write_text(json.dumps(rows[1]) + "\n")  # never read
    out = tmp_path / "audit.json"
    result = main(["--save-dir", str(tmp_path / "eval"), "--data-root", str(tmp_path / "data"), "--out", str(out)])
    cell = result["sft_s0"]["20"]
    assert cell == {"items": 2, "boxed": 50.0, "answer_in_memory": 50.0, "answer_ever": 100.0, "answer_lost": 50.0,
                    "sentences": 1.0, "copied": 50.0}
    assert json.loads(out.read_text()) == result
    # Rows of an evaluation made before the trace existed: those two columns are unknown, not 0.
    for row in rows:
        del row["answer_trace"]
    (folder / "sft_s0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cell = main(["--save-dir", str(tmp_path / "eval"), "--data-root", str(tmp_path / "data")])["sft_s0"]["20"]
    assert cell["answer_ever"] is None and cell["answer_lost"] is None and cell["answer_in_memory"] == 50.0


def test_rows_of_another_eval_file_are_refused(tmp_path):
    write_eval_file(tmp_path / "data", num_docs=20, num=2, seed=3)
    other = json.loads(write_eval_file(tmp_path / "other", num_docs=20, num=2, seed=4).read_text())
    folder = tmp_path / "eval" / "ruler_hqa_20"
    folder.mkdir(parents=True)
    row = {"index": other[0]["index"], "answers": ["Nowhere at all"], "memory": "", "response": ""}
    (folder / "rl_s0.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"rl_s0.jsonl:1: item 0 is not the eval file's"):
        main(["--save-dir", str(tmp_path / "eval"), "--data-root", str(tmp_path / "data")])


def test_a_missing_eval_file_is_named(tmp_path):
    (tmp_path / "eval" / "ruler_hqa_40").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="eval_40.json"):
        main(["--save-dir", str(tmp_path / "eval"), "--data-root", str(tmp_path / "data")])
