"""The chunked log-prob kernel against autograd through a plain log-softmax (values and gradients), alone and
split over vocabulary shards the way TP splits it."""

import pytest
import torch

from vime_ext.trainer.log_probs import chunked_log_probs


@pytest.mark.parametrize("chunk", [3, 64])
def test_values_and_gradients_match_log_softmax(chunk):
    torch.manual_seed(0)
    logits = torch.randn(10, 37, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 37, (10,))
    weights = torch.randn(10, dtype=torch.float64)
    ours = chunked_log_probs(logits, targets, 0, 37, chunk)
    (ours.double() * weights).sum().backward()
    grad_ours = logits.grad.clone()
    logits.grad = None
    ref = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    (ref * weights).sum().backward()
    assert torch.allclose(ours.double(), ref, atol=1e-6)  # the kernel computes in fp32
    assert torch.allclose(grad_ours, logits.grad, atol=1e-6)


def test_padding_columns_get_no_probability_and_no_gradient():
    torch.manual_seed(1)
    logits = torch.randn(6, 12, requires_grad=True)
    targets = torch.tensor([0, 3, 5, 8, 1, 2])
    out = chunked_log_probs(logits, targets, 0, 9, chunk=4)  # columns 9..11 pad the vocabulary
    out.sum().backward()
    ref = torch.log_softmax(logits.detach()[:, :9], -1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(out, ref, atol=1e-6)
    assert logits.grad[:, 9:].abs().max() == 0


def test_bf16_logits_get_bf16_gradients():
    logits = torch.randn(4, 16, dtype=torch.bfloat16, requires_grad=True)
    chunked_log_probs(logits, torch.tensor([1, 2, 3, 4]), 0, 16).sum().backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_from_the_same_chunks_matches_the_softmax_and_leaves_the_logits_alone(dtype):
    torch.manual_seed(2)
    logits = (3 * torch.randn(7, 12)).to(dtype).requires_grad_(True)
    before = logits.detach().clone()
    targets = torch.tensor([0, 3, 5, 8, 1, 2, 4])
    log_probs, entropy = chunked_log_probs(logits, targets, 0, 9, chunk=3, with_entropy=True)
    p = torch.softmax(before[:, :9].float(), -1)  # columns 9..11 pad the vocabulary
    assert torch.allclose(entropy, -(p * p.log()).sum(-1), atol=1e-5)
    assert torch.allclose(log_probs, chunked_log_probs(before, targets, 0, 9, chunk=3))
    assert torch.equal(logits.detach(), before)  # fp32 logits are the kernel's own x: not edited in place
    assert not entropy.requires_grad
    log_probs.sum().backward()  # the log-probs stay differentiable beside the statistic
    assert logits.grad is not None


def test_the_compiled_kernels_cuda_runs_give_the_eager_values_and_gradients():
    """On CUDA each chunk's arithmetic is a torch.compile'd kernel; here the same kernels are compiled for the
    CPU (Inductor's C++ backend, where CUDA gets Triton) and taken through the whole autograd function: bf16
    logits with padding columns, chunks of 4 over 10 rows (the last chunk shorter, the shape compiled once)."""
    from torch._dynamo.utils import counters

    from vime_ext.trainer import log_probs

    torch.manual_seed(3)
    logits = (3 * torch.randn(10, 37)).to(torch.bfloat16)
    targets = torch.randint(2, 35, (10,))
    targets[4] = 1  # with this shard's vocabulary from token 2 on: a token another TP rank holds
    weights = torch.randn(10)

    def run():
        x = logits.clone().requires_grad_(True)
        values, entropy = chunked_log_probs(x, targets, 2, 33, chunk=4, with_entropy=True)
        (values * weights).sum().backward()
        return values, entropy, x.grad

    eager = run()
    counters.clear()
    log_probs.use_compiled("all")
    try:
        compiled = run()
    finally:
        log_probs.use_compiled("cuda")
    assert counters["stats"]["unique_graphs"] == 4  # one graph a kernel, the shorter last chunk included
    for ours, theirs in zip(compiled[:2], eager[:2]):  # fp32: the reductions' order may differ
        assert torch.allclose(ours, theirs, atol=1e-5)
    # bf16 gradients: a last bit may round the other way (8 bits of mantissa)
    assert torch.allclose(compiled[2].float(), eager[2].float(), rtol=1e-2, atol=1e-5)
    assert compiled[2].dtype == torch.bfloat16 and compiled[2][:, 33:].abs().max() == 0


def test_a_compiled_kernel_that_fails_names_the_flag_that_runs_the_eager_one():
    from vime_ext.trainer import log_probs

    log_probs.use_compiled("all")
    try:
        with pytest.raises(RuntimeError, match=r"_row_max failed \(--no-compile-log-probs runs") as caught:
            chunked_log_probs(torch.randn(4, 0), torch.tensor([0, 0, 0, 0]), 0, 0)  # no vocabulary: no maximum
    finally:
        log_probs.use_compiled("cuda")
    assert caught.value.__cause__ is not None  # the compiler's own error stays attached
