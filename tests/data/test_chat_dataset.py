"""SFT chat data: every line is checked when the file is read, and a problem names the file, line and field."""

import json

import pytest

from vime_ext.data.chat_dataset import read_chats
from vime_ext.data.prompt_dataset import DataError

CALL = {"type": "function", "function": {"name": "search", "arguments": "{\"q\": \"x\"}"}}
GOOD = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                     {"role": "assistant", "content": None, "tool_calls": [CALL]},
                     {"role": "tool", "content": "found"}, {"role": "assistant", "content": "done"}],
        "tools": [{"type": "function", "function": {"name": "search", "parameters": {}}}]}


def write(tmp_path, lines) -> str:
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


def test_reads_chats_with_tool_calls_and_keeps_the_tools(tmp_path):
    records = read_chats(write(tmp_path, [GOOD, "", {"messages": GOOD["messages"][:3]}]))
    assert [len(r.prompt) for r in records] == [5, 3]
    assert records[0].metadata["tools"] == GOOD["tools"] and "tools" not in records[1].metadata
    assert records[1].source.endswith("chats.jsonl:3") and records[0].label is None


def messages(*changed):
    return {"messages": [*GOOD["messages"][:2], *changed]}


@pytest.mark.parametrize("bad_line,message", [
    ('{"messages": [', "chats.jsonl:2: not valid JSON"),
    ({"prompt": "x"}, "chats.jsonl:2: missing field 'messages' (--input-key)"),
    ({"messages": []}, "chats.jsonl:2: field messages: must be a non-empty list"),
    (messages(), "chats.jsonl:2: field messages: no assistant turn"),
    (messages({"role": "bot", "content": "x"}), "chats.jsonl:2: field messages[2].role: 'bot' is not one of"),
    (messages({"role": "assistant", "content": 3}), "chats.jsonl:2: field messages[2].content: must be a string"),
    (messages({"role": "assistant", "content": " "}), "chats.jsonl:2: field messages[2]: an assistant turn with "
                                                      "neither content nor tool_calls"),
    (messages({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": ""}}]}),
     "chats.jsonl:2: field messages[2].tool_calls[0].function.name: must be a non-empty string"),
    (messages({"role": "assistant", "content": None,
               "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}),
     "chats.jsonl:2: field messages[2].tool_calls[0].function.arguments: is a string but not JSON"),
    (messages({"role": "user", "content": "x", "tool_calls": [CALL]}),
     "chats.jsonl:2: field messages[2].tool_calls: only assistant messages call tools"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "chats.jsonl:2: field messages[0]: the chat starts "
                                                             "with an assistant turn"),
    ({**GOOD, "tools": {"name": "f"}}, "chats.jsonl:2: field 'tools' (--tool-key) must be a list"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, bad_line, message):
    with pytest.raises(DataError) as err:
        read_chats(write(tmp_path, [GOOD, bad_line]))
    assert message in str(err.value)
