"""examples/mem_update/headroom.py: what the untouched store leaves an editor to gain, on a record worked out by hand
(BM25, top 1), on generated data as prepare_data.py writes it, and on data prepared before the unseen questions
carried their evidence."""

import json

import pytest

from examples.mem_update.headroom import headroom, main
from examples.mem_update.locomo import generate_locomo, load_locomo, prompt_records
from vime_ext.data.prompt_dataset import DataError


def memory(id_: str, content: str, turn: str) -> dict:
    return {"id": id_, "content": content, "metadata": {"evidence": [turn]}}


RECORD = {"prompt": "Where did Maria travel in July?", "label": "Oslo", "metadata": {
    "memories": [memory("m1", "Maria travelled to Oslo in July.", "D1:1"),
                 memory("m2", "John adopted a cat named Pepper.", "D1:2"),
                 memory("m3", "The weather was grey that week.", "D1:3")],
    "evidence": ["D1:1"], "asked_evidence": ["D1:1", "D1:2"],
    "extra_qa": [{"question": "What is the name of John's cat?", "answer": "Pepper", "category": 4,
                  "evidence": ["D1:2"]},
                 {"question": "Where did Maria travel in July and what did John adopt?", "answer": "Oslo, a cat",
                  "category": 1, "evidence": ["D1:1", "D1:2"]},
                 {"question": "How was the weather?", "answer": "grey", "category": 4, "evidence": ["D1:3"]}]}}


def test_a_record_worked_out_by_hand(tmp_path):
    """Top 1 by BM25: each single-turn question finds its memory; the two-turn one cannot have both in one slot.
    The weather memory is of a turn no question of the conversation names (asked_evidence): noise, found once.
    One unseen question shares a turn with the shown one."""
    data = tmp_path / "val_eval.jsonl"
    data.write_text(json.dumps(RECORD) + "\n")
    rows = main([str(data), "--retriever", "bm25", "--top-k", "1", "--out", str(tmp_path / "h")])
    shown, unseen = rows["shown"], rows["unseen"]
    assert (shown.questions, shown.evidence_in_top, shown.noise_in_top, shown.tops_with_noise) == (1, 1, 0, 0)
    assert (unseen.questions, unseen.evidence_in_top, unseen.noise_in_top, unseen.shares_evidence) == (3, 2, 1, 1)
    assert "| unseen | 3 | 2 of 3 | 0.33 | 1 of 3 | 1 of 3 |" in (tmp_path / "h.md").read_text()
    assert json.loads((tmp_path / "h.json").read_text())["shown"]["questions"] == 1
    # --extra-questions takes the first ones only
    assert headroom(data, "bm25", top_k=1, extra_questions=1)["unseen"].questions == 1


def test_generated_data_as_prepared(tmp_path):
    """prepare_data's records carry each unseen question's evidence; every question is counted, and with the
    whole store as the top k every question has all its evidence there."""
    conversations = generate_locomo(2, seed=0)
    source = tmp_path / "locomo.json"
    source.write_text(json.dumps(conversations))
    records = prompt_records(load_locomo(source)[0], extra_questions=3)
    assert all("evidence" in q for r in records for q in r["metadata"]["extra_qa"])
    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = headroom(data, "bm25", top_k=1000)
    assert rows["shown"].questions == len(records) == rows["shown"].evidence_in_top
    assert rows["unseen"].questions == 3 * len(records) == rows["unseen"].evidence_in_top
    assert 0 <= rows["unseen"].shares_evidence <= rows["unseen"].questions


def test_data_prepared_before_the_unseen_questions_had_evidence_is_refused(tmp_path):
    old = json.loads(json.dumps(RECORD))
    for q in old["metadata"]["extra_qa"]:
        del q["evidence"]
    data = tmp_path / "old.jsonl"
    data.write_text(json.dumps(RECORD) + "\n" + json.dumps(old) + "\n")
    with pytest.raises(DataError, match=r"old.jsonl:2 \(extra_qa\): no 'evidence'; prepare the data again"):
        headroom(data, "bm25", top_k=1)
