"""The trainer's optimizers and learning-rate schedule. ``build_optimizer`` picks one: on CUDA megatron-core's
DDP and (distributed) optimizer (``megatron_optimizer.py``), on the CPU ``ActorOptimizer``.

``ActorOptimizer`` is vime_ext's own small AdamW: fp32 master weights, data-parallel gradient sums, a global
gradient norm and clipping. megatron-core's optimizer classes hard-code CUDA, and the CPU trainer must run the
same RL step; its cost, Adam states replicated over data-parallel ranks, does not matter there. Both save their
state as ShardedTensors beside the model's in the torch_dist checkpoint (``sharded_state_dict``): this one keyed
``optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<model key>`` and laid out like the weights, megatron's in its
own data-parallel-sharded layout.
"""

import math
from typing import Callable

import torch
import torch.distributed as dist

from vime_ext.trainer.lr_schedule import LRSchedule
from vime_ext.trainer.memory_handover import HandoverTensors, optimizer_tensors
from vime_ext.trainer.model_provider import unwrap


def _counted_once(param: torch.nn.Parameter, tp_rank: int, first_stage: bool) -> bool:
    """Whether this rank's copy of ``param`` enters the global gradient norm: TP-replicated params (norms) count
    on TP rank 0 only, and the last stage's copy of a tied embedding not at all."""
    if getattr(param, "shared", False) and not first_stage:
        return False
    return getattr(param, "tensor_model_parallel", False) or tp_rank == 0


