"""Push the trainer's weights into running engines through vLLM's RL routes.

Sequence per engine: ``/pause`` (in-flight requests aborted, caches dropped) -> ``/start_weight_update`` ->
``/update_weights`` per bucket -> ``/finish_weight_update`` (records the weight version) -> ``/resume``.
Buckets bound the memory a transfer holds at once. Two transports (the engine's ``--weight-transfer-config``
backend must match):

- ``vime_shm``: safetensors files in shared memory (``shm_weight_transfer.py``); any engine on the trainer's
  host, CPU or GPU.
- ``ipc``: vLLM's own CUDA IPC engine, for an engine on the trainer's GPU (colocated): each bucket travels as
  IPC handles of the trainer's GPU tensors, which the engine maps and copies from; nothing is copied to the host.

vLLM releases differ in one place here: 0.27+ records the weight version sent with ``/finish_weight_update`` and
reports it at ``/weight_info``; 0.26 has neither. ``versions()`` falls back to the version this side recorded
where the route is missing; nothing else depends on the release.
"""

import base64
import os
import pickle
import tempfile
import uuid
from typing import Iterable, Iterator

import httpx
import torch
from safetensors.torch import save_file


TRANSPORTS = ("vime_shm", "ipc")


def buckets(weights: Iterable[tuple[str, torch.Tensor]], max_bytes: int,
            device: str | None = "cpu") -> Iterator[dict[str, torch.Tensor]]:
    """Group ``(name, tensor)`` pairs into dicts of at most ``max_bytes`` (a larger tensor travels alone), each
    tensor contiguous and moved to ``device`` (None: left where it is)."""
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = {}, 0
        tensor = tensor.detach()
        bucket[name] = (tensor if device is None else tensor.to(device)).contiguous()
        size += nbytes
    if bucket:
        yield bucket


class WeightSyncError(RuntimeError):
    pass


def ipc_update_info(bucket: dict[str, torch.Tensor]) -> dict:
    """``/update_weights`` body for vLLM's ``ipc`` engine: per tensor, its CUDA IPC handle keyed by the GPU's
    UUID (the engine rebuilds the tensor on its own device index). The handles are pickled, which the engine
    accepts only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (set for colocated engines)."""
    from torch.multiprocessing.reductions import reduce_tensor

    handles = []
    for name, tensor in bucket.items():
        if not tensor.is_cuda:
            raise ValueError(f"ipc transport: {name} is on {tensor.device}; CUDA IPC shares GPU memory only")
        gpu = str(torch.cuda.get_device_properties(tensor.device).uuid)
        handles.append({gpu: reduce_tensor(tensor)[1]})
    return {"names": list(bucket), "dtype_names": [str(t.dtype).removeprefix("torch.") for t in bucket.values()],
            "shapes": [list(t.shape) for t in bucket.values()],
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode()}


class WeightSync:
    """Trainer side of the weight push for engines reachable at ``engine_urls``, over ``transport``."""

    def __init__(self, engine_urls: list[str], bucket_bytes: int = 512 * 2**20, transport: str = "vime_shm",
                 shm_dir: str | None = None, timeout_s: float = 600.0):
        if transport not in TRANSPORTS:
            raise ValueError(f"weight transport {transport!r} is not one of {TRANSPORTS}")
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.bucket_bytes = bucket_bytes
        self.transport = transport
        self.shm_dir = shm_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        self._http = httpx.Client(timeout=timeout_s)
        self._sent_versions: dict[str, str] = {}

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
        for bucket in buckets(weights, self.bucket_bytes, device="cpu" if self.transport == "vime_shm" else None):
            if self.transport == "ipc":
                # The bucket's tensors stay referenced until every engine has copied them (the call returns
                # after the engine loaded them), so the shared GPU memory is not reused under it.
                info = ipc_update_info(bucket)
                for url in self.engine_urls:
                    self.post(url, "/update_weights", json={"update_info": info})
            else:
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
            self._sent_versions[url] = str(version)

    def push(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """``begin``, ``send`` and ``finish`` for a single sender; returns the number of tensors sent."""
        self.begin()
        try:
            return self.send(weights)
        finally:
            self.finish(version)

    def versions(self) -> dict[str, str | None]:
        """Each engine's weight version: as the engine reports it, or, where it has no ``/weight_info`` (vLLM
        0.26), as last sent to it."""
        found = {}
        for url in self.engine_urls:
            response = self._http.get(url + "/weight_info")
            found[url] = (self._sent_versions.get(url) if response.status_code == 404
                          else response.json().get("weight_version"))
        return found

    def close(self) -> None:
        self._http.close()
