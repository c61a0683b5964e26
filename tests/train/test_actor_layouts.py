"""The RL step is the same computation in every layout: two optimizer steps on the same sequences at TP=1,
TP=2, PP=2, DP=2, with token-budget micro-batches, with token-budget log-prob passes and with right-padded
instead of packed micro-batches give the same gradient norms, losses and weights; with PPO also the same value
losses, advantages and critic weights. On CUDA the reference runs megatron-core's optimizer, and two more layouts
check its distributed form (one GPU; and DP=2 sharded against DP=1, on two GPUs).

This checks what only shows across ranks: loss weights normalised over the whole step (micro-batches and
data-parallel shares add up), data-parallel gradient sums, the global gradient norm counting TP-replicated
params once, vocab-parallel log-probs and entropy, and the tied embedding's gradient across pipeline stages.
Adam's eps is set large, so an update is close to lr x gradient and a gradient error shows in the weights
(compared relative to the largest update).
"""

import json
import os
from pathlib import Path

import pytest
import torch

from tests import dist_workers
from tests.conftest import require_ranks
from vime_ext.convert.hf_checkpoint import HFCheckpointReader
from vime_ext.trainer.launch import run_on_ranks

LAYOUTS = {"tp1": [], "tp2": ["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2"],
           "pp2": ["--actor-num-gpus-per-node", "2", "--pipeline-model-parallel-size", "2"],
           "dp2": ["--actor-num-gpus-per-node", "2"],
           "dynamic": ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "30"],
           # forward-only passes in their own, larger token-budget batches, copied back to the training rows
           "pp2_logprob_batches": ["--actor-num-gpus-per-node", "2", "--pipeline-model-parallel-size", "2",
                                   "--log-probs-max-tokens-per-gpu", "40"],
           # right-padded rows through megatron's own attention, where every other layout packs (SDPA, THD)
           "padded": ["--no-pack-sequences", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "30"],
           # CUDA only: megatron-core's distributed optimizer and its overlaps, against the
           # reference run's (non-distributed) megatron optimizer; dp2_distributed is the DP=2 sharded vs DP=1 check
           "distributed": ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                           "--accumulate-allreduce-grads-in-fp32"],
           "dp2_distributed": ["--actor-num-gpus-per-node", "2", "--use-distributed-optimizer",
                               "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "20000"]}
CUDA_LAYOUTS = ("distributed", "dp2_distributed")  # CPU offload needs --bf16: test_optimizer_resume.py runs it


PPO = ["--advantage-estimator", "ppo", "--gamma", "0.9", "--lambd", "0.8", "--value-clip", "0.05",
       "--kl-coef", "0.05", "--normalize-advantages", "--critic-lr", "0.5", "--num-rollout", "2"]
PPO_KEYS = ("value_loss", "value_clip_fraction", "values", "returns", "advantage_abs")
# The other policy losses and the rollout correction, by hand (VIME_EXT_ALL_LAYOUTS=1; their per-token maths is
# checked against verl in tests/algorithms): GSPO's sequence ratio needs whole rows on the last stage, CISPO's
# gradient flows through the log-probs alone; dual-clip bounds negative advantages' losses.
LOSSES = {"gspo": ["--policy-loss", "gspo", "--eps-clip", "3e-4", "--eps-clip-high", "4e-4"],
          "cispo": ["--policy-loss", "cispo", "--eps-clip-high", "0.28"],
          "dual_clip": ["--eps-clip-c", "1.5"]}
BY_HAND = pytest.mark.skipif(os.environ.get("VIME_EXT_ALL_LAYOUTS") != "1",
                             reason="run by hand: VIME_EXT_ALL_LAYOUTS=1")


def run_layout(family_dir: Path, data: Path, out: Path, layout: str, extra: tuple[str, ...] = ()) -> tuple[list, dict]:
    flags = ["--hf-checkpoint", str(family_dir), "--prompt-data", str(data), "--rollout-batch-size", "4",
             "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--micro-batch-size", "2",
             "--lr", "1.0", "--adam-eps", "1.0", "--clip-grad", "0.5", "--use-kl-loss", "--kl-loss-coef", "0.1",
             "--entropy-coef", "0.01", "--loss-aggregation", "seq_mean_token_mean", *LAYOUTS[layout], *extra]
    out.mkdir()
    world = 2 if "--actor-num-gpus-per-node" in LAYOUTS[layout] else 1
    require_ranks(world)
    run_on_ranks(dist_workers.rl_step, world, str(out), flags, isolate=True)
    steps = [json.loads(p.read_text()) for p in sorted(out.glob("steps_dp*.json"))]
    summed_keys = ("loss", "pg_loss", "entropy", "kl") + (PPO_KEYS if "ppo" in extra else ())
    summed = [{k: sum(s[i][k] for s in steps) for k in summed_keys}
              | {k: steps[0][i][k] for k in ("grad_norm", "critic_grad_norm") if k in steps[0][i]}
              for i in range(len(steps[0]))]
    weights = {}
    for part in out.glob("weights_pp*.pt"):
        weights.update(torch.load(part))
    return summed, weights


class Reference:
    """The tp1 run of a (family, algorithm) case, made once per test session and shared by its layouts."""

    _runs: dict = {}

    def __init__(self, family: str, algorithm: str, hf_dir: Path, root: Path):
        self.extra = tuple(PPO) if algorithm == "ppo" else tuple(LOSSES.get(algorithm, ()))
        self.data = root / "p.jsonl"
        self.data.write_text(json.dumps({"prompt": "x", "label": "y"}) + "\n")
        self.hf_dir = hf_dir
        self.steps, self.weights = run_layout(hf_dir, self.data, root / "tp1", "tp1", self.extra)
        reader = HFCheckpointReader(hf_dir)

        def initial(name: str) -> torch.Tensor:
            if name == "critic.value_head":
                return torch.zeros_like(self.weights[name])  # the value head starts at zero
            return reader.get(name.removeprefix("critic.")).float()

        self.initial = initial
        self.update = {k: self.weights[k] - initial(k) for k in self.weights}
        self.scale = max(u.abs().max().item() for u in self.update.values())

    @classmethod
    def of(cls, family: str, algorithm: str, hf_dir: Path, tmp_path_factory) -> "Reference":
        if (family, algorithm) not in cls._runs:
            cls._runs[family, algorithm] = cls(family, algorithm, hf_dir, tmp_path_factory.mktemp(family))
        return cls._runs[family, algorithm]


# Llama with PPO runs the whole policy loss of the GRPO case (same flags) plus the critic, so Llama needs no GRPO
# case of its own; Qwen3 brings the q/k layernorms (their gradients are TP partial sums).
CASES = [("qwen3", "grpo"), ("llama", "ppo")] + [pytest.param("qwen3", loss, marks=BY_HAND) for loss in LOSSES]


@pytest.mark.parametrize("family, algorithm", CASES)
def test_reference_step_moves_the_weights(family, algorithm, tiny_hf_dirs, tmp_path_factory):
    ref = Reference.of(family, algorithm, tiny_hf_dirs[family], tmp_path_factory)
    assert len(ref.steps) == 2 and ref.steps[0]["grad_norm"] > 0.5  # clipping is exercised
    assert ref.scale > 1e-4  # the steps moved the weights
    if algorithm == "ppo":
        assert ref.steps[1]["critic_grad_norm"] > 0 and ref.steps[1]["value_loss"] > 0
        # Step 1 moved the zero value head; step 2's gradient reached the critic's trunk too.
        assert ref.update["critic.value_head"].abs().max() > 1e-3
        assert ref.update["critic.model.norm.weight"].abs().max() > 1e-4


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != "tp1"])
@pytest.mark.parametrize("family, algorithm", CASES)
def test_layout_takes_the_reference_step(family, algorithm, layout, tiny_hf_dirs, tmp_path_factory, tmp_path):
    if layout in CUDA_LAYOUTS and not torch.cuda.is_available():
        pytest.skip("megatron-core's DDP and optimizer run on CUDA only")
    ref = Reference.of(family, algorithm, tiny_hf_dirs[family], tmp_path_factory)
    steps, weights = run_layout(ref.hf_dir, ref.data, tmp_path / layout, layout, ref.extra)
    for ours, expected in zip(steps, ref.steps):
        for key in expected:
            assert ours[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), (layout, key)
    assert sorted(weights) == sorted(ref.weights)
    # Relative to the largest update: every layout moved every weight the same way.
    worst = max(((weights[k] - ref.initial(k)) - ref.update[k]).abs().max().item() for k in ref.weights)
    assert worst < 1e-3 * ref.scale, (layout, worst, ref.scale)


