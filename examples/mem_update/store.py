"""The memory store: one namespace per episode.

A ``Namespace`` holds one episode's memories (id -> ``Memory``) and a snapshot of where it started; the tools
get the namespace, never the store, so no call can reach another episode's memories. ``MemoryStore`` hands out
namespaces by a fresh id (many episodes run at once in one process: the rollout's event loop) and drops each
after its reward.
"""

import threading
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

MEMORY_TYPES = ("episodic", "semantic", "procedural")


@dataclass(frozen=True)
class Memory:
    id: str
    content: str
    memory_type: str = "episodic"
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    order: int = 0  # creation order within the namespace ("recent" sampling)

    def view(self) -> dict[str, Any]:
        """What a tool shows the policy (with the date of the session the memory came from, where known: LoCoMo's
        observations do not say it in their text)."""
        shown = {"id": self.id, "content": self.content, "memory_type": self.memory_type}
        if self.metadata.get("date"):
            shown["date"] = self.metadata["date"]
        return shown

    @classmethod
    def from_record(cls, record: dict[str, Any], order: int) -> "Memory":
        return cls(id=str(record["id"]), content=str(record["content"]),
                   memory_type=record.get("memory_type", "episodic"), metadata=dict(record.get("metadata") or {}),
                   source=str(record.get("source", "")), order=order)


class Namespace:
    """One episode's memories. ``initial`` is the snapshot taken at creation, for the reward's before/after."""

    def __init__(self, name: str, memories: list[Memory]):
        self.name = name
        self._memories: dict[str, Memory] = {}
        for memory in memories:
            if memory.id in self._memories:
                raise ValueError(f"namespace {name}: memory id {memory.id!r} appears twice")
            self._memories[memory.id] = memory
        self.initial: tuple[Memory, ...] = tuple(self._memories.values())
        self._next = len(self._memories)

    def __len__(self) -> int:
        return len(self._memories)

    def __contains__(self, memory_id: str) -> bool:
        return memory_id in self._memories

    def memories(self) -> list[Memory]:
        return list(self._memories.values())

    def get(self, memory_id: str) -> Memory:
        if memory_id not in self._memories:
            raise KeyError(f"no memory with id {memory_id!r}")
        return self._memories[memory_id]

    def create(self, content: str, memory_type: str = "episodic", metadata: dict | None = None,
               source: str = "agent") -> Memory:
        self._next += 1
        memory = Memory(f"m{self._next}", content, memory_type, dict(metadata or {}), source, self._next)
        self._memories[memory.id] = memory
        return memory

    def update(self, memory_id: str, **changes) -> Memory:
        memory = replace(self.get(memory_id), **{k: v for k, v in changes.items() if v is not None})
        self._memories[memory_id] = memory
        return memory

    def delete(self, memory_id: str) -> Memory:
        memory = self.get(memory_id)
        del self._memories[memory_id]
        return memory


class MemoryStore:
    """Namespaces by name; thread-safe, since reward functions may run off the event loop."""

    def __init__(self):
        self._namespaces: dict[str, Namespace] = {}
        self._lock = threading.Lock()

    def create(self, records: list[dict[str, Any]], prefix: str = "episode") -> Namespace:
        namespace = Namespace(f"{prefix}-{uuid.uuid4().hex[:12]}",
                              [Memory.from_record(r, i) for i, r in enumerate(records)])
        with self._lock:
            self._namespaces[namespace.name] = namespace
        return namespace

    def get(self, name: str) -> Namespace:
        with self._lock:
            if name not in self._namespaces:
                raise KeyError(f"memory namespace {name!r} does not exist (already dropped?)")
            return self._namespaces[name]

    def drop(self, name: str) -> None:
        with self._lock:
            self._namespaces.pop(name, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._namespaces)


STORE = MemoryStore()  # the rollout process's store: generate creates namespaces, the reward drops them
