"""examples/mem_update/headroom.py: what the untouched store leaves an editor to gain, on a record worked out by hand
(BM25, top 1), on generated data as prepare_data.py writes it, and on data prepared before the unseen questions
carried their evidence."""

import json

import pytest

from examples.mem_update.headroom import headroom, main, miss_kind, reader_replies, reader_rows
from examples.mem_update.reward import reply_f1
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
    main([str(data), "--retriever", "bm25", "--top-k", "1", "--out", str(tmp_path / "h")])
    rows, asks = headroom(data, "bm25", top_k=1)
    shown, unseen = rows["shown"], rows["unseen"]
    assert (shown.questions, shown.evidence_in_top, shown.noise_in_top, shown.tops_with_noise) == (1, 1, 0, 0)
    assert (unseen.questions, unseen.evidence_in_top, unseen.noise_in_top, unseen.shares_evidence) == (3, 2, 1, 1)
    assert "| unseen | 3 | 2 of 3 | 0.33 | 1 of 3 | 1 of 3 |" in (tmp_path / "h.md").read_text()
    assert json.loads((tmp_path / "h.json").read_text())["shown"]["questions"] == 1
    # each scored question with what the reader would be given
    assert [(a.group, a.category, a.answer, [m.id for m in a.top]) for a in asks] == [
        ("shown", "unknown", "Oslo", ["m1"]), ("unseen", "single_hop", "Pepper", ["m2"]),
        ("unseen", "multi_hop", "Oslo, a cat", [asks[2].top[0].id]), ("unseen", "single_hop", "grey", ["m3"])]
    # --extra-questions takes the first ones only
    assert headroom(data, "bm25", top_k=1, extra_questions=1)[0]["unseen"].questions == 1


def test_how_a_miss_is_told():
    """A reply holding the whole answer and more (the session's time copied), one holding part of it (a bare Yes,
    which token F1 scores 0), another answer."""
    assert miss_kind("5:00 pm on 16 August, 2022", "16 August, 2022") == "longer"
    assert miss_kind("Yes\nBecause he plays it.", "Yes, Kofi plays the flute") == "shorter"
    assert miss_kind("Lima", "Oslo") == "other" and miss_kind("", "Oslo") == "other"
    assert reply_f1("Yes", "Yes, Kofi plays the flute") == 0.0 and reply_f1("Oslo\nmore", "Oslo") == 1.0


def test_the_readers_replies_on_the_untouched_store(tiny_hf_dirs, tmp_path):
    """A real (tiny, random) model as the reader: replies in left-padded batches (the in-process HFEngine) equal
    each prompt's own greedy reply; every scored question is in its row (question kind and category) with the F1
    the reward gives it; the command line adds the reader's table."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = str(tiny_hf_dirs["qwen2"])
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer(text)["input_ids"] for text in ("Where is Oslo?", "A much longer prompt about a cat named "
                                                         "Pepper and the grey weather")]
    from vime_ext.engines.hf_engine import HFEngine

    batched = reader_replies(HFEngine(model, max_batch_size=2), prompts, max_new_tokens=6)
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    for ids, reply in zip(prompts, batched):
        alone = net.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        assert reply == tokenizer.decode(alone[0][len(ids):], skip_special_tokens=True)
    data = tmp_path / "val_eval.jsonl"
    data.write_text(json.dumps(RECORD) + "\n")
    _, asks = headroom(data, "bm25", top_k=1)
    rows = reader_rows(asks, model, batch=3)
    assert {k: r.questions for k, r in rows.items()} == {"shown unknown": 1, "unseen multi_hop": 1,
                                                          "unseen single_hop": 2}
    assert all(r.misses == sum(r.kinds.values()) <= r.questions for r in rows.values())
    assert all(len(r.examples) == r.misses and 0 <= r.f1 <= r.questions for r in rows.values())  # few misses: all
    figures = main([str(data), "--retriever", "bm25", "--top-k", "1", "--reader", model, "--out", str(tmp_path / "r")])
    assert {k: v["questions"] for k, v in figures["reader"].items()} == {k: r.questions for k, r in rows.items()}
    assert "The reader on the untouched store:" in (tmp_path / "r.md").read_text()
    assert "| unseen single_hop | 2 |" in (tmp_path / "r.md").read_text()


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
    rows, asks = headroom(data, "bm25", top_k=1000)
    assert len(asks) == 4 * len(records)
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
