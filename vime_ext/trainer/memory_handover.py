"""Colocated mode's memory hand-over: a trainer rank gives its accelerator memory to the engines while they
generate, and takes it back to train (what slime's ``--offload-train`` does with torch_memory_saver).

What leaves the GPU: the weights (the model's, the reference model's, the critic's), the gradient buffers and
whatever optimizer state lives on the GPU (fp32 masters, Adam moments). Each tensor storage is freed in place
(``resize_(0)``) and later re-allocated at the same size, so every view of it (megatron's parameters are views
of its contiguous buffers, ``main_grad`` of the gradient buffer) stays valid without being re-bound; then the
caching allocator's free blocks go back to the driver. Values that must survive are copied to pinned host
buffers, which are allocated once and reused; gradient buffers are zero between optimizer steps, so they are
freed without a copy and zeroed on return; the reference model never changes, so it is copied out once. The
optimizers' own state (fp32 masters, Adam moments) is needed by no forward or backward, only by the next optimizer
step: it comes back then (``restore_state``), not with the rest, so that the step's activations and that state
never share the device (a 4B model's masters and moments are 48 GB; W2 of tools/bench_peers.py ran out of an
H200's memory with both).

The same code runs on CPU tensors (``resize_`` works there too), which is how the CPU tests check that a
training run is unchanged by a hand-over; on a real CPU run there is nothing to hand over and the actor skips it.
"""

import contextlib
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

GiB = float(2**30)
PINNED_REPORT_GIB = 1.0  # pinned memory below this is not worth a log line


@dataclass
class _Slot:
    storage: torch.UntypedStorage
    nbytes: int
    # "copy" (values survive), "state" (values survive, back only at restore_state), "constant" (copied once),
    # "zero" (zeroed on return)
    policy: str
    host: torch.Tensor | None = None


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage, for copies."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass
class HandoverStats:
    """What one hand-over moved: bytes copied, bytes released (the storages' sizes), seconds."""

    copied_gb: float = 0.0
    released_gb: float = 0.0
    seconds: float = 0.0
    # Of ``seconds`` in a release: the copies to the host (until the device is done), and giving the freed memory
    # back to the driver (Python's garbage collection, CUDA IPC's, the allocator's cache). A release that copies
    # nothing still pays the second, which is what a hand-over costs beyond its bytes. ``collect_s``: the garbage
    # collection's share of ``return_s`` (on the CPU, where nothing is returned, ``return_s`` stays 0 and the
    # collection is timed alone).
    copy_s: float = 0.0
    return_s: float = 0.0
    collect_s: float = 0.0
    collect_found: float = 0.0  # the objects the collection found unreachable
    skipped: list[str] = field(default_factory=list)  # storages that cannot be freed in place (not resizable)

    def metrics(self) -> dict[str, float]:
        return {"handover_gb": self.released_gb, "handover_copied_gb": self.copied_gb, "handover_s": self.seconds,
                "handover_copy_s": self.copy_s, "handover_return_s": self.return_s,
                "handover_collect_s": self.collect_s, "handover_collect_found": self.collect_found,
                "handover_skipped": float(len(self.skipped))}


@dataclass
class HandoverTensors:
    """An optimizer's tensors by what a hand-over does with them."""

    kept: list[torch.Tensor]  # values survive, back with the weights (megatron's contiguous weight buffers)
    zeroed: list[torch.Tensor]  # zero between steps (gradient buffers): freed without a copy, zeroed on return
    state: list[torch.Tensor]  # values survive, back only for the next step (fp32 masters, Adam's moments)


