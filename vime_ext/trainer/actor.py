"""One trainer rank: a Megatron model shard, its reference copy, the optimizer, PPO's critic, and the RL step.

The driver (``vime_ext/train.py``) runs one ``TrainActor`` per rank, as a Ray actor or (``--no-ray``) in its
own process, and calls the same methods either way.
"""

import random
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from vime_ext.algorithms.advantages import gae_advantages, terminal_rewards, whiten
from vime_ext.algorithms.train_data import TrainSequence
from vime_ext.arguments import TrainConfig
from vime_ext.gpu_sharing import GpuSharing
from vime_ext.trainer.batching import MicroBatch, copy_rows, micro_batches
from vime_ext.trainer.forward import forward_backward, forward_log_probs
from vime_ext.trainer.memory_handover import (MemoryHandover, ipc_shareable_allocations, memory_snapshot,
                                              use_releasable_allocations)
from vime_ext.trainer.progress import Progress
from vime_ext.trainer.rl_loss import LossSettings, micro_batch_loss, micro_batch_sft_loss
from vime_ext.trainer.results import LogProbMismatch, LossSum, RankLayout, StepResult

if TYPE_CHECKING:
    from vime_ext.engines.weight_sync import WeightTarget


def _rng_state() -> dict:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "megatron": get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    get_cuda_rng_tracker().set_states(state["megatron"])


