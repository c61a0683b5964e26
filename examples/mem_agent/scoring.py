"""Answer extraction and scoring.

Training reward (``reward.py``): the last ``\\boxed{...}`` within the last 300 characters of the final answer,
compared with each gold answer after lower-casing and removing white space. Evaluation (the paper's tables):
the gold answer is ``answers[0]``; both sides are normalised (lower case, punctuation and the articles a/an/the
removed, white space collapsed); em = equal, sub_em = one contains the other, f1 over tokens (0 when exactly one
side is yes/no/noanswer and they differ).
"""

import re
import string
from collections import Counter

from vime_ext.rollout.rewards import last_boxed

TAIL_CHARS = 300  # where the trained answer format is looked for
ANSWER_FORMATS = ("boxed", "answer_is")


def extract_answer(response: str, answer_format: str = "boxed") -> str | None:
    """The model's answer in ``response``, or None when it gave none in the asked format."""
    if answer_format == "boxed":
        return last_boxed(response[-TAIL_CHARS:])
    if answer_format == "answer_is":
        matches = list(re.finditer(r"the answer is[:\s]*", response, flags=re.IGNORECASE))
        if not matches:
            return None
        rest = response[matches[-1].end():].strip()
        answer = rest.splitlines()[0] if rest else ""
        # 'The answer is "Elena Pike".' names Elena Pike: the closing period and quotes are not part of it.
        return answer.strip(" \"'.") or None
    raise ValueError(f"answer format {answer_format!r} is not one of {ANSWER_FORMATS}")


def squash(text: str) -> str:
    """The training reward's comparison form: lower case, no white space."""
    return re.sub(r"\s+", "", text.lower())


def normalize(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize(prediction) == normalize(gold))


def substring_match(prediction: str, gold: str) -> float:
    p, g = normalize(prediction), normalize(gold)
    return float(bool(p) and bool(g) and (p in g or g in p))


def f1(prediction: str, gold: str) -> float:
    p, g = normalize(prediction), normalize(gold)
    special = ("yes", "no", "noanswer")
    if (p in special or g in special) and p != g:
        return 0.0
    p_tokens, g_tokens = p.split(), g.split()
    common = sum((Counter(p_tokens) & Counter(g_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p_tokens), common / len(g_tokens)
    return 2 * precision * recall / (precision + recall)
