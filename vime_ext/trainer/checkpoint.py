"""Megatron ``torch_dist`` checkpoints in the layout Megatron users know, saved atomically.

    <save>/latest_checkpointed_iteration.txt
    <save>/iter_0000010/{.metadata, metadata.json, __*.distcp}

All ranks write into ``iter_XXXXXXX.partial``; rank 0 renames it and only then rewrites the tracker file, so a
crash mid-save leaves the previous checkpoint as the latest one and the partial directory is never loaded.
"""

import dataclasses
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from vime_ext.models.model_config import ModelShape
from vime_ext.trainer.model_provider import unwrap

TRACKER_FILE = "latest_checkpointed_iteration.txt"
RANK_STATE_DIR = "rank_state"
PARTIAL_SUFFIX = ".partial"
# Written by torch.distributed.checkpoint at the very end of a save; its absence marks an interrupted one.
_REQUIRED_FILES = (".metadata", "metadata.json")


class SaveError(RuntimeError):
    """A save that could not complete (a full disk, say); the previous complete checkpoint is untouched."""


class CheckpointError(RuntimeError):
    pass


def iteration_dir(save_dir: str | Path, iteration: int) -> Path:
    return Path(save_dir) / f"iter_{iteration:07d}"


def partial_dir(save_dir: str | Path, iteration: int) -> Path:
    """Where a save of ``iteration`` is written until it is complete (then renamed to ``iteration_dir``)."""
    final = iteration_dir(save_dir, iteration)
    return final.with_name(final.name + PARTIAL_SUFFIX)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _in_process_write_results() -> None:
    """megatron's torch_dist writer hands its write results back through a queue made for an asynchronous save,
    written by another process: a multiprocessing Manager, whose server process is spawned on the first save of
    every process (2.8 s of a 12 s conversion on 2 cores). vime_ext saves synchronously: the writing threads run in
    the process that reads the results, and a thread queue carries them the same way."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()


def _save_model(model, directory: Path, common: dict, optimizer=None) -> None:
    from megatron.core import dist_checkpointing

    _in_process_write_results()
    if _rank() == 0:
        directory.mkdir(parents=True)
    _barrier()
    model_state = unwrap(model).sharded_state_dict()
    state = {"model": model_state, **common}
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(model_state)
    dist_checkpointing.save(state, str(directory))


def save_model_checkpoint(model, shape: ModelShape, save_dir: str | Path, iteration: int,
                          extra_state: dict | None = None, rank_state: dict | None = None, optimizer=None,
                          inner_models: dict | None = None) -> Path:
    """Save ``model`` and its ``optimizer`` (every rank calls this) and return the final iteration directory.
    The weights must be current: the caller finishes any overlapped parameter all-gather first
    (``TrainActor.weights_ready``), whether or not the optimizer's state is saved.

    The optimizer's state (fp32 masters, Adam moments) is sharded like the weights, in the same torch_dist
    checkpoint. ``extra_state`` (rank 0's) is stored with the model; ``rank_state`` (each rank's own: RNG) goes
    to ``rank_state/<rank>.pt`` inside the same directory, so both land atomically with the weights; so does
    each of ``inner_models`` (name -> (model, optimizer), e.g. PPO's critic), as its own torch_dist checkpoint
    in ``<name>/`` whose ``vime_ext`` state holds ``{name: True}``.
    """
    final, partial = iteration_dir(save_dir, iteration), partial_dir(save_dir, iteration)
    if _rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
    _barrier()
    common = {"iteration": iteration, "checkpoint_version": 3.0}
    shape_state = {"model_shape": dataclasses.asdict(shape)}
    _save_model(model, partial, {**common, "vime_ext": {**shape_state, **(extra_state or {})}}, optimizer)
    for name, (inner, inner_optimizer) in (inner_models or {}).items():
        _save_model(inner, partial / name, {**common, "vime_ext": {**shape_state, name: True}}, inner_optimizer)
    if rank_state is not None:
        (partial / RANK_STATE_DIR).mkdir(exist_ok=True)
        torch.save(rank_state, partial / RANK_STATE_DIR / f"{_rank():05d}.pt")
    _barrier()
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        tracker_tmp = Path(save_dir) / (TRACKER_FILE + ".tmp")
        tracker_tmp.write_text(str(iteration))
        os.replace(tracker_tmp, Path(save_dir) / TRACKER_FILE)
    _barrier()
    return final


def prune_checkpoints(save_dir: str | Path, keep_last: int, protect: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete iterations of ``save_dir`` (``--save-keep-last``), never
    ``protect`` (the iteration a run resumed from) nor the one the tracker names; returns what was deleted.
    Interrupted saves (``.partial``) are not counted and left alone. Rank 0 calls this after a save."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    save_dir = Path(save_dir)
    iterations = sorted((p for p in save_dir.glob("iter_*") if p.is_dir() and p.name[5:].isdigit()),
                        key=lambda p: int(p.name[5:]))
    keep = set(iterations[-keep_last:])
    tracker = save_dir / TRACKER_FILE
    latest = tracker.read_text().strip() if tracker.is_file() else ""
    if latest.isdigit():
        keep.add(iteration_dir(save_dir, int(latest)))
    if protect is not None:
        keep.add(Path(protect))
    kept = {k.resolve() for k in keep}  # `protect` may be spelled differently (relative, via a link)
    doomed = [p for p in iterations if p.resolve() not in kept]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """An ``iter_*`` directory, or a save directory resolved through its tracker file; checked for completeness."""
    path = Path(path)
    tracker = path / TRACKER_FILE
    if tracker.is_file():
        text = tracker.read_text().strip()
        if not text.isdigit():
            raise CheckpointError(f"{tracker}: expected an iteration number, found {text!r}")
        path = iteration_dir(path, int(text))
    if path.name.endswith(PARTIAL_SUFFIX):
        raise CheckpointError(f"{path}: this is an interrupted save (a '{PARTIAL_SUFFIX}' directory); "
                              "use the previous iteration")
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory (and no {TRACKER_FILE} there)")
    missing = [f for f in _REQUIRED_FILES if not (path / f).is_file()]
    if missing or not any(path.glob("*.distcp")):
        raise CheckpointError(
            f"{path}: incomplete torch_dist checkpoint, missing {missing or ['*.distcp shard files']}"
        )
    return path


def checkpoint_model_shape(path: str | Path) -> ModelShape | None:
    """The ModelShape recorded by vime_ext in a checkpoint, or None for checkpoints written elsewhere."""
    from megatron.core import dist_checkpointing

    common = dist_checkpointing.load_common_state_dict(str(resolve_checkpoint_dir(path)))
    recorded = (common.get("vime_ext") or {}).get("model_shape")
    return ModelShape(**recorded) if recorded else None


def _check_tensor_keys(sharded_state: dict, ckpt_dir: Path, what: str = "model") -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    saved = dist_checkpointing.load_tensors_metadata(str(ckpt_dir))
    wanted = {t.key: t for t in nested_values(sharded_state) if isinstance(t, ShardedTensor)}
    missing = sorted(k for k in wanted if k not in saved)
    if what == "optimizer" and len(missing) == len(wanted):
        raise CheckpointError(f"{ckpt_dir}: no optimizer state in this checkpoint (a converted one, or saved by "
                              "vime_ext before optimizer states were sharded); start from its weights with "
                              "--ref-load instead of --load")
    wrong_shape = sorted(
        f"{k}: checkpoint {tuple(saved[k].global_shape)} vs {what} {tuple(t.global_shape)}"
        for k, t in wanted.items()
        if k in saved and tuple(saved[k].global_shape) != tuple(t.global_shape)
    )
    if missing or wrong_shape:
        raise CheckpointError(
            f"{ckpt_dir}: checkpoint does not fit the {what}; missing {len(missing)} tensors {missing[:8]}; "
            f"shape mismatches {wrong_shape[:8]}"
        )


def has_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a save directory with a tracker file or an iteration directory (a fresh run's
    ``--load`` directory has neither yet)."""
    path = Path(path)
    return (path / TRACKER_FILE).is_file() or path.name.startswith("iter_")


def checkpoint_common_state(path: str | Path) -> dict:
    """What rank 0 stored beside the weights (iteration, vime_ext's extra state)."""
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load_common_state_dict(str(resolve_checkpoint_dir(path)))


def load_rank_state(path: str | Path) -> dict:
    """This rank's ``rank_state`` (RNG) from a checkpoint; the same world size must load it."""

    ckpt_dir = resolve_checkpoint_dir(path)
    file = ckpt_dir / RANK_STATE_DIR / f"{_rank():05d}.pt"
    if not file.is_file():
        saved = sorted(p.name for p in (ckpt_dir / RANK_STATE_DIR).glob("*.pt"))
        raise CheckpointError(f"{file}: no RNG state for rank {_rank()} (the checkpoint has "
                              f"{len(saved)} rank files); resume with the layout it was saved with")
    return torch.load(file, map_location="cpu", weights_only=False)


def load_model_checkpoint(model, path: str | Path, optimizer=None) -> int:
    """Load weights into ``model`` (any TP/PP layout) from a checkpoint, and given its ``optimizer``, the
    optimizer's state; returns the checkpoint's iteration."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    ckpt_dir = resolve_checkpoint_dir(path)
    model = unwrap(model)
    model_state = model.sharded_state_dict()
    _check_tensor_keys(model_state, ckpt_dir)
    wanted = {"model": model_state}
    if optimizer is not None:
        wanted["optimizer"] = optimizer.sharded_state_dict(model_state, is_loading=True)
        _check_tensor_keys(wanted["optimizer"], ckpt_dir, "optimizer")
    state = dist_checkpointing.load(wanted, str(ckpt_dir), strict=StrictHandling.LOG_UNEXPECTED)
    model.load_state_dict(state["model"], strict=False)
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return int(checkpoint_common_state(ckpt_dir).get("iteration", 0))
