"""log p(target) from vocab-sharded logits, in fp32 chunks, with a backward that recomputes instead of storing.

megatron-core's ``vocab_parallel_cross_entropy`` keeps the fp32 softmax of every row for its backward, so a
[tokens x vocab/TP] fp32 tensor lives until backward (10 GB at 16K tokens of a 152K vocabulary). Here forward
keeps only the per-row log-normaliser; backward recomputes each chunk's softmax from the logits (which the
output layer keeps anyway) and writes the gradient chunk by chunk. The entropy statistic can come out of the same
chunks, so logging it costs no fp32 [tokens x vocab] copy of its own. On CUDA each chunk's arithmetic is a
compiled kernel (below), so the fp32 chunk is never written either.
"""

import functools

import torch
import torch.distributed as dist

# The per-chunk arithmetic, each a function of its own so that it can be compiled: eager, every step reads and
# writes a fp32 [rows x vocab] tensor (about 60 bytes an element in forward with the entropy, 50 in backward),
# which at a 16K-token micro-batch and a 152K vocabulary took 115 ms on an H200 (forward and backward), more than
# a 0.6B model's ~90 ms of matmuls. Compiled (torch.compile, on CUDA), each becomes one fused kernel that reads the
# bf16 logits once: 17 ms there (tools/bench_log_probs.py, docs/performance.md).
# They stay separate where tensor parallelism needs an all-reduce between them.


def _row_max(x: torch.Tensor) -> torch.Tensor:
    return x.float().amax(dim=-1)


def _sum_exp_and_pick(x: torch.Tensor, row_max: torch.Tensor, local: torch.Tensor,
                      inside: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    total = (x.float() - row_max[:, None]).exp().sum(dim=-1)
    picked = x.gather(-1, local[:, None]).squeeze(-1).float() * inside
    return total, picked


def _neg_p_log_p(x: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    log_p = x.float() - lse[:, None]
    return -(log_p.exp() * log_p).sum(dim=-1)


def _log_prob_grad(x: torch.Tensor, local: torch.Tensor, inside: torch.Tensor, lse: torch.Tensor,
                   grad_out: torch.Tensor) -> torch.Tensor:
    """d log p(t) / d x_j = 1[j = t] - softmax_j, times the incoming gradient, in the logits' dtype."""
    hit = (torch.arange(x.shape[-1], device=x.device) == local[:, None]) & inside[:, None]
    return ((hit.float() - (x.float() - lse[:, None]).exp()) * grad_out[:, None]).to(x.dtype)


def _reduce(tensor: torch.Tensor, op, group) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


_EAGER = {f.__name__: f for f in (_row_max, _sum_exp_and_pick, _neg_p_log_p, _log_prob_grad)}
_compiled_on = "cuda"


def use_compiled(where: str) -> None:
    """Which logits go through the compiled kernels: ``"cuda"`` (the default), ``"off"`` (eager everywhere:
    ``--no-compile-log-probs``, for a machine where torch.compile cannot build, at ~10x the memory traffic) or
    ``"all"`` (the CPU too: Inductor's C++ backend, for tests and benches)."""
    if where not in ("cuda", "off", "all"):
        raise ValueError(f"use_compiled({where!r}): cuda, off or all")
    global _compiled_on
    _compiled_on = where


@functools.cache
def _compiled(name: str):
    # dynamic: the last chunk of every micro-batch has its own row count, and that must not recompile
    compiled = torch.compile(_EAGER[name], dynamic=True)

    def run(*args):
        try:
            return compiled(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # a compiler missing or failing on this machine shows up here, at the first step
            raise RuntimeError(f"the compiled log-prob kernel {name} failed (--no-compile-log-probs runs the "
                               f"eager one): {type(error).__name__}: {error}") from error
    return run


def _kernel(name: str, x: torch.Tensor):
    if _compiled_on == "all" or (_compiled_on == "cuda" and x.is_cuda):
        return _compiled(name)
    return _EAGER[name]


class _ChunkedVocabParallelLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, vocab_start, valid_columns, chunk, group, with_entropy):
        n = targets.numel()
        out = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=logits.device)
        local = targets - vocab_start
        inside = (local >= 0) & (local < valid_columns)
        local = local.clamp(0, logits.shape[-1] - 1)
        row_max_of, sum_exp_and_pick, neg_p_log_p = (_kernel(name, logits) for name in
                                                     ("_row_max", "_sum_exp_and_pick", "_neg_p_log_p"))
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            x = logits[rows, :valid_columns]
            row_max = _reduce(row_max_of(x), dist.ReduceOp.MAX, group)
            total, picked = sum_exp_and_pick(x, row_max, local[rows], inside[rows])
            lse[rows] = row_max + _reduce(total, dist.ReduceOp.SUM, group).log()
            out[rows] = _reduce(picked, dist.ReduceOp.SUM, group) - lse[rows]
            if with_entropy:  # -sum p log p from the same chunk, summed over the vocabulary's shards
                entropy[rows] = _reduce(neg_p_log_p(x, lse[rows]), dist.ReduceOp.SUM, group)
        ctx.save_for_backward(logits, local, inside, lse)
        ctx.valid_columns, ctx.chunk = valid_columns, chunk
        ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out, _grad_entropy):
        logits, local, inside, lse = ctx.saved_tensors
        cols = ctx.valid_columns
        # padding columns (past the vocabulary) get no gradient; without them the whole of grad is written below
        grad = torch.zeros_like(logits) if cols < logits.shape[-1] else torch.empty_like(logits)
        log_prob_grad = _kernel("_log_prob_grad", logits)
        for start in range(0, lse.numel(), ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            grad[rows, :cols] = log_prob_grad(logits[rows, :cols], local[rows], inside[rows], lse[rows],
                                              grad_out[rows])
        return grad, None, None, None, None, None, None


def chunked_log_probs(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, valid_columns: int,
                      chunk: int = 4096, group=None, with_entropy: bool = False):
    """``logits``: ``[tokens, shard]`` holding vocabulary columns ``vocab_start ...``; the first
    ``valid_columns`` are real (the rest pad the vocabulary to a multiple of TP). ``group``: the TP group
    (None alone). Returns fp32 ``[tokens]``; the gradient flows to ``logits`` in its dtype. ``with_entropy``:
    returns ``(log_probs, entropy)``, the entropy of each row's distribution as a statistic (no gradient)."""
    log_probs, entropy = _ChunkedVocabParallelLogProb.apply(logits, targets, vocab_start, max(valid_columns, 0),
                                                            chunk, group, with_entropy)
    return (log_probs, entropy) if with_entropy else log_probs
