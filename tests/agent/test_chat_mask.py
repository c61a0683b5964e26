"""SFT's loss mask covers exactly the assistant tokens of a chat, as the chat template renders it.

The reference is transformers' own assistant mask (``return_assistant_tokens_mask``), which needs a template that
marks assistant text with ``{% generation %}``: the tool-aware ChatML template below, with Qwen's real tokenizer.
Templates that rewrite earlier turns, drop content or ignore tools are checked against their own renderings."""

import logging

import pytest
from transformers import AutoTokenizer

from vime_ext.agent.chat_mask import ChatMasker, ChatTemplateError
from vime_ext.agent.sample import Sample, Status
from vime_ext.agent.tool_calls import ToolCall, parse_tool_calls
from vime_ext.models.packaged import CHATML_TEMPLATE
from vime_ext.rollout.sft_rollout import chat_sample, mask_all, warn_overlong
from vime_ext.rollout.validate import RolloutError, check_sample, where

NL = "{{ '\\n' }}"
# ChatML with tools: the tool list in the system turn, calls as <tool_call> blocks, results as user turns.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system" + NL + "{% if messages[0].role == 'system' %}{{ messages[0].content }}"
    + NL + NL + "{% endif %}Tools:" + NL + "{% for t in tools %}{{ t | tojson }}" + NL + "{% endfor %}<|im_end|>"
    + NL + "{% elif messages[0].role == 'system' %}<|im_start|>system" + NL + "{{ messages[0].content }}<|im_end|>"
    + NL + "{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant" + NL + "{% generation %}"
    "{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}"
    "{% if loop.first and m.content %}" + NL + "{% endif %}<tool_call>" + NL
    + "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}" + NL + "</tool_call>"
    "{% endfor %}<|im_end|>{% endgeneration %}" + NL +
    "{% elif m.role == 'tool' %}<|im_start|>user" + NL + "<tool_response>" + NL + "{{ m.content }}" + NL
    + "</tool_response><|im_end|>" + NL +
    "{% else %}<|im_start|>{{ m.role }}" + NL + "{{ m.content }}<|im_end|>" + NL + "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant" + NL + "{% endif %}")

TOOLS = [{"type": "function", "function": {"name": "search_memory", "description": "Find stored facts",
                                           "parameters": {"type": "object",
                                                          "properties": {"query": {"type": "string"}}}}}]
CHAT = [
    {"role": "system", "content": "You keep a memory of the user's facts."},
    {"role": "user", "content": "I moved to Lyon last spring."},
    {"role": "assistant", "content": "Let me check what I know.",
     "tool_calls": [{"type": "function", "function": {"name": "search_memory", "arguments": {"query": "city"}}}]},
    {"role": "tool", "content": "[1] lives in Paris"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"type": "function", "function": {"name": "search_memory", "arguments": {"query": "Lyon"}}},
                    {"type": "function", "function": {"name": "search_memory", "arguments": {"query": "spring"}}}]},
    {"role": "tool", "content": "nothing found"},
    {"role": "assistant", "content": "Noted: you now live in Lyon."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "Anytime."},
]


@pytest.fixture(scope="module")
def qwen(tiny_hf_dirs):
    return AutoTokenizer.from_pretrained(tiny_hf_dirs["qwen3"])  # Qwen's real tokenizer, built once per session


def with_template(tokenizer, template: str):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = template
    return tokenizer


def test_mask_is_the_templates_assistant_tokens_token_by_token(qwen):
    tokenizer = with_template(qwen, TOOL_TEMPLATE)
    reference = tokenizer.apply_chat_template(CHAT, tools=TOOLS, tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True)
    chat = ChatMasker(tokenizer)(CHAT, TOOLS)
    assert not chat.split and len(chat.sequences) == 1
    (sequence,) = chat.sequences
    # The chat ends with an assistant turn, so the sequence is the whole rendering minus the newline after it.
    assert sequence.tokens == reference["input_ids"][:len(sequence.tokens)]
    assert len(reference["input_ids"]) - len(sequence.tokens) == 1
    assert sequence.mask == reference["assistant_masks"][:len(sequence.tokens)]
    trained = tokenizer.decode([t for t, m in zip(sequence.tokens, sequence.mask) if m])
    assert trained.count("<|im_end|>") == 4 and "Paris" not in trained and "Thanks" not in trained
    assert [c.arguments for c in parse_tool_calls(trained)] == [{"query": "city"}, {"query": "Lyon"},
                                                                 {"query": "spring"}]


