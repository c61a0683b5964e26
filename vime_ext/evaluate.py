"""Evaluation through a served engine, with the same plug-ins as training in evaluation mode. One loop,
``evaluate_items``, runs every evaluator: this module's reward-based ``evaluate`` (``python -m vime_ext.evaluate``,
MemUpdate's ``eval_mem_update``) and MemAgent's RULER-HQA lengths.

    python -m vime_ext.evaluate --hf-checkpoint DIR --prompt-data FILE.jsonl [--custom-rm-path MOD.fn]
        [--engine-backend vllm|hf] [--n-samples-per-prompt 1] [--rollout-max-response-len 64] [--temperature 0]
        [--custom-generate-function-path MOD.fn] [--custom-config-path FILE] [--engine-dtype float32]
        [--engine-max-model-len N] [--results FILE.jsonl] [--top-p 1.0] [--num-engines 1]
        [--vllm-X ...: vLLM's --X]

With ``--results`` every finished sample is written there as it finishes, and a second run of the same command
skips what is there (a line cut by a kill is dropped and its item run again). An item that fails twice is left
unscored and the command exits with status 3 (``UNSCORED_EXIT``) after printing its figures.
"""

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vime_ext.agent.sample import TRAINABLE, Sample
from vime_ext.arguments import EvalConfig, rollout_problems
from vime_ext.data.prompt_dataset import read_jsonl
from vime_ext.engines.client import RolloutClient
from vime_ext.engines.protocol import SamplingParams
from vime_ext.engines.servers import (EngineConfig, ServerProcess, data_parallel_configs, launch_engines,
                                     launch_router, split_vllm_args, visible_gpus, wait_until_serving)
from vime_ext.item_progress import ItemProgress
from vime_ext.rollout.config import RolloutConfig, sampling_params
from vime_ext.rollout.debug_data import sample_from_dict
from vime_ext.rollout.failures import plugin_failure
from vime_ext.rollout.plugins import PluginArgs, call_plugin, load_custom_config, load_function, plugin_args
from vime_ext.rollout.rollout import apply_reward, penalize_overlong, rollout_metrics
from vime_ext.rollout.validate import check_sample, fold_trajectory


@contextlib.contextmanager
def served(config: EngineConfig, url: str | None = None, timeout_s: float = 1800, engines: int = 1,
           router_policy: str = "consistent_hash") -> Iterator[str]:
    """The URL serving ``config``'s model: ``url`` when one is running already, else engines started here and
    stopped on leaving. ``engines`` > 1: data-parallel engines, each on GPUs of its own (``--tensor-parallel-size``
    of the visible ones), behind vllm-router (``router_policy``; consistent_hash keeps an item's turns on one
    engine, as in training)."""
    if url is not None:
        yield url
        return
    with served_together([(config, engines)], timeout_s, router_policy) as (url,):
        yield url


@contextlib.contextmanager
def served_together(models: list[tuple[EngineConfig, int]], timeout_s: float = 1800,
                    router_policy: str = "consistent_hash") -> Iterator[list[str]]:
    """One URL per (config, engines) of ``models``, as ``served`` gives it, their engines started at once where
    they may be: an engine that must have its GPUs to itself while it starts (``gpu_start_lock.py``: one that
    sizes its KV cache from free memory) first waits until those started before it on the same GPUs serve."""
    copies = [(k, copy) for k, (config, engines) in enumerate(models)
              for copy in data_parallel_configs(config, engines, visible_gpus(config))]
    started: list[ServerProcess] = []
    routers: list[ServerProcess] = []
    try:
        servers = launch_engines([copy for _, copy in copies], started, timeout_s=timeout_s)
        wait_until_serving(servers, timeout_s=timeout_s)
        urls = []
        for k, (config, _) in enumerate(models):
            group = [server for (model, _), server in zip(copies, servers) if model == k]
            url = group[0].url
            if len(group) > 1:
                routers.append(launch_router([s.url for s in group], policy=router_policy, log_dir=config.log_dir))
                wait_until_serving(routers[-1:], timeout_s=120)
                url = routers[-1].url
            urls.append(url)
        yield urls
    finally:
        for server in routers + started:
            server.stop()


