"""tools/bench_peers.py without a GPU: the workload's prompts are exactly as long as it says under the real
tokenizer, this project's GPU command passes train.py's parser, and a run's per-step metrics become its figures
and the table."""

import json

import pytest

from tools.bench_peers import WORKLOADS, result, table, vime_ext_command, write_prompts
from vime_ext.arguments import build_parser


def test_w1_prompts_are_exactly_256_qwen_tokens(tmp_path):
    from transformers import AutoTokenizer

    from vime_ext.models.packaged import qwen_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    w1 = WORKLOADS["w1"]
    rows = [json.loads(line) for line in write_prompts(tokenizer, w1, tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and len({r["prompt"] for r in rows}) == 32
    assert {len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows} == {256}
    assert w1.tokens_per_step == 32 * 8 * (256 + 1024)


def test_the_gpu_command_passes_train_py_s_parser(tmp_path):
    command = vime_ext_command(WORKLOADS["w1"], tmp_path / "model", tmp_path / "p.jsonl", tmp_path, gpu=True)
    args = build_parser().parse_args(command[3:])
    assert (args.rollout_batch_size, args.n_samples_per_prompt, args.rollout_max_response_len) == (32, 8, 1024)
    assert args.global_batch_size == 256 and args.num_rollout == 7 and args.colocate and not args.use_kl_loss


def test_result_leaves_the_warm_up_out_and_the_table_compares_with_this_project():
    """result() and table() on per-step metrics as train.py logs them (the tiny workload ran end to end on this
    machine by hand: ``python tools/bench_peers.py --workload tiny --model-dir TINY --out OUT``)."""
    tiny = WORKLOADS["tiny"]
    steps = [{"time/total": 9.0, "time/rollout": 5.0}] + [
        {"time/total": t, "time/rollout": t / 2, "time/train": t / 4, "time/save": 0.0,
         "memory/train_peak_allocated_gb": 3.0 + i} for i, t in enumerate((2.0, 4.0))]
    ours = result("vime_ext", tiny, steps, gpus=1, wall=20.0)
    assert ours["step_s"] == 3.0 and ours["phases"]["generate"] == 1.5 and ours["peak_gpu_gb"] == 4.0
    assert ours["tokens_per_s_per_gpu"] == pytest.approx(tiny.tokens_per_step / 3.0)
    peer = {**ours, "framework": "peer", "step_s": 6.0, "tokens_per_s_per_gpu": ours["tokens_per_s_per_gpu"] / 2}
    rows = table([ours, peer]).splitlines()
    assert rows[2].startswith("| vime_ext | 3.00 |") and rows[3].startswith("| peer | 6.00 |")
    assert rows[3].endswith("| 2.00x |")
    with pytest.raises(ValueError, match="2 steps logged, the workload has 3"):
        result("vime_ext", tiny, steps[:2], gpus=1, wall=1.0)


def test_trl_scores_a_completion_as_this_project_does_and_its_untimed_phases_show_as_such():
    """tools/bench_trl.py's reward is the bench plug-in's on the same text; a row from TRL's steps (which time the
    generation and the weight sync, not the log-prob and training passes apart) shows those as "-", not 0."""
    from types import SimpleNamespace

    from tools.bench_plugins import reward
    from tools.bench_trl import hash_reward

    texts = ["river stone light", "", "Prompt 3: winter"]
    assert hash_reward(["p"] * 3, texts) == [reward(None, SimpleNamespace(response=t)) for t in texts]
    tiny = WORKLOADS["tiny"]
    steps = [{"time/total": t, "time/rollout": t / 2, "time/weight_sync": 0.1} for t in (9.0, 2.0, 4.0)]
    trl = result("trl", tiny, steps, gpus=1, wall=20.0)
    assert trl["phases"]["generate"] == 1.5 and trl["phases"]["train"] is None
    row = table([trl]).splitlines()[2]
    assert row.startswith("| trl | 3.00 |") and "| 1.50 | - | - | 0.10 | - |" in row
