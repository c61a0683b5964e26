"""examples/mem_update/choice_probe.py: the sweep's first search on each question's store, the ids a reply names
scored against what the sweep deletes after it, and the whole probe through a real (tiny) model."""

import json

import pytest

from examples.mem_update.choice_probe import ASK, Score, Shown, main, prompt, shown_items
from examples.mem_update.prepare_data import main as prepare
from examples.mem_update.sweep import SWEEP_K
from vime_ext.data.prompt_dataset import DataError


@pytest.fixture(scope="module")
def fact_split(tmp_path_factory):
    out = tmp_path_factory.mktemp("fact_lists")
    prepare(["--generate-fact-lists", "--num-conversations", "3", "--n-test", "1", "--facts", "60", "20",
             "--out-dir", str(out)])
    return out / "train.jsonl"


def test_the_shown_facts_are_the_sweeps_first_search_and_its_deletes(fact_split):
    from examples.mem_update.demonstrations import main as demonstrations

    items = shown_items(fact_split, 4, retriever="bm25")
    assert len(items) == 4 and all(len(item.facts) == SWEEP_K for item in items)
    assert sum(len(item.superseded) for item in items) > 0
    # the same search and the same deletes as the sweep's demonstration of the same question
    demos = fact_split.parent / "sweep.jsonl"
    demonstrations(["--sweep-prompts", str(fact_split), "--out", str(demos), "--retriever", "bm25",
                    "--sweep-searches", "1"])
    by_question = {}
    for line in demos.open():
        messages = json.loads(line)["messages"]
        question = messages[1]["content"].split("\n")[0].removeprefix("Question to prepare for: ")
        shown = json.loads(messages[3]["content"])["results"]
        deleted = {c["function"]["arguments"]["memory_id"] for m in messages[4:] if m["role"] == "assistant"
                   for c in m.get("tool_calls") or [] if c["function"]["name"] == "delete_memory"}
        by_question[question] = ([hit["id"] for hit in shown], deleted)
    for item in items:
        ids, deleted = by_question[item.question]
        assert [fact_id for fact_id, _ in item.facts] == ids and item.superseded == deleted


def test_a_reply_is_scored_by_the_first_shown_id_of_each_line():
    item = Shown("q", [("f1", "1. A is married to B."), ("f7", "7. A is married to C."), ("f3", "3. D speaks X."),
                       ("f9", "9. D speaks Y.")], frozenset({"f1", "f3"}))
    score = Score()
    score.add(item, "f1 restated by f7\nf9 restated by f3\nf42\nf1 again")  # f42 was not shown; f1 counted once
    score.add(item, "I cannot tell.")
    row = score.row()
    assert (score.named, score.right, score.superseded, score.shown) == (2, 1, 4, 8)
    assert row["precision"] == 0.5 and row["recall"] == 0.25 and row["f1"] == pytest.approx(0.333, abs=1e-3)
    assert row["chance_precision"] == 0.5 and row["no_id"] == 1 and row["named_a_reply"] == 1.0


def test_the_probe_runs_a_model_on_every_way_of_asking(fact_split, tiny_hf_dirs, tmp_path):
    from transformers import AutoTokenizer

    model = str(tiny_hf_dirs["qwen3"])
    tokenizer, item = AutoTokenizer.from_pretrained(model), shown_items(fact_split, 1, retriever="bm25")[0]
    text = tokenizer.decode(prompt(tokenizer, item, "pairs"))
    assert "restated by" in text and text.rstrip().endswith("assistant")
    assert all(f"{fact_id}: {fact}" in text for fact_id, fact in item.facts)  # every shown fact, by its id
    scores = main([str(fact_split), "--model", model, "--num", "3", "--retriever", "bm25", "--batch", "3",
                   "--max-new-tokens", "8", "--out", str(tmp_path / "probe")])
    assert sorted(scores) == sorted(ASK) and all(score.replies == 3 for score in scores.values())
    written = json.loads((tmp_path / "probe.json").read_text())
    assert sorted(written["asks"]) == sorted(ASK)
    assert all(0 < row["chance_precision"] < 1 for row in written["asks"].values())
    assert "| pairs | 3 |" in (tmp_path / "probe.md").read_text()


def test_a_split_without_numbered_facts_is_refused_with_its_line(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"prompt": "q", "metadata": {"memories": [{"id": "m1", "content": "no number"}]}})
                    + "\n")
    with pytest.raises(DataError, match=r"plain.jsonl:1: no numbered fact"):
        shown_items(path, 1, retriever="bm25")
