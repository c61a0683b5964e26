"""The rollout function of supervised fine-tuning (slime's ``--rollout-function-path`` convention):

    train.py --loss-type sft_loss --rollout-function-path vime_ext.rollout.sft_rollout.generate_rollout \\
        --prompt-data chats.jsonl --input-key messages --n-samples-per-prompt 1 ...

No engine generates anything: each chat of the data (``vime_ext/data/chat_dataset.py``) becomes a Sample whose
tokens are the chat as the tokenizer's template renders it and whose loss mask covers the assistant turns
(``chat_mask.py``); a template that rewrites earlier turns gives one training sequence per assistant turn, as
``Sample.turns``. Chats longer than ``--sft-max-len`` tokens stop the run (``--sft-overlong error``), are cut
(``truncate``: the tokens past the limit go, with their mask) or are left out (``skip``: the sample fails and
trains on nothing); each is counted in ``rollout/sft_truncated`` and ``rollout/sft_skipped``, and a rollout
that cut or left out any says how many in a warning, with the first one's place in the data.
"""

import logging
import os
from concurrent.futures import ThreadPoolExecutor

from vime_ext.agent.chat_mask import ChatMasker, ChatTemplateError, MaskedSequence
from vime_ext.agent.sample import Sample, Status, Turn
from vime_ext.rollout.data_source import DataSource
from vime_ext.rollout.plugins import PluginArgs
from vime_ext.rollout.rollout import RolloutOutput
from vime_ext.rollout.validate import RolloutError, where

log = logging.getLogger(__name__)
_maskers: dict[int, ChatMasker] = {}  # by tokenizer: the template's tool support is probed once per process


def masker_for(tokenizer) -> ChatMasker:
    if id(tokenizer) not in _maskers:
        _maskers[id(tokenizer)] = ChatMasker(tokenizer)
    return _maskers[id(tokenizer)]


def _cut(sequences: list[MaskedSequence], max_len: int | None, overlong: str, sample: Sample) -> tuple[list, bool]:
    """The sequences within ``max_len`` tokens, by ``--sft-overlong``; and whether any was cut."""
    longest = max(len(s.tokens) for s in sequences)
    if max_len is None or longest <= max_len:
        return sequences, False
    if overlong == "error":
        raise RolloutError(f"{where(sample)}: the chat renders to {longest} tokens, more than --sft-max-len "
                           f"{max_len}; --sft-overlong truncate or skip goes on without it")
    if overlong == "skip":
        return [], True
    cut = [MaskedSequence(s.tokens[:max_len], s.mask[:max_len]) for s in sequences]
    return [s for s in cut if s.num_trained], True


def chat_sample(sample: Sample, masker: ChatMasker, max_len: int | None = None, overlong: str = "error") -> Sample:
    """``sample`` (its prompt a chat, its tools in ``metadata["tools"]``) as an SFT training sample."""
    try:
        chat = masker(sample.prompt, sample.metadata.get("tools"))
    except ChatTemplateError as err:
        raise RolloutError(f"{where(sample)}: {err}") from None
    sequences, cut = _cut(chat.sequences, max_len, overlong, sample)
    sample.metrics.update(sft_truncated=float(cut and overlong == "truncate"), sft_skipped=float(not sequences),
                          sft_split=float(chat.split))
    sample.reward = 0.0
    if not sequences:
        return sample.fail(Status.FAILED, f"over --sft-max-len {max_len} tokens (--sft-overlong {overlong})")
    first, *rest = sequences
    sample.loss_mask, sample.rollout_log_probs = _response_of(first)
    sample.tokens, sample.response_length = list(first.tokens), len(sample.loss_mask)
    sample.turns = [Turn(list(s.tokens), *_response_of(s)) for s in rest]
    sample.metrics["sft_trained_tokens"] = float(sum(s.num_trained for s in sequences))
    sample.status = Status.COMPLETED
    return sample