def test_a_template_without_tools_gets_them_as_the_rollout_renders_them(qwen):
    """Plain ChatML ignores tools= and drops tool_calls: the tool list goes into the system turn and the calls
    into the reply as <tool_call> blocks, which the rollout's parser reads back."""
    masker = ChatMasker(qwen)
    assert masker.tools_in_system and masker.calls_as_text
    (sequence,) = masker(CHAT, TOOLS).sequences
    text = qwen.decode(sequence.tokens)
    assert '"name": "search_memory"' in text.split("<|im_start|>user")[0]  # the tool list, in the system turn
    replies = qwen.decode([t for t, m in zip(sequence.tokens, sequence.mask) if m]).split("<|im_end|>")[:-1]
    assert parse_tool_calls(replies[1]) == [ToolCall("search_memory", {"query": "Lyon"}),
                                            ToolCall("search_memory", {"query": "spring"})]
    assert replies[0].startswith("Let me check what I know.\n<tool_call>") and replies[3] == "Anytime."


def test_a_template_that_rewrites_earlier_turns_trains_each_turn_in_its_own_context(qwen):
    """Like Qwen3, which drops the reasoning of earlier turns: the full rendering would train turn 1 on text the
    model never wrote, so each assistant turn is its own sequence, after what the template shows at that turn."""
    template = CHATML_TEMPLATE.replace("{{ message['content'] }}",
                                       "{% if message['role'] == 'assistant' and not loop.last %}"
                                       "{{ message['content'].split('</think>')[-1] }}"
                                       "{% else %}{{ message['content'] }}{% endif %}")
    tokenizer = with_template(qwen, template)
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>add</think>4"},
            {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "<think>add again</think>6"}]
    masked = ChatMasker(tokenizer)(chat)
    assert masked.split and len(masked.sequences) == 2
    for sequence, turn in zip(masked.sequences, (1, 3)):
        start = sequence.mask.index(1)
        assert set(sequence.mask[start:]) == {1}
        context = tokenizer.apply_chat_template(chat[:turn], tokenize=False, add_generation_prompt=True)
        assert tokenizer.decode(sequence.tokens[:start]) == context
        assert tokenizer.decode(sequence.tokens[start:]) == chat[turn]["content"] + "<|im_end|>"
    sample = chat_sample(Sample(prompt=chat), ChatMasker(tokenizer))
    check_sample(sample)
    assert len(sample.turns) == 1 and sample.metrics["sft_split"] == 1.0


def test_a_template_that_drops_content_is_refused_naming_the_message(qwen):
    skip_tools = CHATML_TEMPLATE.replace("{% for message in messages %}",
                                         "{% for message in messages if message['role'] != 'tool' %}")
    with pytest.raises(ChatTemplateError, match=r"drops the content of messages\[3\] \(tool\)"):
        ChatMasker(with_template(qwen, skip_tools))(CHAT)
    no_replies = CHATML_TEMPLATE.replace("{{ message['content'] }}",
                                         "{% if message['role'] != 'assistant' %}{{ message['content'] }}{% endif %}")
    with pytest.raises(ChatTemplateError, match=r"drops the content of messages\[1\] \(assistant\)"):
        ChatMasker(with_template(qwen, no_replies))([{"role": "user", "content": "hi"},
                                                     {"role": "assistant", "content": "hello"}])


