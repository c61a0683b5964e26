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
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

GiB = float(2**30)
PINNED_REPORT_GIB = 1.0  # pinned memory below this is not worth a log line
# Device memory that garbage may hold after a release whose collection is left to the background: a reference
# cycle that keeps more (a bucket of the weight push, an activation) is collected before the release returns.
COLLECT_SLACK_BYTES = 32 * 2**20


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
    # collection's share of ``return_s`` (on the CPU, where nothing is returned, all of it).
    copy_s: float = 0.0
    return_s: float = 0.0
    collect_s: float = 0.0
    # The collection left to a thread (``GarbageCollector``): 1.0 if this release did; the seconds of the last one
    # that finished and what the last collection found unreachable, in place or not.
    collect_deferred: float = 0.0
    background_collect_s: float = 0.0
    collect_found: float = 0.0
    skipped: list[str] = field(default_factory=list)  # storages that cannot be freed in place (not resizable)

    def metrics(self) -> dict[str, float]:
        return {"handover_gb": self.released_gb, "handover_copied_gb": self.copied_gb, "handover_s": self.seconds,
                "handover_copy_s": self.copy_s, "handover_return_s": self.return_s,
                "handover_collect_s": self.collect_s, "handover_collect_deferred": self.collect_deferred,
                "handover_background_collect_s": self.background_collect_s,
                "handover_collect_found": self.collect_found,
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

    def __init__(self, device_type: str = "cuda", allocated: Callable[[], int] | None = None):
        self.device_type = device_type  # only storages on this kind of device are handed over
        if allocated is None and device_type == "cuda" and torch.cuda.is_available():
            allocated = torch.cuda.memory_allocated
        self.collector = GarbageCollector(allocated)
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
        # the allocator cannot give it back to the driver. The collector decides whether that has to happen now.
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.ipc_collect()
        # A release that spares the weights is followed by the push, then by the release of the weights; after
        # that one the rank idles while the engines generate.
        kind = (bool(spared), keep_state)
        if self.collector.collect(kind, idle_next=not spared):
            stats.collect_s = time.perf_counter() - returned
            if cuda:
                torch.cuda.ipc_collect()
            self.collector.note_floor(kind)
        else:
            stats.collect_deferred = 1.0
        stats.background_collect_s, stats.collect_found = self.collector.background_s, self.collector.found
        if cuda:
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


def collect_garbage() -> int:
    """A full garbage collection that scans only what the process made since its first call here; what it found
    unreachable. The first call collects, then freezes what survives (``gc.freeze``): the imported modules, the
    model, the optimizer, half a million objects in a trainer rank, which a full collection otherwise walks each time
    (0.2 s on a 2-core CPU). Garbage made later, the weight push's IPC handles among it, is still collected; what was
    alive at the first call is never examined again, so it is only freed by reference counting: a rank's start-up
    objects live as long as the rank (vLLM freezes its engine's start-up objects the same way). On an H200 machine's
    trainer rank (W1 of tools/bench_peers.py) a collection still took 0.3-0.4 s after the freeze as before it, which
    is why ``GarbageCollector`` takes it off the hand-over's path where it can."""
    found = gc.collect()
    if not gc.get_freeze_count():  # nothing frozen yet: this is the first call
        gc.freeze()
    return found


class GarbageCollector:
    """Whether a release collects garbage before it returns, or leaves that to a thread while the engines generate.
    A collection matters to the hand-over only where garbage holds device memory (a tensor in a reference cycle, a
    weight push's IPC handles): memory the engines are about to take. So each kind of release collects in place the
    first time and notes what stays allocated after (``note_floor``); a later one of that kind that finds no more
    allocated than that, give or take ``COLLECT_SLACK_BYTES``, before collecting has no device memory in its garbage,
    and does not collect before it returns. ``allocated`` measures the device's allocated bytes; without
    it (the CPU, where nothing is handed to an engine) every release collects in place."""

    def __init__(self, allocated: Callable[[], int] | None):
        self._allocated = allocated
        self._floors: dict[Hashable, int] = {}
        self._thread: threading.Thread | None = None
        self.background_s = 0.0  # the last background collection's seconds
        self.found = 0  # what the last collection found unreachable

    def collect(self, kind: Hashable, idle_next: bool) -> bool:
        """Collect now (True) or not now (False). A collection not needed now runs on a thread if the rank is idle
        next (``idle_next``: the engines generate; one collection at a time), and otherwise waits for the next
        release: a thread collecting beside the weight push would hold the interpreter the push needs."""
        floor = self._floors.get(kind)
        if self._allocated is not None and floor is not None and self._allocated() <= floor + COLLECT_SLACK_BYTES:
            if idle_next and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._collect_in_background, name="handover-gc", daemon=True)
                self._thread.start()
            return False
        self.wait()  # two collections at once would only contend for the interpreter
        self.found = collect_garbage()
        return True

    def note_floor(self, kind: Hashable) -> None:
        """After an in-place collection: what this kind of release leaves allocated."""
        if self._allocated is not None:
            self._floors[kind] = self._allocated()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _collect_in_background(self) -> None:
        start = time.perf_counter()
        self.found = collect_garbage()
        self.background_s = time.perf_counter() - start


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
    since the last snapshot, and the whole device's use (every process on it: the engine, when colocated)."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    snap = {"allocated_gb": torch.cuda.memory_allocated() / GiB, "reserved_gb": torch.cuda.memory_reserved() / GiB,
            "peak_allocated_gb": torch.cuda.max_memory_allocated() / GiB, "device_used_gb": (total - free) / GiB}
    torch.cuda.reset_peak_memory_stats()
    return snap


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
