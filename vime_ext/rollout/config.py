"""Rollout flags (slime/vime names) and the typed config they fill."""

from dataclasses import dataclass

from vime_ext.engines.protocol import SamplingParams
from vime_ext.flags import help_field as _help


@dataclass(frozen=True)
class RolloutConfig:
    rollout_batch_size: int = _help("prompts (groups) per rollout", 8)
    n_samples_per_prompt: int = _help("samples per prompt: the group size of GRPO", 4)
    rollout_max_response_len: int = _help("new tokens per generate call", 1024)
    rollout_temperature: float = _help("sampling temperature of training rollouts", 1.0)
    rollout_top_p: float = _help("nucleus sampling of rollouts (1: off)", 1.0)
    rollout_stop: tuple[str, ...] = _help("stop strings", ())
    rollout_seed: int | None = _help("base sampling seed; every sample gets its own seed derived from it")
    rollout_log_probs: bool = _help(
        "ask the engines for each sampled token's log-prob (--use-tis needs them; they give the "
        "train/logprob_abs_diff metrics). --no-rollout-log-probs: the engines answer token ids only, which costs "
        "vLLM's API server and the client about half the CPU per token; samples hold NaN log-probs. Evaluation "
        "never asks for them", True)
    rollout_stream_interval: int = _help(
        "vLLM engines send each reply in pieces of this many tokens as they generate it (vLLM's --stream-interval), "
        "so their API server builds answers while the GPU decodes rather than all at once when a rollout's replies "
        "finish together (W2 of tools/bench_peers.py on an H200: 26.8 s a step against 31.2 with whole replies); "
        "0: whole replies", 64)
    custom_generate_function_path: str = _help(
        "generate(args, sample, sampling_params, evaluation=False) -> Sample | list[Sample]",
        "vime_ext.agent.generate.generate")
    custom_rm_path: str = _help("rm(args, sample) -> float | dict (with --group-rm: rm(args, samples) -> list)",
                                "vime_ext.agent.rewards.boxed_exact_match")
    group_rm: bool = _help("call the reward function once per group with all its samples", False)
    rm_hf_checkpoint: str | None = _help(
        "a fixed model (a judge, a reader) served beside the policy for the reward function: never updated or put "
        "to sleep, restarted if it dies; its URL reaches plug-ins as args.rm_url")
    rm_url: str | None = _help("the address of a reward model the reward function asks (args.rm_url, as in slime); "
                               "with --rm-hf-checkpoint the run sets it")
    rm_replies_file: str | None = _help(
        "with --rm-hf-checkpoint: a SQLite file in which the reward model's greedy replies are kept (by checkpoint, "
        "prompt and sampling settings) for every process that names it, so that seeds and evaluations get one "
        "reply per prompt (plug-ins that ask through vime_ext.engines.fixed_replies.FIXED_REPLIES.ask)")
    rm_gpu_memory_utilization: float = _help(
        "with --rm-hf-checkpoint, vLLM on GPUs: the reward model engine's share of the first engine GPU's memory", 0.1)
    rollout_function_path: str = _help("rollout_function(args, rollout_id, data_source, evaluation=False)",
                                       "vime_ext.rollout.rollout.generate_rollout")
    custom_convert_samples_to_train_data_path: str = _help(
        "convert_samples_to_train_data(args, samples) -> list[TrainSequence]",
        "vime_ext.algorithms.train_data.samples_to_train_data")
    custom_config_path: str | None = _help("YAML or JSON file of plug-in settings; each key becomes args.<key>")
    dynamic_sampling_filter_path: str | None = _help(
        "filter(args, group) -> bool: keep a group? e.g. vime_ext.rollout.filters.check_reward_nonzero_std; "
        "sampling goes on until --rollout-batch-size groups pass")
    over_sampling_batch_size: int | None = _help("with --dynamic-sampling-filter-path: prompts drawn per round "
                                                 "(default --rollout-batch-size)")
    failed_sample_policy: str = _help(
        "a group with a failed or aborted sample (a plug-in raised or timed out, an engine died): regenerate its "
        "bad samples once, then drop it if still short; or drop it at once. A dropped group trains nothing",
        "regenerate")
    max_failed_fraction: float = _help("stop the run when more than this share of a rollout's samples FAILED "
                                       "(plug-in errors, timeouts, refused requests; engine aborts do not count)", 0.5)
    overlong_buffer_len: int | None = _help(
        "DAPO's overlong penalty: a response longer than --rollout-max-response-len minus this many tokens loses "
        "reward linearly, down to --overlong-penalty-factor at the limit")
    overlong_penalty_factor: float = _help("with --overlong-buffer-len: the penalty at the length limit", 1.0)
    async_training: bool = _help(
        "generate the next rollouts while the trainer trains on earlier ones (engines on GPUs of their own, or with "
        "--colocate on the trainer's, both resident in split memory; train_async.py sets it); weights reach the "
        "engines between rollouts", False)
    max_staleness: int | None = _help(
        "with --async-training: how many policy versions the policy that trains on a sample may be ahead of the "
        "one that generated it (default 1: the next rollout overlaps the current step; 0: the synchronous loop)")
    partial_rollout: bool = _help(
        "with --async-training: a weight push no longer waits for the rollout in flight; its requests are aborted, "
        "the weights pushed, and each reply continued under the new weights from the tokens it had, every token "
        "tagged with the version that sampled it (the staleness bound holds for the oldest)", False)
    rollout_sample_timeout: float = _help("seconds one sample's generate and reward may take before it fails "
                                          "(0: no limit)", 3600.0)

    @property
    def staleness_bound(self) -> int:
        """The most policy versions a trained sample may lag: 0 in the synchronous loop."""
        if not self.async_training:
            return 0
        return 1 if self.max_staleness is None else self.max_staleness


def sampling_params(args, evaluation: bool = False) -> SamplingParams:
    """The sampling settings of training rollouts, or of evaluation (``--eval-*`` where given), from ``args``
    (a ``PluginArgs``, or a ``RolloutConfig`` for training settings)."""
    if evaluation:
        return SamplingParams(temperature=args.eval_temperature, top_p=args.rollout_top_p,
                              max_new_tokens=args.eval_max_response_len or args.rollout_max_response_len,
                              stop=tuple(args.rollout_stop), seed=args.rollout_seed, log_probs=False)
    return SamplingParams(temperature=args.rollout_temperature, top_p=args.rollout_top_p,
                          max_new_tokens=args.rollout_max_response_len, stop=tuple(args.rollout_stop),
                          seed=args.rollout_seed, log_probs=args.rollout_log_probs)
