"""Killing an engine with requests in flight, whatever the machine's speed: the engine is paused first, so the
requests it receives wait inside it, and it is killed once its /health counts at least one waiting."""

import asyncio
import time

import httpx


def pause(url: str) -> None:
    httpx.post(url + "/pause", timeout=30).raise_for_status()


async def kill_once_requests_wait(url: str, kill, timeout_s: float = 300.0) -> int:
    """Call ``kill()`` when the paused engine at ``url`` holds a request; returns how many it held."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=30) as http:
        while True:
            waiting = (await http.get(url + "/health")).json()["requests_waiting"]
            if waiting:
                kill()
                return waiting
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} received no request in {timeout_s:.0f} s")
            await asyncio.sleep(0.05)
