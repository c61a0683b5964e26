"""Answer extraction and scoring.

Training reward (``reward.py``): the last ``\\boxed{...}`` within the last 300 characters of the final answer,
compared with each gold answer after lower-casing and removing white space. Evaluation (the paper's tables):
the gold answer is ``answers[0]``; both sides are normalised (lower case, punctuation and the articles a/an/the
removed, white space collapsed); em = equal, sub_em = one contains the other, f1 over tokens (0 when exactly one
side is yes/no/noanswer and they differ).
"""

import re

from vime_ext.agent.rewards import last_boxed
from vime_ext.agent.rewards import normalize_text as normalize

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


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize(prediction) == normalize(gold))


def substring_match(prediction: str, gold: str) -> float:
    p, g = normalize(prediction), normalize(gold)
    return float(bool(p) and bool(g) and (p in g or g in p))


def holds_answer(memory: str, answers) -> bool:
    """Whether ``memory`` contains one of the gold ``answers`` (normalised, as sub-EM compares)."""
    answers = [answers] if isinstance(answers, str) else list(answers or [])
    memory = normalize(memory)
    return any(normalize(gold) and normalize(gold) in memory for gold in answers)
