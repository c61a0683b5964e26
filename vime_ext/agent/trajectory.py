"""Building multi-turn trajectories as token ids, for agent plug-ins.

A ``Trajectory`` starts from chat messages rendered by the tokenizer's chat template (the prompt, not trained),
then grows turn by turn:

- ``await traj.generate(client, params)``: the policy's reply, appended as the engine returned it (token ids and
  log-probs, trained; never re-tokenised, so the trainer sees exactly what was sampled);
- ``traj.prefill(text)``: the start of the next reply, written for the policy (masked), e.g. an answer format;
- ``traj.append_messages([...])``: environment or tool output as chat messages, rendered by the same template and
  appended as masked tokens, closing the policy's turn the way the template would and opening the next one.

``traj.to_sample(slot)`` turns it into a ``Sample`` (one training sequence). One growing conversation (a tool
loop, MemUpdate) is one ``Trajectory``; independent conversations (one per document chunk, MemAgent) are one
``Trajectory`` each, returned by ``generate`` as a list of Samples.

How a message list is rendered on its own: the template's text for ``[system S] + messages`` minus its text for
``[system S]``; that is the same text as after any earlier turn for templates that render each message on its
own (ChatML: Qwen, SmolLM2, ...). The text after an assistant reply's content is read off the template by
rendering a marker reply.
"""

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from vime_ext.agent.sample import Sample, Status
from vime_ext.agent.tool_calls import template_ignores_tools, tools_in_system
from vime_ext.engines.client import EngineUnavailable, RolloutClient
from vime_ext.engines.protocol import InvalidRequest, SamplingParams

_SYSTEM = {"role": "system", "content": "S"}  # a stand-in system message for reading the template
_MARK = "\u2063vime-reply\u2063"


@dataclass
class TurnRecord:
    """One call to the policy: how many tokens it produced and why it stopped."""

    num_tokens: int
    finish_reason: str  # "stop", "length", or the error class when the engine failed
    status: Status


