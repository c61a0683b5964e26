"""MemUpdate's reward (``--custom-rm-path examples.mem_update.reward.reward``): how much better questions are
answered from the store after the episode than before it, times how economical the store stayed.

    reward = (QA(final store) - QA(initial store)) x efficiency        (-0.1 when it cannot be computed)
    efficiency = clamp(size x density x change, 0.1, 1.5)
    size    = max(0.1, 1 - (n_new - cap) / cap) when n_new > cap, else 1
    density = min(1.2, mean characters per memory, new / max(old, 1))
    change  = max(0.8, 1 - 0.5 |n_new - n_old| / max(n_old, 1))

QA is the mean score over the target question (seen: the agent was shown it) and ``memup_extra_questions`` other
questions of the same conversation (unseen), or over one of the two (``memup_reward_questions``: both, seen,
unseen), of one of two scorers, each reading the ``memup_top_k`` memories retrieved for the question:

- ``proxy``: the share of the answer's words (lower case, split on white space, punctuation at the edges
  ignored) that occur in the retrieved memories, clipped to [0.1, 1.0]; an answer without words scores 0.5
  whatever the store holds (as published), so it adds nothing to the delta;
- ``reader``: a model answers from the retrieved memories, greedily; token F1 against the gold answer. The
  model is the run's reward model when it has one (``args.rm_url``: train.py's ``--rm-hf-checkpoint``, the
  evaluation's ``--reader-model``), a fixed reader, asked each distinct prompt once per process
  (``vime_ext.engines.fixed_replies``: vLLM's batched greedy replies vary with the batch, and an unchanged store
  must score the same before and after), and once for every process that shares ``args.rm_replies_file``
  (``--rm-replies-file``; the evaluation's ``--reader-replies-file``); else the policy itself, through the
  rollout's router.

With ``memup_reward_signal: likelihood`` the reward's QA is instead the reader's probability of the gold answer
as its reply (``answer_likelihood``: exp of the mean log-prob of the answer's tokens, from the engine's prompt
log-probs), over the same questions and retrieved memories; the QA metrics stay the scorer's, and
likelihood_before / likelihood_after are logged beside them. F1 changes only when an edit changes the reader's
greedy answer, so most of a GRPO group's episodes tie on it; the likelihood moves with any edit that makes the
answer more or less likely.

The before and after stores are the namespace's snapshot and its final state, both real; the namespace is
dropped here. An unfinished episode (no final reply) is scored the same way, as published, unless
``memup_unfinished_reward`` fixes its reward. When scoring raises (the reader's engine failed, say), the reward
is ``memup_error_reward`` (-0.1, as published), the error is logged and counted in ``reward_error``. Metrics:
memory_reward, qa_before, qa_after, performance_delta (over the questions the reward uses), qa_before_seen,
qa_after_seen and, with unseen questions, qa_before_unseen, qa_after_unseen; efficiency, unfinished, reward_error;
and under the question's LoCoMo category name (multi_hop, temporal, open_domain, single_hop, adversarial) the reward and
``<category>_qa_before`` / ``_qa_after``.
"""

import logging
from functools import cache

import numpy as np

from examples.mem_update.locomo import CATEGORIES
from examples.mem_update.prompts import READER
from examples.mem_update.retrieval import make_retriever
from examples.mem_update.settings import MemUpdateSettings, reader_tokenizer
from examples.mem_update.store import STORE, Memory
from vime_ext.agent.rewards import token_f1
from vime_ext.engines.fixed_replies import FIXED_REPLIES
from vime_ext.engines.protocol import SamplingParams

log = logging.getLogger(__name__)
EMPTY_ANSWER_SCORE = 0.5  # as published: an answer with no words is neither helped nor hurt by the store


def efficiency(n_old: int, n_new: int, chars_old: float, chars_new: float, s: MemUpdateSettings) -> float:
    """The factor above; ``chars_*`` are mean characters per memory."""
    cap = s.size_cap if s.size_cap is not None else max(n_old, 1)
    size = max(s.size_floor, 1 - (n_new - cap) / cap) if n_new > cap else 1.0
    density = min(s.density_max, chars_new / max(chars_old, 1.0))
    change = max(s.change_floor, 1 - s.change_weight * abs(n_new - n_old) / max(n_old, 1))
    return float(np.clip(size * density * change, s.efficiency_min, s.efficiency_max))


