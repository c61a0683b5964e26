"""Reading and writing HF safetensors checkpoints one tensor at a time."""

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# Files copied verbatim from the original HF checkpoint next to converted weights.
HF_SIDE_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
    "chat_template.jinja",
)


class HFCheckpointReader:
    """Lazy access to the tensors of an HF checkpoint directory (single or sharded safetensors)."""

    def __init__(self, hf_dir: str | Path):
        self.dir = Path(hf_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(
                    f"{self.dir}: no *.safetensors files (and no model.safetensors.index.json); convert "
                    "other formats with transformers' save_pretrained(safe_serialization=True) first"
                )
            weight_map = {}
            for file in files:
                with safe_open(file, "pt") as f:
                    weight_map.update({k: file.name for k in f.keys()})
        missing = sorted({f for f in weight_map.values() if not (self.dir / f).is_file()})
        if missing:
            raise FileNotFoundError(f"{self.dir}: shard files listed in the index are missing: {missing}")
        self.weight_map: dict[str, str] = weight_map

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise KeyError(f"{self.dir}: tensor {name!r} not found in the checkpoint")
        # One open per tensor: safetensors maps the file, and pages touched through a long-lived handle stay
        # resident, which would hold a second copy of the whole checkpoint in RAM next to the model.
        with safe_open(self.dir / self.weight_map[name], "pt") as f:
            return f.get_tensor(name)

    def check_names(self, expected: list[str]) -> None:
        """Refuse a checkpoint that lacks expected tensors or carries tensors the model has no place for."""
        have = set(self.weight_map)
        missing = [n for n in expected if n not in have]
        # Tied checkpoints sometimes still store lm_head; rotary caches are derived, not learned.
        ignorable = {"lm_head.weight"} | {n for n in have if n.endswith("rotary_emb.inv_freq")}
        unexpected = sorted(have - set(expected) - ignorable)
        if missing or unexpected:
            raise ValueError(
                f"{self.dir}: checkpoint does not match the model built from its config.json; "
                f"missing {len(missing)} tensors {missing[:8]}, unexpected {len(unexpected)} {unexpected[:8]}"
            )


class HFCheckpointWriter:
    """Writes tensors into size-bounded safetensors shards plus ``model.safetensors.index.json``."""

    def __init__(self, out_dir: str | Path, max_shard_bytes: int = 2 * 1024**3):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes = max_shard_bytes
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[list[str]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._pending or any(name in s for s in self._shards):
            raise ValueError(f"tensor {name!r} written twice")
        nbytes = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + nbytes > self.max_shard_bytes:
            self._flush()
        self._pending[name] = tensor.detach().to("cpu").contiguous()
        self._pending_bytes += nbytes
        self.total_bytes += nbytes

    def _flush(self) -> None:
        index = len(self._shards)
        save_file(self._pending, str(self.dir / f"shard-{index:05d}.tmp"), metadata={"format": "pt"})
        self._shards.append(list(self._pending))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> None:
        if self._pending:
            self._flush()
        total = len(self._shards)
        weight_map = {}
        for i, names in enumerate(self._shards):
            final = "model.safetensors" if total == 1 else f"model-{i + 1:05d}-of-{total:05d}.safetensors"
            (self.dir / f"shard-{i:05d}.tmp").rename(self.dir / final)
            weight_map.update({n: final for n in names})
        if total > 1:
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def copy_side_files(src_dir: str | Path, dst_dir: str | Path) -> list[str]:
    """Copy config and tokenizer files that exist in ``src_dir``; returns the names copied."""
    copied = []
    for name in HF_SIDE_FILES:
        src = Path(src_dir) / name
        if src.is_file():
            shutil.copy2(src, Path(dst_dir) / name)
            copied.append(name)
    return copied
