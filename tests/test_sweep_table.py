"""tools/sweep_table.py on recorded runs' files (MemAgent's fourth run, MemUpdate's ninth lease; seed 0), laid out as
sweep variants' folders."""

import gzip
import json
import shutil
from pathlib import Path
from statistics import mean

from tools.sweep_table import main, reward_limits

RUN = Path(__file__).resolve().parents[1] / "records/mem_agent_smollm2_h200x4_run4"


def test_a_variant_row_has_both_models_sub_em_and_grpo_signal(tmp_path):
    run = tmp_path / "v0"
    (run / "eval_val/ruler_hqa_170").mkdir(parents=True)  # a sweep's variants are scored on validation items
    for name in ("sft_s0", "rl_s0"):
        shutil.copy(RUN / f"eval/ruler_hqa_170/{name}.summary.json", run / "eval_val/ruler_hqa_170")
    (run / "seed_0/rl/tensorboard").mkdir(parents=True)
    shutil.copy(RUN / "rl_s0.metrics.jsonl", run / "seed_0/rl/tensorboard/metrics.jsonl")
    empty = tmp_path / "v1"  # a variant whose seed failed before anything was written
    empty.mkdir()
    rows = main(["--variant", f"RL_TEMPERATURE=1.3={run}", "--variant", f"={empty}", "--out", str(tmp_path / "s")])

    steps = [json.loads(line) for line in (RUN / "rl_s0.metrics.jsonl").read_text().splitlines()]
    steps = list({r["step"]: r for r in steps if "train/loss" in r}.values())
    sft = json.loads((RUN / "eval/ruler_hqa_170/sft_s0.summary.json").read_text())
    rl = json.loads((RUN / "eval/ruler_hqa_170/rl_s0.summary.json").read_text())
    row = rows[0]
    assert row["variant"] == "RL_TEMPERATURE=1.3" and row["rl_steps"] == len(steps) == 12
    assert row["scores"]["sub-EM (170 docs, val)"] == {"sft": {"value": sft["sub_em"], "scored": 32},
                                                      "rl": {"value": rl["sub_em"], "scored": 32}}
    assert row["|adv|"] == mean(r["rollout/advantage_abs_mean"] for r in steps)
    assert row["entropy"] == mean(r["train/entropy"] for r in steps)
    assert row["uniform groups"] is None  # the fourth run predates the metric
    assert row["reward first/last"] == (steps[0]["rollout/reward_mean"], steps[-1]["rollout/reward_mean"])
    assert row["rationale first/last"] is None  # MemAgent writes none; MemUpdate's rollouts log the share
    table = (tmp_path / "s.md").read_text()
    assert f"| RL_TEMPERATURE=1.3 | {sft['sub_em']:.1f} (32) | {rl['sub_em']:.1f} (32) | 12 | - |" in table
    assert "| (the recipe) | - | - | 0 | - | - | - | - | - |" in table
    assert json.loads((tmp_path / "s.json").read_text())[1]["rl_steps"] == 0
    # The plot's series: the reward per step, and no share of uniform groups where the metric was not logged.
    assert row["per step"] == {"reward": [r["rollout/reward_mean"] for r in steps], "uniform groups": [None] * 12}
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_mem_update_variant_row_has_both_models_qa_delta_on_the_validation_questions(tmp_path):
    """A MemUpdate variant (its evaluations on the validation questions, eval_val/): the ninth lease's seed 0 files
    stand in for them."""
    lease = RUN.parent / "mem_update_smollm2_h200x2_run9"
    run = tmp_path / "v0"
    (run / "eval_val").mkdir(parents=True)
    for name in ("sft_s0", "rl_s0", "noop"):  # the rows without training are not the variant's
        shutil.copy(lease / f"eval/{name}.json", run / "eval_val")
    (run / "seed_0/rl/tensorboard").mkdir(parents=True)
    (run / "seed_0/rl/tensorboard/metrics.jsonl").write_bytes(
        gzip.decompress((lease / "rl_s0.metrics.jsonl.gz").read_bytes()))
    (row,) = main(["--variant", f"SFT_EPOCHS=2={run}", "--out", str(tmp_path / "s")])
    sft, rl = (json.loads((lease / f"eval/{n}.json").read_text()) for n in ("sft_s0", "rl_s0"))
    assert row["scores"] == {
        "QA delta unseen (val)": {"sft": {"value": sft["qa_delta_unseen"], "scored": 64},
                                  "rl": {"value": rl["qa_delta_unseen"], "scored": 64}},
        "QA delta all (val)": {"sft": {"value": sft["qa_delta"], "scored": 64},
                               "rl": {"value": rl["qa_delta"], "scored": 64}}}
    assert row["rl_steps"] == 20 and row["uniform groups"] is not None
    assert row["rationale first/last"] is None  # the ninth lease predates the metric: "-"
    table = (tmp_path / "s.md").read_text()
    assert "| variant | SFT QA delta unseen (val) | SFT + RL QA delta unseen (val) |" in table
    assert f"| SFT_EPOCHS=2 | {sft['qa_delta_unseen']:+.3f} (64) | {rl['qa_delta_unseen']:+.3f} (64) |" in table
    # A run that logs the share of episodes writing the rationale: its first and last GRPO step's share
    metrics = run / "seed_0/rl/tensorboard/metrics.jsonl"
    logged = [json.loads(line) for line in metrics.read_text().splitlines()]
    trained = [r for r in logged if "train/loss" in r]
    for r in logged:
        r["rollout/rationale"] = 0.875 if r is trained[0] else 0.125
    metrics.write_text("".join(json.dumps(r) + "\n" for r in logged))
    (row,) = main(["--variant", f"MEMUP_RATIONALE=1={run}", "--out", str(tmp_path / "s")])
    assert row["rationale first/last"] == (0.875, 0.125)
    assert "| 0.88 / 0.12 |" in (tmp_path / "s.md").read_text()


