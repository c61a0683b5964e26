"""Forward passes through the (possibly pipelined) Megatron model via megatron-core's schedules."""

from functools import partial

import torch

from vime_ext.trainer.model_config import ModelShape


def _forward_step(batch_iter, model, collect: list):
    input_ids = next(batch_iter)
    position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
    output = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None)

    def keep(output_tensor):
        collect.append(output_tensor)
        return output_tensor.new_zeros(()), {}

    return output, keep


@torch.no_grad()
def forward_logits(model, shape: ModelShape, input_ids: torch.Tensor) -> torch.Tensor | None:
    """Logits ``[batch, seq, vocab]`` (padding columns removed) on the last pipeline stage, None elsewhere.

    ``input_ids`` must be the same on every rank of the model-parallel group; they are moved to this rank's
    device. Leaves the model in eval mode.
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    if torch.cuda.is_available():
        input_ids = input_ids.to(torch.cuda.current_device())
    model.eval()
    collected: list[torch.Tensor] = []
    get_forward_backward_func()(
        forward_step_func=partial(_forward_step, collect=collected),
        data_iterator=iter([input_ids]),
        model=[model],
        num_microbatches=1,
        seq_length=input_ids.shape[1],
        micro_batch_size=input_ids.shape[0],
        forward_only=True,
    )
    if not parallel_state.is_pipeline_last_stage():
        return None
    logits = gather_from_tensor_model_parallel_region(collected[0])
    return logits[..., : shape.vocab_size]


@torch.no_grad()
def greedy_generate(model, shape: ModelShape, prompt: list[int], max_new_tokens: int,
                    eos_token_id: int | None = None) -> list[int]:
    """Greedy continuation by full forward passes (no KV cache): a reference decoder for checks, not serving."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        logits = forward_logits(model, shape, torch.tensor([tokens]))
        tokens.append(int(logits[0, -1].argmax()))
        if tokens[-1] == eos_token_id:
            break
    return tokens[len(prompt):]


@torch.no_grad()
def token_log_probs(model, shape: ModelShape, tokens: list[int], start: int) -> torch.Tensor | None:
    """log p(tokens[i] | tokens[:i]) for i in [start, len(tokens)), on the last pipeline stage (None elsewhere).

    A reference implementation over full logits, for checks against the engines; the trainer's batched
    log-prob pass replaces it.
    """
    if not 0 < start < len(tokens):
        raise ValueError(f"start={start} must leave at least one prompt and one scored token of {len(tokens)}")
    logits = forward_logits(model, shape, torch.tensor([tokens]))
    if logits is None:
        return None
    log_probs = torch.log_softmax(logits[0, start - 1:-1].float(), dim=-1)
    targets = torch.tensor(tokens[start:], device=log_probs.device).unsqueeze(-1)
    return log_probs.gather(-1, targets).squeeze(-1).cpu()
