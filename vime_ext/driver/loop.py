"""The training loop: rollout -> reward -> advantages -> Megatron update -> weight push, repeated (GRPO, or PPO
with a critic; SFT through the same loop with a rollout that reads chats).

    python -m vime_ext.train --hf-checkpoint DIR --prompt-data FILE.jsonl [flags as in slime]   (or ``train.py``)

Flags: ``python -m vime_ext.train --help``; their meaning and checks: ``vime_ext/arguments.py``. Beside this
module: ``step.py`` (the trainer ranks' side of a step), ``handover.py`` (weights and GPUs between ranks and
engines), ``recovery.py`` (save, resume, restart), ``async_rollouts.py`` (``--async-training``'s producer),
``cluster.py`` and ``rollout_manager.py`` (the processes).
"""

import contextlib
import json
import time
from dataclasses import asdict

from tqdm import tqdm

from vime_ext.agent.sample import TRAINABLE, Sample
from vime_ext.arguments import ConfigError, TrainConfig
from vime_ext.driver.async_rollouts import Generated, RolloutAhead
from vime_ext.driver.cluster import Cluster, TrainerDied
from vime_ext.driver.handover import HandOver
from vime_ext.driver.recovery import Recovery, lineage_metrics
from vime_ext.driver.step import StepTrainer, staleness
from vime_ext.rollout.debug_data import load_rollout, save_rollout
from vime_ext.rollout.rollout import RolloutOutput, rollout_metrics
from vime_ext.rollout.sft_rollout import check_chats
from vime_ext.rollout.validate import RolloutError, check_groups
from vime_ext.trainer.checkpoint import CheckpointError, resolve_checkpoint_dir
from vime_ext.trainer.critic import critic_checkpoint_dir


