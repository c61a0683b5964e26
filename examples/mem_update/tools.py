"""MemUpdate's six tools, their JSON schemas (OpenAI function format, rendered by the chat template or put in
the system prompt), and ``ToolBox``, which runs a parsed call on one namespace.

Every tool changes or reads the store for real. Merge and split need new text; both make it deterministically
from the memories' own sentences (no model call), so the same call on the same store always gives the same
result:

- merge ``concatenate``: the memories' texts one after the other; ``summarize``: their sentences without
  repeats (a sentence whose words are nearly all in an earlier kept one is left out); ``extract_common``: the
  sentences of the first memory that share a content word with every other memory. The merged memory replaces
  the originals.
- split ``speaker``: a part per sentence subject (the sentence's leading name; "she"/"he" sentences stay with
  the one before); ``temporal``: a new part at each sentence that names a date or time; ``thematic``: cut where
  neighbouring sentences share the fewest content words. Parts beyond ``max_parts`` join their smallest
  neighbour; the parts replace the original.

A call the tool cannot do (unknown id, a merge of one id, nothing to split, bad arguments) answers with an
``error`` and changes nothing.
"""

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from examples.mem_update.store import MEMORY_TYPES, Memory, Namespace
from vime_ext.agent.tool_calls import ToolCall, check_arguments

MEMORY_TYPE = {"type": "string", "enum": list(MEMORY_TYPES)}


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


TOOLS = [
    _tool("search_memory", "Find the memories most related to a query.", {
        "query": {"type": "string", "description": "what to look for"},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 20, "description": "how many (default 5)"},
        "memory_type": MEMORY_TYPE,
        "threshold": {"type": "number", "description": "leave out matches scoring below this"}}, ["query"]),
    _tool("manage_memory", "Create a memory, or rewrite an existing one (operation update with its memory_id).", {
        "operation": {"type": "string", "enum": ["create", "update"]},
        "content": {"type": "string", "minLength": 1, "description": "the memory's text"},
        "memory_type": MEMORY_TYPE,
        "metadata": {"type": "object"},
        "source": {"type": "string"},
        "memory_id": {"type": "string", "description": "the memory to update"}}, ["operation", "content"]),
    _tool("delete_memory", "Delete a memory.", {
        "memory_id": {"type": "string"}, "reason": {"type": "string"}}, ["memory_id"]),
    _tool("sample_memory", "Look at a few memories of the store.", {
        "k": {"type": "integer", "minimum": 1, "maximum": 20, "description": "how many (default 3)"},
        "memory_type": MEMORY_TYPE,
        "strategy": {"type": "string", "enum": ["random", "diverse", "recent"]}}, []),
    _tool("merge_memory", "Replace 2 to 5 memories with one.", {
        "memory_ids": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 5,
                       "uniqueItems": True},
        "strategy": {"type": "string", "enum": ["summarize", "concatenate", "extract_common"]}}, ["memory_ids"]),
    _tool("split_memory", "Replace one memory with 2 to max_parts smaller ones.", {
        "memory_id": {"type": "string"},
        "split_criteria": {"type": "string", "enum": ["temporal", "thematic", "speaker"]},
        "max_parts": {"type": "integer", "minimum": 2, "maximum": 5}}, ["memory_id", "split_criteria"]),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CHANGES_STORE = ("manage_memory", "delete_memory", "merge_memory", "split_memory")


class ToolError(Exception):
    """A call the tool refuses; its message goes back to the policy."""


# What a failed call got wrong: the <tool_call> block (unclosed, not JSON, no name), the tool's name, the
# arguments against its schema, or the call itself (an unknown memory id, a split of one sentence, ...).
ERROR_KINDS = ("format", "unknown_tool", "arguments", "tool")


@dataclass
class ToolResult:
    name: str
    content: dict[str, Any]  # the tool message's JSON
    error: bool
    error_kind: str = ""  # one of ERROR_KINDS but "format" (the parser's, before a call reaches the box)

    @property
    def text(self) -> str:
        return json.dumps(self.content, ensure_ascii=False)


# ---- sentences and words ------------------------------------------------------------------------------------

