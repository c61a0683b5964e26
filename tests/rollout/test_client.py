"""RolloutClient against real transformers engines (two processes): concurrency, failover, bad input."""

import asyncio
import math

import pytest
import torch

from vime_ext.engines.client import EngineUnavailable, RolloutClient
from vime_ext.engines.protocol import InvalidRequest, SamplingParams
from vime_ext.engines.servers import EngineConfig, launch_engine, wait_until_serving
from vime_ext.net import free_port

from tests.engines.faults import kill_once_requests_wait, pause


@pytest.fixture(scope="module")
def engines(tiny_hf_dirs):
    """Two engines serving the tiny Llama (SmolLM2's tokenizer, random weights)."""
    engines = [launch_engine(EngineConfig(str(tiny_hf_dirs["llama"]), backend="hf",
                                          extra_args=["--max-batch-size", "8"], env={"OMP_NUM_THREADS": "1"}))
               for _ in range(2)]
    try:
        wait_until_serving(engines, timeout_s=120)
        yield [e.url for e in engines], [e.process for e in engines]
    finally:
        for engine in engines:
            engine.process.kill()
            engine.process.wait()


def prompts(tiny_hf_dirs, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["llama"])
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
            for i in range(n)]


def test_concurrent_requests_return_tokens_and_matching_log_probs(engines, tiny_hf_dirs):
    from transformers import AutoModelForCausalLM

    urls, _ = engines
    params = SamplingParams(temperature=0.7, max_new_tokens=12, seed=None)

    async def run():
        client = RolloutClient(urls, max_concurrency=16)
        try:
            return await asyncio.gather(*(client.generate(p, params) for p in prompts(tiny_hf_dirs, 16)))
        finally:
            await client.close()

    results = asyncio.run(run())
    assert len(results) == 16
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dirs["llama"], dtype=torch.float32).eval()
    diffs = []
    for prompt, result in zip(prompts(tiny_hf_dirs, 16), results):
        assert 1 <= len(result.token_ids) <= 12 and result.finish_reason in ("stop", "length")
        assert result.prompt_length == len(prompt)
        tokens = torch.tensor([prompt + result.token_ids])
        with torch.no_grad():
            logits = model(tokens).logits[0, len(prompt) - 1:-1].float() / params.temperature
            log_probs = torch.log_softmax(logits, dim=-1)  # the sampling distribution's
        recomputed = log_probs.gather(-1, torch.tensor(result.token_ids).unsqueeze(-1)).squeeze(-1)
        diffs.append((recomputed - torch.tensor(result.log_probs)).abs().max().item())
    # Batched (left-padded) generation vs one unpadded forward: only float rounding may differ.
    assert max(diffs) < 1e-3, diffs


def test_greedy_is_deterministic_and_respects_max_tokens(engines, tiny_hf_dirs):
    urls, _ = engines
    prompt = prompts(tiny_hf_dirs, 1)[0]

    async def run():
        client = RolloutClient(urls)
        try:
            a = await client.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5))
            b = await client.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5))
            return a, b
        finally:
            await client.close()

    a, b = asyncio.run(run())
    assert a.token_ids == b.token_ids and len(a.token_ids) <= 5