def test_over_long_chats_are_refused_cut_or_skipped_and_counted(qwen):
    masker = ChatMasker(qwen)
    length = len(masker(CHAT, TOOLS).sequences[0].tokens)

    def sample():
        return Sample(prompt=CHAT, metadata={"tools": TOOLS, "source": "chats.jsonl:7"})

    with pytest.raises(RolloutError, match=f"chats.jsonl:7.*renders to {length} tokens, more than --sft-max-len"):
        chat_sample(sample(), masker, length - 1, "error")
    cut = chat_sample(sample(), masker, length - 5, "truncate")
    check_sample(cut)
    assert len(cut.tokens) == length - 5 and cut.metrics["sft_truncated"] == 1.0
    skipped = chat_sample(sample(), masker, length - 5, "skip")
    assert skipped.status == Status.FAILED and skipped.metrics["sft_skipped"] == 1.0 and not skipped.tokens
    whole = chat_sample(sample(), masker, length, "error")
    assert whole.status == Status.COMPLETED and whole.metrics["sft_truncated"] == 0.0
    # prompt tokens are never trained: the response starts at the first assistant token
    assert qwen.decode(whole.tokens[:whole.prompt_length]).endswith("<|im_start|>assistant\n")
    assert whole.metrics["sft_trained_tokens"] == sum(whole.loss_mask)


def test_a_rollout_that_leaves_chats_out_says_so_once(qwen, caplog):
    masker = ChatMasker(qwen)
    length = len(masker(CHAT, TOOLS).sequences[0].tokens)
    short = [*CHAT[:2], {"role": "assistant", "content": "Noted."}]
    samples = [Sample(prompt=CHAT if i != 1 else short,
                      metadata={"tools": TOOLS, "source": f"chats.jsonl:{i + 1}"}) for i in range(3)]
    mask_all(samples, masker, length - 1, "skip", threads=1)
    with caplog.at_level(logging.WARNING, logger="vime_ext.rollout.sft_rollout"):
        warn_overlong(samples, length - 1, "skip")
        warn_overlong([samples[1]], length - 1, "skip")  # within the bound: nothing to say
    assert [r.getMessage() for r in caplog.records] == [
        f"2 of 3 chats over --sft-max-len {length - 1} tokens (--sft-overlong skip): 0 cut, 2 left out; the first: "
        f"{where(samples[0])}"]
    # under truncate a chat cut to nothing trained is counted as left out, the others as cut
    early = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "word " * 40}]  # its reply starts within 20 tokens
    samples = [Sample(prompt=prompt, metadata={"tools": tools, "source": f"chats.jsonl:{i + 1}"})
               for i, (prompt, tools) in enumerate([(early, None), (CHAT, TOOLS)])]
    mask_all(samples, masker, 20, "truncate", threads=1)
    assert samples[0].metrics["sft_truncated"] == 1.0 and samples[0].status == Status.COMPLETED
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vime_ext.rollout.sft_rollout"):
        warn_overlong(samples, 20, "truncate")
    assert [r.getMessage() for r in caplog.records] == [
        f"2 of 2 chats over --sft-max-len 20 tokens (--sft-overlong truncate): 1 cut, 1 left out; the first: "
        f"{where(samples[0])}"]


def test_a_cut_that_leaves_no_assistant_token_skips_the_chat(qwen):
    masker = ChatMasker(qwen)
    sample = chat_sample(Sample(prompt=CHAT, metadata={"tools": TOOLS}), masker, 20, "truncate")
    assert sample.status == Status.FAILED and sample.metrics["sft_skipped"] == 1.0
    assert "over --sft-max-len 20" in sample.error


