"""Rule-based rewards (``--custom-rm-path``, signature ``rm(args, sample)``): the default compares the last
``\\boxed{...}`` in the response with the label."""

import re
import string
from collections import Counter

from vime_ext.agent.sample import Sample


def overlong_penalty(response_length: int, max_len: int, buffer_len: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max_len - buffer_len`` generated tokens, then falling linearly
    to ``-factor`` at ``max_len``."""
    return min(-(response_length - (max_len - buffer_len)) / buffer_len * factor, 0.0)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, braces balanced; None when there is none or it never closes."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i]
            depth -= 1
    return None


def normalize_answer(text: str) -> str:
    text = text.strip().lower()
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    text = re.sub(r"[\s$]", "", text).rstrip(".")
    if re.fullmatch(r"-?\d+(\.\d+)?", text):  # 3.0 == 3
        text = str(float(text)).removesuffix(".0")
    return text


def boxed_exact_match(args, sample: Sample) -> float:
    """1.0 when the last boxed answer equals the label after normalisation, else 0.0.

    A response without ``\\boxed{}`` scores 0 and is flagged in ``sample.metadata["no_boxed"]`` so it can be
    counted, not mistaken for a wrong answer.
    """
    answer = last_boxed(sample.response)
    sample.metadata["no_boxed"] = answer is None
    if answer is None or sample.label is None:
        return 0.0
    labels = sample.label if isinstance(sample.label, (list, tuple)) else [sample.label]
    return float(any(normalize_answer(answer) == normalize_answer(str(label)) for label in labels))


def first_word_match(args, sample: Sample) -> float:
    """1.0 when the response's first word (case and punctuation ignored) is the label: "answer with a given
    word". A dense enough signal for a small model to learn in a few GRPO steps."""
    words = re.findall(r"[a-z0-9]+", sample.response.lower())
    return float(bool(words) and words[0] == str(sample.label).strip().lower())


def normalize_text(text: str) -> str:
    """SQuAD-style answer normalisation: lower case, punctuation and the articles a/an/the removed, white space
    collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """F1 over the normalised tokens (0 when exactly one side is yes/no/noanswer and they differ)."""
    p, g = normalize_text(prediction), normalize_text(gold)
    special = ("yes", "no", "noanswer")
    if (p in special or g in special) and p != g:
        return 0.0
    p_tokens, g_tokens = p.split(), g.split()
    common = sum((Counter(p_tokens) & Counter(g_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p_tokens), common / len(g_tokens)
    return 2 * precision * recall / (precision + recall)