def test_prompt_log_probs_are_the_models_own_and_come_with_streamed_clients_too(engines, tiny_hf_dirs):
    """SamplingParams.prompt_log_probs: each prompt token's log-prob given those before it (NaN for the first), as
    the model's own forward pass gives it, through a whole-reply and a streaming client alike (the latter asks
    for a whole reply: the prompt's log-probs come only with one)."""
    from transformers import AutoModelForCausalLM

    urls, _ = engines
    prompt = prompts(tiny_hf_dirs, 1)[0]
    params = SamplingParams(temperature=0.0, max_new_tokens=1, log_probs=False, prompt_log_probs=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dirs["llama"], dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()
    for stream in (False, True):
        result = asyncio.run(_generate(urls[0], prompt, params, stream))
        assert len(result.prompt_log_probs) == len(prompt) and math.isnan(result.prompt_log_probs[0])
        assert result.prompt_log_probs[1:] == pytest.approx(expected, abs=1e-4)
    without = asyncio.run(_generate(urls[0], prompt, SamplingParams(temperature=0.0, max_new_tokens=1)))
    assert without.prompt_log_probs == []  # not asked for, not sent


async def _generate(url, prompt, params, stream=False):
    client = RolloutClient(url, stream=stream)
    try:
        return await client.generate(prompt, params)
    finally:
        await client.close()


def test_bad_requests_are_refused_with_the_reason(engines, tiny_hf_dirs):
    urls, _ = engines

    async def run():
        client = RolloutClient(urls[0])
        errors = []
        for tokens, params in (([], SamplingParams()),
                               ([1] * 200, SamplingParams(max_new_tokens=8)),
                               ([1, 2, 3], SamplingParams(top_p=0.0)),
                               ([10**9], SamplingParams())):
            with pytest.raises(InvalidRequest) as err:
                await client.generate(tokens, params)
            errors.append(str(err.value))
        assert client.retries == 0  # the request's fault: never retried
        await client.close()
        return errors

    empty, too_long, top_p, bad_id = asyncio.run(run())
    assert "empty prompt" in empty
    assert "exceeds the model's context of 128 tokens" in too_long and "HTTP 400" in too_long
    assert "top_p=0.0" in top_p
    assert "token ids must lie in" in bad_id


def test_unreachable_engine_is_named():
    async def run():
        client = RolloutClient(f"http://127.0.0.1:{free_port()}", max_retries=1, backoff_s=0.01)
        try:
            await client.generate([1, 2], SamplingParams(max_new_tokens=2))
        finally:
            await client.close()

    with pytest.raises(EngineUnavailable, match="failed on every try.*Cannot connect to host 127.0.0.1"):
        asyncio.run(run())


def test_killed_engine_requests_fail_over(engines, tiny_hf_dirs):
    """One engine dies with requests in flight: every request is answered once, by the survivor."""
    urls, procs = engines
    params = SamplingParams(temperature=1.0, max_new_tokens=24)

    async def run():
        client = RolloutClient(urls, max_concurrency=16, backoff_s=0.05)
        tasks = [asyncio.create_task(client.generate(p, params, request_id=f"r{i}"))
                 for i, p in enumerate(prompts(tiny_hf_dirs, 16))]
        held = await kill_once_requests_wait(urls[0], procs[0].kill)
        results = await asyncio.gather(*tasks)
        await client.close()
        return results, client.retries, held

    pause(urls[0])  # what reaches engine 0 waits there until the kill
    results, retries, held = asyncio.run(run())
    assert len(results) == 16 and all(r.token_ids for r in results)
    assert held >= 1 and retries >= held


def test_generate_fills_samples_and_records_failures(engines, tiny_hf_dirs):
    from transformers import AutoTokenizer

    from vime_ext.agent.generate import generate
    from vime_ext.agent.sample import Sample, Status
    from vime_ext.rollout.plugins import PluginArgs

    urls, procs = engines
    live = [u for u, p in zip(urls, procs) if p.poll() is None]
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["llama"])
    good = Sample(prompt=[{"role": "user", "content": "Name a colour."}], index=0)
    too_long = Sample(prompt="word " * 400, index=1)

    async def run():
        args = PluginArgs(tokenizer=tokenizer, rollout_client=RolloutClient(live))
        try:
            return await asyncio.gather(generate(args, good, SamplingParams(max_new_tokens=6)),
                                        generate(args, too_long, SamplingParams(max_new_tokens=6)))
        finally:
            await args.rollout_client.close()

    good, too_long = asyncio.run(run())
    assert good.status in (Status.COMPLETED, Status.TRUNCATED) and good.error is None
    assert good.response_length == len(good.loss_mask) == len(good.rollout_log_probs) >= 1
    assert good.tokens[: good.prompt_length] == list(tokenizer.apply_chat_template(
        good.prompt, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert good.response == tokenizer.decode(good.tokens[good.prompt_length:], skip_special_tokens=True)
    assert too_long.status == Status.FAILED and "exceeds the model's context" in too_long.error
    assert too_long.tokens == []


def test_weight_update_on_the_transformers_backend(tiny_hf_dirs, tmp_path):
    """The same trainer-side sync drives the transformers engine: new weights, new version, and log-probs that
    match a transformers model holding the pushed weights."""
    from transformers import AutoModelForCausalLM

    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.engines.weight_sync import WeightSync

    engine = launch_engine(EngineConfig(str(tiny_hf_dirs["llama"]), backend="hf", log_dir=str(tmp_path)))
    reader = HFCheckpointReader(tiny_hf_dirs["llama"])
    generator = torch.Generator().manual_seed(5)
    new_weights = {k: reader.get(k) + 0.05 * torch.randn(reader.get(k).shape, generator=generator)
                   for k in reader.keys()}
    prompt = prompts(tiny_hf_dirs, 1)[0]

    async def sample():
        client = RolloutClient(engine.url)
        try:
            return await client.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=8))
        finally:
            await client.close()

    try:
        wait_until_serving([engine], timeout_s=120)
        before = asyncio.run(sample())
        sync = WeightSync([engine.url], bucket_bytes=2 * 2**20)
        sync.init()
        assert sync.push(iter(new_weights.items()), version=7) == len(new_weights)
        assert sync.versions() == {engine.url: "7"}
        sync.close()
        after = asyncio.run(sample())
    finally:
        engine.stop()
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dirs["llama"], dtype=torch.float32).eval()
    model.load_state_dict(new_weights, strict=False)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + after.token_ids])).logits[0, len(prompt) - 1:-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(after.token_ids).unsqueeze(-1)).squeeze(-1)
    assert after.token_ids != before.token_ids
    assert (expected - torch.tensor(after.log_probs)).abs().max() < 1e-3


