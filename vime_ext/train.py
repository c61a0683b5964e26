"""RL training (GRPO, or PPO with a critic): rollout -> reward -> advantages -> Megatron update -> weight sync,
repeated.

    python -m vime_ext.train --hf-checkpoint DIR --prompt-data FILE.jsonl [flags as in slime]   (or ``train.py``)

Flags: ``python -m vime_ext.train --help``; their meaning and checks: ``vime_ext/arguments.py``.
"""

import contextlib
import json
import shutil
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vime_ext.agent.sample import TRAINABLE, Sample
from vime_ext.algorithms.train_data import TrainSequence
from vime_ext.arguments import TrainConfig, parse_train_args
from vime_ext.cluster import Cluster, TrainerDied
from vime_ext.rollout.debug_data import load_rollout, save_rollout
from vime_ext.rollout.failures import last_line
from vime_ext.rollout.plugins import load_function
from vime_ext.rollout.rollout import RolloutOutput, rollout_metrics
from vime_ext.rollout.sft_rollout import check_chats
from vime_ext.rollout.validate import RolloutError, check_groups
from vime_ext.rollout_ahead import Generated, RolloutAhead
from vime_ext.trainer.batching import split_data_parallel
from vime_ext.trainer.checkpoint import TRACKER_FILE, SaveError, has_checkpoint, partial_dir

WEIGHT_BUCKET_BYTES = 512 * 2**20
# Optimizer figures: the same on every rank, so not summed over data-parallel shares.
_PER_STEP = ("grad_norm", "lr", "skipped", "critic_grad_norm", "critic_lr", "critic_skipped")