def test_a_variant_whose_policy_broke_its_tool_calls_shows_its_unfinished_episodes(tmp_path):
    """The 1.5B MemUpdate policy at lr 2e-5 (2026-11-30, seed 0): unfinished episodes rose from none to 98% of a
    rollout; the row's mean over its 9 GRPO steps is 0.569, and MemAgent's rows (no such metric) show "-"."""
    lease = RUN.parent / "mem_update_qwen1.5b_h200x2_val1"
    run = tmp_path / "v0"
    (run / "seed_0/rl/tensorboard").mkdir(parents=True)
    (run / "seed_0/rl/tensorboard/metrics.jsonl").write_bytes(
        gzip.decompress((lease / "rl_s0.metrics.jsonl.gz").read_bytes()))
    broke, mem_agent = main(["--variant", f"RL_LR=2e-5={run}", "--variant", f"MEM_AGENT={RUN}",
                             "--out", str(tmp_path / "s")])
    assert broke["rl_steps"] == 9 and round(broke["unfinished"], 3) == 0.569
    assert mem_agent["unfinished"] is None
    table = (tmp_path / "s.md").read_text().splitlines()
    unfinished = table[0].split(" | ").index("unfinished")
    assert table[2].split(" | ")[unfinished] == "0.569" and table[3].split(" | ")[unfinished] == "-"


def test_the_reward_axis_holds_every_reward_also_below_zero():
    """MemUpdate's rewards are QA gains: the 1.5B sweep of 2026-12-01 moved between -0.085 and +0.046, which the
    former fixed 0 to 1 axis cut off below 0 and flattened above."""
    sweep = RUN.parent / "mem_update_qwen1.5b_h200x2_sweep1"
    rows = [{"per step": {"reward": [json.loads(line)["rollout/reward_mean"]
                                     for line in gzip.decompress((sweep / f"{v}_rl.metrics.jsonl.gz").read_bytes())
                                     .decode().splitlines()]}} for v in ("v0", "v1")]
    rewards = [x for r in rows for x in r["per step"]["reward"]]
    low, high = reward_limits(rows)
    assert low < min(rewards) < -0.08 and 0.04 < max(rewards) < high < 0.06
    assert reward_limits([{"per step": {"reward": [0.2, 0.6]}}]) == (-0.03, 0.63)  # MemAgent's: from 0