def _words(text: str) -> list[str]:
    return [w.strip(".,;:!?\"'()[]") for w in text.lower().split()]


def proxy_score(answer: str, retrieved: list[Memory]) -> float:
    answer_words = {w for w in _words(answer) if w}
    if not answer_words:
        return EMPTY_ANSWER_SCORE
    found = {w for m in retrieved for w in _words(m.content)}
    return float(np.clip(len(answer_words & found) / len(answer_words), 0.1, 1.0))


@cache
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def reader_prompt(args, settings: MemUpdateSettings, question: str, retrieved: list[Memory]):
    """The reader's tokenizer and its prompt's token ids: the question and the retrieved memories."""
    listing = "\n".join(f"- {m.content}" + (f" ({m.metadata['date']})" if m.metadata.get("date") else "")
                        for m in retrieved) or "(none)"
    tokenizer = _tokenizer(reader_tokenizer(settings, args)) if getattr(args, "rm_url", None) else args.tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": READER.format(memories=listing, question=question)}], tokenize=False,
        add_generation_prompt=True)
    return tokenizer, tokenizer(prompt, add_special_tokens=False)["input_ids"]


async def _ask_reader(args, ids: list[int], params: SamplingParams):
    if getattr(args, "rm_url", None):  # one reply per distinct prompt: an unchanged store scores the same
        return await FIXED_REPLIES.ask(args, ids, params)
    return await args.rollout_client.generate(ids, params)


async def reader_score(args, settings: MemUpdateSettings, question: str, answer: str,
                       retrieved: list[Memory]) -> float:
    """The reader's answer from the retrieved memories, scored by token F1."""
    tokenizer, ids = reader_prompt(args, settings, question, retrieved)
    params = SamplingParams(temperature=0.0, max_new_tokens=settings.reader_max_tokens, log_probs=False)
    result = await _ask_reader(args, ids, params)
    return reply_f1(tokenizer.decode(result.token_ids, skip_special_tokens=True), answer)


def answer_line(reply: str) -> str:
    """What of a reader's reply is its answer: the first line, not what follows."""
    return reply.strip().split("\n")[0]


def reply_f1(reply: str, answer: str) -> float:
    """A reader's reply scored against the gold answer: token F1 of its answer line."""
    return token_f1(answer_line(reply), answer)


async def answer_likelihood(args, settings: MemUpdateSettings, question: str, answer: str,
                            retrieved: list[Memory]) -> float:
    """The reader's probability of the gold answer as its reply to the same prompt: exp of the mean log-prob of
    the answer's tokens (in (0, 1]; an answer without tokens scores EMPTY_ANSWER_SCORE, as the proxy's does)."""
    tokenizer, ids = reader_prompt(args, settings, question, retrieved)
    answer_ids = tokenizer(str(answer), add_special_tokens=False)["input_ids"]
    if not answer_ids:
        return EMPTY_ANSWER_SCORE
    params = SamplingParams(temperature=0.0, max_new_tokens=1, log_probs=False, prompt_log_probs=True)
    result = await _ask_reader(args, ids + answer_ids, params)
    return float(np.exp(np.mean(result.prompt_log_probs[-len(answer_ids):])))


def retrieve_for(settings: MemUpdateSettings, questions: list[tuple[str, str]],
                 memories: list[Memory]) -> list[list[Memory]]:
    """The ``memup_top_k`` memories retrieved for each question."""
    retriever = make_retriever(settings.retriever)
    return [[m for m, _ in retriever.search(question, memories, settings.top_k)] for question, _ in questions]


async def qa_scores(args, settings: MemUpdateSettings, questions: list[tuple[str, str]],
                    memories: list[Memory]) -> list[float]:
    """Each question's score from the memories retrieved for it."""
    return await scores_of(args, settings, questions, retrieve_for(settings, questions, memories))


