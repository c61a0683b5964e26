"""The CUDA optimizer: megatron-core's DDP wrapper and its (distributed) mixed-precision AdamW, behind the same
small interface as the CPU trainer's ``ActorOptimizer`` (``step``, ``params_ready``, ``sharded_state_dict``,
``load_state_dict``).

What megatron-core brings over ``ActorOptimizer``: gradients accumulate in one contiguous buffer per dtype (fp32
with ``--accumulate-allreduce-grads-in-fp32``), their data-parallel reduction goes in buckets and can overlap the
backward pass (``--overlap-grad-reduce``); with ``--use-distributed-optimizer`` the fp32 master weights and Adam
states are sharded over data-parallel ranks (a reduce-scatter of gradients, an all-gather of updated weights,
which ``--overlap-param-gather`` hides behind the next forward); ``--optimizer-cpu-offload`` keeps masters and
states in host memory and steps them there. megatron-core hard-codes CUDA throughout these classes, which is
why the CPU trainer keeps its own optimizer.
"""

import math
from typing import Callable

import torch

from vime_ext.trainer.lr_schedule import LRSchedule
from vime_ext.trainer.memory_handover import HandoverTensors, optimizer_tensors

# The optimizer-state layout written into checkpoints: megatron's default, each rank writing its own shard of the
# gradient-buffer-ordered states, in parallel, with no gather (megatron 0.19 no longer saves the per-parameter
# "fully_sharded_model_space" layout; "fully_reshardable" would gather every state on one rank to save).
SHARDING_TYPE = "dp_reshardable"


def _finalize_grads(model, num_tokens=None, **kwargs):
    """megatron's ``finalize_model_grads`` (data-parallel reduction, TP-partial norm gradients, tied embeddings)
    without its per-token rescaling: vime_ext's losses are already normalised over the whole step."""
    from megatron.core.distributed import finalize_model_grads

    return finalize_model_grads(model, None, **kwargs)


class MegatronAdamW:
    """megatron-core's ``DistributedDataParallel`` around the model and its optimizer for it. Build it on the
    model after its weights are loaded (the fp32 masters are copied from them); train ``self.model``."""

    def __init__(self, model: torch.nn.Module, optim, lr: float, schedule: LRSchedule):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        if not torch.cuda.is_available():
            raise RuntimeError("megatron-core's DDP and optimizer need CUDA; the CPU trainer uses ActorOptimizer")
        config = model.config
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=optim.accumulate_allreduce_grads_in_fp32,
            overlap_grad_reduce=optim.overlap_grad_reduce,
            overlap_param_gather=optim.overlap_param_gather,
            use_distributed_optimizer=optim.use_distributed_optimizer,
            bucket_size=optim.ddp_bucket_size)
        self.model = DistributedDataParallel(config, ddp_config, model)
        # With offload, megatron's hybrid CPU/GPU optimizer keeps the fp32 masters itself (its checkpoint loader
        # expects that), which megatron calls the precision-aware optimizer; it needs no TransformerEngine then.
        self.optimizer = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=lr, weight_decay=optim.weight_decay, adam_beta1=optim.adam_beta1,
            adam_beta2=optim.adam_beta2, adam_eps=optim.adam_eps, clip_grad=optim.clip_grad,
            bf16=config.bf16, params_dtype=config.params_dtype,
            use_precision_aware_optimizer=optim.optimizer_cpu_offload,
            use_distributed_optimizer=optim.use_distributed_optimizer,
            optimizer_cpu_offload=optim.optimizer_cpu_offload,
            optimizer_offload_fraction=optim.optimizer_offload_fraction,
            overlap_cpu_optimizer_d2h_h2d=optim.overlap_cpu_optimizer_d2h_h2d), [self.model])
        # What megatron's training loop sets on the model config, and its pipeline schedules read.
        config.grad_scale_func = self.optimizer.scale_loss
        config.finalize_model_grads_func = _finalize_grads
        if optim.overlap_grad_reduce:
            config.no_sync_func = self.model.no_sync
        self.schedule = schedule
        self.step_count = 0
        self._has_states = False  # Adam's states exist after the first step (or a load)
        # Called first by every step: the colocated trainer puts the state a hand-over left on the host back
        # (its seconds: the state's trip back, part of the step's time, logged as train/state_restore_s)
        self.before_step: Callable[[], float] = lambda: 0.0

    @torch.no_grad()
    def step(self) -> dict[str, float]:
        """Apply the gradients the schedule accumulated and reduced (``_finalize_grads``), clipped to
        ``--clip-grad``; a non-finite gradient skips the update (and says so)."""
        restore_s = self.before_step()
        lr = self.schedule(self.step_count)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # A non-finite gradient skips the step, as in ActorOptimizer. megatron checks only under a loss scale,
        # and its check has no bf16 kernel (the precision-aware optimizer's gradients stay bf16), so the
        # decision is taken here, on the global gradient norm; megatron's step repeats prepare_grads.
        self.optimizer.prepare_grads()
        norm = float(self.optimizer.get_grad_norm())  # a float, or a CUDA tensor where TE/Apex kernels exist
        updated = math.isfinite(norm) and self.optimizer.step()[0]
        self._has_states = self._has_states or updated
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        if updated:
            self.step_count += 1
        return {"grad_norm": norm, "lr": lr, "skipped": 0.0 if updated else 1.0, "state_restore_s": restore_s}

    def reload_model_params(self) -> None:
        """Take the fp32 masters from the model's weights (loaded from a checkpoint saved without optimizer
        state)."""
        self.optimizer.reload_model_params()

    def handover_tensors(self) -> HandoverTensors:
        """What a memory hand-over takes: DDP's contiguous weight buffers (the parameters are views of them with
        the distributed optimizer), DDP's gradient buffers (zeroed after every step) and the optimizers' masters
        and states (needed only by the next step)."""
        buffers = self.model.buffers + self.model.expert_parallel_buffers
        state = []
        for inner in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            if getattr(inner, "optimizer", None) is not None:  # a rank without parameters has none
                state += optimizer_tensors(inner.optimizer)
        return HandoverTensors(kept=[b.param_data for b in buffers if b.param_data is not None],
                               zeroed=[b.grad_data for b in buffers], state=state)

    def params_ready(self) -> None:
        """Finish the all-gather of updated weights that ``--overlap-param-gather`` leaves to the next forward,
        before the weights are read directly (pushed to engines, saved)."""
        if self.model.ddp_config.overlap_param_gather:
            self.model.start_param_sync(force_sync=True)

    def sharded_state_dict(self, model_state: dict, is_loading: bool = False) -> dict:
        if is_loading:
            self._allocate_states()
        return {"megatron": self.optimizer.sharded_state_dict(
                    model_state, is_loading, metadata={"distrib_optim_sharding_type": SHARDING_TYPE}),
                "step_count": self.step_count}

    def _allocate_states(self) -> None:
        """Give a fresh optimizer its Adam states before a checkpoint is loaded into them: torch's AdamW makes
        them at its first step, and megatron (without Apex or TE) reads their step count while it builds the
        state dict to load into. One step on the zeroed gradient buffer makes them; what it changes (masters,
        moments, step, the weights copied from the masters) is all overwritten by the load that follows."""
        if not self._has_states:
            self.model.zero_grad_buffer()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self._has_states = True

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["megatron"])
        self.step_count = state["step_count"]