_STOP = frozenset("a an and are as at be but by did do for from had has have he her his i in is it its me my "
                  "of on or our she so that the their them they this to was we were what when where which who "
                  "will with you your about after before also been into than then there these those".split())
_DATE = re.compile(r"\b(january|february|march|april|may|june|july|august|september|october|november|december|"
                   r"jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|monday|tuesday|wednesday|thursday|friday|"
                   r"saturday|sunday|yesterday|today|tomorrow|tonight|last (?:week|month|year|weekend)|"
                   r"next (?:week|month|year)|\d{4}|\d{1,2}:\d{2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?)\b", re.IGNORECASE)
_PRONOUNS = frozenset("she he they it her his their this that these there then".split())


def sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[.!?;])\s+", text.strip())
    return [p.strip() for p in parts if p.strip()]


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in _STOP and len(w) > 1}


def _join(parts: list[str]) -> str:
    return " ".join(p if p[-1] in ".!?;" else p + "." for p in parts if p)


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, min(len(a), len(b)))


# ---- merge and split, deterministic ---------------------------------------------------------------------------

def merge_text(contents: list[str], strategy: str) -> str:
    if strategy == "concatenate":
        return _join([c.strip() for c in contents])
    if strategy == "summarize":
        kept: list[tuple[str, set[str]]] = []
        for sentence in (s for c in contents for s in sentences(c)):
            words = content_words(sentence)
            if not any(words and _overlap(words, other) >= 0.8 and len(words) <= len(other) for _, other in kept):
                kept.append((sentence, words))
        return _join([s for s, _ in kept])
    if strategy == "extract_common":
        others = [content_words(c) for c in contents[1:]]
        common = [s for s in sentences(contents[0]) if all(content_words(s) & o for o in others)]
        if not common:
            raise ToolError("these memories share no content word; merge them with concatenate or summarize")
        return _join(common)
    raise ToolError(f"unknown merge strategy {strategy!r}")


def _subject(sentence: str) -> str | None:
    first = re.match(r"[A-Za-z']+", sentence)
    if not first or first.group(0).lower() in _PRONOUNS:
        return None
    return first.group(0) if first.group(0)[0].isupper() else None


def split_groups(text: str, criteria: str, max_parts: int) -> list[list[str]]:
    units = sentences(text)
    if len(units) < 2:
        raise ToolError("this memory is a single sentence; there is nothing to split")
    groups: list[list[str]] = []
    if criteria == "speaker":
        keys: list[str | None] = []
        for sentence in units:
            key = _subject(sentence)
            key = key if key is not None else (keys[-1] if keys else None)
            if keys and key == keys[-1]:
                groups[-1].append(sentence)
            elif key in keys:
                groups[keys.index(key)].append(sentence)
            else:
                keys.append(key)
                groups.append([sentence])
    elif criteria == "temporal":
        for sentence in units:
            if not groups or _DATE.search(sentence):
                groups.append([sentence])
            else:
                groups[-1].append(sentence)
    elif criteria == "thematic":
        words = [content_words(s) for s in units]
        gaps = sorted(range(1, len(units)), key=lambda i: (_overlap(words[i - 1], words[i]), i))
        cuts = sorted(gaps[:max_parts - 1])
        groups = [units[a:b] for a, b in zip([0, *cuts], [*cuts, len(units)])]
    else:
        raise ToolError(f"unknown split criteria {criteria!r}")
    while len(groups) > max_parts:  # the smallest part joins its smaller neighbour
        i = min(range(len(groups)), key=lambda k: (sum(map(len, groups[k])), k))
        j = i - 1 if i == len(groups) - 1 or (i > 0 and sum(map(len, groups[i - 1])) <= sum(map(len, groups[i + 1])))\
            else i + 1
        a, b = sorted((i, j))
        groups[a:b + 1] = [groups[a] + groups[b]]
    if len(groups) < 2:
        raise ToolError(f"by {criteria} this memory is one part; try another split_criteria")
    return groups


# ---- the tool box -----------------------------------------------------------------------------------------

