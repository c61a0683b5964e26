"""Edits made without the policy, as generate plug-ins the evaluation runs in the agent's place
(``eval_mem_update.py --edit noop|oracle|demonstrated|consolidated``), scored by the same reward:

- ``noop``: the store is left as it is (doing nothing: the row a learned editor must beat);
- ``oracle``: for every question the episode is scored on (the one shown and ``memup_extra_questions`` others of
  the conversation), a memory stating the question and its gold answer is added: the most an edit can give the
  reader, the ceiling of the table;
- ``demonstrated``: the episode SFT's demonstrations play for the question shown (``demonstrations.py``, with
  its answer note unless ``memup_answer_note`` is 0, as the recipe's data), through the same tools: what
  imitating them perfectly would score. It knows which memories
  are evidence and which are noise from the data's labels (``evidence``, ``asked_evidence``), which a policy
  does not: a reference row, like the oracle, not a baseline to beat;
- ``consolidated`` (fact consolidation data only): every fact that a later fact of the same slot restates is
  deleted (``fact_consolidation.superseded``), for all questions at once: what resolving every conflict in the list
  gives, from the list's order alone, no gold answer read. A reference row for an editor's content work: unlike
  the oracle's answers, it is an edit a policy could make with the tools (one delete per conflict).

None asks the engine anything; the episode ends finished, with the agent's counters.
"""

from dataclasses import replace

from examples.mem_update.demonstrations import plan_and_play
from examples.mem_update.fact_consolidation import superseded
from examples.mem_update.retrieval import make_retriever
from examples.mem_update.rollout import episode_metrics
from examples.mem_update.settings import MemUpdateSettings
from examples.mem_update.store import STORE
from examples.mem_update.sweep import play_sweep
from examples.mem_update.tools import CHANGES_STORE, ERROR_KINDS, TOOLS, ToolBox
from vime_ext.agent.sample import Status
from vime_ext.agent.tool_calls import ToolCall, calls_as_text


def _namespace(sample):
    memories = sample.metadata.get("memories")
    if not isinstance(memories, list) or not memories:
        raise ValueError(f"sample {sample.index}: metadata['memories'] must list the initial memories")
    return STORE.create(memories, prefix="baseline")


def _episode(sample, namespace, edits: int, called: list[ToolCall] = (), replies: int | None = None):
    """The finished episode on ``namespace``, with the agent's counters: the tool calls ``called``, none by default,
    made in ``replies`` replies before the final one (default: a reply each). The calls are its response, written
    as a policy writes them, so that what reads a policy's episodes (edit_audit.py) reads the row's alike."""
    calls = {tool["function"]["name"]: 0 for tool in TOOLS}
    for call in called:
        calls[call.name] += 1
    replies = len(called) if replies is None else replies
    turns = replies + 1 if called else 0
    metrics = {**sample.metrics, **episode_metrics(namespace, turns, calls, dict.fromkeys(ERROR_KINDS, 0), edits)}
    response = calls_as_text([{"function": {"name": c.name, "arguments": c.arguments}} for c in called])
    return replace(sample, metadata={**sample.metadata, "memory_namespace": namespace.name, "finished": True},
                   metrics=metrics, response=response, status=Status.COMPLETED)


def _added(sample, contents: list[str]):
    namespace = _namespace(sample)
    for content in contents:
        namespace.create(content, source="oracle")
    return _episode(sample, namespace, len(contents))


async def noop(args, sample, sampling_params, evaluation: bool = False):
    return _added(sample, [])


async def oracle(args, sample, sampling_params, evaluation: bool = False):
    settings = MemUpdateSettings.from_args(args)
    extra = sample.metadata.get("extra_qa", [])[:settings.extra_questions]
    questions = [(str(sample.prompt), str(sample.label))] + [(q["question"], q["answer"]) for q in extra]
    return _added(sample, [f"{question} {answer}" for question, answer in questions])


async def demonstrated(args, sample, sampling_params, evaluation: bool = False):
    settings = MemUpdateSettings.from_args(args)
    asked = sample.metadata.get("asked_evidence")
    if asked is None or "evidence" not in sample.metadata:
        raise ValueError(f"sample {sample.index}: no 'evidence' or 'asked_evidence' in its metadata, which the "
                         "demonstrated row reads; prepare the data again (examples/mem_update/prepare_data.py)")
    namespace = _namespace(sample)
    try:
        box = ToolBox(namespace, make_retriever(settings.retriever), seed=sample.index)
        played = plan_and_play({"question": str(sample.prompt), "evidence": sample.metadata["evidence"]},
                               set(asked), box, answer_note=bool(settings.answer_note),
                               where=f"sample {sample.index}")
    except BaseException:
        STORE.drop(namespace.name)
        raise
    called = [call for call, _ in played.calls]
    return _episode(sample, namespace, sum(call.name in CHANGES_STORE for call in called), called)


def _fact_list(sample, row: str) -> None:
    memories = sample.metadata.get("memories") or []
    if not any(isinstance(m, dict) and m.get("source") == "fact_list" for m in memories):
        raise ValueError(f"sample {sample.index}: the {row} row needs fact consolidation data (memories of "
                         "source 'fact_list': prepare_data.py --fact-consolidation or --generate-fact-lists)")


async def consolidated(args, sample, sampling_params, evaluation: bool = False):
    _fact_list(sample, "consolidated")
    memories = sample.metadata["memories"]
    namespace = _namespace(sample)
    older = superseded(memories)
    for memory_id in older:
        namespace.delete(memory_id)
    return _episode(sample, namespace, len(older),
                    [ToolCall("delete_memory", {"memory_id": memory_id}) for memory_id in older])


async def swept(args, sample, sampling_params, evaluation: bool = False):
    _fact_list(sample, "swept")
    settings = MemUpdateSettings.from_args(args)
    namespace = _namespace(sample)
    try:
        replies = play_sweep(str(sample.prompt), ToolBox(namespace, make_retriever(settings.retriever)),
                             settings.sweep_searches, where=f"sample {sample.index}")
    except BaseException:
        STORE.drop(namespace.name)
        raise
    called = [call for reply in replies for call, _ in reply.calls]
    return _episode(sample, namespace, sum(call.name == "delete_memory" for call in called), called, len(replies))
