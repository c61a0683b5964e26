"""Let megatron-core run on a machine without CUDA (CPU tensors, gloo process groups).

megatron-core assumes CUDA in a handful of places that have nothing to do with the maths: it asks for
``torch.cuda.current_device()`` to place buffers, moves tensors with ``.cuda()``, synchronises streams, keeps
its tensor-parallel RNG streams as CUDA generator states, builds the default causal mask on ``"cuda"``, and
creates one token counter on ``"cuda"`` in each pipeline schedule. On a CPU-only machine each of those points
at the CPU instead.

``install()`` is a no-op when CUDA is available, so GPU runs execute megatron-core unmodified. This is the only
module in vime_ext that changes megatron-core's behaviour.
"""

import types

import torch

_installed = False


def _cpu_device(*_args, **_kwargs) -> torch.device:
    return torch.device("cpu")


def _schedule_torch() -> types.ModuleType:
    """A view of ``torch`` for megatron's schedules module whose ``zeros`` maps ``device="cuda"`` to the CPU."""
    view = types.ModuleType("torch_cpu_view")
    view.__dict__.update(torch.__dict__)

    def zeros(*size, device=None, **kwargs):
        return torch.zeros(*size, device="cpu" if device == "cuda" else device, **kwargs)

    view.zeros = zeros
    return view


def install() -> bool:
    """Patch megatron-core for CPU execution if CUDA is absent; returns whether patches are active."""
    global _installed
    if torch.cuda.is_available():
        return False
    if _installed:
        return True

    from megatron.core.fusions import fused_softmax
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer import utils as transformer_utils

    torch.cuda.current_device = _cpu_device
    torch.cuda.synchronize = lambda *_a, **_k: None
    torch.Tensor.cuda = lambda self, *_a, **_k: self
    # The "CUDA" RNG streams of tensor parallelism (dropout, init) become the CPU generator's state.
    torch.cuda.get_rng_state = lambda *_a, **_k: torch.get_rng_state()
    torch.cuda.manual_seed = torch.manual_seed
    tp_random._get_cuda_rng_state = lambda *_a, clone=False, **_k: torch.get_rng_state()
    tp_random._set_cuda_rng_state = lambda state, *_a, **_k: torch.set_rng_state(state)

    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    transformer_utils.get_default_causal_mask = causal_mask
    fused_softmax.get_default_causal_mask = causal_mask
    schedules.torch = _schedule_torch()
    _installed = True
    return True
