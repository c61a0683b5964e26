"""Evaluate an HF checkpoint (e.g. a trained iteration converted back with tools/convert_torch_dist_to_hf.py) on
prompt data with a reward function, through a real engine.

    python -m vime_ext.evaluate --hf-checkpoint DIR --prompt-data FILE.jsonl [--custom-rm-path MOD.fn]
        [--engine-backend vllm|hf] [--n-samples-per-prompt 1] [--rollout-max-response-len 64] [--temperature 0]
"""

import argparse
import json

import numpy as np

from vime_ext.data.prompt_dataset import read_jsonl
from vime_ext.rollout.config import RolloutConfig
from vime_ext.rollout.engines import EngineConfig, launch_engine, wait_until_serving
from vime_ext.rollout.rollout import rollout_metrics, run_rollout


def evaluate(hf_dir: str, prompt_data: str, reward_path: str = "vime_ext.rollout.rewards.boxed_exact_match",
             backend: str = "hf", n_samples: int = 1, max_response_len: int = 64, temperature: float = 0.0,
             engine_args: list[str] | None = None, log_dir: str | None = None) -> dict[str, float]:
    from transformers import AutoTokenizer

    records = read_jsonl(prompt_data)
    config = RolloutConfig(rollout_batch_size=len(records), n_samples_per_prompt=n_samples,
                           rollout_max_response_len=max_response_len, rollout_temperature=temperature,
                           custom_rm_path=reward_path)
    engine = launch_engine(EngineConfig(hf_dir, backend=backend, extra_args=list(engine_args or []),
                                        log_dir=log_dir))
    try:
        wait_until_serving([engine], timeout_s=900)
        groups = run_rollout(config, engine.url, AutoTokenizer.from_pretrained(hf_dir),
                             [r.as_rollout_input() for r in records])
    finally:
        engine.stop()
    samples = [s for g in groups for s in g]
    return {**rollout_metrics(samples, "eval"), "eval/samples": float(len(samples)),
            "eval/reward_sem": float(np.std([s.reward or 0.0 for s in samples]) / np.sqrt(len(samples)))}


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description="evaluate an HF checkpoint on prompt data with a reward")
    parser.add_argument("--hf-checkpoint", required=True)
    parser.add_argument("--prompt-data", required=True)
    parser.add_argument("--custom-rm-path", default="vime_ext.rollout.rewards.boxed_exact_match")
    parser.add_argument("--engine-backend", choices=["vllm", "hf"], default="hf")
    parser.add_argument("--n-samples-per-prompt", type=int, default=1)
    parser.add_argument("--rollout-max-response-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    result = evaluate(args.hf_checkpoint, args.prompt_data, args.custom_rm_path, args.engine_backend,
                      args.n_samples_per_prompt, args.rollout_max_response_len, args.temperature)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
