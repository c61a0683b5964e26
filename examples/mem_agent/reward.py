"""The training reward (``--custom-rm-path examples.mem_agent.reward.reward``): 1 when the final answer's answer,
in the format ``mem_answer_format`` asks for, equals one of the gold answers (lower case, white space removed),
else 0. MemAgent's format is ``boxed``: the last ``\\boxed{}`` in the last 300 characters; ``answer_is`` reads
what follows the last "the answer is". The sample is the folded trajectory, so ``sample.response`` is the final
chat's answer (with any ``mem_answer_prefix``)."""

from examples.mem_agent.rollout import MemSettings
from examples.mem_agent.scoring import extract_answer, squash


def reward(args, sample) -> dict:
    answer = extract_answer(sample.response, MemSettings.from_args(args).answer_format)
    golds = sample.label if isinstance(sample.label, (list, tuple)) else [sample.label]
    score = 0.0 if answer is None else max(float(squash(answer) == squash(str(g))) for g in golds)
    return {"reward": score, "no_answer": float(answer is None)}