class TrainActor:
    def __init__(self, config: TrainConfig, rank: int, world_size: int, master_addr: str, master_port: int,
                 local_rank: int | None = None):
        from megatron.core import parallel_state

        from vime_ext.convert.hf_checkpoint import HFCheckpointReader
        from vime_ext.trainer.hf_weights import load_hf_weights
        from vime_ext.trainer.checkpoint import load_model_checkpoint
        from vime_ext.trainer.log_probs import use_compiled
        from vime_ext.trainer.model_provider import build_gpt_model
        from vime_ext.trainer.optimizer import build_optimizer
        from vime_ext.trainer.parallel import Rendezvous, init_distributed

        self.progress = Progress()  # read by the driver's watchdog while this rank works
        use_compiled("cuda" if config.trainer.compile_log_probs else "off")
        self.config, self.shape, self.rank = config, config.shape, rank
        if GpuSharing.from_config(config).releases_memory():
            use_releasable_allocations()  # before anything is allocated: the hand-over must get it all back
        parallel = config.trainer.parallel
        # Sequence parallelism splits the packed row over TP ranks, so it must divide evenly.
        self.pack_multiple = (parallel.tensor_model_parallel_size if parallel.sequence_parallel else 1) \
            if config.trainer.pack_sequences else None
        init_distributed(parallel, seed=config.data.seed,
                         rendezvous=Rendezvous(rank, world_size, master_addr, master_port, local_rank or 0))
        self.dtype = torch.bfloat16 if config.trainer.bf16 else torch.float32
        self.model = self._build(build_gpt_model, parallel, recompute=config.trainer.recompute_granularity,
                                 recompute_num_layers=config.trainer.recompute_num_layers)
        hf = HFCheckpointReader(config.checkpoint.hf_checkpoint)
        ref_load = config.checkpoint.ref_load
        # --ref-load (slime's convention): the run starts from that checkpoint's weights, unless --load resumes
        # one (actor.load, later); loaded before the optimizer exists, so its fp32 masters start from them too.
        if ref_load:
            load_model_checkpoint(self.model, ref_load)
        else:
            load_hf_weights(self.model, self.shape, hf.get, progress=rank == 0)
        self.ref_model = None
        if config.algorithm.use_kl_loss or config.algorithm.kl_coef > 0:
            self.ref_model = self._build(build_gpt_model, parallel)
            if ref_load:
                load_model_checkpoint(self.ref_model, ref_load)
            else:
                load_hf_weights(self.ref_model, self.shape, hf.get)
            self.ref_model.requires_grad_(False)
        o = config.optimizer
        total_steps = config.data.num_rollout * config.steps_per_rollout
        # The optimizer wraps the model on CUDA (megatron's DDP): train and save what it hands back.
        self.optimizer = build_optimizer(self.model, o, o.lr, total_steps)
        self.model = self.optimizer.model
        a = config.algorithm
        self.critic = None
        if a.advantage_estimator == "ppo":
            from vime_ext.trainer.critic import Critic, attach_value_head, critic_checkpoint_dir

            critic_model = self._build(build_gpt_model, parallel, recompute=config.trainer.recompute_granularity,
                                       recompute_num_layers=config.trainer.recompute_num_layers)
            load_hf_weights(critic_model, self.shape, hf.get)
            attach_value_head(critic_model)
            if config.checkpoint.critic_load:
                load_model_checkpoint(critic_model, critic_checkpoint_dir(config.checkpoint.critic_load))
            critic_lr = o.critic_lr if o.critic_lr is not None else o.lr
            self.critic = Critic(build_optimizer(critic_model, o, critic_lr, total_steps), a.loss_aggregation,
                                 a.value_clip)
        self.loss_settings = LossSettings(
            policy_loss=a.policy_loss, eps_clip=a.eps_clip, eps_clip_high=a.eps_clip_high, eps_clip_c=a.eps_clip_c,
            use_kl_loss=a.use_kl_loss, kl_loss_coef=a.kl_loss_coef, kl_loss_type=a.kl_loss_type,
            entropy_coef=a.entropy_coef, aggregation=a.loss_aggregation, use_tis=a.use_tis, tis_cap=a.tis_cap,
            tis_level=a.tis_level, tis_floor=a.tis_floor, temperature=config.rollout.rollout_temperature or 1.0)
        self.ps = parallel_state
        self._handover = MemoryHandover(self._device().type)
        # The optimizers' state stays off the device from a hand-over until their next step needs it
        for optimizer in [self.optimizer] + ([self.critic.optimizer] if self.critic is not None else []):
            optimizer.before_step = self._restore_state
        self._weight_sync = None  # the sender's (target, WeightSync), kept between pushes
        self._resumed_from = None  # the iteration this run loaded: --save-keep-last never deletes it

    def _restore_state(self) -> float:
        """The optimizers' state back from the host before their step; its seconds, 0 when none was away (so that
        the step's figures stay exact where nothing is handed over)."""
        restored = self._handover.restore_state()
        return restored.seconds if restored.released_gb else 0.0

    def _build(self, build_gpt_model, parallel, recompute=None, recompute_num_layers=None):
        from vime_ext.models.model_config import default_attention

        model = build_gpt_model(self.shape, parallel, dtype=self.dtype, init_weights=False, recompute=recompute,
                                recompute_num_layers=recompute_num_layers,
                                attention=default_attention(packed=self.config.trainer.pack_sequences))
        # Losses are normalised by the driver over the whole step; megatron must not average them again.
        model.config.calculate_per_token_loss = True
        model.config.variable_seq_lengths = parallel.pipeline_model_parallel_size > 1
        return model

    def layout(self) -> RankLayout:
        ps = self.ps
        return RankLayout(rank=self.rank, dp_rank=ps.get_data_parallel_rank(),
                          tp_rank=ps.get_tensor_model_parallel_rank(), pp_rank=ps.get_pipeline_model_parallel_rank(),
                          last_stage=ps.is_pipeline_last_stage(), dp_size=ps.get_data_parallel_world_size(),
                          device=self._device().type)

    def _reports(self) -> bool:
        return self.ps.is_pipeline_last_stage() and self.ps.get_tensor_model_parallel_rank() == 0

    # ---- colocated mode: the accelerator goes to the engines between training steps -----------------------

    def release_memory(self, keep_weights: bool = False) -> dict[str, float]:
        """Hand this rank's accelerator memory over (``memory_handover``): weights, gradient buffers, optimizer
        state (unless ``--no-offload-optimizer-state``), the reference model and the critic. ``keep_weights`` keeps
        the policy's weights for a push; a second call releases them. Returns what moved and the memory left."""
        weights = list(self.model.parameters())
        policy = self.optimizer.handover_tensors()
        kept, zeroed, state = policy.kept, policy.zeroed, policy.state
        constant = list(self.ref_model.parameters()) if self.ref_model is not None else []
        if self.critic is not None:
            critic = self.critic.optimizer.handover_tensors()
            kept += list(self.critic.model.parameters()) + critic.kept
            zeroed += critic.zeroed
            state += critic.state
        stats = self._handover.release(kept + weights, zeroed, constant, spare=weights if keep_weights else (),
                                       state=state, keep_state=not self.config.cluster.offload_optimizer_state)
        return {**stats.metrics(), **memory_snapshot()}

    def restore_memory(self) -> dict[str, float]:
        """Take back what ``release_memory`` handed over, values intact, gradient buffers zeroed; the optimizers'
        state follows at their next step (``MemoryHandover.restore_state``) or save."""
        return {**self._handover.restore().metrics(), **memory_snapshot()}

    def memory(self) -> dict[str, float]:
        """This rank's accelerator memory now, and its peak since the last call (``memory_snapshot``)."""
        return memory_snapshot()

    # ---- log-probs and training ---------------------------------------------------------------------------

    def _device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

    def _fill_log_probs(self, batches: list[MicroBatch], old: bool = True) -> None:
        """Old-policy (unless ``old`` is False) and reference log-probs, forward only, before any update of this
        rollout."""
        chunk = self.config.trainer.log_probs_chunk_size
        temperature = self.loss_settings.temperature
        for batch in batches:
            self.progress.tick()
            if old:
                batch.old_log_probs = forward_log_probs(self.model, self.shape, batch.tokens, chunk, temperature,
                                                        batch.packing)
            if self.ref_model is not None:
                batch.ref_log_probs = forward_log_probs(self.ref_model, self.shape, batch.tokens, chunk,
                                                        temperature, batch.packing)

    def _forward_only_passes(self, batches: list[MicroBatch], sequences: list[TrainSequence],
                             old: bool = True) -> None:
        """Old (unless ``old`` is False) and reference log-probs and critic values for ``batches``, computed in
        the training micro-batches or, with ``--log-probs-max-tokens-per-gpu``, in larger token-budget batches of
        the same ``sequences`` (fewer, fuller passes: forward-only keeps no activations) and copied back row by
        row."""
        if not old and self.ref_model is None and self.critic is None:
            return
        budget = self.config.trainer.log_probs_max_tokens_per_gpu
        passes = batches if budget is None else [
            b.to(self._device()) for b in micro_batches(sequences, max_tokens=budget,
                                                         budget_flag="--log-probs-max-tokens-per-gpu",
                                                         pack_multiple=self.pack_multiple)]
        self._fill_log_probs(passes, old)
        if self.critic is not None:
            self.critic.fill_values(passes)
        if budget is not None and passes and self.ps.is_pipeline_last_stage():
            copy_rows(passes, batches, ("old_log_probs", "ref_log_probs", "old_values"))

    def _fill_advantages(self, batches: list[MicroBatch]) -> None:
        """PPO: GAE advantages and returns from the critic's values and each row's terminal reward (minus
        ``kl_coef`` x the per-token log-ratio to the reference); then, with ``--normalize-advantages``, whitening
        over the whole rollout on every data-parallel rank. Last pipeline stage only (the losses live there)."""
        a = self.config.algorithm
        if self.critic is not None:
            for batch in batches:
                if torch.isnan(batch.rewards).any():
                    raise ValueError("--advantage-estimator ppo needs each training sequence's reward; the "
                                     "samples-to-train-data converter left TrainSequence.reward unset")
                rewards = terminal_rewards(batch.rewards, batch.loss_mask)
                if a.kl_coef:
                    rewards = rewards - a.kl_coef * (batch.old_log_probs - batch.ref_log_probs) * batch.loss_mask
                batch.advantages, batch.returns = gae_advantages(rewards, batch.old_values, batch.loss_mask,
                                                                 a.gamma, a.lambd)
        if a.normalize_advantages:
            device = self._device()
            moments = torch.zeros(3, dtype=torch.float64, device=device)
            for batch in batches:
                adv, mask = batch.advantages.double(), batch.loss_mask.double()
                moments += torch.stack([mask.sum(), (adv * mask).sum(), (adv.square() * mask).sum()])
            if self.ps.get_data_parallel_world_size() > 1:
                torch.distributed.all_reduce(moments, group=self.ps.get_data_parallel_group())
            for batch in batches:
                batch.advantages = whiten(batch.advantages, batch.loss_mask, tuple(moments.tolist()))

    def _policy_step(self, batches: list[MicroBatch], total_tokens: float, total_sequences: float) -> dict:
        def loss_fn(logits: torch.Tensor, batch: MicroBatch):
            return micro_batch_loss(logits, batch, self.shape, self.loss_settings, total_tokens, total_sequences,
                                    self.config.trainer.log_probs_chunk_size)

        def sft_loss_fn(logits: torch.Tensor, batch: MicroBatch):
            return micro_batch_sft_loss(logits, batch, self.shape, self.loss_settings.aggregation, total_tokens,
                                        total_sequences, self.config.trainer.log_probs_chunk_size)

        stats = forward_backward(self.model, batches, sft_loss_fn if self.config.sft else loss_fn)
        return {**stats, **self.optimizer.step()}

    def train_rollout(self, steps: list[list[TrainSequence]], totals: list[tuple[float, float]],
                       update_policy: bool = True) -> StepResult:
        """Train on one rollout: ``steps[i]`` is this rank's data-parallel share of optimizer step i, ``totals[i]``
        that step's (loss tokens, sequences) over all ranks. With a critic (PPO) each step also updates it;
        ``update_policy=False`` updates only the critic. Returns per-step weighted statistic sums (last stage;
        the driver adds them over data-parallel ranks) and timings."""
        device = self._device()
        mbs = self.config.trainer.micro_batch_size
        max_tokens = self.config.trainer.max_tokens_per_gpu if self.config.trainer.use_dynamic_batch_size else None
        offsets = np.cumsum([0] + [len(seqs) for seqs in steps])
        step_batches = [[b.to(device) for b in micro_batches(seqs, mbs, max_tokens, first_row=int(first),
                                                             pack_multiple=self.pack_multiple)]
                        for seqs, first in zip(steps, offsets)]
        every_batch = [b for bs in step_batches for b in bs]
        # A rollout trained in one optimizer step, without a critic, is on-policy at its one update: the old
        # policy is the weights the step starts from, so the step's own forward gives the old log-probs
        # (rl_loss.micro_batch_loss) and a forward-only pass of the policy over the rollout would repeat it.
        one_pass = len(step_batches) == 1 and update_policy and self.critic is None
        start = time.perf_counter()
        if not self.config.sft:  # SFT's loss needs neither old log-probs nor advantages
            self._forward_only_passes(every_batch, [s for seqs in steps for s in seqs], old=not one_pass)
            if self.ps.is_pipeline_last_stage():
                self._fill_advantages(every_batch)
        log_prob_time = time.perf_counter() - start
        start = time.perf_counter()
        steps = []
        for batches, step_totals in zip(step_batches, totals):
            self.progress.tick()
            stats = self._policy_step(batches, *step_totals) if update_policy else {}
            if self.critic is not None:
                stats.update(self.critic.train_step(batches, *step_totals))
            steps.append(stats)
        train_time = time.perf_counter() - start
        # After the steps: the old log-probs are those of the weights before them, from the forward-only pass or
        # (one_pass) left on the batches by the step's own forward.
        mismatch = self._engine_mismatch(step_batches)
        if not self._reports():
            return StepResult(reports=False, log_prob_time=log_prob_time, train_time=train_time)
        return StepResult(reports=True, log_prob_time=log_prob_time, train_time=train_time,
                          tokens=sum(b.num_tokens for b in every_batch), mismatch=mismatch, steps=steps)

    def _engine_mismatch(self, step_batches: list[list[MicroBatch]]) -> LogProbMismatch | None:
        """|trainer - engine| log-prob over the loss tokens of this rank's share (last stage; None for SFT and
        with --no-rollout-log-probs, where the engine recorded none)."""
        if not self.ps.is_pipeline_last_stage() or self.config.sft or not self.config.rollout.rollout_log_probs:
            return None
        total, worst, count = 0.0, 0.0, 0.0
        for batch in (b for bs in step_batches for b in bs):
            diff = (batch.old_log_probs.float() - batch.rollout_log_probs).abs() * batch.loss_mask
            total += float(diff.sum())
            worst = max(worst, float(diff.max()))
            count += float(batch.loss_mask.sum())
        return LogProbMismatch(total, worst, count)

    @torch.no_grad()
    def eval_loss(self, sequences: list[TrainSequence]) -> LossSum:
        """The summed negative log-likelihood and count of ``sequences``' trained tokens under the current
        weights, forward only, in the training micro-batches; zeros from ranks that do not report."""
        t = self.config.trainer
        device = self._device()
        batches = [b.to(device) for b in micro_batches(
            sequences, t.micro_batch_size, t.max_tokens_per_gpu if t.use_dynamic_batch_size else None,
            pack_multiple=self.pack_multiple)]
        total, count = 0.0, 0.0
        for batch in batches:
            self.progress.tick()
            log_probs = forward_log_probs(self.model, self.shape, batch.tokens, t.log_probs_chunk_size, 1.0,
                                          batch.packing)
            if log_probs is not None:
                total -= float((log_probs.float() * batch.loss_mask).sum())
                count += float(batch.loss_mask.sum())
        return LossSum(total, count) if self._reports() else LossSum()

    # ---- weights out: engines and checkpoints --------------------------------------------------------------

    def push_weights(self, target: "WeightTarget", bucket_bytes: int) -> int:
        """Send the weights to the engines ``target`` names. Over ipc (colocated) every rank takes part and feeds
        the engine on its own GPU (``colocated_push.py``); otherwise each stage's data-parallel rank 0, TP rank 0
        sends its stage's weights to every engine, the stage's other TP ranks joining the gathers. The driver
        opens and closes the update around all of it. The sender is kept between pushes (an NCCL group lives as
        long as its engines) and made again when the target changes, e.g. after an engine restart."""
        from vime_ext.trainer.hf_weights import iter_hf_weights
        from vime_ext.engines.weight_sync import WeightSync

        self.weights_ready()
        if target.transport == "ipc":
            return self._push_colocated(target, bucket_bytes)
        if self.ps.get_data_parallel_rank() != 0:
            return 0
        weights = self._ticking(iter_hf_weights(self.model, self.shape))
        if self.ps.get_tensor_model_parallel_rank() != 0:
            for _ in weights:  # take part in the TP gathers
                pass
            return 0
        if self._weight_sync is None or self._weight_sync[0] != (target, bucket_bytes):
            if self._weight_sync is not None:
                self._weight_sync[1].close()
            sync = WeightSync(list(target.urls), bucket_bytes=bucket_bytes, transport=target.transport)
            if target.transport == "nccl":
                sync.connect(target.workers_per_engine)
            self._weight_sync = ((target, bucket_bytes), sync)
        return self._weight_sync[1].send(weights)

    def _ticking(self, weights):
        """``weights``, the progress ticking with each tensor."""
        for item in weights:
            self.progress.tick()
            yield item

    def _push_colocated(self, target: "WeightTarget", bucket_bytes: int) -> int:
        from vime_ext.trainer.colocated_push import ColocatedPush

        if self._weight_sync is None or self._weight_sync[0] != (target, bucket_bytes):
            if self._weight_sync is not None:
                self._weight_sync[1].close()
            self._weight_sync = ((target, bucket_bytes), ColocatedPush(target, self.rank, bucket_bytes))
        with ipc_shareable_allocations(True):
            return self._weight_sync[1].send(self.model, self.shape)

    def weights_ready(self) -> None:
        """Finish what the optimizers left for the next forward (``--overlap-param-gather``'s all-gather of the
        other data-parallel ranks' updated shards) before the weights are read directly: pushed, saved (with or
        without the optimizer's state) or compared."""
        self.optimizer.params_ready()
        if self.critic is not None:
            self.critic.optimizer.params_ready()

    def save(self, save_dir: str, iteration: int, extra_state: dict) -> str:
        from vime_ext.trainer.checkpoint import save_model_checkpoint
        from vime_ext.trainer.critic import CRITIC_DIR

        self.weights_ready()
        with_optimizer = not self.config.checkpoint.no_save_optim
        if with_optimizer:
            self._handover.restore_state()  # a save right after a hand-over, before any step
        inner = {} if self.critic is None else {
            CRITIC_DIR: (self.critic.model, self.critic.optimizer if with_optimizer else None)}
        saved = save_model_checkpoint(self.model, self.shape, save_dir, iteration,
                                      {**extra_state, "optimizer_saved": with_optimizer}, {"rng": _rng_state()},
                                      self.optimizer if with_optimizer else None, inner)
        keep = self.config.checkpoint.save_keep_last
        if keep is not None and self.rank == 0:
            from vime_ext.trainer.checkpoint import prune_checkpoints

            prune_checkpoints(save_dir, keep, protect=self._resumed_from)
        return str(saved)

    def load(self, path: str) -> dict:
        """Weights, optimizer and RNG from a checkpoint; returns what the driver stored with it."""
        from vime_ext.trainer.checkpoint import (checkpoint_common_state, load_model_checkpoint, load_rank_state,
                                                 resolve_checkpoint_dir)

        state = checkpoint_common_state(path).get("vime_ext", {})
        # A save made with --no-save-optim has weights only: the optimizer starts afresh from them.
        with_optimizer = state.get("optimizer_saved", True)
        if not with_optimizer and self.rank == 0:
            print(f"--load {path}: saved without optimizer state (--no-save-optim); the optimizer starts afresh "
                  "from the loaded weights, so the run does not continue exactly as an uninterrupted one would")
        optimizers = [self.optimizer] + ([self.critic.optimizer] if self.critic is not None else [])
        load_model_checkpoint(self.model, path, self.optimizer if with_optimizer else None)
        self._resumed_from = resolve_checkpoint_dir(path)
        if self.critic is not None:
            from vime_ext.trainer.critic import critic_checkpoint_dir

            load_model_checkpoint(self.critic.model, critic_checkpoint_dir(path),
                                  self.critic.optimizer if with_optimizer else None)
        if not with_optimizer:
            for optimizer in optimizers:
                optimizer.reload_model_params()
        _set_rng_state(load_rank_state(path)["rng"])
        return state

    def shutdown(self) -> None:
        from vime_ext.trainer.parallel import destroy_distributed

        destroy_distributed()