def test_group_rollout_with_plugins(engines, tiny_hf_dirs):
    """The default rollout function through run_rollout: groups numbered by position, the custom reward on
    every finished sample, failures kept as failures, the weight version stamped."""
    from transformers import AutoTokenizer

    from vime_ext.agent.sample import Status
    from vime_ext.data.prompt_dataset import PromptRecord
    from vime_ext.rollout.config import RolloutConfig
    from vime_ext.rollout.data_source import DataSource
    from vime_ext.rollout.plugins import plugin_args
    from vime_ext.rollout.rollout import run_rollout

    urls, procs = engines
    live = [u for u, p in zip(urls, procs) if p.poll() is None]
    config = RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=4, rollout_max_response_len=6,
                           custom_rm_path="tests.rollout.test_client.reward_by_length")
    args = plugin_args([config])
    args.tokenizer, args.weight_version = AutoTokenizer.from_pretrained(tiny_hf_dirs["llama"]), 2
    records = [PromptRecord([{"role": "user", "content": "2+2?"}], "4", {}, "a:1"),
               PromptRecord("word " * 300, "x", {}, "a:2")]  # too long for the tiny model's 128-token context
    output = run_rollout(args, live[0], 0, DataSource(records, 4))
    good, bad = output.groups
    assert [s.index for s in good + bad] == list(range(8))
    assert {s.group_index for s in good} == {0} and {s.group_index for s in bad} == {1}
    for sample in good:
        assert sample.status in (Status.COMPLETED, Status.TRUNCATED) and sample.weight_version == 2
        assert sample.reward == float(sample.response_length) and sample.metadata["source"] == "a:1"
    assert all(s.status == Status.FAILED and s.reward is None and "context" in s.error for s in bad)
    # The failed group was regenerated once (the same refusal again), then dropped: it trains nothing.
    first, last = output.metrics.pop("first_sample_s"), output.metrics.pop("last_sample_s")
    assert 0.0 < first <= last  # when the first and the last of the 8 + 4 regenerated samples finished
    assert output.metrics == {"samples_regenerated": 4.0, "groups_dropped": 1.0}