def test_a_one_step_rollout_takes_its_old_log_probs_from_the_step_itself(tiny_hf_dirs, tmp_path):
    """The whole rollout in one optimizer step (global batch = rollout), with the KL loss's reference: skipping
    the policy's forward-only pass changes nothing, neither the step's statistics (the ratio is 1 either way)
    nor the weights after it nor the engine mismatch, which is now taken from the step's own forward."""
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "x", "label": "y"}) + "\n")
    flags = ["--hf-checkpoint", str(tiny_hf_dirs["qwen3"]), "--prompt-data", str(data), "--rollout-batch-size", "4",
             "--n-samples-per-prompt", "2", "--global-batch-size", "8", "--micro-batch-size", "2", "--lr", "1.0",
             "--adam-eps", "1.0", "--clip-grad", "0.5", "--use-kl-loss", "--kl-loss-coef", "0.1",
             "--entropy-coef", "0.01"]
    runs = {}
    for separate in (False, True):
        out = tmp_path / f"separate_{separate}"
        out.mkdir()
        run_on_ranks(dist_workers.one_step_rollout, 1, str(out), flags, separate, isolate=True)
        runs[separate] = (json.loads((out / "result.json").read_text()), torch.load(out / "weights.pt"))
    (ours, our_weights), (reference, reference_weights) = runs[False], runs[True]
    assert len(ours["steps"]) == 1 and ours["steps"][0]["grad_norm"] > 0.5
    # The reference model's pass runs in both (the KL loss needs it); the policy's only when asked for.
    assert ours["policy_passes"] == [False] and reference["policy_passes"] == [True]
    for key, expected in reference["steps"][0].items():
        assert ours["steps"][0][key] == pytest.approx(expected, rel=1e-5, abs=1e-7), key
    for key, expected in reference["mismatch"].items():
        assert ours["mismatch"][key] == pytest.approx(expected, rel=1e-5), key
    assert ours["mismatch"]["tokens"] > 0
    for name, expected in reference_weights.items():
        torch.testing.assert_close(our_weights[name], expected, rtol=1e-5, atol=1e-6)


