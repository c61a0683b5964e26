import gzip
import json
import lzma

import pytest

from vime_ext.data.prompt_dataset import DataError, PromptDataset, json_lines, read_jsonl


def write(tmp_path, lines) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


def test_reads_text_and_chat_prompts(tmp_path):
    path = write(tmp_path, [{"q": "2+2?", "a": "4"}, "", {"q": [{"role": "user", "content": "hi"}], "a": ["x"],
                                                           "metadata": {"id": 7}}])
    records = read_jsonl(path, input_key="q", label_key="a")
    assert [r.prompt for r in records] == ["2+2?", [{"role": "user", "content": "hi"}]]
    assert records[1].source.endswith("data.jsonl:3") and records[1].as_rollout_input()["metadata"]["id"] == 7


@pytest.mark.parametrize("bad_line,message", [
    ('{"q": "x", "a": 1', "data.jsonl:2: not valid JSON (Expecting ',' delimiter at column 18, the end of the line)"),
    ('["q"]', "data.jsonl:2: expected a JSON object, got list"),
    ({"question": "x", "a": 1}, "data.jsonl:2: missing field 'q' (--input-key)"),
    ({"q": "x"}, "data.jsonl:2: missing field 'a' (--label-key)"),
    ({"q": "  ", "a": 1}, "data.jsonl:2: field 'q' must be a non-empty string"),
    ({"q": [{"role": "user"}], "a": 1}, "data.jsonl:2: field 'q' must be"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, bad_line, message):
    path = write(tmp_path, [{"q": "fine", "a": 1}, bad_line])
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_jsonl(path, input_key="q", label_key="a")


def test_gzipped_lines_read_as_plain_ones_and_a_bad_one_is_named(tmp_path):
    """The records keep results gzipped; the tools that read them (tools/seed_stats.py, the edit audit) use the same
    reader as prompt data, so a bad line of either is named by file and line."""
    rows = [{"q": "a"}, {"q": [{"role": "user", "content": "b"}]}]
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress(("\n".join(json.dumps(r) for r in rows) + "\n\n").encode()))
    assert [(where.rpartition("/")[2], row) for where, row in json_lines(packed)] == [
        ("rows.jsonl.gz:1", rows[0]), ("rows.jsonl.gz:2", rows[1])]
    packed.write_bytes(gzip.compress(b'{"q": "a"}\n{"q": \n'))
    with pytest.raises(DataError, match=r"rows.jsonl.gz:2: not valid JSON \(Expecting value at column 7"):
        list(json_lines(packed))
    xz = tmp_path / "rows.jsonl.xz"  # the records' fact-list episodes
    xz.write_bytes(lzma.compress(("\n".join(json.dumps(r) for r in rows) + "\n").encode()))
    assert [row for _, row in json_lines(xz)] == rows
    with pytest.raises(DataError, match="absent.jsonl: no such data file"):
        list(json_lines(tmp_path / "absent.jsonl"))


def test_shuffle_is_seeded_and_resumes_exactly(tmp_path):
    path = write(tmp_path, [{"prompt": f"p{i}", "label": i} for i in range(5)])
    records = read_jsonl(path)
    uninterrupted = PromptDataset(records, batch_size=2, shuffle=True, seed=3)
    stream = [[r.label for r in uninterrupted.next_batch()] for _ in range(6)]  # crosses two epoch boundaries
    assert sorted(sum(stream[:2], []) + [stream[2][0]]) == [0, 1, 2, 3, 4]  # first epoch is a permutation
    first = PromptDataset(records, batch_size=2, shuffle=True, seed=3)
    for _ in range(4):
        first.next_batch()
    resumed = PromptDataset(records, batch_size=2, shuffle=True, seed=3)
    resumed.load_state(json.loads(json.dumps(first.state())))
    assert [[r.label for r in resumed.next_batch()] for _ in range(2)] == stream[4:]
    with pytest.raises(DataError, match="seed 3"):
        PromptDataset(records, 2, shuffle=True, seed=4).load_state(first.state())