class MemoryHandover:
    """Frees and restores a set of tensor storages. Tensors are named by group each time ``release`` is called
    (optimizer states appear at the first step, so the set is gathered anew), and a storage keeps its host
    buffer between hand-overs."""

    def __init__(self, device_type: str = "cuda"):
        self.device_type = device_type  # only storages on this kind of device are handed over
        self._slots: dict[int, _Slot] = {}  # by the storage's C++ identity, stable across resizes
        self._released: list[_Slot] = []
        self._state_released: list[_Slot] = []  # the optimizers' state, back at the next step

    def release(self, kept: list[torch.Tensor], zeroed: list[torch.Tensor] = (),
                constant: list[torch.Tensor] = (), spare: list[torch.Tensor] = (),
                state: list[torch.Tensor] = (), keep_state: bool = False) -> HandoverStats:
        """Free the storages of ``kept`` (copied out first), ``state`` (copied out; back at ``restore_state``;
        left in place with ``keep_state``), ``constant`` (copied out the first time) and ``zeroed`` (not copied),
        except those of ``spare`` (still needed: released by a later call). A storage named twice keeps the policy
        that restores it soonest and preserves most (a master that is the weight goes with the weight, even with
        ``keep_state``); one released already is left as it is."""
        start = time.perf_counter()
        stats = HandoverStats()
        spared = {t.untyped_storage()._cdata for t in spare if t is not None}
        chosen: dict[int, tuple[torch.UntypedStorage, str]] = {}
        rank = {"zero": 0, "constant": 1, "state": 2, "copy": 3}
        for policy, tensors in (("zero", zeroed), ("constant", constant), ("state", state), ("copy", kept)):
            for tensor in tensors:
                if tensor is None or tensor.device.type != self.device_type:
                    continue
                storage = tensor.untyped_storage()
                if storage.nbytes() == 0 or storage._cdata in spared:
                    continue
                key = storage._cdata
                if key not in chosen or rank[policy] > rank[chosen[key][1]]:
                    chosen[key] = (storage, policy)
        newly = []
        for key, (storage, policy) in chosen.items():
            if policy == "state" and keep_state:
                continue
            if not storage.resizable():
                stats.skipped.append(f"{storage.nbytes()} bytes on {storage.device}")
                continue
            slot = self._slots.get(key)
            if slot is None or slot.nbytes != storage.nbytes():
                slot = self._slots[key] = _Slot(storage, storage.nbytes(), policy)
            slot.policy = policy
            if policy in ("copy", "state") or (policy == "constant" and slot.host is None):
                if slot.host is None:
                    slot.host = torch.empty(slot.nbytes, dtype=torch.uint8,
                                            pin_memory=storage.device.type == "cuda")
                slot.host.copy_(_bytes_of(storage), non_blocking=True)
                stats.copied_gb += slot.nbytes / GiB
            newly.append(slot)
        _synchronize()
        stats.copy_s = time.perf_counter() - start
        for slot in newly:
            slot.storage.resize_(0)
            stats.released_gb += slot.nbytes / GiB
        self._released += [slot for slot in newly if slot.policy != "state"]
        self._state_released += [slot for slot in newly if slot.policy == "state"]
        returned = time.perf_counter()
        # Memory shared with an engine over CUDA IPC (the weight push) is only freed once Python collects the
        # handles the engine has closed, and a tensor held in a reference cycle only by a collection; until then
        # the allocator cannot give it back to the driver.
        stats.collect_found = collect_garbage()
        stats.collect_s = time.perf_counter() - returned
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
            stats.return_s = time.perf_counter() - returned
            # What keeps the engines from waking, named in the log before they try. Pinned memory is reserved
            # but not allocated, so below the report's floor the (slow, per-block) snapshot is not taken.
            if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() >= PINNED_REPORT_GIB * GiB:
                pinned = describe_pinned_segments(torch.cuda.memory_snapshot(), PINNED_REPORT_GIB)
                if pinned:
                    print(f"after the hand-over the allocator still holds {pinned}", flush=True)
        stats.seconds = time.perf_counter() - start
        return stats

    def restore(self) -> HandoverStats:
        """Re-allocate every released storage but the optimizers' state at its size and put its values back."""
        stats = self._restore(self._released)
        self._released = []
        return stats

    def restore_state(self) -> HandoverStats:
        """Put the optimizers' state back (the step that needs it is next); nothing to do if it is in place."""
        stats = self._restore(self._state_released)
        self._state_released = []
        return stats

    @staticmethod
    def _restore(slots: list[_Slot]) -> HandoverStats:
        start = time.perf_counter()
        stats = HandoverStats()
        for slot in slots:
            slot.storage.resize_(slot.nbytes)
            view = _bytes_of(slot.storage)
            if slot.policy == "zero":
                view.zero_()
            else:
                view.copy_(slot.host, non_blocking=True)
                stats.copied_gb += slot.nbytes / GiB
            stats.released_gb += slot.nbytes / GiB
        _synchronize()
        stats.seconds = time.perf_counter() - start
        return stats


# Whether collect_garbage has frozen the start-up objects. Kept here rather than read from gc.get_freeze_count(),
# which counts the frozen objects by walking them all: 35-80 ms a call on the 2-core CPU machine for a trainer
# rank's 390,000, against 0.3 ms for the collection itself (on an H200 machine's rank, with that call, a release's
# collection took 0.3-0.4 s: W1, 2026-12-01).
_frozen = False


