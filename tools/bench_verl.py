"""verl 0.9.1 on one of ``tools/bench_peers.py``'s workloads (``--frameworks verl``): its ``main_ppo`` with the
workload's settings as Hydra overrides, in a process whose path starts with verl's own site (``$VERL_SITE``,
``tools/gpu_wheels.py --verl``: verl pins transformers<5.11, the GPU image has 5.17).

The workload in verl's terms: the bench's prompts as a parquet file of one-message chats under a chat template
that renders the message as it is (the prompt is exactly the workload's tokens, as for the other frameworks; the
prompt length is also verl's limit, with truncation an error), GRPO with ``train_batch_size`` prompts x
``rollout.n`` samples and one optimizer step per rollout (``ppo_mini_batch_size`` = the whole batch, one epoch),
responses of exactly the workload's length (vLLM's ``ignore_eos``), temperature 1, no KL (neither in the loss nor
in the reward), no entropy bonus, lr 1e-6, the bench's hash reward on the response's text, vLLM colocated
(``hybrid_engine``) with its cache freed while the actor trains and CUDA graphs on, FSDP with fp32 master
weights and bf16 compute (as megatron here), dynamic batches of at most 16,384 tokens, no gradient checkpointing.
flash-attn has no wheel for the image: the actor runs transformers' SDPA attention with padding kept.

Phases: verl's own timers (``timing_s/gen``, ``old_log_prob``, ``update_actor``, ``update_weights``, ``step``);
the engine's sleep and wake fall inside ``gen`` and ``update_weights``. Peak memory: the actor's
``actor/perf/max_memory_allocated_gb`` (the name verl 0.9.1 logs it under, seen on the GPU run).
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.bench_plugins import text_reward  # noqa: E402

# A template that renders the one user message as it is: no role markers, no generation prompt.
PLAIN_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# verl's metric -> the name bench_peers reads (the names this project logs)
METRICS = {"timing_s/step": "time/total", "timing_s/gen": "time/rollout", "timing_s/old_log_prob": "time/log_probs",
           "timing_s/update_actor": "time/train", "timing_s/update_weights": "time/weight_sync",
           # the actor's torch peak, as verl logs it
           "actor/perf/max_memory_allocated_gb": "memory/actor_peak_allocated_gb"}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_) -> float:
    """The bench's reward as verl calls a custom reward function (``reward.custom_reward_function``)."""
    return text_reward(solution_str)


def write_parquet(prompts_jsonl: Path, path: Path) -> Path:
    """bench_peers' prompt file as verl's RL dataset: one user message per row, no ground truth needed."""
    import pandas as pd

    prompts = [json.loads(line)["prompt"] for line in prompts_jsonl.read_text().splitlines()]
    rows = [{"data_source": "bench", "prompt": [{"role": "user", "content": p}],
             "reward_model": {"style": "rule", "ground_truth": ""}, "extra_info": {"index": i}}
            for i, p in enumerate(prompts)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


# verl's bypass mode: the rollout's log-probs serve as the old ones (its PPO ratio handles the correction), so the
# separate old-log-prob pass of its default, decoupled mode is skipped; with one optimizer step per rollout, as
# this project's trainer does.
BYPASS = ["algorithm.rollout_correction.bypass_mode=True", "algorithm.rollout_correction.rollout_is=null",
          "algorithm.rollout_correction.loss_type=ppo_clip"]


def overrides(workload, model_dir: Path, data: Path, out: Path, engine_memory: float,
              bypass: bool = False) -> list[str]:
    """``main_ppo``'s Hydra overrides for ``workload`` (a bench_peers ``Workload``) on one GPU; ``bypass``: verl's
    bypass mode (``BYPASS``)."""
    micro_tokens = 16384
    return (BYPASS if bypass else []) + [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files=['{data}']", f"data.val_files=['{data}']",
        f"data.train_batch_size={workload.prompts}", f"data.max_prompt_length={workload.prompt_tokens}",
        f"data.max_response_length={workload.response_tokens}", "data.truncation=error", "data.shuffle=False",
        "data.filter_overlong_prompts=False", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.model.custom_chat_template=\"{PLAIN_TEMPLATE}\"",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={workload.prompts}", "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={micro_tokens}",
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.n={workload.samples}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={engine_memory}",
        "actor_rollout_ref.rollout.enforce_eager=False", "actor_rollout_ref.rollout.free_cache_engine=True",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={micro_tokens}",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.nnodes=1", "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={workload.steps}",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.logger=['console','file']", "trainer.project_name=bench_peers",
        f"trainer.experiment_name={workload.name}", f"trainer.default_local_dir={out / 'ckpt'}",
    ]


def steps(file_log: Path) -> list[dict]:
    """verl's file logger (``VERL_FILE_LOGGER_PATH``: one ``{"step", "data"}`` line per step) as bench_peers'
    per-step rows; verl's own metrics kept under ``verl/``."""
    rows = []
    for number, line in enumerate(file_log.read_text().splitlines(), start=1):
        data = json.loads(line)["data"]
        missing = [k for k in ("timing_s/step", "timing_s/gen") if k not in data]
        if missing:
            raise ValueError(f"{file_log}:{number}: no {', '.join(missing)} in verl's metrics")
        row = {ours: float(data[theirs]) for theirs, ours in METRICS.items() if theirs in data}
        row["verl/timing_s"] = {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith("timing_s/")}
        rows.append(row)
    return rows