class Trainer:
    def __init__(self, config: TrainConfig, log_dir: str | None = None):
        from vime_ext.tracking import Tracker

        started = time.monotonic()
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
        # A checkpoint to start from that is not one: named here, not in a trainer rank's traceback later.
        c = config.checkpoint
        for flag, path, resolve in (("--ref-load", c.ref_load, resolve_checkpoint_dir),
                                    ("--critic-load", c.critic_load, critic_checkpoint_dir)):
            if path:
                try:
                    resolve(path)
                except CheckpointError as err:
                    raise ConfigError(f"{flag} {err}") from err
        self.tracker = Tracker(config.tensorboard_dir, config.logging.use_wandb, config.logging.wandb_project,
                               config.logging.wandb_group, config=_flat(asdict(config)))
        self.cluster = Cluster(config, log_dir)
        self.steps = StepTrainer(config, self.cluster)
        self.handover = HandOver(self.cluster)
        self.recovery = Recovery(config, self.cluster, self.handover, started)
        self.ahead: RolloutAhead | None = None  # --async-training's producer
        self.history: list[dict[str, float]] = []  # every logged metric dict, for tests and the demo's summary

    def run(self) -> list[dict[str, float]]:
        config, recovery = self.config, self.recovery
        try:
            recovery.resume()
            if config.eval.eval_prompt_data and not config.eval.skip_eval_before_train:
                self.evaluate(recovery.start_rollout)
            bar = tqdm(total=config.data.num_rollout, initial=recovery.start_rollout, desc="train", unit="rollout")
            rollout_id = recovery.start_rollout
            self.start_ahead(rollout_id)
            while rollout_id < config.data.num_rollout:
                try:
                    m = self.train_one_async(rollout_id) if self.ahead else self.train_one(rollout_id)
                except TrainerDied as err:
                    if not recovery.can_restart():
                        raise
                    self.stop_ahead()  # what it made was for weights the restart throws away
                    rollout_id = recovery.recover(err, rollout_id)
                    self.start_ahead(rollout_id)
                    bar.n = rollout_id
                    continue
                shown = {} if config.sft else {"reward": f"{m['rollout/reward_mean']:.3f}"}
                bar.update(1)
                bar.set_postfix(**shown, loss=f"{m.get('train/loss', 0.0):.4f}", step_s=f"{m['time/total']:.1f}")
                tqdm.write(json.dumps({"rollout": rollout_id, **{k: float(f"{v:.6g}") for k, v in m.items()}}))
                if config.eval.eval_interval and (rollout_id + 1) % config.eval.eval_interval == 0:
                    self.evaluate(rollout_id + 1)
                if recovery.out_of_time(rollout_id) and rollout_id + 1 < config.data.num_rollout:
                    saved = f"; saved as iteration {rollout_id + 1}" if "time/save" in m else ""  # as it happened
                    tqdm.write(f"--exit-duration-in-mins {config.checkpoint.exit_duration_in_mins:g}: stopping "
                               f"after rollout {rollout_id + 1} of {config.data.num_rollout}{saved}")
                    break
                rollout_id += 1
            bar.close()
        finally:
            self.stop_ahead(wait=False)  # on an error its rollout fails once the engines are gone
            self.tracker.close()
            self.cluster.shutdown()
        print(f"TensorBoard logs: {self.tracker.log_dir}")
        if config.checkpoint.save:
            print(f"checkpoints: {config.checkpoint.save}")
        return self.history

    # ---- one step ---------------------------------------------------------------------------------------------

    def train_one(self, rollout_id: int) -> dict[str, float]:
        """One synchronous step: generate rollout ``rollout_id`` with the current weights, then train on it."""
        start = time.perf_counter()
        made = self.produce(rollout_id, lambda times, memory: self.handover.heal_engines(rollout_id, times, memory))
        return self.learn(made, start)

    def train_one_async(self, rollout_id: int) -> dict[str, float]:
        """One step of --async-training: rollout ``rollout_id`` from the producer (made while earlier steps
        trained), then train on it. A dead engine the producer found is healed here, with this step's weights."""
        start = time.perf_counter()
        made = self.ahead.take(rollout_id, lambda: self.handover.heal_engines(rollout_id, {}, {}))
        made.times["wait_rollout"] = time.perf_counter() - start
        return self.learn(made, start)

    def start_ahead(self, first: int) -> None:
        """--async-training's producer, from rollout ``first``, the engines holding version ``first``."""
        if self.config.rollout.async_training:
            self.ahead = RolloutAhead(lambda n, heal: self.produce(n, lambda times, memory: heal()), first,
                                      self.config.data.num_rollout, self.config.rollout.staleness_bound, first)
            self.handover.pushed = self.ahead.pushed

    def stop_ahead(self, wait: bool = True) -> None:
        if self.ahead is not None:
            self.ahead.stop(wait=wait)
            self.ahead = self.handover.pushed = None

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

    def produce(self, rollout_id: int, heal) -> Generated:
        """Generate rollout ``rollout_id`` (or read it back, ``--load-debug-rollout-data``). ``heal(times, memory)``
        restarts dead engines and gives them the trainer's weights: before the rollout if one is dead, and when
        the router or the only engine a group could reach died mid-rollout, after which the same prompts are
        generated again, once, rather than trained without those groups."""
        config, times, memory, lock = self.config, {}, {}, self.handover.lock
        generating = self.cluster.has_engines and not config.debug.load_debug_rollout_data
        position = None
        if generating and self.cluster.manager.dead_engines():
            heal(times, memory)
        with lock:
            if generating:
                position = self.recovery.positions[rollout_id] = self.cluster.manager.data_state()
        # --partial-rollout: a push may pause this rollout and continue it under the new weights; otherwise the
        # rollout holds the engines, and a push waits for its end.
        with contextlib.nullcontext() if config.rollout.partial_rollout else lock:
            tick = time.perf_counter()
            output = self.rollout(rollout_id)
            times["rollout"] = time.perf_counter() - tick
            dead = self.cluster.manager.dead_servers() if generating and output.metrics.get("groups_dropped") \
                else []
        if dead:
            tqdm.write(f"rollout {rollout_id}: {', '.join(dead)} died and {output.metrics['groups_dropped']:.0f} "
                       "groups were dropped; restarting and generating the rollout again")
            heal(times, memory)
            with lock:
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
            metrics.update(staleness(rollout_id, samples, config.rollout.staleness_bound))
        for old in [k for k in self.recovery.positions if k <= rollout_id]:
            del self.recovery.positions[old]
        prompts = [g[0].metadata.get("source", "") for g in output.groups]
        if self.cluster.has_actors:
            metrics.update(self.train_on(rollout_id, samples, times, memory))
        if self.cluster.has_engines:
            metrics.update({f"rollout/{k}": float(v) for k, v in self.cluster.manager.restart_count().items()})
        if self.cluster.has_actors:
            metrics.update(lineage_metrics(self.recovery.trained))
        if self.recovery.restarts:
            metrics["train/restarts"] = float(self.recovery.restarts)
        times["total"] = time.perf_counter() - start
        metrics.update({f"time/{k}": v for k, v in times.items()})
        metrics.update({f"memory/{k}": v for k, v in memory.items()})
        if memory:  # printed too, so that a run that fails in its next phase still shows where memory went
            shown = ("reserved_gb", "device_used_gb", "peak_allocated_gb", "peak_rss_gb")
            tqdm.write("memory (GiB): " + ", ".join(f"{k} {v:.1f}" for k, v in memory.items() if k.endswith(shown)))
        self.tracker.log(metrics, rollout_id, {"prompts": prompts})
        self.history.append({"rollout": rollout_id, **metrics})
        return metrics

    def train_on(self, rollout_id: int, samples: list[Sample], times: dict[str, float],
                 memory: dict[str, float]) -> dict[str, float]:
        """The GPUs to the trainer, the rollout's optimizer steps, the save when one is due (before the hand-over
        back: the ranks hold their weights), the weight push; train metrics. ``times`` and ``memory`` get each
        phase's seconds and GPU memory."""
        plan = self.steps.plan(samples)
        self.handover.to_trainer(times, memory)
        results = self.steps.train(plan, rollout_id) if plan.totals else None
        if results is not None:
            self.recovery.record_step(rollout_id)  # before the save, which records it
        self.recovery.save_if_due(rollout_id, times)
        self.handover.to_engines(rollout_id + 1, times, memory)
        if results is None:  # every group failed or was dropped (a dead engine, say): no step, the weights stay
            bad = sum(s.status not in TRAINABLE for s in samples)
            tqdm.write(f"rollout {rollout_id}: no sample can train ({bad} of {len(samples)} failed, aborted or "
                       "dropped with their groups); no optimizer step")
            return {"train/sequences": 0.0, "train/steps": 0.0}
        return self.steps.metrics(plan, results, times)

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Every evaluation set: the policy's answers and their rewards, or (SFT) the loss on its chats."""
        metrics = {}
        if self.cluster.has_manager:
            with self.handover.lock:
                outputs = self.cluster.manager.evaluate(rollout_id)
            for name, output in outputs.items():
                samples = [s for g in output.groups for s in g]
                metrics.update(self.steps.eval_loss(samples, f"eval/{name}") if self.config.sft
                               else rollout_metrics(samples, f"eval/{name}"))
        if metrics:
            self.tracker.log(metrics, rollout_id)
            self.history.append({"rollout": rollout_id, **metrics})
            tqdm.write(json.dumps({"eval_at_rollout": rollout_id,
                                   **{k: float(f"{v:.6g}") for k, v in metrics.items()}}))
        return metrics


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return out