def counts(output) -> dict[str, float]:
    """A rollout's metrics but its timing (when the first and the last sample finished)."""
    return {k: v for k, v in output.metrics.items() if not k.endswith("_sample_s")}


_FIRST_TRIES: set[int] = set()


async def faulty_reward(args, sample):
    """A reward that misbehaves as its prompt's label asks:
    "flaky" raises the first time the group's first sample is scored, "broken" always raises, "hang" blocks past the
    timeout, "nan" returns NaN, anything else is the response length."""
    if sample.label == "flaky" and sample.index % 2 == 0 and sample.index not in _FIRST_TRIES:
        _FIRST_TRIES.add(sample.index)
        raise ConnectionError("reward service hiccup\nretry later")
    if sample.label == "broken":
        raise KeyError("no gold answer for this prompt")
    if sample.label == "hang":
        await asyncio.sleep(30)
    if sample.label == "nan":
        return float("nan")
    return float(sample.response_length)


def test_a_plugin_that_raises_or_hangs_fails_its_sample_not_the_run(engines, tiny_hf_dirs, caplog):
    """Per sample: an exception (its last line kept), a timeout, a NaN reward fail that sample; its group is
    regenerated once (a flaky reward recovers) and dropped if still short, so GRPO never sees a partial group.
    With --failed-sample-policy drop nothing is regenerated. Only past --max-failed-fraction does the rollout
    stop, naming the first failure."""
    from transformers import AutoTokenizer

    from vime_ext.agent.sample import TRAINABLE, Status
    from vime_ext.data.prompt_dataset import PromptRecord
    from vime_ext.rollout.config import RolloutConfig
    from vime_ext.rollout.data_source import DataSource
    from vime_ext.rollout.plugins import plugin_args
    from vime_ext.rollout.rollout import run_rollout
    from vime_ext.rollout.validate import RolloutError

    urls, procs = engines
    live = [u for u, p in zip(urls, procs) if p.poll() is None]
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["llama"])
    # The timeout covers generation too: 4 s, not 1, so that no 4-token answer of a loaded machine (the suite runs
    # on two workers) times out before its reward is asked, which would turn the flaky reward's recovery into a
    # failure (seen: "7 of 10 samples failed" with a 1 s timeout while the other worker trained).
    labels = ["fine", "flaky", "broken", "hang", "nan"]
    records = [PromptRecord(f"Say {label}.", label, {}, f"f:{i + 1}") for i, label in enumerate(labels)]

    def rollout(policy: str, max_failed: float = 0.75):
        config = RolloutConfig(rollout_batch_size=5, n_samples_per_prompt=2, rollout_max_response_len=4,
                               custom_rm_path="tests.rollout.test_client.faulty_reward", rollout_sample_timeout=4.0,
                               failed_sample_policy=policy, max_failed_fraction=max_failed)
        args = plugin_args([config])
        args.tokenizer = tokenizer
        _FIRST_TRIES.clear()
        return run_rollout(args, live[0], 0, DataSource(records, 2))

    output = rollout("regenerate")
    fine, flaky, broken, hang, nan = output.groups
    assert all(s.status in TRAINABLE for s in fine + flaky)  # the flaky reward recovered on the second try
    assert [s.status for s in broken] == [Status.FAILED] * 2
    assert broken[0].error == "KeyError: 'no gold answer for this prompt'"
    assert all(s.error == "timed out after 4 s (--rollout-sample-timeout)" for s in hang)
    assert all(s.status == Status.FAILED and "reward" in s.error and "nan" in s.error.lower() for s in nan)
    assert counts(output) == {"samples_regenerated": 7.0, "groups_dropped": 3.0}
    assert "ConnectionError: retry later" in caplog.text  # logged with its last line (and the traceback)

    output = rollout("drop")
    assert counts(output) == {"samples_regenerated": 0.0, "groups_dropped": 4.0}
    flaky = output.groups[1]
    failed = next(s for s in flaky if s.status == Status.FAILED)
    assert failed.error == "ConnectionError: retry later"
    assert all(s.status == Status.ABORTED and s.error.startswith("dropped with its group: sample (group 1")
               for s in flaky if s is not failed)

    with pytest.raises(RolloutError, match=r"6 of 10 samples failed, more than --max-failed-fraction 0.5; the first, "
                                           r"sample \(group 2, index 4, f:3\): KeyError"):
        rollout("regenerate", max_failed=0.5)