def saved_rows(path: Path) -> tuple[dict[str, dict], list[str]]:
    """The rows in ``path`` by ``_id`` and their lines, leaving the file as it is (an evaluation may still be
    writing it): a torn last line (a kill mid-write) and a repeated ``_id`` are skipped."""
    done, keep = {}, []
    if not path.is_file():
        return done, keep
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "_id" in row and str(row["_id"]) not in done:
            done[str(row["_id"])] = row
            keep.append(line)
    return done, keep


def read_rows(path: Path) -> dict[str, dict]:
    """The rows already in ``path``, by ``_id``, before an evaluation appends to it: a torn last line is dropped
    from the file, so that the next row starts on a line of its own."""
    if not path.is_file():
        return {}
    done, keep = saved_rows(path)
    path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    return done


@dataclass
class EvalPass:
    """Every item's row (those of earlier runs included), the ids of the rows this run scored, and the samples
    that failed in this run."""

    rows: dict[str, dict]
    scored_now: list[str]
    failed: list[Sample]


Row = Callable[[str, Sample], Awaitable[dict]]

log = logging.getLogger(__name__)
ATTEMPTS = 2  # tries of an item in one run before it is listed as failed
UNSCORED_EXIT = 3  # the exit status of an evaluation that left items unscored (1: it crashed; 2: a usage error)


LOOP_KEYS = ("_id", "seconds")  # what evaluate_items adds to each row


def mean_and_range(values: list[float], digits: int) -> str:
    """A table cell for one model's seeds: their mean and, where they differ, (min-max); "-" for none."""
    if not values:
        return "-"
    if min(values) == max(values):
        return f"{values[0]:.{digits}f}"
    return f"{sum(values) / len(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def model_groups(specs: list[str], found: list[str]) -> dict[str, list[str]]:
    """Result names grouped into models for a table: each spec ``NAME=PATTERN`` takes the names of ``found``
    that match the glob pattern (a model's seeds, say ``rl_s*``), in spec order; a spec that is malformed or
    matches nothing is an error that lists what was found."""
    import fnmatch

    groups = {}
    for spec in specs:
        name, sep, pattern = spec.partition("=")
        if not sep or not name or not pattern:
            raise ValueError(f"model {spec!r}: write NAME=PATTERN")
        matched = sorted(f for f in found if fnmatch.fnmatchcase(f, pattern))
        if not matched:
            raise ValueError(f"--model {spec}: no result matches; found {sorted(found)}")
        groups[name] = matched
    return groups


