"""Push the trainer's weights into running engines through vLLM's RL routes.

Sequence per engine: ``/pause`` (in-flight requests aborted, caches dropped) -> ``/start_weight_update`` ->
``/update_weights`` per bucket -> ``/finish_weight_update`` (records the weight version) -> ``/resume``.
Buckets bound the memory a transfer holds at once. Two transports (the engine's ``--weight-transfer-config``
backend must match):

- ``vime_shm``: safetensors files in shared memory (``shm_weight_transfer.py``); any engine on the trainer's
  host, CPU or GPU.
- ``ipc``: vLLM's own CUDA IPC engine, for engines on the trainer's GPUs (colocated): each bucket travels as
  IPC handles of GPU tensors, which the engine maps and copies from; nothing is copied to the host. Every engine
  worker maps the copy on its own GPU, found by that GPU's UUID: the trainer ranks on an engine's GPUs each hold
  the full bucket, gather their handles to the first of them (``IpcShare``), and it posts one request per bucket
  to the engines on those GPUs alone (one, or ``--rollout-engines-per-gpu`` of them, each mapping the same copy).
- ``nccl``: vLLM's own NCCL engine, for engines on other GPUs or nodes: the sender is rank 0 of one NCCL group
  with every engine worker (``connect``) and broadcasts each bucket's tensors while the engines'
  ``/update_weights`` calls, which block until they have received them, wait in threads.

vLLM releases differ in one place here: 0.27+ records the weight version sent with ``/finish_weight_update`` and
reports it at ``/weight_info``; 0.26 has neither. ``versions()`` falls back to the version this side recorded
where the route is missing; nothing else depends on the release.
"""

import base64
import os
import pickle
import socket
import tempfile
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator
from urllib.parse import urlparse

import httpx
import torch
from safetensors.torch import save_file

from vime_ext.net import LOOPBACK

TRANSPORTS = ("vime_shm", "ipc", "nccl")


@dataclass(frozen=True)
class WeightTarget:
    """Where the trainer sends weights and over which transport; the rollout manager says, the sender follows."""
    urls: tuple[str, ...]
    transport: str
    workers_per_engine: int = 1  # an engine's GPUs: its ranks in an NCCL group
    generation: int = 0  # bumped whenever engines restart: an NCCL group with them must be formed again
    engine_ranks: tuple[tuple[int, ...], ...] = ()  # ipc: per engine, the trainer ranks on its GPUs in its order

    def ipc_engines_of(self, rank: int) -> list[int]:
        """ipc: the engines on trainer rank ``rank``'s GPU (several share it with --rollout-engines-per-gpu)."""
        engines = [engine for engine, ranks in enumerate(self.engine_ranks) if rank in ranks]
        if not engines:
            raise WeightSyncError(f"ipc transport: trainer rank {rank} is on none of the engines' GPUs "
                                  f"({self.engine_ranks or 'no routes given'})")
        if len({self.engine_ranks[e] for e in engines}) > 1:
            raise WeightSyncError(f"ipc transport: trainer rank {rank} is on engines of different GPU sets "
                                  f"({[self.engine_ranks[e] for e in engines]})")
        return engines


def choose_transport(requested: str, engine_backend: str, on_gpu: bool, colocate: bool,
                     pipeline_size: int) -> str:
    """The transport for ``--weight-transport`` (``auto``: ipc for colocated vLLM on GPUs, nccl for vLLM on
    GPUs of their own, vime_shm otherwise); raises ``ValueError`` for a choice these engines cannot take."""
    vllm_gpu = engine_backend == "vllm" and on_gpu
    if requested == "auto":
        if not vllm_gpu:
            return "vime_shm"
        # One NCCL group has one sender; pipeline stages each send their own layers, so they use files.
        return "ipc" if colocate else ("nccl" if pipeline_size == 1 else "vime_shm")
    if requested not in TRANSPORTS:
        raise ValueError(f"--weight-transport {requested!r} is not one of auto, {', '.join(TRANSPORTS)}")
    if requested != "vime_shm" and not vllm_gpu:
        raise ValueError(f"--weight-transport {requested} needs vLLM engines on GPUs; the transformers engine and "
                         "CPU engines take vime_shm")
    if requested == "ipc" and not colocate:
        raise ValueError("--weight-transport ipc shares the trainer's GPU memory; it needs --colocate")
    if requested == "nccl" and colocate:
        raise ValueError("--weight-transport nccl cannot join a trainer and an engine on the same GPU; colocated "
                         "engines take ipc")
    if requested == "nccl" and pipeline_size > 1:
        raise ValueError("--weight-transport nccl has one sender; with --pipeline-model-parallel-size > 1 use "
                         "vime_shm")
    return requested


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


