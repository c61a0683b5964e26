"""Edits made without the policy, as generate plug-ins the evaluation runs in the agent's place
(``eval_mem_update.py --edit noop|oracle``), scored by the same reward:

- ``noop``: the store is left as it is (doing nothing: the row a learned editor must beat);
- ``oracle``: for every question the episode is scored on (the one shown and ``memup_extra_questions`` others of
  the conversation), a memory stating the question and its gold answer is added: the most an edit can give the
  reader, the ceiling of the table.

Neither asks the engine anything; the episode ends finished, with the agent's counters (no calls).
"""

from dataclasses import replace

from examples.mem_update.rollout import episode_metrics
from examples.mem_update.settings import MemUpdateSettings
from examples.mem_update.store import STORE
from examples.mem_update.tools import ERROR_KINDS, TOOLS
from vime_ext.agent.sample import Status


def _episode(sample, added: list[str]):
    memories = sample.metadata.get("memories")
    if not isinstance(memories, list) or not memories:
        raise ValueError(f"sample {sample.index}: metadata['memories'] must list the initial memories")
    namespace = STORE.create(memories, prefix="baseline")
    for content in added:
        namespace.create(content, source="oracle")
    no_calls = {tool["function"]["name"]: 0 for tool in TOOLS}
    metrics = {**sample.metrics, **episode_metrics(namespace, 0, no_calls, dict.fromkeys(ERROR_KINDS, 0), len(added))}
    return replace(sample, metadata={**sample.metadata, "memory_namespace": namespace.name, "finished": True},
                   metrics=metrics, response="", status=Status.COMPLETED)


async def noop(args, sample, sampling_params, evaluation: bool = False):
    return _episode(sample, [])


async def oracle(args, sample, sampling_params, evaluation: bool = False):
    settings = MemUpdateSettings.from_args(args)
    extra = sample.metadata.get("extra_qa", [])[:settings.extra_questions]
    questions = [(str(sample.prompt), str(sample.label))] + [(q["question"], q["answer"]) for q in extra]
    return _episode(sample, [f"{question} {answer}" for question, answer in questions])
