"""MemUpdate's generate plug-in (``--custom-generate-function-path examples.mem_update.rollout.generate``).

One episode per sample: a namespace is made from ``sample.metadata["memories"]`` (the conversation's initial
memories), and the policy edits it through the six tools in one growing chat: each reply's ``<tool_call>``
blocks are parsed and run, their results appended as tool messages (masked out of the loss), until a reply
without a call (the episode is finished), ``memup_max_turns`` replies (the calls of the last one are not run,
as verl's ``max_assistant_turns`` ends an episode), or ``memup_max_context_tokens`` tokens. Malformed calls, unknown tools, bad arguments and refused operations are answered with an error the
policy reads, and counted. The reward (``reward.py``) compares the namespace's snapshot with its final state and
drops it.
"""

from dataclasses import replace

from examples.mem_update.prompts import SYSTEM, USER, speakers, wrote_rationale
from examples.mem_update.retrieval import make_retriever
from examples.mem_update.settings import MemUpdateSettings
from examples.mem_update.store import STORE
from examples.mem_update.tools import CHANGES_STORE, ERROR_KINDS, TOOLS, ToolBox
from vime_ext.agent.tool_calls import ToolCallError, parse_tool_calls, tool_message
from vime_ext.agent.trajectory import Trajectory


def episode_messages(sample, settings: MemUpdateSettings, count: int) -> list[dict]:
    memories = sample.metadata["memories"]
    return [{"role": "system", "content": SYSTEM.format(speakers=speakers(memories), top_k=settings.top_k)},
            {"role": "user", "content": USER.format(question=sample.prompt, count=count)}]


async def generate(args, sample, sampling_params, evaluation: bool = False):
    settings = MemUpdateSettings.from_args(args)
    memories = sample.metadata.get("memories")
    if not isinstance(memories, list) or not memories:
        raise ValueError(f"sample {sample.index} ({sample.metadata.get('source', '?')}): metadata['memories'] must "
                         "list the initial memories (prepare the data with examples/mem_update/prepare_data.py)")
    namespace = STORE.create(memories)
    try:
        return await _episode(args, sample, sampling_params, settings, namespace)
    except BaseException:  # the reward, which drops the namespace, will not come: drop it here
        STORE.drop(namespace.name)
        raise


async def _episode(args, sample, sampling_params, settings: MemUpdateSettings, namespace):
    box = ToolBox(namespace, make_retriever(settings.retriever), seed=sample.index)
    chat = Trajectory(args.tokenizer, episode_messages(sample, settings, len(namespace)), tools=TOOLS)
    edits = 0
    used = {tool["function"]["name"]: 0 for tool in TOOLS}  # calls that ran, by tool
    failed = dict.fromkeys(ERROR_KINDS, 0)  # calls that did not, by what was wrong
    finished = False
    replies = []  # the policy's own words (the response also holds the tool results, which echo memories)
    if settings.first_reply_prefix:  # written for the policy, not trained: a small model's first call
        chat.prefill(settings.first_reply_prefix)
    while len(chat.tokens) < settings.max_context_tokens:
        budget = min(sampling_params.max_new_tokens, settings.max_context_tokens - len(chat.tokens))
        reply = await chat.generate(args.rollout_client, replace(sampling_params, max_new_tokens=budget),
                                    session_id=namespace.name)
        if reply is None:  # the engine failed: no reward will come to drop the namespace
            STORE.drop(namespace.name)
            return chat.to_sample(sample)
        if len(chat.turns) == 1 and settings.first_reply_prefix:
            reply = settings.first_reply_prefix + reply
        replies.append(reply)
        parsed = parse_tool_calls(reply)
        if not parsed:
            finished = chat.turns[-1].finish_reason == "stop"
            break
        if len(chat.turns) >= settings.max_turns:
            break  # the cap: the episode ends unfinished, its last calls not run
        results = []
        for item in parsed:
            if isinstance(item, ToolCallError):
                failed["format"] += 1
                results.append(tool_message({"error": item.message}))
                continue
            result = box.run(item)
            if result.error:
                failed[result.error_kind] += 1
            else:
                used[result.name] += 1
                edits += result.name in CHANGES_STORE
            results.append(tool_message(result.content))
        chat.append_messages(results)
    out = chat.to_sample(sample)
    out.metadata.update(memory_namespace=namespace.name, finished=finished)
    out.metrics.update(episode_metrics(namespace, len(chat.turns), used, failed, edits, "\n".join(replies)))
    return out


def episode_metrics(namespace, turns: int, used: dict[str, int], failed: dict[str, int],
                    edits: int, replies: str = "") -> dict[str, float]:
    """An episode's counters: every call either ran (``used``, by tool) or failed (``failed``, by what was wrong);
    ``rationale`` 1 where the policy's ``replies`` hold the demonstrations' rationale."""
    errors = sum(failed.values())
    calls = sum(used.values()) + errors
    return dict(num_turns=float(turns), tool_calls=float(calls), tool_errors=float(errors),
                valid_tool_calls=float(calls - errors), store_edits=float(edits),
                rationale=float(wrote_rationale(replies)),
                initial_memory_count=float(len(namespace.initial)), final_memory_count=float(len(namespace)),
                initial_memory_chars=float(sum(len(m.content) for m in namespace.initial)),
                final_memory_chars=float(sum(len(m.content) for m in namespace.memories())),
                **{f"calls_{name}": float(n) for name, n in used.items()},
                **{f"errors_{kind}": float(n) for kind, n in failed.items()})