@dataclass
class Trajectory:
    tokenizer: Any
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tokens: list[int] = field(init=False)
    prompt_length: int = field(init=False)
    loss_mask: list[int] = field(init=False, default_factory=list)  # over tokens[prompt_length:]
    log_probs: list[float] = field(init=False, default_factory=list)
    # The weight version that sampled each generated token, None for masked ones (over tokens[prompt_length:];
    # empty unless the client records versions: --partial-rollout)
    versions: list[int | None] = field(init=False, default_factory=list)
    turns: list[TurnRecord] = field(init=False, default_factory=list)
    error: str | None = field(init=False, default=None)

    def __post_init__(self):
        if self.tools and template_ignores_tools(self.tokenizer, self.chat_template_kwargs):
            # Templates without tool support (plain ChatML: SmolLM2's, the packaged Qwen tokenizer's) would
            # drop the tool list: it goes into the system message instead, as Qwen's template writes it.
            self.messages, self.tools = tools_in_system(self.messages, self.tools), None
        self.tokens = self._ids(self._render(self.messages, add_generation_prompt=True))
        self.prompt_length = len(self.tokens)

    # ---- rendering -------------------------------------------------------------------------------------------

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  **self.chat_template_kwargs)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @cached_property
    def _reply_close(self) -> str:
        """What the template writes after an assistant reply's content (e.g. "<|im_end|>\\n"); the same for every
        turn, so rendered once per trajectory."""
        text = self._render([_SYSTEM, {"role": "user", "content": "U"}, {"role": "assistant", "content": _MARK}])
        return text[text.rindex(_MARK) + len(_MARK):]

    def render_continuation(self, messages: list[dict[str, Any]]) -> str:
        """The template's text for ``messages`` following earlier turns, ending with the next reply's opening."""
        head = self._render([_SYSTEM])
        full = self._render([_SYSTEM, *messages], add_generation_prompt=True)
        if not full.startswith(head):
            raise ValueError("this chat template renders a system message differently when messages follow it; "
                             "append the environment's turn as token ids with append_tokens() instead")
        return full[len(head):]

    # ---- growing the trajectory ------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.error is not None

    def append_model(self, token_ids: list[int], log_probs: list[float], finish_reason: str,
                     versions: list[int] = ()) -> None:
        """The policy's reply as sampled (trained), with the weight version of each token where known. A reply
        the engine aborted (and nothing continued) makes the trajectory aborted: not trained, may be retried."""
        if len(token_ids) != len(log_probs):
            raise ValueError(f"append_model: {len(token_ids)} tokens but {len(log_probs)} log-probs")
        if versions and len(versions) != len(token_ids):
            raise ValueError(f"append_model: {len(token_ids)} tokens but {len(versions)} versions")
        if versions and not self.versions:
            self.versions = [None] * (len(self.tokens) - self.prompt_length)
        self.tokens += list(token_ids)
        self.loss_mask += [1] * len(token_ids)
        self.log_probs += list(log_probs)
        if self.versions or versions:
            self.versions += list(versions) if versions else [None] * len(token_ids)
        if finish_reason == "abort":
            self.error = "the engine aborted the reply (paused for a weight update) and it was not continued"
            self.turns.append(TurnRecord(len(token_ids), finish_reason, Status.ABORTED))
            return
        status = Status.COMPLETED if finish_reason == "stop" else Status.TRUNCATED
        self.turns.append(TurnRecord(len(token_ids), finish_reason, status))

    def append_tokens(self, token_ids: list[int]) -> None:
        """Environment tokens as they are (masked: not trained, no log-probs)."""
        self.tokens += list(token_ids)
        self.loss_mask += [0] * len(token_ids)
        self.log_probs += [0.0] * len(token_ids)
        if self.versions:
            self.versions += [None] * len(token_ids)

    def prefill(self, text: str) -> None:
        """Text the policy's next reply starts with (masked: written for the policy, not trained). It is part of
        the sample's ``response``, so a reward reads it together with what the policy went on to write."""
        self.append_tokens(self._ids(text))

    def append_messages(self, messages: list[dict[str, Any]]) -> None:
        """Environment or tool output as chat messages (masked), after the policy's last reply: first whatever
        the template would have closed that reply with and the reply did not emit (its end-of-turn text when the
        reply was cut at the length limit), then the messages and the opening of the next reply."""
        close = self._reply_close
        if self.turns:
            said = self.tokenizer.decode(self.tokens[-self.turns[-1].num_tokens:], skip_special_tokens=False)
            done = next((k for k in range(len(close), 0, -1) if said.endswith(close[:k])), 0)
            close = close[done:]
        else:
            close = ""
        self.append_tokens(self._ids(close + self.render_continuation(messages)))

    async def generate(self, client: RolloutClient, params: SamplingParams, session_id: str | None = None) -> str | None:
        """Ask the policy for its next reply; returns its text (special tokens removed), or None when the engine
        refused or failed (recorded in ``error``; ``to_sample`` then marks the sample failed or aborted)."""
        try:
            result = await client.generate(self.tokens, params, session_id=session_id)
        except (InvalidRequest, EngineUnavailable) as err:
            self.error = f"{type(err).__name__}: {err}"
            self.turns.append(TurnRecord(0, type(err).__name__,
                                         Status.FAILED if isinstance(err, InvalidRequest) else Status.ABORTED))
            return None
        self.append_model(result.token_ids, result.log_probs, result.finish_reason, result.versions)
        return self.tokenizer.decode(result.token_ids, skip_special_tokens=True)

    # ---- out -------------------------------------------------------------------------------------------------

    def to_sample(self, slot: Sample) -> Sample:
        """A Sample with the slot's prompt, label, indices and metadata, and this trajectory as its one training
        sequence; its status is the last turn's (a failed call fails the sample)."""
        sample = replace(slot, metadata=dict(slot.metadata), metrics=dict(slot.metrics), turns=[])
        if self.error is not None:
            return sample.fail(self.turns[-1].status, self.error)
        if not self.turns:
            raise ValueError("to_sample: the trajectory has no reply from the policy yet")
        sample.tokens = list(self.tokens)
        sample.response_length = len(self.tokens) - self.prompt_length
        sample.loss_mask, sample.rollout_log_probs = list(self.loss_mask), list(self.log_probs)
        sample.token_versions = list(self.versions)
        sample.response = self.tokenizer.decode(self.tokens[self.prompt_length:], skip_special_tokens=True)
        sample.status = self.turns[-1].status
        sample.metrics["turns"] = float(len(self.turns))
        return sample
