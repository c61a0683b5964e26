"""A chat as training tokens: the tokenizer's chat template renders it, and only the assistant turns are trained.

For each assistant message i, the tokens the model writes in that turn are the template's rendering of
``messages[:i+1]`` minus its rendering of ``messages[:i]`` with the generation prompt (``<|im_start|>assistant\\n``
and the like), up to and including the end-of-turn token (the tokenizer's EOS; what the template writes after
it, such as ChatML's newline, is never generated and not trained). System, user and tool turns, and the
generation prompts, are masked.

Templates that render every turn the same whatever follows it (ChatML: SmolLM2, Qwen2.5) give one sequence,
the whole chat, with every assistant span trained. Templates that rewrite earlier turns once later ones follow
(Qwen3 drops the reasoning of turns before the last user query) give one sequence per assistant turn, each with
exactly the context the template shows the model at that turn; ``MaskedChat.split`` says so.

Checks, each a ``ChatTemplateError`` naming the message: the generation prompt must be a token prefix of the
turn it opens; every assistant turn's content and tool-call names must appear in its trained span, and every other
turn's content in the rendering (a template that drops content would train on something else). Chat templates
that ignore ``tools=`` or drop ``tool_calls`` get the tool list in the system message and the calls as
``<tool_call>`` blocks in the content, as the rollout's ``Trajectory`` renders them.

A chat is rendered 2 + 2 x (assistant turns) times, each time from its start, so masking costs more than the
training step of a small model (64 MemUpdate chats of ~1,200 tokens: 2.2 s, against SmolLM2's 0.85 s step on an
H200; 2.6 s a step of the 1.5B model's first SFT pass, against its 3.4 s of training). Nearly all of it is the
tokenizer's encoding, which lets go of Python's lock, so a masker may be called from several threads at once
(``sft_rollout.mask_all``; its cache takes a lock). SFT runs several epochs over the same chats, so the masker
keeps what it made, keyed by the chat, up to ``cache_tokens`` tokens in all (compact arrays, 5 bytes a token),
and later epochs take it from there.
"""

import hashlib
import json
import threading
from array import array
from dataclasses import dataclass
from typing import Any

from vime_ext.agent.tool_calls import calls_as_text, template_drops_tool_calls, template_ignores_tools, tools_in_system

_MARK = "\u2063vime-message\u2063"  # an invisible separator around a message number: text no chat holds


class ChatTemplateError(ValueError):
    """The chat template cannot give this chat's assistant tokens exactly."""


@dataclass(frozen=True)
class MaskedSequence:
    tokens: list[int]
    mask: list[int]  # one per token: 1 where the token is an assistant token (trained)

    @property
    def num_trained(self) -> int:
        return sum(self.mask)


@dataclass(frozen=True)
class MaskedChat:
    sequences: list[MaskedSequence]
    split: bool  # one sequence per assistant turn (the template rewrites earlier turns)


