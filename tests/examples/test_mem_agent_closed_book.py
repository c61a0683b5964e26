"""MemAgent's closed-book filter (examples/mem_agent/closed_book.py) and the splits it feeds
(hotpotqa_dev --closed-book), on the slice of 16 real dev records."""

import json
from pathlib import Path

import pytest

from examples.mem_agent.closed_book import ClosedBook, answers_it, main
from examples.mem_agent.hotpotqa_dev import read_hotpotqa, split_order, split_questions

SLICE = Path(__file__).parent / "data" / "hotpotqa_dev_slice.json"


@pytest.fixture(scope="module")
def dev():
    return read_hotpotqa(SLICE)


def test_a_sample_answers_when_it_holds_or_boxes_the_gold_answer():
    assert answers_it("I think it was Scott Derrickson, the director.", "Scott Derrickson")
    assert answers_it("\\boxed{scottderrickson}", "Scott Derrickson")  # boxed: case and spaces do not count
    assert answers_it("Both are American, so yes. \\boxed{no}", "yes")  # MemAgent's rule: anywhere counts
    assert not answers_it("\\boxed{Ed Wood}", "Scott Derrickson") and not answers_it("", "yes")


def test_answered_questions_leave_every_split_and_held_out_ones_were_all_checked(dev):
    order = split_order(dev, seed=0)
    plain = split_questions(dev, 4, 4, seed=0)
    assert set(plain.test) == set(order[:4]) and set(plain.validation) == set(order[4:8])
    # Two models asked about the first 12 questions of the order: one answered two of them, the other one more.
    first = ClosedBook("a", 2, tuple(order[:12]), (order[0], order[5]))
    second = ClosedBook("b", 2, tuple(order[:12]), (order[9],))
    splits = split_questions(dev, 4, 4, seed=0, closed_book=[first, second])
    answered = {order[0], order[5], order[9]}
    kept = [q for q in order[:12] if q not in answered]
    assert set(splits.test) == set(kept[:4]) and set(splits.validation) == set(kept[4:8])
    assert not answered & {*splits.test, *splits.validation, *splits.train}
    assert set(splits.train) == set(order) - answered - {*splits.test, *splits.validation}
    # Test and validation take only questions every model was asked.
    with pytest.raises(ValueError, match="check more"):
        split_questions(dev, 4, 4, seed=0, closed_book=[first, ClosedBook("c", 2, tuple(order[:8]), ())])


def test_a_closed_book_file_that_is_not_one_is_named(tmp_path):
    bad = tmp_path / "closed_book.json"
    bad.write_text('{"model": "m"}')
    with pytest.raises(ValueError, match="closed_book.json: not a closed-book file"):
        ClosedBook.read(bad)


def test_the_check_asks_each_question_twice_and_a_second_run_goes_on(tiny_hf_dirs, tmp_path):
    """Through the framework's evaluation loop and a transformers engine (a random Qwen2, which answers
    nothing): the first questions of the splits' order, two samples each, then the tally; a second run with more
    questions asks only the new ones."""
    argv = ["--model-path", str(tiny_hf_dirs["qwen2"]), "--out-dir", str(tmp_path), "--source", str(SLICE),
            "--engine-backend", "hf", "--max-new-tokens", "8", "--first", "3"]
    book = main(argv)
    order = split_order(read_hotpotqa(SLICE), seed=0)
    assert book.checked == tuple(sorted(order[:3])) and book.samples == 2
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sorted(r["metadata"]["index"] for r in rows) == sorted(order[:3] * 2)
    assert all(r["reward"] == float(answers_it(r["response"], r["label"])) for r in rows)
    prompt = json.loads((tmp_path / "prompts.jsonl").read_text().splitlines()[0])["prompt"][0]["content"]
    assert prompt.endswith("\nYour final answer in \\boxed{}.\n")
    more = main(argv[:-1] + ["5"])
    again = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert again[:6] == rows and len(again) == 10 and more.checked == tuple(sorted(order[:5]))
    assert ClosedBook.read(tmp_path / "closed_book.json") == more


def test_a_question_the_engine_refuses_is_not_checked_and_the_command_exits_3(tiny_hf_dirs, tmp_path):
    """A question longer than the engine's context (512 tokens beside the answer's) fails both its attempts: it
    is left out of the questions checked, not counted as unanswered, and the command exits 3 after writing the
    file; the others are checked."""
    from vime_ext.evaluate import UNSCORED_EXIT

    dev = read_hotpotqa(SLICE)
    order = split_order(dev, seed=0)
    records = json.loads(SLICE.read_text())
    long_one = records[dev.questions[order[0]].index]
    long_one["question"] = "Which of these words comes first? " + "alpha beta gamma delta " * 200
    source = tmp_path / "dev.json"
    source.write_text(json.dumps(records))
    with pytest.raises(SystemExit) as stop:
        main(["--model-path", str(tiny_hf_dirs["qwen2"]), "--out-dir", str(tmp_path / "out"), "--source",
              str(source), "--engine-backend", "hf", "--max-new-tokens", "8", "--first", "2"])
    assert stop.value.code == UNSCORED_EXIT
    book = ClosedBook.read(tmp_path / "out/closed_book.json")
    assert book.checked == (order[1],)
    failed = (tmp_path / "out/samples.failed.jsonl").read_text().splitlines()
    assert len(failed) == 2 and all("context" in json.loads(line)["error"] for line in failed)


def test_the_builder_drops_what_the_given_checks_answered_and_records_them(dev, tmp_path, capsys):
    from examples.mem_agent.hotpotqa_dev import main as build

    order = split_order(dev, seed=0)
    check = ClosedBook("m", 2, tuple(order[:12]), (order[1],)).write(tmp_path / "closed_book.json")
    sizes = ["--eval-lengths", "20", "--validation-lengths", "20", "--num-test", "4", "--num-validation", "4",
             "--train-num", "2", "--train-docs", "30"]
    assert build(["--source", str(SLICE), "--out-dir", str(tmp_path / "kept"), *sizes, "--closed-book",
                  str(check)]) == 0
    assert "1 answered with no document, dropped" in capsys.readouterr().out
    splits = json.loads((tmp_path / "kept" / "splits.json").read_text())
    assert splits["dropped"] == [order[1]] and splits["closed_book"][0]["answered"] == 1
    assert order[1] not in splits["test"] + splits["validation"] and splits["train"] == 16 - 8 - 1
    # The checks in the repo belong to the pinned dev file: a file of another source keeps every question.
    assert build(["--source", str(SLICE), "--out-dir", str(tmp_path / "all"), *sizes]) == 0
    assert json.loads((tmp_path / "all" / "splits.json").read_text())["dropped"] == []
