"""Chats for supervised fine-tuning: JSONL lines holding OpenAI-format messages (``--input-key``, e.g.
``messages``) and optionally the tool definitions the chat was held with (``--tool-key``, default ``tools``).

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": null,
                   "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": "{\\"q\\": 1}"}}]},
                  {"role": "tool", "content": "..."}, {"role": "assistant", "content": "..."}],
     "tools": [{"type": "function", "function": {"name": "search", "parameters": {...}}}]}

Every line is checked when the file is read, before any model loads: roles, content types, tool calls, and at
least one assistant turn (the only turns an SFT run trains on). A problem names the file, line and field
(``data.jsonl:7: field messages[2].tool_calls[0].function.name: ...``).
"""

import json
from pathlib import Path
from typing import Any

from vime_ext.data.prompt_dataset import DataError, PromptRecord, jsonl_rows, row_metadata

ROLES = ("system", "user", "assistant", "tool")


def _tool_call_problem(call: Any) -> tuple[str, str] | None:
    """(field suffix, problem) of one OpenAI tool call, or None."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return "", "must be an object with a 'function' object ({'type': 'function', 'function': {...}})"
    function = call["function"]
    if not isinstance(function.get("name"), str) or not function["name"].strip():
        return ".function.name", "must be a non-empty string"
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return ".function.arguments", f"is a string but not JSON ({err.msg})"
    if not isinstance(arguments, dict):
        return ".function.arguments", "must be an object (or a JSON string of one)"
    return None


def check_messages(messages: Any, key: str) -> str | None:
    """What is wrong with one chat, as "field <path>: <problem>"; None when it can train."""
    if not isinstance(messages, list) or not messages:
        return f"field {key}: must be a non-empty list of messages"
    for i, message in enumerate(messages):
        field = f"{key}[{i}]"
        if not isinstance(message, dict):
            return f"field {field}: must be an object with 'role' and 'content'"
        role = message.get("role")
        if role not in ROLES:
            return f"field {field}.role: {role!r} is not one of {', '.join(ROLES)}"
        content, calls = message.get("content"), message.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                return f"field {field}.tool_calls: only assistant messages call tools"
            if not isinstance(calls, list) or not calls:
                return f"field {field}.tool_calls: must be a non-empty list"
            for j, call in enumerate(calls):
                problem = _tool_call_problem(call)
                if problem:
                    return f"field {field}.tool_calls[{j}]{problem[0]}: {problem[1]}"
        if content is None and calls:
            continue
        if not isinstance(content, str):
            return f"field {field}.content: must be a string, got {type(content).__name__}"
        if role == "assistant" and not content.strip() and not calls:
            return f"field {field}: an assistant turn with neither content nor tool_calls has nothing to train on"
    if not any(m["role"] == "assistant" for m in messages):
        return f"field {key}: no assistant turn (SFT trains on assistant turns only)"
    if messages[0]["role"] == "assistant":
        return f"field {key}[0]: the chat starts with an assistant turn; give it the system or user turn it answers"
    return None


def read_chats(path: str | Path, input_key: str = "messages", tool_key: str | None = "tools",
               metadata_key: str | None = "metadata") -> list[PromptRecord]:
    """Every chat of ``path`` as a ``PromptRecord`` (prompt: the messages; the tools, if any, in
    ``metadata["tools"]``, where slime keeps them), each checked (``check_messages``)."""
    records = []
    for where, row in jsonl_rows(path, input_key):
        problem = check_messages(row[input_key], input_key)
        if problem:
            raise DataError(f"{where}: {problem}")
        metadata = row_metadata(row, metadata_key, where)
        tools = row.get(tool_key) if tool_key else None
        if tools is not None:
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise DataError(f"{where}: field {tool_key!r} (--tool-key) must be a list of tool objects")
            metadata["tools"] = tools
        records.append(PromptRecord(row[input_key], None, metadata, where))
    if not records:
        raise DataError(f"{path}: no records")
    return records
