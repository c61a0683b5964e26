"""Push the trainer's weights into running engines through vLLM's RL routes.

Sequence per engine: ``/pause`` (in-flight requests aborted, caches dropped) -> ``/start_weight_update`` ->
``/update_weights`` per bucket -> ``/finish_weight_update`` (records the weight version) -> ``/resume``.
Buckets bound the memory a transfer holds at once. The CPU transport is ``vime_shm`` (safetensors files in
shared memory, see ``shm_weight_transfer.py``).
"""

import os
import tempfile
import uuid
from typing import Iterable, Iterator

import httpx
import torch
from safetensors.torch import save_file


def buckets(weights: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """Group ``(name, tensor)`` pairs into dicts of at most ``max_bytes`` (a larger tensor travels alone)."""
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = tensor.detach().to("cpu").contiguous()
        size += nbytes
    if bucket:
        yield bucket


class WeightSyncError(RuntimeError):
    pass


class SharedMemoryWeightSync:
    """Trainer side of the ``vime_shm`` transport, for engines reachable at ``engine_urls``."""

    def __init__(self, engine_urls: list[str], bucket_bytes: int = 512 * 2**20, shm_dir: str | None = None,
                 timeout_s: float = 600.0):
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.bucket_bytes = bucket_bytes
        self.shm_dir = shm_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        self._http = httpx.Client(timeout=timeout_s)

    def post(self, url: str, route: str, **kwargs) -> None:
        """POST to one engine; an error answer raises ``WeightSyncError`` with the engine's reason."""
        response = self._http.post(url + route, **kwargs)
        if response.status_code >= 400:
            raise WeightSyncError(f"{url}{route}: HTTP {response.status_code} {response.text[:500]}")

    def init(self, urls: list[str] | None = None) -> None:
        """Set up the transfer engine on every engine (or on ``urls``, e.g. restarted ones)."""
        for url in urls or self.engine_urls:
            self.post(url, "/init_weight_transfer_engine", json={"init_info": {}})

    def begin(self) -> None:
        """Pause every engine (in-flight requests are aborted and retried later) and open an update."""
        for url in self.engine_urls:
            self.post(url, "/pause", params={"mode": "abort"})
            self.post(url, "/start_weight_update")

    def send(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Send tensors to every engine in buckets; returns how many were sent. Several senders (one per
        pipeline stage) may send between one ``begin`` and ``finish``."""
        sent = 0
        for bucket in buckets(weights, self.bucket_bytes):
            path = os.path.join(self.shm_dir, f"vime_ext_weights_{uuid.uuid4().hex}.safetensors")
            save_file(bucket, path)
            try:
                for url in self.engine_urls:
                    self.post(url, "/update_weights", json={"update_info": {"path": path, "names": list(bucket)}})
            finally:
                os.unlink(path)
            sent += len(bucket)
        return sent

    def finish(self, version: int) -> None:
        """Close the update (the engines record ``version``) and resume serving."""
        for url in self.engine_urls:
            self.post(url, "/finish_weight_update", json={"weight_version": str(version)})
            self.post(url, "/resume")

    def push(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """``begin``, ``send`` and ``finish`` for a single sender; returns the number of tensors sent."""
        self.begin()
        try:
            return self.send(weights)
        finally:
            self.finish(version)

    def versions(self) -> dict[str, str | None]:
        return {url: self._http.get(url + "/weight_info").json().get("weight_version") for url in self.engine_urls}

    def close(self) -> None:
        self._http.close()