_ACTIVE = {"now": 0, "most": 0}
_ACTIVE_LOCK = __import__("threading").Lock()


def slow_plain_reward(args, sample) -> float:
    """A plain-def reward: blocks for 6 s on the first sample of the prompt "hang", 0.05 s otherwise; counts how
    many of its calls overlap."""
    import time

    with _ACTIVE_LOCK:
        _ACTIVE["now"] += 1
        _ACTIVE["most"] = max(_ACTIVE["most"], _ACTIVE["now"])
    time.sleep(6.0 if sample.label == "hang" and sample.index == 0 else 0.3)
    with _ACTIVE_LOCK:
        _ACTIVE["now"] -= 1
    return 1.0


def test_plain_def_plugins_run_off_the_loop_and_time_out(engines, tiny_hf_dirs):
    """A plain-def plug-in runs on threads, several calls at once (as async ones interleave); one that blocks
    fails its own sample at --rollout-sample-timeout while the others finish."""
    from transformers import AutoTokenizer

    from vime_ext.agent.sample import TRAINABLE, Status
    from vime_ext.data.prompt_dataset import PromptRecord
    from vime_ext.rollout.config import RolloutConfig
    from vime_ext.rollout.data_source import DataSource
    from vime_ext.rollout.plugins import plugin_args
    from vime_ext.rollout.rollout import run_rollout

    urls, procs = engines
    live = [u for u, p in zip(urls, procs) if p.poll() is None]

    def rollout(label: str):
        config = RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=3, rollout_max_response_len=4,
                               custom_rm_path="tests.rollout.test_client.slow_plain_reward",
                               rollout_sample_timeout=2.0, failed_sample_policy="drop", max_failed_fraction=1.0)
        args = plugin_args([config])
        args.tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["llama"])
        records = [PromptRecord(f"Say {label} {i}.", label, {}, f"s:{i}") for i in range(2)]
        return [s for g in run_rollout(args, live[0], 0, DataSource(records, 3)).groups for s in g]

    _ACTIVE.update(now=0, most=0)
    assert all(s.status in TRAINABLE and s.reward == 1.0 for s in rollout("fine"))
    assert _ACTIVE["most"] > 1  # the event loop went on while one call slept
    hung = rollout("hang")
    assert hung[0].error == "timed out after 2 s (--rollout-sample-timeout)"
    assert all(s.status in TRAINABLE for s in hung[3:])  # the other group: scored beside the hung call
    assert {s.status for s in hung[1:3]} == {Status.ABORTED}  # dropped with the hung sample's group


async def reward_by_length(args, sample) -> float:
    """A custom reward for the plug-in test (async, as slime's are): the response length."""
    return float(sample.response_length)


