"""Evaluate an HF checkpoint (e.g. a trained iteration converted back with tools/convert_torch_dist_to_hf.py) on
prompt data with a reward function, through a real engine.

    python -m vime_ext.evaluate --hf-checkpoint DIR --prompt-data FILE.jsonl [--custom-rm-path MOD.fn]
        [--engine-backend vllm|hf] [--n-samples-per-prompt 1] [--rollout-max-response-len 64] [--temperature 0]
        [--custom-generate-function-path MOD.fn] [--custom-config-path FILE] [--engine-dtype float32]
        [--engine-max-model-len N] [--vllm-X ...: vLLM's --X]

The same plug-ins as training run here, in evaluation mode (``evaluation=True``).
"""

import argparse
import json
import sys

import numpy as np

from vime_ext.arguments import EvalConfig, rollout_problems
from vime_ext.data.prompt_dataset import read_jsonl
from vime_ext.engines.servers import EngineConfig, launch_engine, split_vllm_args, wait_until_serving
from vime_ext.rollout.config import RolloutConfig
from vime_ext.rollout.data_source import DataSource
from vime_ext.rollout.plugins import load_custom_config, plugin_args
from vime_ext.rollout.rollout import rollout_metrics, run_rollout


def evaluate(hf_dir: str, prompt_data: str, reward_path: str = "vime_ext.agent.rewards.boxed_exact_match",
             backend: str = "hf", n_samples: int = 1, max_response_len: int = 64, temperature: float = 0.0,
             engine_args: list[str] | None = None, log_dir: str | None = None,
             generate_path: str = "vime_ext.agent.generate.generate",
             custom_config_path: str | None = None, dtype: str = "auto",
             max_model_len: int | None = None) -> dict[str, float]:
    from dataclasses import fields

    from transformers import AutoTokenizer

    records = read_jsonl(prompt_data)
    rollout = RolloutConfig(rollout_batch_size=len(records), n_samples_per_prompt=n_samples,
                            rollout_max_response_len=max_response_len, custom_rm_path=reward_path,
                            custom_generate_function_path=generate_path, custom_config_path=custom_config_path)
    problems = rollout_problems(rollout)
    if problems:
        raise ValueError("; ".join(problems))
    settings = EvalConfig(n_samples_per_eval_prompt=n_samples, eval_max_response_len=max_response_len,
                          eval_temperature=temperature)
    names = {f.name for section in (rollout, settings) for f in fields(section)}
    custom = load_custom_config(custom_config_path, names) if custom_config_path else {}
    args = plugin_args([rollout, settings], custom)
    args.tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    engine = launch_engine(EngineConfig(hf_dir, backend=backend, dtype=dtype, max_model_len=max_model_len,
                                        extra_args=list(engine_args or []), log_dir=log_dir))
    try:
        wait_until_serving([engine], timeout_s=900)
        output = run_rollout(args, engine.url, 0, DataSource(records, n_samples, len(records)), evaluation=True)
    finally:
        engine.stop()
    samples = [s for g in output.groups for s in g]
    return {**rollout_metrics(samples, "eval"), "eval/samples": float(len(samples)),
            "eval/reward_sem": float(np.std([s.reward or 0.0 for s in samples]) / np.sqrt(len(samples)))}


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description="evaluate an HF checkpoint on prompt data with a reward")
    parser.add_argument("--hf-checkpoint", required=True)
    parser.add_argument("--prompt-data", required=True)
    parser.add_argument("--custom-rm-path", default="vime_ext.agent.rewards.boxed_exact_match")
    parser.add_argument("--engine-backend", choices=["vllm", "hf"], default="hf")
    parser.add_argument("--n-samples-per-prompt", type=int, default=1)
    parser.add_argument("--rollout-max-response-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--custom-generate-function-path", default="vime_ext.agent.generate.generate")
    parser.add_argument("--custom-config-path", default=None, help="YAML or JSON plug-in settings")
    parser.add_argument("--engine-dtype", default="auto", help="the engine's weights and activations")
    parser.add_argument("--engine-max-model-len", type=int, default=None, help="the engine's context length")
    own, vllm_args = split_vllm_args(sys.argv[1:] if argv is None else list(argv))  # --vllm-X: the engine's --X
    args = parser.parse_args(own)
    result = evaluate(args.hf_checkpoint, args.prompt_data, args.custom_rm_path, args.engine_backend,
                      args.n_samples_per_prompt, args.rollout_max_response_len, args.temperature,
                      engine_args=vllm_args, generate_path=args.custom_generate_function_path,
                      custom_config_path=args.custom_config_path, dtype=args.engine_dtype,
                      max_model_len=args.engine_max_model_len)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