class ChatMasker:
    """Renders chats with one tokenizer's template; the template's tool support is probed once."""

    def __init__(self, tokenizer, chat_template_kwargs: dict[str, Any] | None = None,
                 cache_tokens: int = 20_000_000):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(f"the tokenizer of {getattr(tokenizer, 'name_or_path', '?')} has no chat "
                                    "template to render chats with")
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.tools_in_system = template_ignores_tools(tokenizer, self.kwargs)
        self.calls_as_text = template_drops_tool_calls(tokenizer, self.kwargs)
        self.eos = tokenizer.eos_token_id
        self.cache_tokens = cache_tokens  # the cache's bound: chats past it are rendered every time
        self._cache: dict[bytes, tuple[bool, list[tuple[array, array]]]] = {}
        self._cached_tokens = 0
        self._cache_lock = threading.Lock()  # callers in several threads (sft_rollout.mask_all)

    def _normalise(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
        if self.calls_as_text:
            messages = [_calls_in_content(m) if m.get("tool_calls") else m for m in messages]
        if tools and self.tools_in_system:
            messages, tools = tools_in_system(messages, tools), None
        return messages, tools

    def _ids(self, messages: list[dict], tools, generation_prompt: bool) -> tuple[list[int], str]:
        text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt, **self.kwargs)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]), text

    def _check_kept(self, messages: list[dict], tools) -> None:
        """Every system, user and tool message's content is in the rendering: rendered once with each content
        replaced by a marker of its own, so that no other text can stand in for it."""
        marked = [{**m, "content": f"{_MARK}{i}{_MARK}"} if m["role"] != "assistant" and (m.get("content") or "")
                  .strip() else m for i, m in enumerate(messages)]
        _, text = self._ids(marked, tools, False)
        for i, (message, probe) in enumerate(zip(messages, marked)):
            if probe is not message and probe["content"] not in text:
                raise ChatTemplateError(f"the chat template drops the content of messages[{i}] ({message['role']})")

    def __call__(self, messages: list[dict], tools: list[dict] | None = None) -> MaskedChat:
        key = hashlib.blake2b(json.dumps([messages, tools], sort_keys=True, default=str).encode(),
                              digest_size=16).digest()
        if key in self._cache:  # fresh lists: a caller may change what it gets
            split, sequences = self._cache[key]
            return MaskedChat([MaskedSequence(list(t), list(m)) for t, m in sequences], split)
        chat = self._mask(messages, tools)
        size = sum(len(s.tokens) for s in chat.sequences)
        with self._cache_lock:
            if key not in self._cache and self._cached_tokens + size <= self.cache_tokens:
                self._cache[key] = chat.split, [(array("i", s.tokens), array("b", s.mask)) for s in chat.sequences]
                self._cached_tokens += size
        return chat

    def _mask(self, messages: list[dict], tools: list[dict] | None) -> MaskedChat:
        messages, tools = self._normalise(messages, tools)
        self._check_kept(messages, tools)
        full, _ = self._ids(messages, tools, False)
        turns = []  # (tokens of messages[:i+1], start, end) per assistant message i
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            opening, _ = self._ids(messages[:i], tools, True)
            closed, _ = self._ids(messages[:i + 1], tools, False)
            if closed[:len(opening)] != opening:
                raise ChatTemplateError(f"messages[{i}]: the template's generation prompt is not a token prefix of "
                                        "the assistant turn it opens, so the turn's tokens cannot be told apart")
            end = len(closed)
            if self.eos is not None and self.eos in closed[len(opening):]:
                end = len(closed) - closed[::-1].index(self.eos)  # up to and including the last EOS
            span = self.tokenizer.decode(closed[len(opening):end], skip_special_tokens=False)
            expected = [(message.get("content") or "").strip()] + \
                [c["function"]["name"] for c in message.get("tool_calls") or ()]
            missing = next((text for text in expected if text and text not in span), None)
            if missing is not None or end == len(opening):
                raise ChatTemplateError(f"the chat template drops the content of messages[{i}] (assistant): "
                                        f"{(missing or '')[:60]!r} is not in the tokens of its turn")
            turns.append((closed, len(opening), end))
        if not turns:
            raise ChatTemplateError(f"the chat has no assistant message to train on (roles: "
                                    f"{', '.join(m['role'] for m in messages)})")
        if all(full[:len(closed)] == closed for closed, _, _ in turns):
            mask = [0] * turns[-1][2]
            for _, start, end in turns:
                mask[start:end] = [1] * (end - start)
            return MaskedChat([MaskedSequence(full[:len(mask)], mask)], split=False)
        return MaskedChat([MaskedSequence(closed[:end], [0] * start + [1] * (end - start))
                           for closed, start, end in turns], split=True)


def _calls_in_content(message: dict) -> dict:
    content = (message.get("content") or "").strip()
    text = calls_as_text(message["tool_calls"])
    message = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**message, "content": f"{content}\n{text}" if content else text}
