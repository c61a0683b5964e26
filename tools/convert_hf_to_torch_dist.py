"""Convert an HF checkpoint (safetensors) into a Megatron torch_dist checkpoint (iter_0000000)."""

import os

# Conversion is a CPU job on every machine: it does no maths worth a GPU, and with the model on CUDA the
# checkpoint writer's device-to-host staging held about one more copy of the weights in host RAM (SmolLM2 on an
# H100: peak RSS 1.95x the weights above the import floor, against 1.44x on the CPU path).
os.environ["CUDA_VISIBLE_DEVICES"] = ""

from vime_ext.flags import CliParser  # noqa: E402
from vime_ext.models.model_config import ModelShape, ParallelConfig, parse_dtype  # noqa: E402
from vime_ext.sysinfo import peak_rss_mib  # noqa: E402
from vime_ext.trainer.launch import run_on_ranks  # noqa: E402


def convert(hf_dir: str, save_dir: str, parallel: ParallelConfig, dtype_name: str) -> None:
    import torch.distributed as dist

    from vime_ext.convert import mapping_for
    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.trainer.checkpoint import save_model_checkpoint
    from vime_ext.trainer.hf_weights import load_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    shape = ModelShape.from_hf_dir(hf_dir)
    reader = HFCheckpointReader(hf_dir)
    reader.check_names(mapping_for(shape).hf_param_names())
    init_distributed(parallel)
    rank0 = dist.get_rank() == 0
    model = build_gpt_model(shape, parallel, dtype=parse_dtype(dtype_name, hf_dir), init_weights=False)
    load_hf_weights(model, shape, reader.get, progress=rank0)
    out = save_model_checkpoint(model, shape, save_dir, iteration=0)
    if rank0:
        print(f"saved torch_dist checkpoint: {out} (peak RSS of rank 0: {peak_rss_mib():.0f} MiB)")
    destroy_distributed()


def build_parser() -> CliParser:
    parser = CliParser(prog="convert_hf_to_torch_dist.py", description=__doc__)
    parser.add_argument("--hf-checkpoint", required=True, help="HF model directory (config.json + safetensors)")
    parser.add_argument("--save", required=True, help="output directory; gets iter_0000000/ and the tracker file")
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1,
                        help="convert on this many ranks per layer (splits memory only; the checkpoint loads "
                             "under any layout)")
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                        help="convert on this many pipeline stages (splits memory only, as above)")
    parser.add_argument("--dtype", default="auto", help="auto (from config.json), float32, bfloat16, float16")
    return parser


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.hf_checkpoint, "config.json")):
        parser.fail(f"--hf-checkpoint {args.hf_checkpoint}: no config.json there (an HF model directory is "
                    "expected)")
    parallel = ParallelConfig(args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    # torch_dist checkpoints are layout independent: TP/PP here only splits the conversion's memory.
    run_on_ranks(convert, parallel.model_parallel_size, args.hf_checkpoint, args.save, parallel, args.dtype)


if __name__ == "__main__":
    main()