def packed(bucket: dict[str, torch.Tensor], align: int = 256) -> dict[str, torch.Tensor]:
    """The bucket's tensors copied into one new allocation, as views of it (same names, dtypes and shapes, each
    starting on an ``align``-byte boundary). The IPC push shares these instead of the trainer's own tensors: the
    engine maps memory that belongs to the push alone and is freed whole after it, whatever allocator segments
    the weights live in."""
    sizes = [t.numel() * t.element_size() for t in bucket.values()]
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + -(-size // align) * align)
    device = next(iter(bucket.values())).device
    flat = torch.empty(offsets[-1] + sizes[-1], dtype=torch.uint8, device=device)
    out = {}
    for (name, tensor), offset, size in zip(bucket.items(), offsets, sizes):
        out[name] = flat[offset:offset + size].view(tensor.dtype).view(tensor.shape)
        out[name].copy_(tensor)
    return out


class WeightSyncError(RuntimeError):
    pass


def tensor_meta(bucket: dict[str, torch.Tensor]) -> dict:
    """Names, dtypes and shapes of a bucket: what every vLLM transfer engine's update info starts with."""
    return {"names": list(bucket), "dtype_names": [str(t.dtype).removeprefix("torch.") for t in bucket.values()],
            "shapes": [list(t.shape) for t in bucket.values()]}


def cuda_ipc_share(tensor: torch.Tensor) -> tuple[str, object]:
    """The UUID of the GPU ``tensor`` lives on and a CUDA IPC handle of it (what ``reduce_tensor`` pickles; the
    engine rebuilds the tensor on its own device index)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if not tensor.is_cuda:
        raise ValueError(f"ipc transport: a tensor on {tensor.device}; CUDA IPC shares GPU memory only")
    return str(torch.cuda.get_device_properties(tensor.device).uuid), reduce_tensor(tensor)[1]


def gpu_handles(bucket: dict[str, torch.Tensor], share: Callable = cuda_ipc_share) -> tuple[str, list]:
    """This process's part of an IPC bucket: its GPU's UUID and one handle per tensor, in the bucket's order."""
    gpus, handles = set(), []
    for name, tensor in bucket.items():
        try:
            gpu, handle = share(tensor)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
        gpus.add(gpu)
        handles.append(handle)
    if len(gpus) != 1:
        raise ValueError(f"ipc transport: one bucket's tensors lie on {len(gpus)} GPUs ({sorted(gpus)}); a rank "
                         "shares the copy on its own GPU only")
    return gpus.pop(), handles


def ipc_update_info(bucket: dict[str, torch.Tensor], parts: list[tuple[str, list]]) -> dict:
    """``/update_weights`` body for vLLM's ``ipc`` engine: per tensor, a dict from each of the engine's GPU UUIDs to
    the handle of the copy on that GPU (``parts``: ``gpu_handles`` of each rank on the engine's GPUs). The
    handles are pickled, which the engine accepts only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (set for
    colocated engines)."""
    gpus = [gpu for gpu, _ in parts]
    if len(set(gpus)) != len(gpus):
        raise WeightSyncError(f"ipc transport: two ranks of one engine share a GPU ({gpus})")
    for gpu, handles in parts:
        if len(handles) != len(bucket):
            raise WeightSyncError(f"ipc transport: the rank on GPU {gpu} shared {len(handles)} tensors of a bucket "
                                  f"of {len(bucket)}; the ranks of one engine must push the same buckets")
    handles = [{gpu: part[i] for gpu, part in parts} for i in range(len(bucket))]
    return {**tensor_meta(bucket), "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode()}


@dataclass
class IpcShare:
    """How one trainer rank takes part in an IPC push: ``group``, the ranks on its engine's GPUs (None: it is the
    only one), gathers every rank's handles to global rank ``lead``, which posts them; ``share`` names a tensor's
    GPU and makes its handle (stand-in devices in the tests)."""
    group: object | None = None
    lead: int = 0
    posts: bool = True
    share: Callable[[torch.Tensor], tuple[str, object]] = cuda_ipc_share


def _raise_refusal(calls: list[Future]) -> None:
    """Raise the error of the first engine call that has already failed."""
    for call in calls:
        if call.done() and call.exception() is not None:
            raise call.exception()


def nccl_rendezvous(host: str, port: int, rank: int, world_size: int):
    """vLLM's TCP-store rendezvous for the weight push's group (``StatelessProcessGroup``, apart from
    torch.distributed's groups); rank 0's store listens on ``host`` alone (``trainer_address``: the loopback
    when every engine is local). In vLLM 0.26 and 0.32."""
    from vllm.distributed.utils import StatelessProcessGroup

    return StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)


def vllm_nccl_group(host: str, port: int, rank: int, world_size: int):
    """This process's end of the group vLLM's NCCL engine forms on its workers: the rendezvous and vLLM's NCCL
    communicator on the current GPU (its bootstrap sockets on the loopback when this rank's are:
    ``loopback_sockets_env``)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    return PyNcclCommunicator(nccl_rendezvous(host, port, rank, world_size), device=torch.cuda.current_device())


def trainer_address(engine_urls: list[str]) -> str:
    """The address engines reach this process at: loopback when every engine is local, else this node's IP."""
    if all(urlparse(u).hostname in LOOPBACK for u in engine_urls):
        return "127.0.0.1"
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return socket.gethostbyname(socket.gethostname())


class WeightSync:
    """Trainer side of the weight push for engines reachable at ``engine_urls``, over ``transport``."""

    def __init__(self, engine_urls: list[str], bucket_bytes: int = 512 * 2**20, transport: str = "vime_shm",
                 shm_dir: str | None = None, timeout_s: float = 600.0, ipc: IpcShare | None = None):
        """``ipc``: with the ipc transport, this process's part among the ranks on the engine's GPUs (default:
        alone, posting its own handles to every engine in ``engine_urls``)."""
        if transport not in TRANSPORTS:
            raise ValueError(f"weight transport {transport!r} is not one of {TRANSPORTS}")
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.bucket_bytes = bucket_bytes
        self.transport = transport
        self.shm_dir = shm_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        self._http = httpx.Client(timeout=timeout_s)
        self._sent_versions: dict[str, str] = {}
        self.group = None  # nccl: this process's end of the group with the engines' workers (``connect``)
        self.ipc = ipc or IpcShare()

    def post(self, url: str, route: str, **kwargs) -> None:
        """POST to one engine; an error answer raises ``WeightSyncError`` with the engine's reason."""
        response = self._http.post(url + route, **kwargs)
        if response.status_code >= 400:
            raise WeightSyncError(f"{url}{route}: HTTP {response.status_code} {response.text[:500]}")

    def post_each(self, route: str, **kwargs) -> None:
        """POST the same request to every engine at once (each copies the bucket on its own; engines sharing a GPU
        would otherwise copy one after another); waits for all, then raises the first engine's error."""
        self.post_all(route, [kwargs] * len(self.engine_urls))

    def post_all(self, route: str, requests: list[dict]) -> None:
        """POST engine i its own request (``requests[i]``: ``post``'s keyword arguments), all at once, as
        ``post_each``."""
        if len(self.engine_urls) == 1:
            self.post(self.engine_urls[0], route, **requests[0])
            return
        with ThreadPoolExecutor(len(self.engine_urls)) as pool:
            calls = [pool.submit(self.post, url, route, **request)
                     for url, request in zip(self.engine_urls, requests, strict=True)]
        for call in calls:
            call.result()

    def init(self, urls: list[str] | None = None) -> None:
        """Set up the transfer engine on every engine (or on ``urls``, e.g. restarted ones). Nothing to do for
        nccl here: its group is formed by the sender, the trainer, in ``connect``."""
        if self.transport == "nccl":
            return
        for url in urls or self.engine_urls:
            self.post(url, "/init_weight_transfer_engine", json={"init_info": {}})

    def connect(self, workers_per_engine: int = 1, host: str | None = None,
                make_group: Callable = vllm_nccl_group) -> None:
        """nccl: form the group of this sender (rank 0) and every engine worker (engine i's workers from rank
        1 + i x ``workers_per_engine``). Each engine's ``/init_weight_transfer_engine`` returns only once the
        whole group has met, so those calls wait in threads while this process joins. Call again after engines
        restart: the old group lost its members."""
        from vime_ext.net import free_port

        if self.transport != "nccl":
            raise ValueError(f"connect() forms an NCCL group; the {self.transport} transport has none")
        host = host or trainer_address(self.engine_urls)
        port, world_size = free_port(), 1 + len(self.engine_urls) * workers_per_engine
        self.group = None
        with ThreadPoolExecutor(len(self.engine_urls)) as pool:
            calls = [pool.submit(self.post, url, "/init_weight_transfer_engine", json={"init_info": {
                "master_address": host, "master_port": port, "rank_offset": 1 + i * workers_per_engine,
                "world_size": world_size}}) for i, url in enumerate(self.engine_urls)]
            group = make_group(host, port, 0, world_size)
            for call in calls:
                call.result()
        self.group = group

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
            if self.transport == "nccl":
                self._broadcast(bucket)
            elif self.transport == "ipc":
                self._send_ipc(packed(bucket))
            else:
                path = os.path.join(self.shm_dir, f"vime_ext_weights_{uuid.uuid4().hex}.safetensors")
                save_file(bucket, path)
                try:
                    self.post_each("/update_weights", json={"update_info": {"path": path, "names": list(bucket)}})
                finally:
                    os.unlink(path)
            sent += len(bucket)
        return sent

    def _send_ipc(self, bucket: dict[str, torch.Tensor]) -> None:
        """One bucket over CUDA IPC: every rank on the engine's GPUs gives its handles to the lead, which posts
        them in one request. All keep the bucket until the engine has copied it (the lead's post returns after
        the engine loaded it; the others wait for the lead's word), so the shared memory is not reused under it;
        an engine's refusal is raised on every rank of the group, so none waits for a bucket that never comes.

        Each engine gets handles made for it alone. torch counts a shared block's users in one counter per share,
        which the one process that opens the handle releases: two engines opening one share release it twice, the
        (unsigned) counter wraps and the sender never frees the block. With two engines on a GPU
        (``--rollout-engines-per-gpu 2``) every push then kept a copy of the weights on the trainer's GPU, 7.5 GiB
        a step at Qwen3-4B's shape, until the engines could not wake (records/peers_w2_h200_run3)."""
        import torch.distributed as dist

        mine = [gpu_handles(bucket, self.ipc.share) for _ in self.engine_urls]
        parts, failure = [mine], None
        if self.ipc.group is not None:
            parts = [None] * dist.get_world_size(self.ipc.group) if self.ipc.posts else None
            dist.gather_object(mine, parts, dst=self.ipc.lead, group=self.ipc.group)
        if self.ipc.posts:
            try:
                self.post_all("/update_weights", [
                    {"json": {"update_info": ipc_update_info(bucket, [rank[engine] for rank in parts])}}
                    for engine in range(len(self.engine_urls))])
            except Exception as error:  # noqa: BLE001 (told to the group, then raised here)
                failure = error
        if self.ipc.group is not None:
            word = [None if failure is None else f"{type(failure).__name__}: {failure}"]
            dist.broadcast_object_list(word, src=self.ipc.lead, group=self.ipc.group)
            if failure is None and word[0] is not None:
                raise WeightSyncError(f"ipc transport: rank {self.ipc.lead}, which posts this engine's buckets, "
                                      f"failed: {word[0]}")
        if failure is not None:
            raise failure

    def _broadcast(self, bucket: dict[str, torch.Tensor]) -> None:
        """One bucket over NCCL: every engine's ``/update_weights`` (it receives in the order of the names it is
        given) runs in a thread while this process broadcasts the tensors in that order. An engine that refuses
        the update never joins the broadcast: its answer is raised instead of waiting on it for ever, and the
        group is dropped (``connect`` again)."""
        if self.group is None:
            raise WeightSyncError("nccl transport: no group with the engines; call connect() first")
        info = tensor_meta(bucket)
        pool = ThreadPoolExecutor(len(self.engine_urls))
        calls = [pool.submit(self.post, url, "/update_weights", json={"update_info": info})
                 for url in self.engine_urls]
        try:
            _raise_refusal(calls)
            on_gpu = next(iter(bucket.values())).is_cuda
            for tensor in bucket.values():
                self.group.broadcast(tensor, src=0, stream=torch.cuda.current_stream() if on_gpu else None)
            if on_gpu:  # NCCL only queued the broadcasts; the bucket may be freed once they have run
                done = torch.cuda.Event()
                done.record()
                while not done.query():
                    _raise_refusal(calls)
                    time.sleep(0.001)
            for call in calls:
                call.result()
        except BaseException:
            self.group = None
            _raise_refusal(calls)
            raise
        finally:
            pool.shutdown(wait=False)  # a thread still waiting in a broken broadcast must not hold this one

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