async def evaluate_items(args: PluginArgs, url: str, items: list[tuple[str, Sample]], generate: Callable,
                         row: Row, params: SamplingParams, out: Path, n_proc: int = 16, force: bool = False,
                         desc: str = "eval", timeout_s: float | None = None,
                         attempts: int = ATTEMPTS) -> EvalPass:
    """The evaluation loop: each ``(id, sample)`` not yet in ``out`` through ``generate`` (a generate plug-in,
    called with ``evaluation=True``), at most ``n_proc`` at once; a finished sample's ``row(id, sample)`` (its
    score, with ``LOOP_KEYS`` added: the id, and the seconds of the item's generate and score) is appended to
    ``out`` as soon as it is made, so a kill loses only the items in flight. An item that the engine or a
    plug-in failed, or that took longer than ``timeout_s`` (its generate and row together), is run again from
    its own copy, up to ``attempts`` times in all (as training retries a failed sample once); one that fails
    every time is listed in ``out``'s ``.failed.jsonl``, named in a warning with its error, and run again next
    time, never scored (``exit_if_unscored``). A plug-in may save an item's state as it goes
    (``args.save_progress(sample, state)``, kept in ``out``'s ``.progress.jsonl``); the next attempt or run
    hands it back in ``sample.metadata["resume"]`` (``vime_ext.item_progress``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    progress_file = out.with_name(out.name.removesuffix(".jsonl") + ".progress.jsonl")
    if force:
        out.unlink(missing_ok=True)
        progress_file.unlink(missing_ok=True)
    if attempts < 1:
        raise ValueError(f"{desc}: attempts={attempts}; at least 1")
    rows = read_rows(out)
    todo = [(item_id, slot) for item_id, slot in items if item_id not in rows]
    ids = {slot.index: item_id for item_id, slot in todo}
    if len(ids) != len(todo):
        raise ValueError(f"{desc}: the samples' indices repeat; each item needs its own index")
    given = dict(todo)  # left as the caller made them: each attempt runs on a copy, so a retry starts afresh
    saved = ItemProgress(progress_file, set(rows))

    def ready(item_id: str) -> Sample:
        slot = copy.deepcopy(given[item_id])
        if (state := saved.state(item_id)) is not None:  # from an earlier run, or this run's failed attempt
            slot.metadata["resume"] = state
        return slot

    args.save_progress = lambda sample, state: saved.save(ids[sample.index], state)
    failed: list[tuple[str, Sample]] = []
    scored_now: list[str] = []
    semaphore = asyncio.Semaphore(n_proc)
    progress = tqdm(total=len(todo), desc=f"{desc} ({len(rows)} done before)", unit="item")
    client = RolloutClient(url, max_concurrency=max(n_proc, 1) * 2, timeout_s=1800)
    args.rollout_client, args.loop = client, asyncio.get_running_loop()
    try:
        with out.open("a", encoding="utf-8") as sink:
            async def attempt(item_id: str, slot: Sample) -> tuple[Sample, dict | None]:
                start = time.perf_counter()
                sample = fold_trajectory(slot, await call_plugin(generate, args, slot, params, evaluation=True))
                scored = await row(item_id, sample) if sample.status in TRAINABLE else None
                # The item's own time (its generate and score, not its wait for a place): the cost per item.
                return sample, None if scored is None else {**scored, "seconds": time.perf_counter() - start}

            async def one(item_id: str, slot: Sample) -> None:
                try:
                    async with semaphore:  # the wait for a place is not the item's time
                        sample, scored = await asyncio.wait_for(attempt(item_id, slot), timeout_s)
                    if scored is None:
                        failed.append((item_id, sample))
                    else:
                        scored = {**scored, "_id": item_id}  # LOOP_KEYS complete
                        sink.write(json.dumps(scored, default=repr) + "\n")
                        sink.flush()  # one whole line per item
                        rows[item_id] = scored
                        scored_now.append(item_id)
                        saved.finish(item_id)
                except Exception as err:  # noqa: BLE001 (a plug-in's error or timeout fails this item only)
                    failed.append((item_id, plugin_failure(slot, err, timeout_s)))
                finally:
                    progress.update(1)

            pending = [item_id for item_id, _ in todo]
            for attempt_number in range(attempts):
                if attempt_number:
                    progress.total += len(pending)
                    progress.set_description(f"{desc} (attempt {attempt_number + 1} of {attempts})")
                    failed.clear()
                await asyncio.gather(*(one(item_id, ready(item_id)) for item_id in pending))
                pending = [item_id for item_id, _ in failed]
                if not pending:
                    break
    finally:
        progress.close()
        saved.compact()
        args.rollout_client = args.loop = args.save_progress = None
        await client.close()
    failed_file = out.with_name(out.name.removesuffix(".jsonl") + ".failed.jsonl")
    failed_file.write_text("".join(json.dumps({"_id": item_id, "status": s.status.value, "error": s.error}) + "\n"
                                   for item_id, s in failed), encoding="utf-8")
    if failed:
        item_id, first = failed[0]
        log.warning("%s: %d of %d items failed %d time(s) and are not scored (%s); the first, %s: %s", desc,
                    len(failed), len(items), attempts, failed_file, item_id, first.error)
    return EvalPass(rows, scored_now, [s for _, s in failed])


def exit_if_unscored(unscored: int, command: str) -> None:
    """After ``command`` has written what it scored: exit with ``UNSCORED_EXIT`` when ``unscored`` items (over
    all its rows) failed every attempt, so that a script cannot take a partial evaluation for a whole one. The
    scored items are kept; the same command again runs only the others."""
    if unscored:
        print(f"{command}: {unscored} item(s) not scored after {ATTEMPTS} attempts each (listed in the "
              f".failed.jsonl beside the results, with their errors); run the same command again to retry them",
              file=sys.stderr)
        raise SystemExit(UNSCORED_EXIT)


GENERATE = "vime_ext.agent.generate.generate"


@dataclass(frozen=True)
class EvalRow:
    """One row of an evaluation: who answers (``generate_path``, a generate plug-in) and where its rewarded
    samples are kept across runs (``results``, a JSONL; None: a scratch file)."""

    generate_path: str = GENERATE
    results: str | None = None


def evaluate(hf_dir: str, prompt_data: str, *args, generate_path: str = GENERATE, results: str | None = None,
             **kwargs) -> dict[str, float]:
    """One row of ``evaluate_rows``: its metrics."""
    return evaluate_rows(hf_dir, prompt_data, *args, rows=[EvalRow(generate_path, results)], **kwargs)[0]


def evaluate_rows(hf_dir: str, prompt_data: str, reward_path: str = "vime_ext.agent.rewards.boxed_exact_match",
                  backend: str = "hf", n_samples: int = 1, max_response_len: int = 64, temperature: float = 0.0,
                  engine_args: list[str] | None = None, log_dir: str | None = None,
                  custom_config_path: str | None = None, dtype: str = "auto",
                  max_model_len: int | None = None, force: bool = False,
                  n_proc: int = 64, settings_override: dict | None = None,
                  reward_model: EngineConfig | None = None, top_p: float = 1.0, engines: int = 1, *,
                  rows: list[EvalRow], reward_replies_file: str | None = None) -> list[dict[str, float]]:
    """``n_samples`` answers to each prompt of ``prompt_data`` from the model at ``hf_dir``, each rewarded by
    ``reward_path``, once per row of ``rows``, in turn, on the same engines; each row's rollout metrics
    (``eval/...``). A row's ``results`` is kept across runs, one rewarded sample a line, so that a second run goes
    on where the first stopped (``force``: start afresh). ``settings_override``: plug-in settings that replace
    those of ``custom_config_path``. ``reward_model``: an engine served for the reward function, as train.py's
    ``--rm-hf-checkpoint`` (``args.rm_url``), started beside the model's (``served_together``). ``engines``:
    data-parallel engines behind vllm-router (``served``). Rows that share engines share one start, and a reward
    that asks a fixed model through ``fixed_replies`` gets one reply per prompt across the rows (and across
    runs that share ``reward_replies_file``, train.py's ``--rm-replies-file``)."""
    import tempfile
    from dataclasses import fields

    from transformers import AutoTokenizer

    if not rows:
        raise ValueError("evaluate_rows needs at least one row")
    records = read_jsonl(prompt_data)
    rollout = RolloutConfig(rollout_batch_size=len(records), n_samples_per_prompt=n_samples,
                            rollout_max_response_len=max_response_len, rollout_top_p=top_p,
                            custom_rm_path=reward_path,
                            custom_generate_function_path=rows[0].generate_path,
                            custom_config_path=custom_config_path,
                            rm_hf_checkpoint=reward_model.model if reward_model else None,
                            rm_replies_file=reward_replies_file)
    problems = rollout_problems(rollout)
    if problems:
        raise ValueError("; ".join(problems))
    settings = EvalConfig(n_samples_per_eval_prompt=n_samples, eval_max_response_len=max_response_len,
                          eval_temperature=temperature)
    names = {f.name for section in (rollout, settings) for f in fields(section)}
    custom = load_custom_config(custom_config_path, names) if custom_config_path else {}
    args = plugin_args([rollout, settings], {**custom, **(settings_override or {})})
    args.tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    generates = [load_function(row.generate_path, "--custom-generate-function-path") for row in rows]
    reward = load_function(reward_path, "--custom-rm-path")

    async def rewarded(_: str, sample: Sample) -> dict:
        apply_reward(sample, await call_plugin(reward, args, sample))
        penalize_overlong(args, sample)
        check_sample(sample, evaluation=True)
        return asdict(sample)

    engine = EngineConfig(hf_dir, backend=backend, dtype=dtype, max_model_len=max_model_len,
                          extra_args=list(engine_args or []), log_dir=log_dir)
    models = [(engine, engines)] + ([(reward_model, 1)] if reward_model is not None else [])
    metrics = []
    with tempfile.TemporaryDirectory() as scratch, served_together(models, timeout_s=900) as urls:
        if reward_model is not None:
            args.rm_url = urls[1]
        for number, (row, generate) in enumerate(zip(rows, generates)):
            # fresh samples for each row: the generate plug-in fills them in
            items = [(f"{r.source}#{k}", Sample(prompt=r.prompt, label=r.label,
                                                metadata={**r.metadata, "source": r.source},
                                                group_index=g, index=g * n_samples + k))
                     for g, r in enumerate(records) for k in range(n_samples)]
            out = Path(row.results) if row.results else Path(scratch) / f"samples_{number}.jsonl"
            done = asyncio.run(evaluate_items(args, urls[0], items, generate, rewarded, sampling_params(args, True),
                                              out, n_proc, force, timeout_s=rollout.rollout_sample_timeout or None))
            samples = [sample_from_dict({k: v for k, v in r.items() if k not in LOOP_KEYS}, f"{out}: {item_id}")
                       for item_id, r in done.rows.items()] + done.failed
            metrics.append({**rollout_metrics(samples, "eval"), "eval/samples": float(len(samples)),
                            "eval/unscored": float(len(done.failed)),
                            "eval/reward_sem": float(np.std([s.reward or 0.0 for s in samples])
                                                     / np.sqrt(len(samples)))})
    return metrics


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description="evaluate an HF checkpoint on prompt data with a reward")
    parser.add_argument("--hf-checkpoint", required=True)
    parser.add_argument("--prompt-data", required=True)
    parser.add_argument("--custom-rm-path", default="vime_ext.agent.rewards.boxed_exact_match")
    parser.add_argument("--engine-backend", choices=["vllm", "hf"], default="hf")
    parser.add_argument("--n-samples-per-prompt", type=int, default=1)
    parser.add_argument("--rollout-max-response-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (1: off)")
    parser.add_argument("--custom-generate-function-path", default="vime_ext.agent.generate.generate")
    parser.add_argument("--custom-config-path", default=None, help="YAML or JSON plug-in settings")
    parser.add_argument("--engine-dtype", default="auto", help="the engine's weights and activations")
    parser.add_argument("--engine-max-model-len", type=int, default=None, help="the engine's context length")
    parser.add_argument("--results", default=None, help="JSONL of the rewarded samples, kept across runs")
    parser.add_argument("--num-engines", type=int, default=1,
                        help="data-parallel engines, each on GPUs of its own, behind vllm-router")
    own, vllm_args = split_vllm_args(sys.argv[1:] if argv is None else list(argv))  # --vllm-X: the engine's --X
    args = parser.parse_args(own)
    result = evaluate(args.hf_checkpoint, args.prompt_data, args.custom_rm_path, args.engine_backend,
                      args.n_samples_per_prompt, args.rollout_max_response_len, args.temperature,
                      engine_args=vllm_args, generate_path=args.custom_generate_function_path,
                      custom_config_path=args.custom_config_path, dtype=args.engine_dtype,
                      max_model_len=args.engine_max_model_len, results=args.results, top_p=args.top_p,
                      engines=args.num_engines)
    print(json.dumps(result, indent=1))
    exit_if_unscored(int(result["eval/unscored"]), "vime_ext.evaluate")
    return result


if __name__ == "__main__":
    main()