class ActorOptimizer:
    """AdamW over ``model``'s parameters (the CPU trainer's; see the module docstring). ``self.model`` is the
    model to train, as given."""

    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                 eps: float, clip_grad: float, schedule: LRSchedule):
        self.model = model
        gpt = unwrap(model)
        named = [(n, p) for n, p in gpt.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        # Replicated over TP but fed by only this rank's heads / sequence slice: their gradients are partial
        # sums that must be added over TP ranks (as megatron's finalize_model_grads does).
        config = gpt.config
        self.tp_partial = [p for n, p in named
                           if (config.qk_layernorm and ("q_layernorm" in n or "k_layernorm" in n))
                           or (config.sequence_parallel and getattr(p, "sequence_parallel", False))]
        # fp32 masters when the model computes in bf16/fp16; fp32 models train their own params in place.
        self.masters = [p if p.dtype == torch.float32 else p.detach().float().clone().requires_grad_(True)
                        for p in self.params]
        decay = [m for p, m in zip(self.params, self.masters) if p.ndim >= 2]
        no_decay = [m for p, m in zip(self.params, self.masters) if p.ndim < 2]  # norms and biases
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.adam = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps,
                                      fused=all(p.is_cuda for p in self.params))
        self.clip_grad, self.schedule = clip_grad, schedule
        self.step_count = 0
        # Called first by every step: the colocated trainer puts the state a hand-over left on the host back
        # (its seconds: the state's trip back, part of the step's time, logged as train/state_restore_s)
        self.before_step: Callable[[], float] = lambda: 0.0

    def zero_grad(self) -> None:
        for p in self.params + self.masters:
            p.grad = None

    @torch.no_grad()
    def reload_model_params(self) -> None:
        """Take the masters from the model's weights (loaded from a checkpoint saved without optimizer state)."""
        for p, m in zip(self.params, self.masters):
            if m is not p:
                m.copy_(p.float())

    def handover_tensors(self) -> HandoverTensors:
        """What a memory hand-over takes: the fp32 masters and Adam's states, needed only by the next step (an
        fp32 model's masters are its weights, which the hand-over brings back with the weights); gradients are
        dropped after each step, so nothing is zero between steps."""
        return HandoverTensors(kept=[], zeroed=[], state=optimizer_tensors(self.adam))

    def _sync_grads(self) -> None:
        from megatron.core import parallel_state

        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.tp_partial and parallel_state.get_tensor_model_parallel_world_size() > 1:
            self._all_reduce([p.grad for p in self.tp_partial], parallel_state.get_tensor_model_parallel_group())
        # A tied embedding lives on the first and the last stage; both copies get the summed gradient.
        gpt = unwrap(self.model)
        if (parallel_state.get_pipeline_model_parallel_world_size() > 1 and gpt.share_embeddings_and_output_weights
                and parallel_state.is_rank_in_embedding_group()):
            dist.all_reduce(gpt.shared_embedding_or_output_weight().grad,
                            group=parallel_state.get_embedding_group())
        # Losses are already normalised over the whole step, so data-parallel gradients add up.
        if parallel_state.get_data_parallel_world_size() > 1:
            self._all_reduce([p.grad for p in self.params], parallel_state.get_data_parallel_group())

    @staticmethod
    def _all_reduce(tensors: list[torch.Tensor], group) -> None:
        """Sum ``tensors`` in place over ``group``, as one flat message."""
        flat = torch._utils._flatten_dense_tensors(tensors)
        dist.all_reduce(flat, group=group)
        for tensor, synced in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors)):
            tensor.copy_(synced)

    def _grad_norm(self) -> float:
        from megatron.core import parallel_state

        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        first = parallel_state.is_pipeline_first_stage()
        squares = torch.zeros((), dtype=torch.float32, device=self.params[0].device)
        for p in self.params:
            if _counted_once(p, tp_rank, first):
                squares += p.grad.float().square().sum()
        if parallel_state.get_model_parallel_group() is not None and dist.get_world_size() > 1:
            dist.all_reduce(squares, group=parallel_state.get_model_parallel_group())
        return math.sqrt(squares.item())

    @torch.no_grad()
    def step(self) -> dict[str, float]:
        """Sync, clip and apply the accumulated gradients. A non-finite norm skips the update (and says so)."""
        restore_s = self.before_step()
        self._sync_grads()
        norm = self._grad_norm()
        lr = self.schedule(self.step_count)
        stats = {"grad_norm": norm, "lr": lr, "skipped": 0.0, "state_restore_s": restore_s}
        if not math.isfinite(norm):
            stats["skipped"] = 1.0
            self.zero_grad()
            return stats
        scale = min(1.0, self.clip_grad / (norm + 1e-6)) if self.clip_grad > 0 else 1.0
        for p, m in zip(self.params, self.masters):
            m.grad = p.grad.float() * scale if m is not p else p.grad.mul_(scale)
        for group in self.adam.param_groups:
            group["lr"] = lr
        self.adam.step()
        for p, m in zip(self.params, self.masters):
            if m is not p:
                p.copy_(m)
        self.step_count += 1
        self.zero_grad()
        return stats

    def params_ready(self) -> None:
        """The weights are always up to date after ``step`` (nothing is gathered later)."""

    def _state_tensors(self, index: int, fresh: bool) -> dict[str, torch.Tensor]:
        """Parameter ``index``'s fp32 master (when it has its own) and Adam moments; ``fresh``: zero-filled
        tensors of their shapes to load into (also the moments before the first step)."""
        param, master = self.params[index], self.masters[index]
        state = {} if fresh else self.adam.state.get(master, {})
        tensors = {k: state[k] if k in state else torch.zeros_like(master) for k in ("exp_avg", "exp_avg_sq")}
        if master is not param:
            tensors["fp32_param"] = torch.empty_like(master) if fresh else master
        return tensors

    def sharded_state_dict(self, model_state: dict, is_loading: bool = False) -> dict:
        """The optimizer's part of a torch_dist checkpoint: ShardedTensors laid out like the parameters they
        belong to (``model_state``: the model's sharded state dict), so data-parallel replicas write once."""
        from megatron.core.dist_checkpointing.optimizer import (get_param_id_to_sharded_param_map,
                                                                make_sharded_optimizer_tensor)

        by_index = get_param_id_to_sharded_param_map(model_state, iter(self.params))
        param_state = {index: {key: make_sharded_optimizer_tensor(by_index[index], tensor, f"optimizer.state.{key}")
                               for key, tensor in self._state_tensors(index, fresh=is_loading).items()}
                       for index in range(len(self.params))}
        return {"param_state": param_state, "step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        """Restore from what ``sharded_state_dict(is_loading=True)`` was loaded into."""
        self.step_count = state["step_count"]
        # torch numbers an optimizer's state by position over its param groups (decay, then no-decay)
        position = {id(m): i for i, m in enumerate(m for group in self.adam.param_groups for m in group["params"])}
        adam_state = {}
        with torch.no_grad():
            for index, tensors in state["param_state"].items():
                master = self.masters[index]
                if "fp32_param" in tensors:
                    master.copy_(tensors["fp32_param"])
                if self.step_count:  # AdamW's own step counter equals ours (both skip non-finite steps)
                    adam_state[position[id(master)]] = {
                        "step": torch.tensor(float(self.step_count)),
                        "exp_avg": tensors["exp_avg"], "exp_avg_sq": tensors["exp_avg_sq"]}
        # torch's loader places each state on its parameter's device, in the dtype its step function expects.
        self.adam.load_state_dict({"state": adam_state, "param_groups": self.adam.state_dict()["param_groups"]})


def build_optimizer(model: torch.nn.Module, optim, lr: float, total_steps: int):
    """The optimizer for ``model`` (weights already loaded) from ``optim`` (``OptimizerConfig``) at learning
    rate ``lr``: megatron-core's on CUDA (its ``.model`` is the DDP-wrapped model to train), ActorOptimizer on
    the CPU."""
    schedule = LRSchedule(lr, min(optim.min_lr, lr), optim.lr_decay_style, optim.lr_warmup_iters,
                          optim.lr_decay_iters or total_steps)
    if torch.cuda.is_available():
        from vime_ext.trainer.megatron_optimizer import MegatronAdamW

        return MegatronAdamW(model, optim, lr, schedule)
    # megatron-only flags on a machine without CUDA were refused when the flags were parsed (arguments._check)
    return ActorOptimizer(model, lr, optim.weight_decay, (optim.adam_beta1, optim.adam_beta2), optim.adam_eps,
                          optim.clip_grad, schedule)
