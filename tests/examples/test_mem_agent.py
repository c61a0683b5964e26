"""MemAgent's pieces: chunking, answer extraction and scoring, data conversion and the eval file format, the
rollout's sequences (one per chat, prompt masked, advantages), and a resumed evaluation, on a real engine."""

import json
import random

import pytest

from examples.mem_agent.data import DataError, generate_item, item_from_eval_entry, read_eval_file
from examples.mem_agent.reward import reward
from examples.mem_agent.rollout import split_chunks
from examples.mem_agent.scoring import exact_match, extract_answer, normalize, substring_match
from vime_ext.agent.rewards import token_f1 as f1
from vime_ext.agent.sample import Sample


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tests.conftest import real_tokenizer

    return real_tokenizer("llama", tmp_path_factory.mktemp("tok"))


def test_chunks_count_keep_the_last_partial_one_and_obey_the_cap(tokenizer):
    text = " ".join(f"word{i}" for i in range(300))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    chunks, cut, tokens = split_chunks(tokenizer, text, 100, None)
    sizes = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in chunks]
    assert len(chunks) == -(-len(ids) // 100) and cut == 0 and tokens == len(ids)
    assert sizes[:-1] == [100] * (len(chunks) - 1) and 0 < sizes[-1] <= 100
    assert "".join(chunks) == tokenizer.decode(ids)
    capped, cut, tokens = split_chunks(tokenizer, text, 100, 2)
    assert capped == chunks[:2] and cut == len(ids) - 200 and tokens == len(ids)
    assert split_chunks(tokenizer, text, 100_000, 1) == ([tokenizer.decode(ids)], 0, len(ids))


@pytest.mark.parametrize("response, answer", [
    (r"So it is \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),  # nested braces
    (r"first \boxed{Arden} then \boxed{Kelso}", "Kelso"),  # the last one counts
    ("no box at all", None),
    (r"\boxed{Arden} " + "x" * 300, None),  # only the last 300 characters count
    ("x" * 400 + r" \boxed{Upton}", "Upton"),
])
def test_boxed_answers(response, answer):
    assert extract_answer(response, "boxed") == answer


def test_the_answer_is_format():
    assert extract_answer("Reasoning... The answer is: Marsden.\n", "answer_is") == "Marsden"
    assert extract_answer("the answer is x. Then the answer is Kelso", "answer_is") == "Kelso"
    assert extract_answer("I do not know", "answer_is") is None
    assert extract_answer('The answer is "Elena Pike".', "answer_is") == "Elena Pike"
    assert extract_answer("The answer is: '.'", "answer_is") is None


def test_normaliser_and_judges_against_hand_computed_cases():
    assert normalize("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert normalize("An apple a day") == "apple day"
    assert exact_match("the Paris", "paris") == 1.0 and exact_match("Paris, France", "Paris") == 0.0
    assert substring_match("Paris, France", "paris") == 1.0 and substring_match("Lyon", "Paris") == 0.0
    assert substring_match("", "paris") == 0.0
    # f1: prediction "new york city" vs gold "york city": 2 common tokens, precision 2/3, recall 1.
    assert f1("New York City", "York City") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert f1("yes", "no") == 0.0 and f1("yes", "yes") == 1.0 and f1("no", "no answer here") == 0.0
    assert f1("noanswer", "Paris") == 0.0 and f1("Lyon", "Paris") == 0.0


def test_training_reward_uses_the_last_box_in_the_tail():
    from vime_ext.rollout.plugins import PluginArgs

    args = PluginArgs(mem_answer_format="boxed")
    sample = Sample(prompt="q", label=["New York", "NYC"], response=r"I think \boxed{new york}")
    assert reward(args, sample) == {"reward": 1.0, "no_answer": 0.0}
    sample.response = r"\boxed{New York}" + " " * 301
    assert reward(args, sample) == {"reward": 0.0, "no_answer": 1.0}
    sample.response = r"\boxed{ N Y C }"
    assert reward(args, sample)["reward"] == 1.0


def test_training_reward_follows_the_answer_format():
    from vime_ext.rollout.plugins import PluginArgs

    args = PluginArgs(mem_answer_format="answer_is")
    sample = Sample(prompt="q", label=["Alma Zorn"], response="The answer is: Alma Zorn.")
    assert reward(args, sample) == {"reward": 1.0, "no_answer": 0.0}
    sample.response = r"\boxed{Alma Zorn}"  # not the asked format
    assert reward(args, sample) == {"reward": 0.0, "no_answer": 1.0}


def test_prepare_data_keeps_good_rows_and_names_bad_ones(tmp_path):
    from examples.mem_agent.prepare_data import convert

    good = {"data_source": "hotpotqa", "prompt": [{"role": "user", "content": "Who?"}], "ability": "qa",
            "context": "Document 1:\nA\ntext", "reward_model": {"ground_truth": ["Ann"]},
            "extra_info": {"index": 7, "question": "Who wrote A?", "num_docs": 1}}
    rows = [good, {**good, "reward_model": {"ground_truth": []}}, {k: v for k, v in good.items() if k != "context"},
            {**good, "context": [3, 5, 8]}]
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n")
    kept, skipped = convert(source, tmp_path / "out.jsonl")
    assert kept == 1 and len(skipped) == 4
    assert f"{source}:2: reward_model.ground_truth: answers must be a non-empty list" in skipped[0]
    assert f"{source}:3: missing field 'context'" in skipped[1]
    assert f"{source}:4: field 'context' is a list of document indices" in skipped[2]
    assert f"{source}:5: not valid JSON" in skipped[3]
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert row == {"prompt": "Who wrote A?", "label": ["Ann"], "metadata": {
        "context": "Document 1:\nA\ntext", "num_docs": 1, "index": 7, "data_source": "hotpotqa"}}
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([good, good]), tmp_path / "train.parquet")
    assert convert(tmp_path / "train.parquet", tmp_path / "out2.jsonl") == (2, [])


def test_eval_files_refuse_index_contexts(tmp_path):
    item = generate_item(random.Random(0), 5, 0)
    entries = [{"index": 0, "input": item.question, "answers": item.answers, "context": item.context, "num_docs": 5},
               {"index": 1, "input": "q", "answers": ["a"], "context": [1, 2, 3], "num_docs": 3}]
    (tmp_path / "eval_5.json").write_text(json.dumps(entries))
    items, refused = read_eval_file(tmp_path / "eval_5.json")
    assert [i.index for i, _ in items] == [0] and items[0][0].context.count("Document ") == 5
    assert len(refused) == 1 and "eval_5.json[1]: field 'context' is a list of document indices" in refused[0]
    with pytest.raises(DataError, match="missing field 'answers'"):
        item_from_eval_entry({"input": "q", "context": "c"}, "x")


def test_generated_items_hide_the_facts_among_distractors():
    item = generate_item(random.Random(3), 12, "a", hops=2)
    docs = item.context.split("\n\n")
    assert len(docs) == item.num_docs == 12 and all(d.startswith("Document ") for d in docs)
    assert sum(item.answers[0] in d for d in docs) >= 1 and "born" in item.question


def test_past_the_name_pool_the_world_stays_consistent():
    """Long items need more writers than the pool has names: a reused name keeps its one birthplace, and the
    author is never reused, so the question has one answer (before, at a million tokens the author had dozens of
    birthplaces)."""
    import re

    from examples.mem_agent.data import ENTITY_POOLS

    pool = ENTITY_POOLS["heldout"]
    for seed in range(3):
        item = generate_item(random.Random(seed), 800, seed, entities=pool)  # 144 names in the pool
        author = re.search(r"written by (.+?)\.", item.supporting[0]).group(1)
        born = {}
        for person, city in re.findall(r"^(.+?) is a writer who was born in (.+?)\.", item.context, re.MULTILINE):
            assert born.setdefault(person, city) == city
        assert born[author] == item.answers[0] and item.context.count(f"{author} is a writer") == 1
        assert item.context.count(f"written by {author}.") == 1
        assert len(born) < 400  # names were reused


def test_held_out_items_name_nothing_a_training_item_names(tmp_path):
    """prepare_data --entities train --eval-entities heldout: the eval files' novels, people and cities (gold and
    distractors alike) appear in no training row, nor the validation files' (other items, drawn the same way), and
    the default pool draws exactly as before the split."""
    import hashlib
    import re

    from examples.mem_agent.data import ALL_ENTITIES, ENTITY_POOLS
    from examples.mem_agent.prepare_data import main

    assert main(["--generate", "--num", "64", "--num-docs", "40", "--entities", "train", "--out",
                 str(tmp_path / "train.jsonl"), "--eval-dir", str(tmp_path), "--eval-lengths", "40", "300",
                 "--eval-entities", "heldout", "--eval-num", "8", "--val-dir", str(tmp_path / "val"),
                 "--val-lengths", "40"]) == 0
    train, heldout = ENTITY_POOLS["train"], ENTITY_POOLS["heldout"]

    def names(text: str) -> set[str]:
        every = ALL_ENTITIES.first + ALL_ENTITIES.last + ALL_ENTITIES.cities + ALL_ENTITIES.works
        return {name for name in every if re.search(rf"\b{re.escape(name)}\b", text)}

    seen = names((tmp_path / "train.jsonl").read_text())
    assert seen and seen <= set(train.first + train.last + train.cities + train.works)
    for path in (tmp_path / "eval_40.json", tmp_path / "eval_300.json", tmp_path / "val/eval_40.json"):
        entries = json.loads(path.read_text())
        held = names(json.dumps(entries))
        assert held and not held & seen, held & seen
        assert all(e["answers"][0] in heldout.cities for e in entries)
    # the validation items are drawn like the eval ones, with another seed: none of them is an eval item
    questions = {(e["input"], e["context"]) for e in json.loads((tmp_path / "eval_40.json").read_text())}
    val = json.loads((tmp_path / "val/eval_40.json").read_text())
    assert len(val) == 8 and not {(e["input"], e["context"]) for e in val} & questions
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == ["eval_40.json"]
    # The default, the whole pool, draws as every run before the split did (this item's digest from then).
    item = generate_item(random.Random(3), 12, "a", 2)
    assert item.answers == ["Eastwick"] and "The Long Meridian" in item.question
    assert hashlib.sha256(item.context.encode()).hexdigest()[:16] == "09707c60ce13e657"


def test_a_document_count_range_gives_a_long_tail_and_the_fixed_count_is_unchanged(tmp_path):
    import json

    from examples.mem_agent.data import write_training_jsonl

    def counts(**kw):
        path = write_training_jsonl(tmp_path / "t.jsonl", 200, 4, seed=5, **kw)
        return [json.loads(line)["metadata"]["num_docs"] for line in path.read_text().splitlines()]

    fixed = counts()
    assert set(fixed) == {4}
    assert counts(max_docs=None) == fixed
    tail = sorted(counts(max_docs=64))
    assert tail[0] >= 4 and tail[-1] <= 64 and tail[-1] > 40
    assert tail[len(tail) // 2] < 20  # log-uniform: the median item is far shorter than the longest
    with pytest.raises(ValueError, match="max_docs 3 is below num_docs 4"):
        counts(max_docs=3)


# ---- on a real engine (the transformers backend serving a tiny random model) --------------------------------

@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tests.conftest import make_tiny_hf_dir
    from vime_ext.engines.servers import EngineConfig, launch_engine, wait_until_serving

    root = tmp_path_factory.mktemp("mem_agent_model")
    model = make_tiny_hf_dir("llama", root / "tiny", seed=4, cache_dir=root, max_position_embeddings=2048)
    server = launch_engine(EngineConfig(str(model), backend="hf", log_dir=str(root), env={"OMP_NUM_THREADS": "1"}))
    try:
        wait_until_serving([server], timeout_s=300)
        yield model, server.url
    finally:
        server.stop()


def mem_args(model, chunk_tokens=40, **extra):
    from transformers import AutoTokenizer

    from vime_ext.rollout.plugins import PluginArgs

    return PluginArgs(tokenizer=AutoTokenizer.from_pretrained(model), mem_chunk_tokens=chunk_tokens,
                      mem_max_memory=6, mem_max_final=5, mem_max_chunks=3, weight_version=None, **extra)


def mem_rollout(engine, tmp_path, prompts: int, num_docs: int, settings: dict):
    """One rollout of the MemAgent plug-ins on generated data: (plug-in args, groups)."""
    from examples.mem_agent.data import write_training_jsonl
    from vime_ext.data.prompt_dataset import read_jsonl
    from vime_ext.rollout.config import RolloutConfig
    from vime_ext.rollout.data_source import DataSource
    from vime_ext.rollout.plugins import plugin_args
    from vime_ext.rollout.rollout import run_rollout

    model, url = engine
    data = write_training_jsonl(tmp_path / "train.jsonl", prompts, num_docs=num_docs, seed=0)
    config = RolloutConfig(rollout_batch_size=prompts, n_samples_per_prompt=2, rollout_max_response_len=6,
                           custom_generate_function_path="examples.mem_agent.rollout.generate",
                           custom_rm_path="examples.mem_agent.reward.reward")
    args = plugin_args([config], {"mem_max_memory": 6, "mem_max_final": 5, **settings})
    args.tokenizer = mem_args(model).tokenizer
    return args, run_rollout(args, url, 0, DataSource(read_jsonl(data), 2)).groups


def test_one_sequence_per_chat_with_masks_and_advantages(engine, tmp_path):
    from vime_ext.algorithms.train_data import samples_to_train_data

    args, groups = mem_rollout(engine, tmp_path, 2, 3, {"mem_chunk_tokens": 40, "mem_max_chunks": 3})
    samples = [s for g in groups for s in g]
    for s in samples:  # 3 documents of ~40 tokens: more than 3 chunks, capped at 3, + the final chat
        assert s.metadata["chunks"] == 3 and s.metadata["tokens_cut"] > 0 and len(s.turns) == 3
    samples[0].reward, samples[1].reward = 1.0, 0.0  # a group with a signal: the tiny model never answers right
    for mode, divide in (("shared", 1), ("split", 4)):
        args.advantage_estimator, args.loss_type, args.n_samples_per_prompt = "grpo", "policy_loss", 2
        args.disable_grpo_std_normalization, args.trajectory_advantage = False, mode
        sequences = samples_to_train_data(args, samples)
        assert len(sequences) == 4 * len(samples)
        first = [q for q in sequences if q.sample_index == samples[0].index]
        assert [q.advantage for q in first] == pytest.approx([0.7071 / divide] * 4, abs=1e-3)
    # The final chat (the sample's own sequence) comes first, then the memory chats; each trains on its reply only.
    chats = [(samples[0].tokens, samples[0].response_length)] + [(t.tokens, len(t.loss_mask))
                                                                for t in samples[0].turns]
    for (tokens, reply), seq in zip(chats, first):
        assert seq.tokens == tokens
        assert seq.loss_mask == [0] * (len(tokens) - reply - 1) + [1] * reply


def test_an_evaluation_keeps_the_final_chat_and_a_long_document_is_split_off_the_loop(engine, monkeypatch):
    """In evaluation ``generate`` returns the final chat alone (with the memory it answered from): an item of a
    million tokens would otherwise hold 500 chats. The document is tokenized in a worker thread, not on the event
    loop, so the other items in flight keep going meanwhile (checked by the thread it runs on: a check by the
    loop's timing failed once under CI load)."""
    import asyncio
    import random
    import threading

    import examples.mem_agent.rollout as rollout
    from examples.mem_agent.data import generate_item
    from examples.mem_agent.scoring import holds_answer
    from vime_ext.agent.sample import Sample
    from vime_ext.engines.client import RolloutClient
    from vime_ext.engines.protocol import SamplingParams

    model, url = engine
    args = mem_args(model, mem_eval_max_chunks=2)
    item = generate_item(random.Random(3), 6000, 0)
    split_threads = []

    def recorded_split(*a, **kw):
        split_threads.append(threading.get_ident())
        return split_chunks(*a, **kw)

    monkeypatch.setattr(rollout, "split_chunks", recorded_split)

    async def run(evaluation: bool):
        args.rollout_client = RolloutClient(url, max_concurrency=4, timeout_s=300)
        slot = Sample(prompt=item.question, label=item.answers, index=0, metadata={"context": item.context})
        try:
            return await rollout.generate(args, slot, SamplingParams(max_new_tokens=4), evaluation=evaluation), \
                threading.get_ident()
        finally:
            await args.rollout_client.close()

    (final,), loop_thread = asyncio.run(run(evaluation=True))
    assert final.metadata["chunks"] == 2 and isinstance(final.metadata["memory"], str)
    # a character per chunk read; the last says whether the final memory holds the answer
    trace = final.metadata["answer_trace"]
    assert len(trace) == 2 and set(trace) <= {"0", "1"}
    assert (trace[-1] == "1") == holds_answer(final.metadata["memory"], item.answers)
    assert len(split_threads) == 1 and split_threads[0] != loop_thread
    training, _ = asyncio.run(run(evaluation=False))
    assert len(training) == 4  # a memory chat for each of mem_max_chunks (3) and the final one


def test_an_evaluation_item_saves_each_chunk_and_resumes_from_the_last(engine, monkeypatch):
    """In evaluation the chunk reached, the memory and the answer trace are saved after every chunk
    (args.save_progress); an item handed such a state (metadata["resume"]) reads only the chunks after it, from
    the saved memory, and says where it resumed; a state saved for another chunking starts the item afresh."""
    import asyncio
    import random

    import examples.mem_agent.rollout as rollout
    from examples.mem_agent.data import generate_item
    from vime_ext.agent.sample import Sample
    from vime_ext.engines.client import RolloutClient
    from vime_ext.engines.protocol import SamplingParams

    model, url = engine
    args = mem_args(model)
    item = generate_item(random.Random(5), 4, 0)  # about 4 chunks of 40 tokens
    reads: list[tuple[str, str]] = []  # (memory, chunk) of each memory update

    def recorded_prompt(question, memory, chunk):
        reads.append((memory, chunk))
        return rollout_prompt(question, memory, chunk)

    rollout_prompt = rollout.memory_prompt
    monkeypatch.setattr(rollout, "memory_prompt", recorded_prompt)

    def run(resume=None):
        states, reads[:] = [], []
        args.save_progress = lambda sample, state: states.append(state)
        metadata = {"context": item.context, **({"resume": resume} if resume else {})}

        async def go():
            args.rollout_client = RolloutClient(url, max_concurrency=4, timeout_s=300)
            try:
                slot = Sample(prompt=item.question, label=item.answers, index=0, metadata=metadata)
                return await rollout.generate(args, slot, SamplingParams(max_new_tokens=4), evaluation=True)
            finally:
                await args.rollout_client.close()

        (final,) = asyncio.run(go())
        return final, states, list(reads)

    final, states, whole = run()
    n = final.metadata["chunks"]
    assert n >= 3 and [s["chunk"] for s in states] == list(range(1, n + 1)) and len(whole) == n
    assert states[-1]["memory"] == final.metadata["memory"] and states[-1]["trace"] == final.metadata["answer_trace"]
    assert all(s["chunks"] == n and s["chunk_tokens"] == 40 for s in states) and final.metadata["resumed_at"] == 0
    saved = {**states[0], "memory": "the saved memory", "trace": "1"}
    final, states, rest = run(resume=saved)
    assert [chunk for _, chunk in rest] == [chunk for _, chunk in whole[1:]]  # chunks 2.. only
    assert rest[0][0] == "the saved memory" and final.metadata["resumed_at"] == 1
    assert final.metadata["answer_trace"].startswith("1") and len(final.metadata["answer_trace"]) == n
    assert [s["chunk"] for s in states] == list(range(2, n + 1))
    final, _, again = run(resume={**saved, "chunk_tokens": 64})  # saved for another chunking
    assert len(again) == n and final.metadata["resumed_at"] == 0


def test_the_answer_prefix_starts_the_final_reply_and_is_not_trained(engine, tmp_path):
    args, groups = mem_rollout(engine, tmp_path, 1, 2, {"mem_chunk_tokens": 400, "mem_answer_format": "answer_is",
                                                        "mem_answer_prefix": "The answer is"})
    prefix = args.tokenizer("The answer is", add_special_tokens=False)["input_ids"]
    for sample in groups[0]:
        reply = sample.tokens[-sample.response_length:]
        assert sample.response.startswith("The answer is")
        assert reply[:len(prefix)] == prefix and sample.loss_mask[:len(prefix)] == [0] * len(prefix)
        assert sample.loss_mask[len(prefix):] == [1] * (sample.response_length - len(prefix))
        assert sample.rollout_log_probs[:len(prefix)] == [0.0] * len(prefix)


def test_an_eval_that_leaves_items_unscored_exits_3_after_its_summary(engine, tmp_path):
    """eval_ruler_hqa: items the engine refuses twice (a memory budget of 4,096 new tokens on a model of 2,048
    positions) are listed in .failed.jsonl, not scored as 0; the summary is written, and then the command exits
    with status 3 (a recipe under set -e stops there instead of tabling a partial evaluation)."""
    from examples.mem_agent.data import write_eval_file
    from examples.mem_agent.eval_ruler_hqa import main
    from vime_ext.evaluate import UNSCORED_EXIT

    model, url = engine
    write_eval_file(tmp_path / "data", 3, 2, seed=2)
    (tmp_path / "mem.json").write_text(json.dumps({"mem_chunk_tokens": 64, "mem_max_memory": 4096,
                                                   "mem_max_final": 4}))
    with pytest.raises(SystemExit) as stop:
        main(["--model-path", str(model), "--model-url", url, "--data-root", str(tmp_path / "data"), "--length",
              "3", "--save-dir", str(tmp_path / "out"), "--save-file", "tiny", "--custom-config-path",
              str(tmp_path / "mem.json")])
    assert stop.value.code == UNSCORED_EXIT
    summary = json.loads((tmp_path / "out/ruler_hqa_3/tiny.summary.json").read_text())
    assert summary["scored"] == 0 and summary["failed"] == 2
    failed = (tmp_path / "out/ruler_hqa_3/tiny.failed.jsonl").read_text().splitlines()
    assert len(failed) == 2 and all("context" in json.loads(line)["error"] for line in failed)


def test_a_resumed_eval_scores_every_item_once(engine, tmp_path):
    from examples.mem_agent.data import write_eval_file
    from examples.mem_agent.eval_ruler_hqa import main

    from transformers import AutoTokenizer

    model, url = engine
    model_tokenizer = AutoTokenizer.from_pretrained(model)
    write_eval_file(tmp_path / "data", 3, 6, seed=2)
    (tmp_path / "mem.json").write_text(json.dumps({"mem_chunk_tokens": 64, "mem_max_memory": 4,
                                                   "mem_max_final": 4}))
    argv = ["--model-path", str(model), "--model-url", url, "--data-root", str(tmp_path / "data"), "--length", "3",
            "--save-dir", str(tmp_path / "out"), "--save-file", "tiny", "--n-proc", "3", "--custom-config-path",
            str(tmp_path / "mem.json")]
    [summary] = main(argv)
    out = tmp_path / "out/ruler_hqa_3/tiny.jsonl"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["scored"] == 6 and summary["failed"] == 0 and sorted(r["_id"] for r in rows) == list("012345")
    assert set(rows[0]) >= {"_id", "answer", "pred", "judge_f1", "judge_em", "judge_sub_em", "response", "input",
                            "answers", "num_docs", "index", "memory", "answer_trace"} and "context" not in rows[0]
    assert all(len(r["answer_trace"]) == r["chunks"] for r in rows)
    # What each item cost: its document's tokens (the tokenizer's count of the whole context) and chunks, its time.
    tokens = [len(model_tokenizer(e["context"], add_special_tokens=False)["input_ids"])
              for e in json.loads((tmp_path / "data/eval_3.json").read_text())]
    assert sorted(r["doc_tokens"] for r in rows) == sorted(tokens)
    assert all(r["chunks"] == -(-r["doc_tokens"] // 64) and r["seconds"] > 0 for r in rows)
    assert summary["doc_tokens"] == round(sum(tokens) / 6, 1) and summary["n_proc"] == 3
    assert summary["seconds_per_item"] > 0 and summary["doc_tokens_per_s"] > 0
    assert summary["scored_this_run"] == 6 and summary["wall_s"] > 0
    # The rate is taken on the unrounded wall time; wall_s and the rate are each rounded to 0.1, so the product
    # lands within half a tenth of a second of reading (and half a tenth of a token/s over the wall) of the tokens.
    rate, wall = summary["read_tokens_per_s"], summary["wall_s"]
    assert abs(rate * wall - sum(tokens)) <= 0.05 * rate + 0.05 * wall + 1e-6
    # Stopped half-way: three whole lines and a torn fourth. The re-run keeps the three, scores the other three.
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])
    [summary] = main(argv)
    again = out.read_text().splitlines()
    assert again[:3] == lines[:3] and len(again) == 6
    assert sorted(json.loads(line)["_id"] for line in again) == list("012345") and summary["scored"] == 6
    assert summary["scored_this_run"] == 3  # the throughput of this run counts its own items alone
    assert (tmp_path / "out/ruler_hqa_sub_em.png").stat().st_size > 1000
    # --lengths-at-once: a second length beside the first (whose items are all scored: none is run again).
    write_eval_file(tmp_path / "data", 5, 4, seed=2)
    both = main(argv[:argv.index("--length")] + ["--length", "3", "5", "--lengths-at-once"]
                + argv[argv.index("--length") + 2:])
    assert [(s["num_docs"], s["scored"], s["lengths_at_once"]) for s in both] == [(3, 6, 2), (5, 4, 2)]
    assert both[0]["scored_this_run"] == 0 and both[0]["read_tokens_per_s"] is None
    # --at-once-max-docs: the lengths above it after the others, one at a time, on the same engine
    capped = main(argv[:argv.index("--length")] + ["--length", "5", "3", "--lengths-at-once", "--at-once-max-docs",
                                                   "3"] + argv[argv.index("--length") + 2:])
    assert [(s["num_docs"], s["lengths_at_once"]) for s in capped] == [(3, 1), (5, 1)]
    assert out.read_text().splitlines() == again
    rows5 = [json.loads(line) for line in (tmp_path / "out/ruler_hqa_5/tiny.jsonl").read_text().splitlines()]
    assert sorted(r["_id"] for r in rows5) == list("0123") and all(r["num_docs"] == 5 for r in rows5)


def test_the_length_plot_draws_the_reference_files_as_levels(tmp_path, monkeypatch):
    """eval_ruler_hqa.plot: the lengths as one line per model; no document (eval_0) and the gold pair (eval_2) as
    horizontal levels, not as points at 0 and 2 documents."""
    from examples.mem_agent import eval_ruler_hqa

    for num_docs, sub_em in ((0, 1.6), (2, 22.7), (50, 9.4), (100, 7.8)):
        folder = tmp_path / f"ruler_hqa_{num_docs}"
        folder.mkdir()
        (folder / "m.summary.json").write_text(json.dumps({"save_file": "m", "num_docs": num_docs, "sub_em": sub_em}))
    drawn = {}
    monkeypatch.setattr(eval_ruler_hqa, "save_sub_em_figure", lambda fig, ax, xlabel, path: drawn.update(ax=ax))
    eval_ruler_hqa.plot(tmp_path)
    lines = {line.get_label(): line for line in drawn["ax"].get_lines()}
    assert list(lines["m"].get_xdata()) == [50, 100] and list(lines["m"].get_ydata()) == [9.4, 7.8]
    assert list(lines["m, no document"].get_ydata()) == [1.6, 1.6]
    assert list(lines["m, gold pair"].get_ydata()) == [22.7, 22.7]