def test_the_manual_s_agent_runs(engines, tiny_hf_dirs, tmp_path, monkeypatch):
    """The example agent of docs/agents.md ("Writing an agent"), as printed there, through the default rollout
    function: three sequences per trajectory, the reward and its extra metric."""
    import re
    import sys
    from pathlib import Path

    from transformers import AutoTokenizer

    from vime_ext.data.prompt_dataset import PromptRecord
    from vime_ext.rollout.config import RolloutConfig
    from vime_ext.rollout.data_source import DataSource
    from vime_ext.rollout.plugins import plugin_args
    from vime_ext.rollout.rollout import rollout_metrics, run_rollout

    page = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    code = re.search(r"A three-chat agent.*?```python\n(.*?)```", page, re.S).group(1)
    (tmp_path / "manual_agent.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    urls, procs = engines
    live = [u for u, p in zip(urls, procs) if p.poll() is None]
    config = RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=2, rollout_max_response_len=5,
                           custom_generate_function_path="manual_agent.generate",
                           custom_rm_path="manual_agent.reward")
    args = plugin_args([config], {"num_chats": 3})
    args.tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dirs["llama"])
    records = [PromptRecord(f"What is {i} + {i}?", str(2 * i), {}, f"q:{i}") for i in range(2)]
    output = run_rollout(args, live[0], 0, DataSource(records, 2))
    samples = [s for g in output.groups for s in g]
    assert all(len(s.turns) == 2 and s.reward in (0.0, 1.0) for s in samples)
    metrics = rollout_metrics(samples, "rollout")
    assert metrics["rollout/sequences_per_sample"] == 3.0 and "rollout/no_answer" in metrics
    sys.modules.pop("manual_agent", None)


def test_a_reply_paused_for_a_weight_update_continues_from_its_tokens(engines, tiny_hf_dirs):
    """--partial-rollout at the client (tests/engines/partial.py): replies paused half made continue from their
    tokens under version 1, and the log-probs of each stitched reply are the model's for those tokens (the
    engine recomputed the prefix)."""
    from transformers import AutoModelForCausalLM

    from tests.engines.partial import check_stitched, interrupted_replies

    url = next(u for u, process in zip(*engines) if process.poll() is None)  # the fail-over test killed one
    asked = prompts(tiny_hf_dirs, 8)
    params = SamplingParams(temperature=1.0, max_new_tokens=128 - max(len(p) for p in asked), ignore_eos=True)
    results, segments = interrupted_replies(url, asked, params)
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dirs["llama"], dtype=torch.float32).eval()
    split = 0
    for i, (prompt, result) in enumerate(zip(asked, results)):
        split += check_stitched(prompt, result, segments[f"r{i}"], params.max_new_tokens)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + result.token_ids])).logits[0, len(prompt) - 1:-1].float()
        recomputed = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(result.token_ids)[:, None])[:, 0]
        assert (recomputed - torch.tensor(result.log_probs)).abs().max().item() < 1e-3
    assert split > 0  # at least one reply has tokens of both versions


def test_streamed_replies_from_the_transformers_engine_equal_whole_ones(engines, tiny_hf_dirs):
    """--rollout-stream-interval on the transformers backend: it answers a streamed request with the whole reply
    as one piece, so the client's streamed result is the whole one."""
    urls, _ = engines
    params = SamplingParams(temperature=0.0, max_new_tokens=10)

    async def run(stream):
        client = RolloutClient(urls[-1], stream=stream)  # the engine that test_killed_engine_requests_fail_over spares
        try:
            return await asyncio.gather(*(client.generate(p, params) for p in prompts(tiny_hf_dirs, 3)))
        finally:
            await client.close()

    whole, streamed = asyncio.run(run(False)), asyncio.run(run(True))
    for w, s, p in zip(whole, streamed, prompts(tiny_hf_dirs, 3)):
        assert s.token_ids == w.token_ids and s.finish_reason == w.finish_reason and s.prompt_length == len(p)
        assert s.log_probs == pytest.approx(w.log_probs, abs=1e-5)