def test_a_chat_masked_again_comes_from_the_cache_within_its_token_bound(qwen):
    """SFT's later epochs: the same chat is not rendered again, and what the cache hands out is a copy; past
    ``cache_tokens`` chats are rendered every time."""
    tokenizer = with_template(qwen, TOOL_TEMPLATE)
    renders = []
    render = tokenizer.apply_chat_template
    tokenizer.apply_chat_template = lambda *a, **k: renders.append(1) or render(*a, **k)
    masker = ChatMasker(tokenizer)
    probes = len(renders)  # the template's tool support, probed once per masker
    first = masker(CHAT, TOOLS)
    once = len(renders) - probes
    assert once == 2 + 2 * 4  # the chat, its kept-content probe, and each of its 4 assistant turns twice
    first.sequences[0].tokens.clear()  # a caller's change does not reach the cache
    again = masker(CHAT, TOOLS)
    assert len(renders) == probes + once and again == ChatMasker(with_template(qwen, TOOL_TEMPLATE))(CHAT, TOOLS)
    assert masker(CHAT[:3], TOOLS) != again and len(renders) > probes + once  # another chat, another key
    with pytest.raises(ChatTemplateError, match=r"no assistant message to train on \(roles: system, user\)"):
        masker(CHAT[:2], TOOLS)
    bounded = ChatMasker(tokenizer, cache_tokens=len(again.sequences[0].tokens) - 1)
    before = len(renders)
    assert bounded(CHAT, TOOLS) == again and bounded(CHAT, TOOLS) == again
    assert len(renders) == before + 2 * once


def test_chats_masked_on_several_threads_equal_those_masked_one_at_a_time(qwen):
    """SFT's rollout masks a batch on threads (``mask_all``): every sample equals the one-at-a-time result, each
    chat is cached once, and a chat that cannot be masked raises the error of the first such chat in order."""
    tokenizer = with_template(qwen, TOOL_TEMPLATE)
    chats = [[{**m, "content": f"{m['content']} ({i})"} if m["role"] == "user" else m for m in CHAT]
             for i in range(24)]

    def samples(batch):
        return [Sample(prompt=chat, metadata={"tools": TOOLS}) for chat in batch]

    alone, threaded = samples(chats), samples(chats)
    one_by_one = ChatMasker(tokenizer)
    for sample in alone:
        chat_sample(sample, one_by_one)
    masker = ChatMasker(tokenizer)
    mask_all(threaded, masker, None, "error", threads=4)
    fields = ("tokens", "loss_mask", "response_length", "rollout_log_probs", "turns", "metrics", "status")
    assert [[getattr(s, f) for f in fields] for s in threaded] == [[getattr(s, f) for f in fields] for s in alone]
    assert len(masker._cache) == 24 and masker._cached_tokens == one_by_one._cached_tokens
    # A tokenizer whose file sets padding: its first call turns it off, before any thread starts
    padded = with_template(qwen, TOOL_TEMPLATE)
    padded.backend_tokenizer.enable_padding(pad_id=0)
    again = samples(chats)
    mask_all(again, ChatMasker(padded), None, "error", threads=4)
    assert padded.backend_tokenizer.padding is None
    assert [s.tokens for s in again] == [s.tokens for s in alone]
    bad = samples(chats[:3] + [CHAT[:2]] + chats[3:6] + [CHAT[:1]])
    with pytest.raises(RolloutError, match=r"no assistant message to train on \(roles: system, user\)"):
        mask_all(bad, masker, None, "error", threads=4)


def test_the_masking_bench_masks_the_same_chats_on_every_thread_count(qwen, tmp_path):
    """tools/bench_sft_mask.py: a row per thread count, each the whole batch's tokens, with its speed-up."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": CHAT, "tools": TOOLS}) + "\n" for _ in range(6)))
    tokenizer = with_template(qwen, TOOL_TEMPLATE)
    tokenizer.save_pretrained(tmp_path / "tok")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "tools/bench_sft_mask.py"), "--chats", str(chats),
                           "--tokenizer", str(tmp_path / "tok"), "--batch", "4", "--threads", "1", "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    one = len(ChatMasker(tokenizer)(CHAT, TOOLS).sequences[0].tokens)
    assert [(r["threads"], r["tokens"]) for r in rows] == [(1, 4 * one), (3, 4 * one)]
    assert rows[0]["speed-up"] == 1.0 and rows[1]["speed-up"] > 0