async def scores_of(args, settings: MemUpdateSettings, questions: list[tuple[str, str]],
                    found: list[list[Memory]], likelihood: bool = False) -> list[float]:
    """Each question's score from its retrieved memories (``found``, in the same order); ``likelihood``: the
    reader's likelihood of its answer instead."""
    scores = []
    for (question, answer), retrieved in zip(questions, found, strict=True):
        if likelihood:
            scores.append(await answer_likelihood(args, settings, question, answer, retrieved))
        elif settings.scorer == "proxy":
            scores.append(proxy_score(answer, retrieved))
        else:
            scores.append(await reader_score(args, settings, question, answer, retrieved))
    return scores


async def qa_score(args, settings: MemUpdateSettings, questions: list[tuple[str, str]],
                   memories: list[Memory]) -> float:
    return float(np.mean(await qa_scores(args, settings, questions, memories)))


def _mean_chars(memories) -> float:
    return float(np.mean([len(m.content) for m in memories])) if memories else 0.0


async def reward(args, sample) -> dict:
    settings = MemUpdateSettings.from_args(args)
    name = sample.metadata.get("memory_namespace")
    if name is None:
        raise ValueError(f"sample {sample.index}: no memory namespace in its metadata; the reward needs "
                         "examples.mem_update.rollout.generate as --custom-generate-function-path")
    finished = bool(sample.metadata.get("finished"))
    try:
        namespace = STORE.get(name)
        extra = sample.metadata.get("extra_qa", [])[:settings.extra_questions]
        # The question the agent was shown first (seen), then the conversation's others (unseen)
        questions = [(str(sample.prompt), str(sample.label))] + [(q["question"], q["answer"]) for q in extra]
        if settings.reward_questions == "unseen" and not extra:
            raise ValueError("memup_reward_questions is unseen, but the sample has no other questions (extra_qa)")
        # what each question retrieves from the store before and after: scored for QA, and for the likelihood
        found = {"before": retrieve_for(settings, questions, list(namespace.initial)),
                 "after": retrieve_for(settings, questions, namespace.memories())}
        each = {when: await scores_of(args, settings, questions, retrieved) for when, retrieved in found.items()}
        groups = {"seen": slice(0, 1), "unseen": slice(1, None), "both": slice(None)}
        scores = {(group, when): float(np.mean(values[groups[group]])) for when, values in each.items()
                  for group in ("seen", "unseen") if values[groups[group]]}
        rewarded = groups[settings.reward_questions]
        before, after = (float(np.mean(each[when][rewarded])) for when in ("before", "after"))
        likely = {}
        if settings.reward_signal == "likelihood":
            likely = {when: float(np.mean((await scores_of(args, settings, questions, retrieved,
                                                           likelihood=True))[rewarded]))
                      for when, retrieved in found.items()}
        factor = efficiency(len(namespace.initial), len(namespace), _mean_chars(namespace.initial),
                            _mean_chars(namespace.memories()), settings)
    except Exception as err:  # noqa: BLE001 (as published: a reward that cannot be computed is a small penalty)
        log.warning("sample %s: the reward could not be computed, %s instead: %s: %s", sample.index,
                    settings.error_reward, type(err).__name__, err)
        value = settings.error_reward
        return {"reward": value, "memory_reward": value, "reward_error": 1.0, "unfinished": float(not finished)}
    finally:
        STORE.drop(name)
    value = ((likely["after"] - likely["before"]) if likely else (after - before)) * factor
    if not finished and settings.unfinished_reward is not None:
        value = settings.unfinished_reward
    metrics = {"reward": value, "memory_reward": value, "qa_before": before, "qa_after": after,
               "performance_delta": after - before, "efficiency": factor, "unfinished": float(not finished),
               "reward_error": 0.0}
    metrics.update({f"qa_{when}_{group}": score for (group, when), score in scores.items()})
    metrics.update({f"likelihood_{when}": score for when, score in likely.items()})
    category = CATEGORIES.get(sample.metadata.get("category"))
    if category:
        metrics.update({category: value, f"{category}_qa_before": before, f"{category}_qa_after": after})
    return metrics
