"""Edits made without the policy, as generate plug-ins the evaluation runs in the agent's place
(``eval_mem_update.py --edit noop|oracle``), scored by the same reward:

- ``noop``: the store is left as it is (doing nothing: the row a learned editor must beat);
- ``oracle``: for every question the episode is scored on (the one shown and ``memup_extra_questions`` others of
  the conversation), a memory stating the question and its gold answer is added: the most an edit can give the
  reader, the ceiling of the table.

Neither asks the engine anything; the episode ends finished, with the agent's counters (no calls).
"""

from dataclasses import replace

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
    out = replace(sample, metadata={**sample.metadata, "memory_namespace": namespace.name, "finished": True},
                  metrics=dict(sample.metrics), response="", status=Status.COMPLETED)
    out.metrics.update(num_turns=0.0, tool_calls=0.0, tool_errors=0.0, valid_tool_calls=0.0,
                       store_edits=float(len(added)), initial_memory_count=float(len(namespace.initial)),
                       final_memory_count=float(len(namespace)),
                       initial_memory_chars=float(sum(len(m.content) for m in namespace.initial)),
                       final_memory_chars=float(sum(len(m.content) for m in namespace.memories())),
                       **{f"calls_{tool['function']['name']}": 0.0 for tool in TOOLS},
                       **{f"errors_{kind}": 0.0 for kind in ERROR_KINDS})
    return out


async def noop(args, sample, sampling_params, evaluation: bool = False):
    return _episode(sample, [])


async def oracle(args, sample, sampling_params, evaluation: bool = False):
    settings = MemUpdateSettings.from_args(args)
    extra = sample.metadata.get("extra_qa", [])[:settings.extra_questions]
    questions = [(str(sample.prompt), str(sample.label))] + [(q["question"], q["answer"]) for q in extra]
    return _episode(sample, [f"{question} {answer}" for question, answer in questions])
