"""Tool calls in the Hermes/Qwen format, for agent plug-ins: the policy writes

    <tool_call>
    {"name": "search_memory", "arguments": {"query": "..."}}
    </tool_call>

(any number of them, with text around), and the environment answers each with a ``tool`` message.

- ``parse_tool_calls(text)``: every call in order, or for a malformed one a ``ToolCallError`` that says what was
  wrong (unclosed tag, invalid JSON, no name, arguments not an object) so the episode can go on and count it.
- ``check_arguments(schema, arguments)``: the arguments against the tool's JSON schema (``jsonschema``); the first
  problem as one line naming the argument, or None.
- ``tools_prompt(tools)``: the tool list as system-prompt text, for chat templates that ignore ``tools=`` (the
  ``Trajectory`` and SFT's chat masks add it by themselves when the template does: ``tools_in_system``).
- ``calls_as_text(tool_calls)``: OpenAI-format ``tool_calls`` as the blocks above, for chat templates that drop
  them (SFT demonstrations then train on what the policy writes in a rollout).
"""

import json
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    message: str  # what was wrong, for the tool message the policy reads next
    text: str  # the offending text, cut to 200 characters


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """Every ``<tool_call>`` block of ``text`` in order: a ``ToolCall`` or, when malformed, a ``ToolCallError``.
    A reply without the tag has no calls (it is a final message)."""
    found: list[ToolCall | ToolCallError] = []
    position = 0
    while (start := text.find(OPEN, position)) >= 0:
        end = text.find(CLOSE, start)
        if end < 0:
            found.append(ToolCallError("the tool call is not closed with </tool_call> (cut off?)",
                                       text[start:start + 200]))
            break
        found.append(_one_call(text[start + len(OPEN):end].strip()))
        position = end + len(CLOSE)
    return found


def _one_call(body: str) -> ToolCall | ToolCallError:
    def error(message: str) -> ToolCallError:
        return ToolCallError(message, body[:200])

    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        return error(f"the tool call is not valid JSON ({err.msg} at column {err.colno})")
    if not isinstance(value, dict):
        return error(f"the tool call must be a JSON object with 'name' and 'arguments', got {type(value).__name__}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return error("the tool call has no 'name' string")
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI's wire format carries the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            return error(f"the arguments of {name} are a string that is not valid JSON ({err.msg})")
    if not isinstance(arguments, dict):
        return error(f"the arguments of {name} must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name, arguments)


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """The first way ``arguments`` break the JSON ``schema`` (a tool's ``parameters``), naming the argument."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: (list(e.absolute_path), e.message))
    if not errors:
        return None
    first = errors[0]
    where = ".".join(str(p) for p in first.absolute_path)
    return f"argument {where}: {first.message}" if where else first.message


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The tools as text for a system prompt, in the shape Qwen's template gives them."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou can call these functions. Their signatures are inside <tools></tools>:\n"
            f"<tools>\n{listing}\n</tools>\n\nTo call one, write a JSON object with its name and arguments "
            f"between tags, one call per block:\n{OPEN}\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n'
            f"{CLOSE}")


_PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


def template_ignores_tools(tokenizer, chat_template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether ``tokenizer``'s chat template renders a chat the same with and without ``tools=``."""
    kwargs = chat_template_kwargs or {}
    tool = {"type": "function", "function": {"name": "probe", "description": "d", "parameters": {}}}
    return tokenizer.apply_chat_template(_PROBE, tools=[tool], tokenize=False, **kwargs) == \
        tokenizer.apply_chat_template(_PROBE, tokenize=False, **kwargs)


def template_drops_tool_calls(tokenizer, chat_template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether ``tokenizer``'s chat template leaves an assistant message's ``tool_calls`` out of its text."""
    mark = "vime_probe_function"
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": mark, "arguments": {}}}]}
    return mark not in tokenizer.apply_chat_template(_PROBE + [call], tokenize=False, **(chat_template_kwargs or {}))


def tools_in_system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with ``tools_prompt(tools)`` after the system message's content (a system message is added
    when there is none)."""
    text, messages = tools_prompt(tools), list(messages)
    if messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
    else:
        messages.insert(0, {"role": "system", "content": text})
    return messages


def calls_as_text(tool_calls: list[dict[str, Any]]) -> str:
    """OpenAI-format tool calls (``{"function": {"name", "arguments"}}``, arguments an object or a JSON string)
    as the blocks a policy writes; ``parse_tool_calls`` reads them back."""
    blocks = []
    for call in tool_calls:
        function = call["function"]
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        body = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"{OPEN}\n{body}\n{CLOSE}")
    return "\n".join(blocks)


def tool_message(content: Any) -> dict[str, str]:
    """A tool's result as the chat message that follows the call."""
    return {"role": "tool", "content": content if isinstance(content, str) else json.dumps(content,
                                                                                          ensure_ascii=False)}