def test_bf16_step_tracks_fp32(tiny_hf_dirs, tmp_path):
    """--bf16 (bf16 weights and norms, fp32 master weights in the optimizer, packed SDPA attention) takes the same
    RL step as fp32, within bf16's rounding: statistics, gradient norms and the weights it moved."""
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "x", "label": "y"}) + "\n")
    ref_steps, ref_weights = run_layout(tiny_hf_dirs["qwen3"], data, tmp_path / "fp32", "tp1")
    steps, weights = run_layout(tiny_hf_dirs["qwen3"], data, tmp_path / "bf16", "tp1", ("--bf16",))
    reader = HFCheckpointReader(tiny_hf_dirs["qwen3"])
    for ours, ref in zip(steps, ref_steps):
        for key in ("loss", "pg_loss", "entropy", "grad_norm"):
            assert ours[key] == pytest.approx(ref[key], rel=0.03, abs=0.01), (key, ours[key], ref[key])
    ref_update = {k: ref_weights[k] - reader.get(k).float() for k in ref_weights}
    update = {k: weights[k] - reader.get(k).float() for k in ref_weights}
    scale = max(u.abs().max().item() for u in ref_update.values())
    # A bf16 weight is its fp32 master rounded: up to half a bf16 step (2^-8 of its size) off, on top of the
    # update's own bf16 error; measured relative to the largest update.
    worst = max(((update[k] - ref_update[k]).abs() - ref_weights[k].abs() * 2**-8).max().item()
                for k in ref_weights)
    assert worst < 0.05 * scale, (worst, scale)
