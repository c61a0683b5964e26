"""vllm-router in front of two transformers engines: routing policies and a dead engine behind the router."""

import asyncio

import httpx
import pytest

from vime_ext.engines.client import RolloutClient
from vime_ext.engines.protocol import SamplingParams
from vime_ext.engines.servers import EngineConfig, launch_engine, launch_router, split_vllm_args, wait_until_serving

from .faults import kill_once_requests_wait, pause


@pytest.fixture
def two_engines(tiny_hf_dirs, tmp_path):
    engines = [launch_engine(EngineConfig(str(tiny_hf_dirs["llama"]), backend="hf", log_dir=str(tmp_path),
                                          env={"OMP_NUM_THREADS": "1"})) for _ in range(2)]
    try:
        wait_until_serving(engines, timeout_s=120)
        yield engines
    finally:
        for engine in engines:
            engine.stop()


def served(engines) -> list[int]:
    return [httpx.get(e.url + "/health").json()["requests_served"] for e in engines]


def run_requests(url: str, n: int, session_ids: list[str | None], max_new_tokens: int = 4,
                 kill: tuple | None = None):
    """``kill``: (engine URL, kill function) of a paused engine, killed once it holds a request."""
    async def run():
        client = RolloutClient(url, max_concurrency=n, backoff_s=0.1)
        tasks = [asyncio.create_task(client.generate([1, 2, 3 + i], SamplingParams(max_new_tokens=max_new_tokens),
                                                     session_id=session_ids[i % len(session_ids)]))
                 for i in range(n)]
        if kill:
            await kill_once_requests_wait(*kill)
        try:
            return await asyncio.gather(*tasks)
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.mark.parametrize("policy", ["consistent_hash", "round_robin"])
def test_policies(policy, two_engines, tmp_path):
    router = launch_router([e.url for e in two_engines], policy=policy, log_dir=str(tmp_path))
    try:
        wait_until_serving([router], timeout_s=60)
        before = served(two_engines)
        results = run_requests(router.url, 8, ["conversation-a"] if policy == "consistent_hash" else [None])
        counts = [after - b for after, b in zip(served(two_engines), before)]
    finally:
        router.stop()
    assert len(results) == 8 and all(r.token_ids for r in results)
    assert sum(counts) == 8
    if policy == "consistent_hash":  # one session: every turn on the engine that holds its prefix
        assert sorted(counts) == [0, 8], counts
    else:
        assert counts == [4, 4], counts


def test_dead_engine_behind_router(two_engines, tmp_path):
    router = launch_router([e.url for e in two_engines], policy="round_robin", log_dir=str(tmp_path))
    try:
        wait_until_serving([router], timeout_s=60)
        pause(two_engines[0].url)  # what the router sends to engine 0 waits there until the kill
        results = run_requests(router.url, 16, [None], max_new_tokens=24,
                               kill=(two_engines[0].url, two_engines[0].process.kill))
    finally:
        router.stop()
    assert len(results) == 16 and all(r.token_ids for r in results)


def test_vllm_flags_pass_through():
    own, vllm = split_vllm_args(["--lr", "1e-6", "--vllm-max-num-seqs", "64", "--vllm-enable-prefix-caching",
                                 "--vllm-kv-cache-dtype=fp8", "--seed", "3"])
    assert own == ["--lr", "1e-6", "--seed", "3"]
    assert vllm == ["--max-num-seqs", "64", "--enable-prefix-caching", "--kv-cache-dtype=fp8"]


def test_an_evaluation_serves_from_data_parallel_engines_behind_the_router(tiny_hf_dirs, tmp_path):
    """vime_ext.evaluate.served with engines=2 (eval_ruler_hqa's and vime_ext.evaluate's --num-engines): two
    engines and a router in front of them; requests spread over both; all three stopped on leaving."""
    from vime_ext.evaluate import served as serve

    config = EngineConfig(str(tiny_hf_dirs["llama"]), backend="hf", log_dir=str(tmp_path),
                          env={"OMP_NUM_THREADS": "1"})
    with serve(config, timeout_s=120, engines=2, router_policy="round_robin") as url:
        engines = [f"http://127.0.0.1:{log.stem.rsplit('_', 1)[1]}" for log in tmp_path.glob("hf_engine_*.log")]
        assert len(engines) == 2 and url not in engines and list(tmp_path.glob("router_*.log"))
        before = [httpx.get(e + "/health").json()["requests_served"] for e in engines]
        results = run_requests(url, 8, [None])
        counts = [httpx.get(e + "/health").json()["requests_served"] - b for e, b in zip(engines, before)]
    assert len(results) == 8 and counts == [4, 4], counts
    for address in [*engines, url]:
        with pytest.raises(httpx.TransportError):
            httpx.get(address + "/health", timeout=5)
