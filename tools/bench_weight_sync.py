"""Weight sync of a Qwen3-shaped model (random bf16 weights) from a Megatron trainer into a vLLM engine: on the
same GPU over CUDA IPC (colocated) or shared-memory files, or on a second GPU over NCCL. Needs vLLM, megatron-core
and one GPU (two for nccl).

    python tools/bench_weight_sync.py --shape qwen3-4b --transport ipc --pushes 3 --out weight_sync.json
    python tools/bench_weight_sync.py --shape qwen3-4b --transport nccl   # engine on GPU 1, trainer on GPU 0

The engine starts from dummy weights (vLLM's ``--load-format dummy``); the trainer builds the same shape with its
own random initialisation, pushes it ``--pushes`` times (each timed: pause, every bucket, finish, resume), then the
engine's greedy continuation and log-probs are compared with the trainer's forward pass on the same tokens.
Prints one JSON object.
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.bench_train import SHAPES, hf_config, print_and_save  # noqa: E402
from tools.make_random_hf import write_hf_dir  # noqa: E402


async def _generate(url: str, prompts: list[list[int]], new_tokens: int):
    from vime_ext.engines.client import RolloutClient
    from vime_ext.engines.protocol import SamplingParams

    client = RolloutClient(url)
    try:
        return await asyncio.gather(*(client.generate(p, SamplingParams(temperature=0.0, max_new_tokens=new_tokens))
                                      for p in prompts))
    finally:
        await client.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--transport", default="ipc", choices=["ipc", "vime_shm", "nccl"])
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--bucket-mib", type=int, default=512)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from vime_ext.engines.servers import EngineConfig, launch_engine, wait_until_serving
    from vime_ext.engines.weight_sync import WeightSync
    from vime_ext.models.model_config import ModelShape, ParallelConfig
    from vime_ext.trainer.forward import token_log_probs
    from vime_ext.trainer.hf_weights import iter_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    if args.transport == "nccl" and torch.cuda.device_count() < 2:
        parser.error(f"--transport nccl puts the engine on a second GPU; this machine has "
                     f"{torch.cuda.device_count()}")
    root = Path(tempfile.mkdtemp(prefix="bench_weight_sync_"))
    folder = write_hf_dir(hf_config(args.shape), root / args.shape, weights=False)  # engine: dummy weights
    engine = launch_engine(EngineConfig(
        str(folder), dtype="bfloat16", max_model_len=2048, log_dir=str(root), weight_transport=args.transport,
        env={"CUDA_VISIBLE_DEVICES": "1"} if args.transport == "nccl" else {},
        extra_args=["--load-format", "dummy", "--enforce-eager",
                    "--gpu-memory-utilization", str(args.gpu_memory_utilization)]))
    result = {"shape": args.shape, "transport": args.transport, "device": torch.cuda.get_device_name()}
    try:
        init_distributed(ParallelConfig())
        shape = ModelShape.from_hf_dir(folder)
        model = build_gpt_model(shape, ParallelConfig(), dtype=torch.bfloat16, init_weights=True)
        params = sum(p.numel() for p in model.parameters())
        result["parameters"] = params
        start = time.perf_counter()
        wait_until_serving([engine], timeout_s=900)
        result["engine_start_s"] = round(time.perf_counter() - start, 1)
        prompts = [[151644, 872, 198] + list(range(1000 + 17 * i, 1040 + 17 * i)) for i in range(4)]
        before = asyncio.run(_generate(engine.url, prompts, 16))
        sync = WeightSync([engine.url], bucket_bytes=args.bucket_mib * 2**20, transport=args.transport)
        if args.transport == "nccl":
            sync.connect()
        else:
            sync.init()
        times = []
        for version in range(1, args.pushes + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            sent = sync.push(iter_hf_weights(model, shape), version=version)
            times.append(time.perf_counter() - start)
        sync.close()
        after = asyncio.run(_generate(engine.url, prompts, 16))
        diffs = []
        for prompt, out in zip(prompts, after):
            ours = token_log_probs(model, shape, prompt + out.token_ids, len(prompt)).float()
            diffs += (ours - torch.tensor(out.log_probs)).abs().tolist()
        result.update(
            tensors_per_push=sent, bytes_per_push=sum(p.numel() * p.element_size() for p in model.parameters()),
            push_s=[round(t, 3) for t in times], push_s_median=round(statistics.median(times), 3),
            greedy_changed=sum(a.token_ids != b.token_ids for a, b in zip(after, before)), prompts=len(prompts),
            logprob_abs_diff_mean=statistics.fmean(diffs), logprob_abs_diff_max=max(diffs))
        destroy_distributed()
    finally:
        engine.stop()
        result["engine_log_tail"] = engine.log_tail(1500) if "push_s" not in result else None
    print_and_save(result, args.out)


if __name__ == "__main__":
    main()
