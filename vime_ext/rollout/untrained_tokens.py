"""Token rows a checkpoint never trained, among the tokens its fine-tuning chats train on, and an HF checkpoint with
those rows started from their spelling.

A tokenizer may carry added tokens that its model was never trained to read or write: Qwen2.5-Coder-1.5B-Instruct's
``<tool_call>`` (151657) and ``</tool_call>`` (151658) rows, in its embedding and its output layer, are the vector of
its padding rows (151665 on, which no training reaches; norm 0.391, where the trained rows' median is 0.675), so the
base model gives ``<tool_call>`` a probability of 0.0000 where its chat template opens a call. SFT on tool-call chats at
3e-5 for 25 steps (the MemUpdate recipe, one H200, 2026-12-04) then reached a loss of 0.32 and still could not open
a call: every evaluation episode ended with an empty reply. Here each such row becomes the mean of the rows of the
token's text spelled as ordinary tokens (``<``, ``tool``, ``_call``, ``>``), in both matrices, the usual start for
a new token; every other tensor is copied as it is.

    python -m vime_ext.rollout.untrained_tokens --hf HF_DIR --chats sft.jsonl --out OUT_DIR

prints the HF checkpoint to train from: OUT_DIR when rows were started there, else HF_DIR itself.
"""

import argparse
import json
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)
EMBEDDING = "model.embed_tokens.weight"
OUTPUT = "lm_head.weight"


@dataclass(frozen=True)
class UntrainedToken:
    token_id: int
    text: str
    spelling: tuple[int, ...]  # ordinary tokens that spell the text


# Rows within this share of the rows' median distance (mean absolute difference) from the last row are that row's
# vector: in the 1.5B model's GGUF the quantisation noise leaves its padding rows 6e-6 or less from it, while its
# trained rows lie 0.013 away (median), in both matrices.
SAME_ROW = 0.01
MIN_ROWS = 8  # fewer rows sharing the last one's vector: no padding signature (a vocabulary that fills its matrix)


def untrained_ids(weight: torch.Tensor) -> set[int]:
    """Ids whose row of ``weight`` is the vector of its last row, when at least MIN_ROWS share it: a vocabulary
    padded past its tokens ends in rows no training reaches, and the tokens it never trained keep that vector
    (their mean absolute difference from it within SAME_ROW of the rows' median); else empty."""
    distance = (weight.float() - weight[-1].float()).abs().mean(1)
    same = (distance <= SAME_ROW * float(distance.median())).nonzero()[:, 0]
    return {int(i) for i in same} if len(same) >= MIN_ROWS else set()


def spelling(tokenizer, text: str) -> tuple[int, ...]:
    """``text`` as ordinary tokens: in two pieces, neither of which is the added token's whole text."""
    ids = tokenizer.encode(text[:-1], add_special_tokens=False) + tokenizer.encode(text[-1], add_special_tokens=False)
    added = set(tokenizer.get_added_vocab().values())
    if not ids or added & set(ids):
        raise ValueError(f"{text!r} cannot be spelled in ordinary tokens ({ids})")
    return tuple(ids)


def trained_token_ids(tokenizer, chats: str, count: int = 16) -> set[int]:
    """The token ids that the first ``count`` chats of ``chats`` train on, masked as an SFT run masks them."""
    from vime_ext.data.chat_dataset import read_chats
    from vime_ext.rollout.sft_rollout import masker_for

    masker = masker_for(tokenizer)
    ids = set()
    for record in read_chats(chats)[:count]:
        for sequence in masker(record.prompt, record.metadata.get("tools")).sequences:
            ids.update(t for t, m in zip(sequence.tokens, sequence.mask) if m)
    return ids


def find_untrained(hf_dir: Path, chats: str) -> list[UntrainedToken]:
    """The tokens the chats train on whose embedding row (and output row, where not tied) is untrained."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    rows = {}
    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            rows.update({name: f.get_tensor(name) for name in f.keys() if name in (EMBEDDING, OUTPUT)})
    if EMBEDDING not in rows:
        raise ValueError(f"{hf_dir}: no {EMBEDDING} in its safetensors")
    untrained = set.intersection(*(untrained_ids(w) for w in rows.values()))
    found = sorted(untrained & trained_token_ids(tokenizer, chats))
    return [UntrainedToken(i, tokenizer.convert_ids_to_tokens(i), spelling(tokenizer, tokenizer.decode([i])))
            for i in found]


def start_rows(hf_dir: Path, out: Path, tokens: list[UntrainedToken]) -> None:
    """``out`` (written whole or not at all: seeds that start at once share it): ``hf_dir`` with each token's
    embedding and output rows the mean of its spelling's rows."""
    from safetensors.torch import load_file, save_file

    from vime_ext.models.packaged import publish

    def write(folder: Path) -> None:
        for path in hf_dir.iterdir():
            if path.suffix != ".safetensors" and path.is_file():
                shutil.copy2(path, folder / path.name)
        for path in sorted(hf_dir.glob("*.safetensors")):
            tensors = load_file(path)
            for name in (EMBEDDING, OUTPUT):
                if name in tensors:
                    weight = tensors[name]
                    for token in tokens:
                        weight[token.token_id] = weight[list(token.spelling)].float().mean(0).to(weight.dtype)
            save_file(tensors, folder / path.name, metadata={"format": "pt"})
        (folder / "started_rows.json").write_text(json.dumps(
            {"from": str(hf_dir), "tokens": [{"id": t.token_id, "text": t.text, "spelling": list(t.spelling)}
                                             for t in tokens]}, indent=1) + "\n")

    publish(out, write)


def checkpoint_to_train(hf_dir: str | Path, chats: str, out: str | Path) -> Path:
    """The HF checkpoint to fine-tune on ``chats``: ``out`` with the untrained rows started (written once; kept
    when it already records the same source), or ``hf_dir`` when the chats train on no untrained row."""
    hf_dir, out = Path(hf_dir), Path(out)
    record = out / "started_rows.json"
    if record.is_file():
        if json.loads(record.read_text()).get("from") == str(hf_dir):
            return out
        raise ValueError(f"{out} holds the started rows of another checkpoint ({record}); give another --out")
    tokens = find_untrained(hf_dir, chats)
    if not tokens:
        log.info("%s: every token the chats train on has trained rows", hf_dir)
        return hf_dir
    log.warning("%s: the rows of %s are untrained (the vector of the vocabulary's padding rows); started from their "
                "spellings in %s", hf_dir, ", ".join(f"{t.text!r} ({t.token_id})" for t in tokens), out)
    start_rows(hf_dir, out, tokens)
    return out


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", required=True, help="the HF checkpoint fine-tuning starts from")
    parser.add_argument("--chats", required=True, help="the SFT chats (JSONL)")
    parser.add_argument("--out", required=True, help="where the checkpoint with started rows goes")
    args = parser.parse_args(argv)
    try:
        print(checkpoint_to_train(args.hf, args.chats, args.out))
    except ValueError as err:  # bad chats (file, line and field named), a checkpoint without embeddings, a taken --out
        sys.exit(f"untrained_tokens: {err}")


if __name__ == "__main__":
    main()
