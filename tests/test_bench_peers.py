"""tools/bench_peers.py without a GPU: the workload's prompts are exactly as long as it says under the real
tokenizer, this project's GPU command passes train.py's parser, and the tiny workload runs end to end through
train.py (the transformers engine, in-process) into a result file and the table."""

import json

import pytest

from tools.bench_peers import WORKLOADS, main, table, vime_ext_command, write_prompts
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


@pytest.mark.slow
def test_the_tiny_workload_runs_and_is_tabled(tmp_path, capsys):
    from tests.train.test_train_loop import tiny_model_dir

    model = tiny_model_dir(tmp_path)
    assert main(["--workload", "tiny", "--model-dir", str(model), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "vime_ext.json").read_text())
    tiny = WORKLOADS["tiny"]
    assert result["step_s"] > 0 and result["tokens_per_s_per_gpu"] == pytest.approx(
        tiny.tokens_per_step / result["step_s"])
    steps = [json.loads(line) for line in (tmp_path / "out/vime_ext_tb/metrics.jsonl").read_text().splitlines()
             if "time/total" in line]
    assert len(steps) == tiny.steps
    # every response the full length (ignore_eos), every step a real update (the hash reward varies)
    assert all(s["rollout/response_length"] == tiny.response_tokens and s["rollout/reward_std"] > 0 for s in steps)
    assert all(s["train/steps"] == 1 for s in steps)
    out = capsys.readouterr().out
    assert "| vime_ext |" in out and out.strip().splitlines()[-1] == table([result]).splitlines()[-1]
