"""Does an HF checkpoint predict the chats it was fine-tuned on? The check between a trainer's SFT loss and what the
checkpoint does once exported and served.

    python tools/sft_fit.py --hf BASE_HF_DIR --hf SFT_HF_DIR --chats sft.jsonl [--n 4] [--generate 40]

Each chat is rendered and masked as the SFT run renders it (``vime_ext/agent/chat_mask.py``, with each checkpoint's
own tokenizer), run through the checkpoint with transformers (bf16 on a GPU, fp32 on the CPU; no engine), and
reported per chat: the mean negative log-likelihood of its trained tokens (the quantity the trainer's ``train/loss``
averages), the probability of the first trained token and the top 3 there (for a tool-calling agent, whether its
first reply opens with a call), and the greedy continuation of the prompt up to that token. Then one line per
checkpoint with the mean over the chats.

An SFT checkpoint whose NLL is near the trainer's last loss fits its chats as trained; near its base's, the export
(or the save it came from) lost the training; a low NLL with a greedy reply unlike the chats' points at the serving
side (engine, sampling, parsing) instead. The 1.5B MemUpdate policy's SFT evaluation of 2026-12-04 ended every
episode with an empty first reply after a loss of 0.32: this tells those apart in a minute of one GPU.
"""

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vime_ext.agent.chat_mask import ChatMasker, MaskedSequence  # noqa: E402
from vime_ext.data.chat_dataset import read_chats  # noqa: E402
from vime_ext.rollout.sft_rollout import masker_for  # noqa: E402


@dataclass
class ChatFit:
    source: str  # file:line of the chat
    tokens: int
    trained: int
    nll: float  # mean over the trained tokens
    first_token: str  # the first trained token
    first_prob: float  # its probability given the prompt before it
    top: list[tuple[str, float]]  # the top 3 at that place
    greedy: str  # the greedy continuation from that place


def masked_nll(logits: torch.Tensor, sequence: MaskedSequence) -> tuple[float, int]:
    """The summed negative log-likelihood of ``sequence``'s trained tokens from ``logits`` ([tokens, vocab], the
    logits at place i predicting token i + 1), and how many there are."""
    targets = torch.tensor(sequence.tokens[1:], device=logits.device)
    mask = torch.tensor(sequence.mask[1:], device=logits.device, dtype=torch.bool)
    rows = logits[:-1][mask].float()
    log_probs = rows.log_softmax(-1).gather(-1, targets[mask][:, None])[:, 0]
    return float(-log_probs.sum()), int(mask.sum())


@torch.no_grad()
def chat_fit(model, tokenizer, masker: ChatMasker, record, generate: int) -> ChatFit:
    chat = masker(record.prompt, record.metadata.get("tools"))
    device = next(model.parameters()).device
    first = chat.sequences[0]
    start = first.mask.index(1)
    total, count, tokens = 0.0, 0, 0
    for sequence in chat.sequences:  # one per assistant turn when the template rewrites earlier turns
        logits = model(torch.tensor([sequence.tokens], device=device)).logits[0]
        if sequence is first:  # the place before the first trained token predicts it
            probs = logits[start - 1].float().softmax(-1)
        nll, n = masked_nll(logits, sequence)
        total, count, tokens = total + nll, count + n, tokens + len(sequence.tokens)
    prompt = torch.tensor([first.tokens[:start]], device=device)
    top = probs.topk(3)
    name = tokenizer.convert_ids_to_tokens
    out = model.generate(prompt, max_new_tokens=generate, do_sample=False, pad_token_id=tokenizer.pad_token_id
                         if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    return ChatFit(record.source, tokens, count, total / max(count, 1), name(first.tokens[start]),
                   float(probs[first.tokens[start]]), [(name(int(i)), float(p)) for p, i in zip(top.values,
                                                                                                 top.indices)],
                   tokenizer.decode(out[0, start:], skip_special_tokens=False))


def load(hf_dir: str, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(hf_dir)


def fits(hf_dir: str, records, device: str, generate: int) -> list[ChatFit]:
    model, tokenizer = load(hf_dir, device)
    masker = masker_for(tokenizer)
    results = [chat_fit(model, tokenizer, masker, record, generate) for record in records]
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return results


def report(hf_dir: str, results: list[ChatFit]) -> str:
    lines = [f"{hf_dir}:"]
    for r in results:
        top = ", ".join(f"{t!r} {p:.3f}" for t, p in r.top)
        lines.append(f"  {r.source}: {r.tokens} tokens, {r.trained} trained, NLL {r.nll:.4f}; first trained token "
                     f"{r.first_token!r} p={r.first_prob:.4f} (top: {top}); greedy: {r.greedy[:120]!r}")
    mean = sum(r.nll for r in results) / len(results)
    first = sum(r.first_prob for r in results) / len(results)
    lines.append(f"  mean over {len(results)} chats: NLL {mean:.4f}, p(first trained token) {first:.4f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", action="append", required=True, help="an HF checkpoint directory (repeatable)")
    parser.add_argument("--chats", required=True, help="the SFT chats (JSONL: messages and tools a line)")
    parser.add_argument("--n", type=int, default=4, help="the first N chats (default 4)")
    parser.add_argument("--generate", type=int, default=40, help="greedy tokens to show a chat (default 40)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    records = read_chats(args.chats)[:args.n]
    for hf_dir in args.hf:
        results = fits(hf_dir, records, args.device, args.generate)
        if not all(math.isfinite(r.nll) for r in results):
            print(f"{hf_dir}: a chat's NLL is not finite (NaN or inf weights?)", file=sys.stderr)
        print(report(hf_dir, results), flush=True)


if __name__ == "__main__":
    main()
