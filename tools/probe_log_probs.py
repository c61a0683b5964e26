"""Where the forward-only log-prob pass spends its time at 4096 tokens (Qwen3-4B shape): wall time vs summed
kernel time, and the top kernels, for the Megatron SDPA model and the HF peer; 4096 and 4097 tokens.

    python3 tools/probe_log_probs.py [--shape qwen3-4b]   (one CUDA GPU; a run: records/logprob_probe_qwen3-4b_h100.txt)
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
sys.path.insert(0, "tools")
import bench_train as b  # noqa: E402

from vime_ext.models.model_config import ModelShape, ParallelConfig  # noqa: E402
from vime_ext.trainer.parallel import init_distributed  # noqa: E402

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(b.SHAPES))
    args = parser.parse_args()
    init_distributed(ParallelConfig())
    config = b.hf_config(args.shape)
    shape = ModelShape.from_hf_config(config, source=args.shape)
    for impl in ("megatron-sdpa", "hf"):
        model, _, log_probs_fn = b.build(impl, shape, config)
        for n in (4096, 4097):
            ids = torch.randint(0, shape.vocab_size, (1, n), device="cuda")
            with torch.no_grad():
                for _ in range(2):
                    log_probs_fn(ids)
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(3):
                    log_probs_fn(ids)
                torch.cuda.synchronize()
                wall = (time.perf_counter() - start) / 3
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    log_probs_fn(ids)
                    torch.cuda.synchronize()
            events = prof.key_averages()
            # Kernel records only (operator records repeat their kernels' time).
            kernel = sum(e.device_time_total for e in prof.events()
                         if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
            print(f"{impl} n={n}: wall {wall * 1e3:.1f} ms, kernels {kernel:.1f} ms, {n / wall:.0f} tok/s")
            if n == 4097:
                print(events.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))
        model = None
        torch.cuda.empty_cache()