class ToolBox:
    """Runs calls on one namespace with one retriever."""

    def __init__(self, namespace: Namespace, retriever, seed: int = 0):
        self.namespace, self.retriever = namespace, retriever
        self.rng = random.Random(seed)

    def run(self, call: ToolCall) -> ToolResult:
        if call.name not in SCHEMAS:
            return ToolResult(call.name, {"error": f"unknown tool {call.name!r}; the tools are {sorted(SCHEMAS)}"},
                              True, "unknown_tool")
        problem = check_arguments(SCHEMAS[call.name], call.arguments)
        if problem:
            return ToolResult(call.name, {"error": f"{call.name}: {problem}"}, True, "arguments")
        try:
            return ToolResult(call.name, getattr(self, call.name)(**call.arguments), False)
        except ToolError as err:
            return ToolResult(call.name, {"error": f"{call.name}: {err}"}, True, "tool")

    def _memory(self, memory_id: str) -> Memory:
        if memory_id not in self.namespace:
            raise ToolError(f"no memory with id {memory_id!r}")
        return self.namespace.get(memory_id)

    def _of_type(self, memory_type: str | None) -> list[Memory]:
        return [m for m in self.namespace.memories() if memory_type is None or m.memory_type == memory_type]

    def search_memory(self, query: str, top_k: int = 5, memory_type: str | None = None,
                      threshold: float | None = None) -> dict:
        hits = self.retriever.search(query, self._of_type(memory_type), top_k, threshold)
        return {"results": [{**m.view(), "score": round(s, 3)} for m, s in hits]}

    def manage_memory(self, operation: str, content: str, memory_type: str | None = None,
                      metadata: dict | None = None, source: str | None = None, memory_id: str | None = None) -> dict:
        if operation == "create":
            if memory_id is not None:
                raise ToolError("create makes a new id; leave memory_id out (or use operation update)")
            memory = self.namespace.create(content, memory_type or "episodic", metadata, source or "agent")
            return {"created": memory.view()}
        if memory_id is None:
            raise ToolError("update needs the memory_id of the memory to rewrite")
        old = self._memory(memory_id)
        memory = self.namespace.update(memory_id, content=content, memory_type=memory_type, source=source,
                                       metadata={**old.metadata, **metadata} if metadata else None)
        return {"updated": memory.view()}

    def delete_memory(self, memory_id: str, reason: str | None = None) -> dict:
        self._memory(memory_id)
        self.namespace.delete(memory_id)
        return {"deleted": memory_id, "remaining": len(self.namespace)}

    def sample_memory(self, k: int = 3, memory_type: str | None = None, strategy: str = "random") -> dict:
        pool = self._of_type(memory_type)
        if strategy == "recent":
            chosen = sorted(pool, key=lambda m: m.order, reverse=True)[:k]
        elif strategy == "random":
            chosen = self.rng.sample(pool, min(k, len(pool)))
        else:  # diverse: each next memory is the one sharing the fewest words with those already chosen
            words = {m.id: content_words(m.content) for m in pool}
            chosen = pool[:1]
            while len(chosen) < min(k, len(pool)):
                rest = [m for m in pool if m not in chosen]
                chosen.append(min(rest, key=lambda m: max(_overlap(words[m.id], words[c.id]) for c in chosen)))
        return {"memories": [m.view() for m in chosen], "total": len(self.namespace)}

    def merge_memory(self, memory_ids: list[str], strategy: str = "concatenate") -> dict:
        originals = [self._memory(i) for i in memory_ids]
        text = merge_text([m.content for m in originals], strategy)
        for m in originals:
            self.namespace.delete(m.id)
        metadata = {"merged_from": list(memory_ids)}
        evidence = [e for m in originals for e in m.metadata.get("evidence", [])]
        if evidence:
            metadata["evidence"] = evidence
        memory = self.namespace.create(text, originals[0].memory_type, metadata, "merge")
        return {"merged": memory.view(), "removed": list(memory_ids)}

    def split_memory(self, memory_id: str, split_criteria: str, max_parts: int = 3) -> dict:
        original = self._memory(memory_id)
        groups = split_groups(original.content, split_criteria, max_parts)
        self.namespace.delete(memory_id)
        parts = [self.namespace.create(_join(g), original.memory_type, {**original.metadata, "split_from": memory_id},
                                       "split") for g in groups]
        return {"parts": [p.view() for p in parts], "removed": memory_id}