def plan_steps(config: TrainConfig, samples: list[Sample], sequences: list[TrainSequence],
               dp_size: int) -> tuple[list[list[list[TrainSequence]]], list[tuple[float, float]]]:
    """Per data-parallel rank, the sequences of each optimizer step; and each step's (loss tokens, sequences).
    A step whose samples all failed or were dropped with their groups has nothing to train and is left out."""
    position = {s.index: i for i, s in enumerate(samples)}
    steps: list[list[TrainSequence]] = [[] for _ in range(config.steps_per_rollout)]
    for seq in sequences:
        if seq.sample_index not in position:
            raise RolloutError(f"the samples-to-train-data converter made a sequence for sample index "
                               f"{seq.sample_index}, which is not in this rollout")
        steps[position[seq.sample_index] // config.global_batch_size].append(seq)
    steps = [step for step in steps if step]
    per_rank = [[] for _ in range(dp_size)]
    for step in steps:
        for rank, share in enumerate(split_data_parallel(step, dp_size)):
            per_rank[rank].append(share)
    totals = [(float(sum(s.num_loss_tokens for s in step)), float(len(step))) for step in steps]
    return per_rank, totals


class Trainer:
    def __init__(self, config: TrainConfig, log_dir: str | None = None):
        from vime_ext.tracking import Tracker

        self.started = time.monotonic()  # --exit-duration-in-mins counts the start-up too
        self.config = config
        d = config.data
        # The rollout manager reads the prompt data; reading it here first stops a malformed line (named by file,
        # line and field) before any process or model starts.
        if config.sft:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(config.checkpoint.hf_checkpoint)
        for path in [d.prompt_data, *config.eval.datasets().values()]:
            records = config.read_data(path)
            if config.sft:  # the chat template too, on the first chats of each file
                check_chats(tokenizer, records, d.sft_max_len, d.sft_overlong)
        self.args = config.plugin_args()
        self.convert = load_function(config.rollout.custom_convert_samples_to_train_data_path,
                                     "--custom-convert-samples-to-train-data-path")
        self.tracker = Tracker(config.tensorboard_dir, config.logging.use_wandb, config.logging.wandb_project,
                               config.logging.wandb_group, config=_flat(asdict(config)))
        self.cluster = Cluster(config, log_dir)
        layouts = self.cluster.layouts
        self.dp_size = layouts[0].dp_size if layouts else 1
        self.dp_rank = [layout.dp_rank for layout in layouts]
        # How the trainer ranks and the engines share the GPUs, and hand them over around each step.
        self.sharing = self.cluster.sharing
        self.engines = self.cluster.manager if self.cluster.has_engines else None
        self.start_rollout = 0
        self.restarts = 0  # trainer-rank restarts so far (--max-restarts)
        self.initial_data: dict | None = None  # the data position the run started from, for a restart without save
        self.history: list[dict[str, float]] = []  # every logged metric dict, for tests and the demo's summary
        # Held while the engines generate, push weights or evaluate: with --async-training a rollout runs beside
        # training, and the weights must not change inside one.
        self.engine_lock = threading.Lock()
        self.ahead: RolloutAhead | None = None  # --async-training's producer
        self.positions: dict[int, dict] = {}  # the data position before each rollout drew its prompts
        self.last_rollout: int | None = None  # --exit-duration-in-mins: the step the run stops after

    # ---- pieces of one rollout ------------------------------------------------------------------------------

    def push_weights(self, version: int) -> float:
        if not (self.cluster.has_engines and self.cluster.has_actors):  # SFT, or a debug run with one side only
            return 0.0
        start, manager = time.perf_counter(), self.cluster.manager
        with self.engine_lock:  # between two rollouts, or (--partial-rollout) pausing the one in flight
            for attempt in range(2):
                try:
                    manager.begin_weight_update()  # restarts an engine that died since the last one
                    self.cluster.ranks.push_weights(manager.weight_target(), WEIGHT_BUCKET_BYTES)
                    manager.finish_weight_update(version)
                    break
                except Exception as err:  # noqa: BLE001 (an engine that died mid-push; anything else goes on up)
                    if attempt or not manager.dead_engines():
                        raise
                    tqdm.write(f"an engine died during the weight push ({type(err).__name__}); restarting it and "
                               "pushing again")
        if self.ahead is not None:
            self.ahead.pushed(version)
        return time.perf_counter() - start

    def to_trainer(self, times: dict[str, float], memory: dict[str, float]) -> None:
        """The GPUs to the trainer ranks (colocated: the engines sleep; ``gpu_sharing.py``)."""
        self.sharing.to_trainer(self.cluster.ranks, self.engines, times, memory)

    def to_engines(self, version: int, times: dict[str, float], memory: dict[str, float]) -> None:
        """The weights of ``version`` to the engines, and the GPUs with them (colocated: woken around the push)."""
        self.sharing.to_engines(lambda: self.push_weights(version), self.cluster.ranks, self.engines, times, memory)

    def out_of_time(self, rollout_id: int) -> bool:
        """Whether rollout ``rollout_id`` is the last one --exit-duration-in-mins allows. Decided once, at the
        first step that ends past the limit, so that the step the run stops after is the one it saves."""
        limit = self.config.checkpoint.exit_duration_in_mins
        if self.last_rollout is None and limit is not None and time.monotonic() - self.started >= 60 * limit:
            self.last_rollout = rollout_id
        return self.last_rollout == rollout_id

    def save_due(self, rollout_id: int) -> bool:
        c = self.config.checkpoint
        last = self.out_of_time(rollout_id) or rollout_id + 1 == self.config.data.num_rollout
        return bool(c.save) and (last or bool(c.save_interval and (rollout_id + 1) % c.save_interval == 0))

    def save(self, rollout_id: int) -> float:
        start = time.perf_counter()
        # The position before rollout rollout_id + 1 drew its prompts: with --async-training it may have been
        # drawn (and be generating) already, and a resume must draw the same prompts again.
        data = self.positions.get(rollout_id + 1)
        if data is None and self.cluster.has_manager:
            with self.engine_lock:
                data = self.positions.get(rollout_id + 1) or self.cluster.manager.data_state()
        extra = {"next_rollout": rollout_id + 1, "data": data}
        save = self.config.checkpoint.save
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            self.cluster.ranks.save(save, rollout_id + 1, extra)
        except (OSError, CheckpointException) as err:  # a full disk, a quota, a lost mount (Ray's errors subclass
            # their cause); megatron's writer wraps the OSError of its worker in a CheckpointException
            # useless, and in the way of the room a resume needs
            shutil.rmtree(partial_dir(save, rollout_id + 1), ignore_errors=True)
            tracker = Path(save) / TRACKER_FILE
            last = f"iteration {tracker.read_text().strip()}" if tracker.is_file() else "none yet"
            free = shutil.disk_usage(save).free / 2**20
            raise SaveError(f"saving iteration {rollout_id + 1} to {save} failed ({_os_cause(err)}; {free:.0f} "
                            f"MiB free there). The last complete checkpoint ({last}) is untouched; make room and "
                            f"resume with --load {save}") from err
        return time.perf_counter() - start

    def resume(self) -> None:
        """``--load``'s checkpoint when it holds one; else the weights the ranks started from (``--ref-load``'s,
        which the engines, started from ``--hf-checkpoint``, then receive)."""
        path, ref_load = self.config.checkpoint.load, self.config.checkpoint.ref_load
        if not self.cluster.has_actors:
            return
        if not path or not has_checkpoint(path):
            start = f"--ref-load {ref_load}" if ref_load else "--hf-checkpoint"
            if path:
                print(f"--load {path}: no checkpoint there yet; starting from {start}")
            if ref_load and self.cluster.has_engines:
                times, memory = {}, {}
                self.to_trainer(times, memory)
                self.to_engines(0, times, memory)
            return
        self.start_rollout = self.load(path)
        print(f"resumed from {path} at rollout {self.start_rollout}")

    def load(self, path: str) -> int:
        """A checkpoint into the trainer ranks, its data position into the rollout manager, its weights to the
        engines; returns the rollout to go on from."""
        times, memory = {}, {}
        self.to_trainer(times, memory)
        state = self.cluster.ranks.load(path)[0]
        if self.cluster.has_manager and state["data"] is not None:
            self.cluster.manager.load_data_state(state["data"])
        next_rollout = int(state["next_rollout"])
        self.to_engines(next_rollout, times, memory)
        return next_rollout

    def recover(self, err: Exception) -> int:
        """A trainer rank died: a new group of ranks starts, loads the last complete checkpoint (``--save``'s, else
        the one the run started from, else the starting weights and data position), and the run goes on from
        there; the rollouts since are generated again, and their steps trained once, on the restored weights."""
        self.restarts += 1
        print(f"{err}; restarting the trainer ranks ({self.restarts} of --max-restarts "
              f"{self.config.cluster.max_restarts})", flush=True)
        self.cluster.restart_actors()
        for path in (self.config.checkpoint.save, self.config.checkpoint.load):
            if path and has_checkpoint(path):
                rollout_id = self.load(path)
                print(f"the trainer ranks restarted from {path}; going on from rollout {rollout_id}", flush=True)
                return rollout_id
        if self.cluster.has_manager:
            self.cluster.manager.load_data_state(self.initial_data)
        times, memory = {}, {}
        self.to_trainer(times, memory)
        self.to_engines(self.start_rollout, times, memory)
        print(f"no checkpoint yet: the trainer ranks restarted from their starting weights; going on from rollout "
              f"{self.start_rollout}", flush=True)
        return self.start_rollout

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Every evaluation set: the policy's answers and their rewards, or (SFT) the loss on its chats."""
        metrics = {}
        if self.cluster.has_manager:
            with self.engine_lock:
                outputs = self.cluster.manager.evaluate(rollout_id)
            for name, output in outputs.items():
                samples = [s for g in output.groups for s in g]
                metrics.update(self.eval_loss(samples, f"eval/{name}") if self.config.sft
                               else rollout_metrics(samples, f"eval/{name}"))
        if metrics:
            self.tracker.log(metrics, rollout_id)
            self.history.append({"rollout": rollout_id, **metrics})
            tqdm.write(json.dumps({"eval_at_rollout": rollout_id,
                                   **{k: float(f"{v:.6g}") for k, v in metrics.items()}}))
        return metrics

    def eval_loss(self, samples: list[Sample], prefix: str) -> dict[str, float]:
        """SFT: the mean negative log-likelihood per trained token of ``samples`` (``<prefix>/loss``), forward
        only on the trainer ranks, each its data-parallel share."""
        if not self.cluster.has_actors:
            return {}
        sequences = self.convert(self.args, samples)
        shares = split_data_parallel(sequences, self.dp_size)
        results = self.cluster.ranks.eval_loss([shares[r] for r in self.dp_rank])
        total, count = sum(r.nll for r in results), sum(r.tokens for r in results)
        return {f"{prefix}/loss": total / max(count, 1.0), f"{prefix}/tokens": count,
                f"{prefix}/skipped": float(sum(s.status not in TRAINABLE for s in samples))}

    def rollout(self, rollout_id: int) -> RolloutOutput:
        """Generated by the engines, or (``--load-debug-rollout-data``) read back from a saved rollout."""
        d = self.config.debug
        if d.load_debug_rollout_data:
            groups, metrics = load_rollout(d.load_debug_rollout_data, rollout_id)
            check_groups(groups, self.config.rollout.rollout_batch_size, self.config.rollout.n_samples_per_prompt)
            return RolloutOutput(groups, metrics)
        output = self.cluster.manager.rollout(rollout_id)
        if d.save_debug_rollout_data:
            save_rollout(d.save_debug_rollout_data, rollout_id, output.groups, output.metrics)
        return output

    def heal_engines(self, version: int, times: dict[str, float], memory: dict[str, float]) -> None:
        """An engine that died since the last weight push (during training, say) is restarted and given the
        current weights before the next rollout, so that it never serves the starting weights. Colocated, the
        round trip through the trainer side puts every engine to sleep (restarting the dead one while the
        memory is the engines') and wakes them around the push."""
        if not (self.cluster.has_engines and self.cluster.has_actors) or not self.cluster.manager.dead_engines():
            return
        tick = time.perf_counter()
        self.to_trainer(times, memory)
        self.to_engines(version, times, memory)
        times["engine_restart"] = time.perf_counter() - tick

    def train_one(self, rollout_id: int) -> dict[str, float]:
        """One synchronous step: generate rollout ``rollout_id`` with the current weights, then train on it."""
        start = time.perf_counter()
        made = self.produce(rollout_id, lambda times, memory: self.heal_engines(rollout_id, times, memory))
        return self.learn(made, start)

    def train_one_async(self, rollout_id: int) -> dict[str, float]:
        """One step of --async-training: rollout ``rollout_id`` from the producer (made while earlier steps
        trained), then train on it. A dead engine the producer found is healed here, with this step's weights."""
        start = time.perf_counter()
        made = self.ahead.take(rollout_id, lambda: self.heal_engines(rollout_id, {}, {}))
        made.times["wait_rollout"] = time.perf_counter() - start
        return self.learn(made, start)

    def start_ahead(self, first: int) -> RolloutAhead:
        """--async-training's producer, from rollout ``first``, the engines holding version ``first``."""
        return RolloutAhead(lambda n, heal: self.produce(n, lambda times, memory: heal()), first,
                            self.config.data.num_rollout, self.config.rollout.staleness_bound, first)

    def produce(self, rollout_id: int, heal) -> Generated:
        """Generate rollout ``rollout_id`` (or read it back, ``--load-debug-rollout-data``). ``heal(times, memory)``
        restarts dead engines and gives them the trainer's weights: before the rollout if one is dead, and when
        the router or the only engine a group could reach died mid-rollout, after which the same prompts are
        generated again, once, rather than trained without those groups."""
        config, times, memory = self.config, {}, {}
        generating = self.cluster.has_engines and not config.debug.load_debug_rollout_data
        position = None
        if generating and self.cluster.manager.dead_engines():
            heal(times, memory)
        with self.engine_lock:
            if generating:
                position = self.positions[rollout_id] = self.cluster.manager.data_state()
        # --partial-rollout: a push may pause this rollout and continue it under the new weights; otherwise the
        # rollout holds the engines, and a push waits for its end.
        with contextlib.nullcontext() if config.rollout.partial_rollout else self.engine_lock:
            tick = time.perf_counter()
            output = self.rollout(rollout_id)
            times["rollout"] = time.perf_counter() - tick
            dead = self.cluster.manager.dead_servers() if generating and output.metrics.get("groups_dropped") \
                else []
        if dead:
            tqdm.write(f"rollout {rollout_id}: {', '.join(dead)} died and {output.metrics['groups_dropped']:.0f} "
                       "groups were dropped; restarting and generating the rollout again")
            heal(times, memory)
            with self.engine_lock:
                self.cluster.manager.load_data_state(position)
                tick = time.perf_counter()
                output = self.rollout(rollout_id)
                times["rollout"] = time.perf_counter() - tick
        return Generated(rollout_id, output, position, times, memory)

    def learn(self, made: Generated, start: float) -> dict[str, float]:
        """Train on a generated rollout and log the step (``start``: when the step's clock started)."""
        config, rollout_id, output = self.config, made.rollout_id, made.output
        times, memory = made.times, made.memory
        samples = [s for g in output.groups for s in g]
        metrics = rollout_metrics(samples, "rollout")
        if config.sft:  # SFT samples carry no reward
            metrics = {k: v for k, v in metrics.items() if "reward" not in k}
        metrics.update({f"rollout/{k}": float(v) for k, v in output.metrics.items()})
        metrics["rollout/tokens_per_s"] = sum(s.response_length for s in samples) / max(times["rollout"], 1e-9)
        if self.cluster.has_engines and not config.debug.load_debug_rollout_data:
            metrics.update(self.staleness(rollout_id, samples))
        for old in [k for k in self.positions if k <= rollout_id]:
            del self.positions[old]
        prompts = [g[0].metadata.get("source", "") for g in output.groups]
        if self.cluster.has_actors:
            metrics.update(self.train_on(rollout_id, samples, times, memory))
        if self.cluster.has_engines:
            metrics.update({f"rollout/{k}": float(v) for k, v in self.cluster.manager.restart_count().items()})
        if self.restarts:
            metrics["train/restarts"] = float(self.restarts)
        times["total"] = time.perf_counter() - start
        metrics.update({f"time/{k}": v for k, v in times.items()})
        metrics.update({f"memory/{k}": v for k, v in memory.items()})
        if memory:  # printed too, so that a run that fails in its next phase still shows where memory went
            tqdm.write("memory (GiB): " + ", ".join(f"{k} {v:.1f}" for k, v in memory.items()
                                                    if k.endswith(("reserved_gb", "device_used_gb", "peak_allocated_gb"))))
        self.tracker.log(metrics, rollout_id, {"prompts": prompts})
        self.history.append({"rollout": rollout_id, **metrics})
        return metrics

    def staleness(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        """How many policy versions each sample's oldest token lags the policy that trains on it (rollout n is
        trained by version n). Rollout n starts only once the engines hold version n - K, and a push during it
        (--partial-rollout) only makes later tokens newer, so none may lag more than --max-staleness K (0 in the
        synchronous loop); one that does is a bug, and stops the run rather than train off-policy unawares."""
        lags = [rollout_id - s.weight_version for s in samples if s.weight_version is not None]
        bound = self.config.rollout.staleness_bound
        if lags and max(lags) > bound:
            raise RuntimeError(f"rollout {rollout_id}: a sample was generated {max(lags)} policy versions before "
                               f"the step that trains on it, more than the bound {bound}")
        return {"rollout/staleness_mean": float(np.mean(lags)) if lags else 0.0,
                "rollout/staleness_max": float(max(lags, default=0))}

    def train_on(self, rollout_id: int, samples: list[Sample], times: dict[str, float],
                 memory: dict[str, float]) -> dict[str, float]:
        """Advantages, the optimizer steps of one rollout on the trainer ranks, the save when one is due, the
        weight push; train metrics. ``times`` and ``memory`` get each phase's seconds and GPU memory."""
        config = self.config
        sequences = self.convert(self.args, samples)
        if not isinstance(sequences, list) or not all(isinstance(q, TrainSequence) for q in sequences):
            raise RolloutError("the samples-to-train-data converter must return a list of TrainSequence")
        per_rank, totals = plan_steps(config, samples, sequences, self.dp_size)
        if not totals:  # every group failed or was dropped (a dead engine, say): no step, the weights stay
            bad = sum(s.status not in TRAINABLE for s in samples)
            tqdm.write(f"rollout {rollout_id}: no sample can train ({bad} of {len(samples)} failed, aborted or "
                       "dropped with their groups); no optimizer step")
            self.to_trainer(times, memory)
            if self.save_due(rollout_id):
                times["save"] = self.save(rollout_id)
            self.to_engines(rollout_id + 1, times, memory)
            return {"train/sequences": 0.0, "train/steps": 0.0}
        self.to_trainer(times, memory)
        update_policy = rollout_id >= config.algorithm.num_critic_only_steps
        results = self.cluster.ranks.train_rollout([per_rank[r] for r in self.dp_rank], totals, update_policy)
        if self.save_due(rollout_id):
            times["save"] = self.save(rollout_id)  # before the hand-over: the ranks hold their weights
        self.to_engines(rollout_id + 1, times, memory)
        reported = [r for r in results if r.reports]
        times["log_probs"] = max(r.log_prob_time for r in results)
        times["train"] = max(r.train_time for r in results)
        train_tokens = sum(r.tokens for r in reported)
        metrics = {"train/sequences": float(len(sequences)), "train/steps": float(len(totals)),
                   "train/tokens_per_s": train_tokens / max(times["train"], 1e-9)}
        if config.sft:
            metrics["train/trained_tokens"] = sum(total for total, _ in totals)
        else:
            mismatch = [r.mismatch for r in reported]
            count = sum(m.tokens for m in mismatch)
            metrics.update({"train/logprob_abs_diff_mean": sum(m.abs_sum for m in mismatch) / max(count, 1.0),
                            "train/logprob_abs_diff_max": max(m.abs_max for m in mismatch)})
        if config.algorithm.advantage_estimator != "ppo" and not config.sft:
            metrics["rollout/advantage_abs_mean"] = float(np.mean([abs(q.advantage) for q in sequences] or [0.0]))
        for key in reported[0].steps[0]:
            if key in _PER_STEP:
                values = [step[key] for step in reported[0].steps]
            else:  # weighted sums over each rank's share of the step
                values = [sum(r.steps[i].get(key, 0.0) for r in reported) for i in range(len(totals))]
            metrics[f"train/{key}"] = float(np.mean(values))
        return metrics

    def run(self) -> list[dict[str, float]]:
        config = self.config
        try:
            self.resume()
            if self.cluster.has_manager:
                self.initial_data = self.cluster.manager.data_state()
            if config.eval.eval_prompt_data and not config.eval.skip_eval_before_train:
                self.evaluate(self.start_rollout)
            bar = tqdm(total=config.data.num_rollout, initial=self.start_rollout, desc="train", unit="rollout")
            rollout_id = self.start_rollout
            if config.rollout.async_training:
                self.ahead = self.start_ahead(rollout_id)
            while rollout_id < config.data.num_rollout:
                try:
                    m = self.train_one_async(rollout_id) if self.ahead else self.train_one(rollout_id)
                except TrainerDied as err:
                    if self.restarts >= config.cluster.max_restarts:
                        raise
                    if self.ahead is not None:  # what it made was for weights the restart throws away
                        self.ahead.stop()
                        self.ahead = None
                    rollout_id = self.recover(err)
                    if config.rollout.async_training:
                        self.ahead = self.start_ahead(rollout_id)
                    bar.n = rollout_id
                    continue
                shown = {} if config.sft else {"reward": f"{m['rollout/reward_mean']:.3f}"}
                bar.update(1)
                bar.set_postfix(**shown, loss=f"{m.get('train/loss', 0.0):.4f}", step_s=f"{m['time/total']:.1f}")
                tqdm.write(json.dumps({"rollout": rollout_id, **{k: float(f"{v:.6g}") for k, v in m.items()}}))
                if config.eval.eval_interval and (rollout_id + 1) % config.eval.eval_interval == 0:
                    self.evaluate(rollout_id + 1)
                if self.out_of_time(rollout_id) and rollout_id + 1 < config.data.num_rollout:
                    saved = f"; saved as iteration {rollout_id + 1}" if config.checkpoint.save else ""
                    tqdm.write(f"--exit-duration-in-mins {config.checkpoint.exit_duration_in_mins:g}: stopping "
                               f"after rollout {rollout_id + 1} of {config.data.num_rollout}{saved}")
                    break
                rollout_id += 1
            bar.close()
        finally:
            if self.ahead is not None:
                self.ahead.stop(wait=False)  # on an error its rollout fails once the engines are gone
            self.tracker.close()
            self.cluster.shutdown()
        print(f"TensorBoard logs: {self.tracker.log_dir}")
        if config.checkpoint.save:
            print(f"checkpoints: {config.checkpoint.save}")
        return self.history


def _os_cause(err: BaseException) -> str:
    """The operating system's words for a failed write, dug out of the wrappers around it (megatron's writer
    threads, torch's CheckpointException, Ray), else the error's own last line."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror:
            return f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        todo += [f for f in getattr(e, "failures", {}).values() if isinstance(f, BaseException)]
    return last_line(err)


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return out


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    from vime_ext.arguments import ConfigError
    from vime_ext.data.prompt_dataset import DataError

    try:
        trainer = Trainer(parse_train_args(argv))
    except (ConfigError, DataError) as err:  # the user's flags or data: one message, no traceback
        print(f"train.py: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    try:
        return trainer.run()
    except SaveError as err:  # the machine's disk, not a bug: one message
        print(f"train.py: {err}", file=sys.stderr)
        raise SystemExit(1) from err


if __name__ == "__main__":
    main()
