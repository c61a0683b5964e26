"""A fixed model's greedy replies, one request per distinct prompt (vime_ext.engines.fixed_replies), against an
engine that answers the same prompt differently each time it is asked, as vLLM's batched bf16 kernels can."""

import asyncio
import json
import sys

import pytest
from aiohttp import web

from vime_ext.engines.fixed_replies import FixedModelReplies, ReplyFile, reply_file
from vime_ext.engines.protocol import GENERATE_ROUTE, GenerateResult, InvalidRequest, SamplingParams
from vime_ext.net import free_port

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4, log_probs=False)


class VaryingEngine:
    """Serves the generate route; the n-th request (from 0) is answered ``replies[n % len(replies)]``; the
    requests listed in ``refuse`` get a 400."""

    def __init__(self, replies: list[list[int]], refuse: tuple[int, ...] = ()):
        self.replies, self.refuse, self.requests = replies, refuse, []

    async def generate(self, request):
        body = await request.json()
        n = len(self.requests)
        self.requests.append(body["token_ids"])
        await asyncio.sleep(0.05)  # long enough for concurrent callers to find the request in flight
        if n in self.refuse:
            return web.json_response({"error": {"message": "refused"}}, status=400)
        choice = {"index": 0, "token_ids": self.replies[n % len(self.replies)], "finish_reason": "stop",
                  "logprobs": None}
        return web.Response(text=json.dumps({"choices": [choice]}), content_type="application/json")

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_post(GENERATE_ROUTE, self.generate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def test_each_greedy_prompt_is_asked_once_and_keeps_its_first_reply():
    engine = VaryingEngine([[11], [22], [33]])
    replies = FixedModelReplies()

    async def run():
        async with engine as url:
            together = await asyncio.gather(*[replies.generate(url, [1, 2, 3], GREEDY) for _ in range(8)],
                                            replies.generate(url, [4, 5], GREEDY))
            again = await replies.generate(url + "/", [1, 2, 3], GREEDY)  # the same engine, spelled otherwise
            again.token_ids.append(99)  # a caller's copy: the kept reply is untouched
            later = await replies.generate(url, [1, 2, 3], GREEDY)
            return together, later

    together, later = asyncio.run(run())
    assert engine.requests == [[1, 2, 3], [4, 5]]  # eight callers, one request
    assert {tuple(r.token_ids) for r in together[:8]} == {(11,)} and together[8].token_ids == [22]
    assert later.token_ids == [11] and replies.asked == 2 and replies.reused == 9 and len(replies) == 2


def test_sampled_requests_are_asked_every_time():
    engine = VaryingEngine([[11], [22]])
    replies = FixedModelReplies()

    async def run():
        async with engine as url:
            sampled = SamplingParams(temperature=1.0, max_new_tokens=4, log_probs=False)
            return [(await replies.generate(url, [1], sampled)).token_ids for _ in range(2)]

    assert asyncio.run(run()) == [[11], [22]] and len(engine.requests) == 2 and len(replies) == 0


def test_a_failed_request_is_not_kept_and_the_oldest_reply_goes_first():
    engine = VaryingEngine([[11], [22], [33], [44]], refuse=(0,))
    replies = FixedModelReplies(max_entries=1)

    async def run():
        async with engine as url:
            with pytest.raises(InvalidRequest):
                await replies.generate(url, [1], GREEDY)
            first = (await replies.generate(url, [1], GREEDY)).token_ids  # asked again
            other = (await replies.generate(url, [2], GREEDY)).token_ids  # pushes [1]'s reply out
            return first, other, (await replies.generate(url, [1], GREEDY)).token_ids

    assert asyncio.run(run()) == ([22], [33], [44]) and len(engine.requests) == 4


def test_an_unchanged_store_scores_the_same_before_and_after_with_a_fixed_reader(smollm2_dir):
    """MemUpdate's reward with a fixed reader (args.rm_url) that answers the gold date the first time it is asked
    and something else after: an episode that edits nothing gets a delta of exactly 0, and the second reward of
    the same store asks the reader nothing."""
    from transformers import AutoTokenizer

    from examples.mem_update.reward import reward
    from tests.examples.test_mem_update import _episode_sample
    from vime_ext.engines.fixed_replies import FIXED_REPLIES
    from vime_ext.rollout.config import RolloutConfig
    from vime_ext.rollout.plugins import plugin_args

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    engine = VaryingEngine([tokenizer("8 May 2023")["input_ids"], tokenizer("no idea")["input_ids"]])

    async def run():
        async with engine as url:
            args = plugin_args([RolloutConfig(rm_url=url)], {"memup_retriever": "bm25", "memup_scorer": "reader",
                                                              "memup_reader_tokenizer": str(smollm2_dir)})
            first = await reward(args, _episode_sample(lambda tools: None))
            return first, await reward(args, _episode_sample(lambda tools: None))

    asked = FIXED_REPLIES.asked
    first, second = asyncio.run(run())
    assert first["qa_before"] == first["qa_after"] == 1.0 and first["performance_delta"] == 0.0
    assert second == first and len(engine.requests) == 1 and FIXED_REPLIES.asked == asked + 1


ASK_IN_ANOTHER_PROCESS = """
import asyncio, sys
from types import SimpleNamespace
from vime_ext.engines.fixed_replies import FixedModelReplies
from vime_ext.engines.protocol import SamplingParams
args = SimpleNamespace(rm_url=sys.argv[1], rm_hf_checkpoint=sys.argv[2], rm_replies_file=sys.argv[3])
replies = FixedModelReplies()
result = asyncio.run(replies.ask(args, [1, 2, 3], SamplingParams(temperature=0.0, max_new_tokens=4, log_probs=False)))
print(result.token_ids, replies.asked)
"""


def test_processes_that_share_a_reply_file_get_the_first_reply(tmp_path):
    """Two processes (this one and a child) with one reply file: the child gets the reply this process stored and
    asks the engine nothing; another checkpoint under the same file is another model, asked afresh."""
    from types import SimpleNamespace

    engine = VaryingEngine([[11], [22], [33]])
    file = tmp_path / "replies.sqlite"

    async def run():
        async with engine as url:
            args = SimpleNamespace(rm_url=url, rm_hf_checkpoint=str(tmp_path / "reader"), rm_replies_file=str(file))
            mine = await FixedModelReplies().ask(args, [1, 2, 3], GREEDY)
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", ASK_IN_ANOTHER_PROCESS, url, args.rm_hf_checkpoint, str(file),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await child.communicate()
            assert child.returncode == 0, err.decode()[-2000:]
            args.rm_hf_checkpoint = str(tmp_path / "another_reader")
            other = await FixedModelReplies().ask(args, [1, 2, 3], GREEDY)
            return mine.token_ids, out.decode().split("\n")[0], other.token_ids

    mine, theirs, other = asyncio.run(run())
    assert mine == [11] and theirs == "[11] 0" and other == [22]
    assert len(engine.requests) == 2 and len(reply_file(file)) == 2


def test_the_first_reply_stored_stays_and_a_bad_file_is_named(tmp_path):
    """Two processes that asked at once both store: the second gets the first's reply back. A file that is not
    SQLite is refused with its name."""
    replies = ReplyFile(tmp_path / "r.sqlite")
    key = ReplyFile.key(str(tmp_path / "reader"), "abc", GREEDY)
    first = GenerateResult(token_ids=[1], log_probs=[float("nan")], finish_reason="stop")
    assert replies.put(key, first).token_ids == [1]
    assert replies.put(key, GenerateResult(token_ids=[2], log_probs=[0.0], finish_reason="stop")).token_ids == [1]
    assert replies.get(key).token_ids == [1] and replies.get(key + "x") is None
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a database, " * 100)
    with pytest.raises(ValueError, match="bad.sqlite: not a reply file"):
        ReplyFile(bad)
