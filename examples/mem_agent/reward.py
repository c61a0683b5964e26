"""The training reward (``--custom-rm-path examples.mem_agent.reward.reward``): 1 when the last ``\\boxed{}`` in
the last 300 characters of the final answer equals one of the gold answers (lower case, white space removed),
else 0. The sample is the folded trajectory, so ``sample.response`` is the final chat's answer."""

from examples.mem_agent.scoring import extract_answer, squash


def reward(args, sample) -> dict:
    answer = extract_answer(sample.response, "boxed")
    golds = sample.label if isinstance(sample.label, (list, tuple)) else [sample.label]
    score = 0.0 if answer is None else max(float(squash(answer) == squash(str(g))) for g in golds)
    return {"reward": score, "no_boxed": float(answer is None)}