def test_a_streamed_reply_is_put_back_together_however_its_bytes_arrive():
    """vLLM's pieces (``data:`` events of a few tokens each, then ``data: [DONE]``) split at every possible byte:
    the same result each time; an error piece, a stream cut before [DONE] and a malformed piece are named."""
    import json
    import math

    from vime_ext.engines.protocol import StreamedReply, StreamFailed

    def piece(tokens, finish=None):
        return {"request_id": "r", "choices": [{"index": 0, "token_ids": tokens, "finish_reason": finish, "logprobs": {
            "content": [{"token_id": t, "logprob": -t / 10, "top_logprobs": []} for t in tokens]}}]}

    pieces = (piece([1, 2]), piece([3, 4]), piece([5], "length"))
    events = b"".join(f"data: {json.dumps(p)}\n\n".encode() for p in pieces)
    stream = events + b"data: [DONE]\n\n"
    for size in (1, 7, 64, len(stream)):
        reply = StreamedReply()
        done = [reply.feed(stream[i:i + size]) for i in range(0, len(stream), size)]
        assert done[-1] and done == sorted(done)  # once [DONE] has come, and not before
        result = reply.result()
        assert result.token_ids == [1, 2, 3, 4, 5] and result.log_probs == [-0.1, -0.2, -0.3, -0.4, -0.5]
        assert result.finish_reason == "length"
    bare = StreamedReply(log_probs=False)
    bare.feed(stream)
    assert all(math.isnan(lp) for lp in bare.result().log_probs)
    # an aborted request (a pause with no new token) gets no last piece: no finish reason means "abort"
    aborted = StreamedReply()
    aborted.feed(f"data: {json.dumps(piece([1]))}\n\ndata: [DONE]\n\n".encode())
    assert aborted.result().finish_reason == "abort" and aborted.result().token_ids == [1]

    # stream_pieces (the transformers engine's answer, the client bench's stand-in) writes the same stream
    from vime_ext.engines.protocol import GenerateResult, stream_pieces

    whole = GenerateResult([1, 2, 3, 4, 5], [-0.1, -0.2, -0.3, -0.4, -0.5], "length")
    for interval, events_written in ((2, 4), (None, 2)):
        written = stream_pieces("r", whole, interval=interval)
        again = StreamedReply()
        assert len(written) == events_written and [again.feed(e) for e in written][-1]
        assert (again.result().token_ids, again.result().log_probs, again.result().finish_reason) == \
            (whole.token_ids, whole.log_probs, "length")
        assert json.loads(written[0][5:])["choices"][0]["finish_reason"] == (None if interval else "length")

    cut = StreamedReply()
    assert not cut.feed(events[:-5])
    with pytest.raises(StreamFailed, match="ended before data: \\[DONE\\]"):
        cut.result()
    with pytest.raises(StreamFailed, match="engine core died"):
        StreamedReply().feed(b'data: {"error": {"message": "engine core died", "code": 500}}\n\n')
    with pytest.raises(ValueError, match="malformed piece of a streamed generate reply"):
        StreamedReply().feed(b'data: {"choices": [{"token_ids": [1], "logprobs": {"content": [{}]}}]}\n\n')


def test_a_stream_that_fails_midway_is_tried_again():
    """An engine that reports an error in the middle of a streamed reply, or whose stream is cut before [DONE],
    is retried like a 5xx answer; the reply then comes whole from the next try."""
    import json

    from aiohttp import web

    tries = []

    async def generate(request):
        tries.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        first = {"choices": [{"index": 0, "token_ids": [7], "finish_reason": None, "logprobs": None}]}
        await response.write(f"data: {json.dumps(first)}\n\n".encode())
        if len(tries) == 1:
            await response.write(b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n')
        elif len(tries) == 2:
            pass  # cut: no [DONE]
        else:
            last = {"choices": [{"index": 0, "token_ids": [8], "finish_reason": "length", "logprobs": None}]}
            await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        return response

    async def run():
        app = web.Application()
        app.router.add_post("/inference/v1/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        client = RolloutClient(f"http://127.0.0.1:{port}", stream=True, backoff_s=0.01)
        try:
            return await client.generate([1, 2], SamplingParams(max_new_tokens=2, log_probs=False)), client.retries
        finally:
            await client.close()
            await runner.cleanup()

    result, retries = asyncio.run(run())
    assert result.token_ids == [7, 8] and result.finish_reason == "length" and retries == 2
    assert all(t["stream"] is True for t in tries) and len(tries) == 3