def collect_garbage() -> int:
    """A full garbage collection that scans only what the process made since its first call here; the objects it
    found unreachable. The first call collects, then freezes what survives (``gc.freeze``): the imported modules,
    the model, the optimizer, some 400,000 objects in a trainer rank, which a full collection otherwise walks each
    time (0.2 s on a 2-core CPU; a colocated step runs two releases). Garbage made later, the weight push's IPC
    handles among it, is still collected; what was alive at the first call is never examined again, so it is only
    freed by reference counting: a rank's start-up objects live as long as the rank (vLLM freezes its engine's
    start-up objects the same way)."""
    global _frozen
    found = gc.collect()
    if not _frozen:
        gc.freeze()
        _frozen = True
    return found


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a torch optimizer holds: its parameters (megatron's fp32 masters) and their states, and those
    of its sub-optimizers (megatron's hybrid CPU/GPU optimizer keeps its GPU share's fp32 copies there)."""
    tensors = []
    for group in optimizer.param_groups:
        tensors += list(group["params"])
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    for inner in getattr(optimizer, "sub_optimizers", None) or []:
        tensors += optimizer_tensors(inner)
    return tensors


def memory_snapshot() -> dict[str, float]:
    """This rank's accelerator memory, GiB: allocated and reserved by its caching allocator, the peak allocated
    since the last snapshot, and the whole device's use (every process on it: the engine, when colocated); and
    its host memory (``host_memory``), which Ray's OOM killer watches."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    snap = {"allocated_gb": torch.cuda.memory_allocated() / GiB, "reserved_gb": torch.cuda.memory_reserved() / GiB,
            "peak_allocated_gb": torch.cuda.max_memory_allocated() / GiB, "device_used_gb": (total - free) / GiB,
            **host_memory()}
    torch.cuda.reset_peak_memory_stats()
    return snap


def host_memory() -> dict[str, float]:
    """This process's resident host memory, GiB, now and at its peak since the last call: the peak of a phase
    (a save with the optimizer on the host reached 92 GB on a one-GPU machine of 128). Linux's /proc: the peak is
    reset by writing 5 to clear_refs (where that is refused, it is the process's peak so far); {} without /proc."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    kib = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in status.splitlines() if ":" in line)
           if k in ("VmRSS", "VmHWM")}
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return {"host_rss_gb": kib["VmRSS"] * 1024 / GiB, "host_peak_rss_gb": kib["VmHWM"] * 1024 / GiB}


def describe_pinned_segments(segments: list[dict], floor_gb: float = 1.0, top: int = 4) -> str:
    """The caching allocator's segments that live blocks keep from the driver (``torch.cuda.memory_snapshot()``'s
    format), largest first, when they add up to ``floor_gb`` or more; "" otherwise. Each names its size, what is
    allocated in it, in how many blocks, and whether it is expandable (an expandable one returns its free pages)."""
    held = []
    for seg in segments:
        live = [b for b in seg.get("blocks", []) if b.get("state") == "active_allocated"]
        if live and not seg.get("is_expandable", False):
            held.append((seg["total_size"], sum(b["size"] for b in live), len(live)))
        elif live:  # an expandable segment keeps only its mapped, allocated pages
            held.append((sum(b["size"] for b in live), sum(b["size"] for b in live), len(live)))
    pinned = sum(size - used for size, used, _ in held)
    if pinned / GiB < floor_gb:
        return ""
    held.sort(reverse=True)
    parts = [f"{size / GiB:.2f} GiB segment with {used / 2**20:.1f} MiB in {n} live block(s)"
             for size, used, n in held[:top]]
    return f"{pinned / GiB:.2f} GiB pinned by live blocks: " + "; ".join(parts)


def _set_expandable_segments(enabled: bool) -> None:
    setting = f"expandable_segments:{enabled}"
    try:
        torch._C._accelerator_setAllocatorSettings(setting)
    except AttributeError:  # torch releases before the accelerator-generic allocator settings
        torch.cuda.memory._set_allocator_settings(setting)


def use_releasable_allocations() -> None:
    """A colocated trainer rank allocates from expandable segments for its whole life (call before its first
    CUDA allocation). A classic segment goes back to the driver only when every block in it is free, and one
    live block pins all of it: on an H100 with a colocated Qwen3-4B step, a 1.1 MiB tensor placed in the spare
    tail of the 15 GiB gradient buffer's segment (and another in the weights' 7.5 GiB one) kept 22.5 GiB from
    the engine's KV cache after every tensor of the hand-over had been freed. Expandable segments map memory in
    pages and return every page without a live block."""
    _set_expandable_segments(True)


@contextlib.contextmanager
def ipc_shareable_allocations(enabled: bool):
    """Allocate from classic segments inside this (the weight push over CUDA IPC: an expandable segment's memory
    is not what vLLM's IPC receiver maps), expandable ones again after it; what the push allocated is freed by
    the next hand-over's ``empty_cache`` (verl and miles switch the same setting around their weight sync)."""
    if not (enabled and torch.cuda.is_available()):
        yield
        return
    _set_expandable_segments(False)
    try:
        yield
    finally:
        _set_expandable_segments(True)