def _response_of(sequence: MaskedSequence) -> tuple[list[int], list[float]]:
    """Mask and (zero) log-probs over the response: from the first trained token on."""
    start = sequence.mask.index(1)
    return list(sequence.mask[start:]), [0.0] * (len(sequence.tokens) - start)


def check_chats(tokenizer, records, max_len: int | None, overlong: str, count: int = 8) -> None:
    """Mask the first ``count`` chats of ``records`` as the run will, so that a chat template that cannot give
    their assistant tokens (or a chat over the length limit, under ``--sft-overlong error``) stops the run in
    the driver, before any process or model starts; raises ``DataError`` naming the chat."""
    from vime_ext.data.prompt_dataset import DataError

    try:
        masker = masker_for(tokenizer)
        for record in records[:count]:
            sample = Sample(prompt=record.prompt, metadata={**record.metadata, "source": record.source})
            chat_sample(sample, masker, max_len, overlong)
    except (ChatTemplateError, RolloutError) as err:
        raise DataError(str(err)) from None


def generate_rollout(args: PluginArgs, rollout_id: int, data_source: DataSource,
                     evaluation: bool = False) -> RolloutOutput:
    """``--rollout-batch-size`` chats of the training data (an evaluation set: all of its chats) as samples."""
    groups = data_source.get_samples(len(data_source) if evaluation else args.rollout_batch_size)
    samples = [s for g in groups for s in g]
    mask_all(samples, masker_for(args.tokenizer), args.sft_max_len, args.sft_overlong)
    warn_overlong(samples, args.sft_max_len, args.sft_overlong)
    return RolloutOutput(groups)


def warn_overlong(samples: list[Sample], max_len: int | None, overlong: str) -> None:
    """One warning for the chats of a rollout that ``--sft-overlong`` cut or left out: data cut to a context by
    another tokenizer or template than the run's can lose a share of every batch, which the metrics alone hide."""
    over = [s for s in samples if s.metrics.get("sft_skipped") or s.metrics.get("sft_truncated")]
    if over:
        left = sum(1 for s in over if s.metrics.get("sft_skipped"))  # under truncate: a cut with nothing to train
        log.warning("%d of %d chats over --sft-max-len %s tokens (--sft-overlong %s): %d cut, %d left out; the "
                    "first: %s", len(over), len(samples), max_len, overlong, len(over) - left, left, where(over[0]))


# Threads that mask chats at once: the tokenizer's encoding (nearly all of a chat's masking) runs outside Python's
# lock, so they share the process's CPUs. 64 MemUpdate demonstrations under Qwen's template (135,971 tokens) took
# 2.67 s one at a time and 1.03 s on two threads (tools/bench_sft_mask.py, TOKENIZERS_PARALLELISM off as the launch
# scripts set it; this project's 2-core CPU machine; 3.51 and 1.51 s in an earlier run). A bound, since engines and
# trainers share the host.
MASK_THREADS = 8


def mask_all(samples: list[Sample], masker: ChatMasker, max_len: int | None, overlong: str,
             threads: int | None = None) -> None:
    """``chat_sample`` for every sample, on ``threads`` threads (default: up to ``MASK_THREADS``, no more than the
    CPUs this process may use); a chat that cannot be masked raises as it would one at a time (the first in order)."""
    if threads is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = min(MASK_THREADS, cpus)
    threads = min(threads, len(samples) - 1)
    if threads <= 1:
        for sample in samples:
            chat_sample(sample, masker, max_len, overlong)
        return
    # The first chat alone: a fast tokenizer's first call may change its settings (padding or truncation that its
    # file sets are turned off), which must not happen in two threads at once; later calls only read them.
    chat_sample(samples[0], masker, max_len, overlong)
    with ThreadPoolExecutor(threads, thread_name_prefix="sft-mask") as pool:
        for _ in pool.map(lambda sample: chat_sample(sample, masker, max_len, overlong), samples[1:]):
            pass
