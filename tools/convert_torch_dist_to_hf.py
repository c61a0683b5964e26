"""Convert a Megatron torch_dist checkpoint (an iter_* directory) back into an HF checkpoint."""

import dataclasses
import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CPU only, before torch loads: see convert_hf_to_torch_dist.py

from tqdm import tqdm  # noqa: E402

from vime_ext.flags import CliParser  # noqa: E402
from vime_ext.models.model_config import ModelShape, ParallelConfig, parse_dtype  # noqa: E402
from vime_ext.sysinfo import peak_rss_mib  # noqa: E402


def _check_same_shape(recorded: ModelShape | None, expected: ModelShape, ckpt: str, origin: str) -> None:
    if recorded is None or recorded == expected:
        return
    diffs = [f"{f.name}: checkpoint {getattr(recorded, f.name)!r} vs origin {getattr(expected, f.name)!r}"
             for f in dataclasses.fields(ModelShape) if getattr(recorded, f.name) != getattr(expected, f.name)]
    raise SystemExit(f"{ckpt} was saved for a different model than {origin}/config.json: " + "; ".join(diffs))


def convert(input_dir: str, output_dir: str, origin_hf_dir: str, dtype_name: str,
            max_shard_bytes: int) -> None:
    from vime_ext.convert import mapping_for
    from vime_ext.convert.hf_checkpoint import HFCheckpointWriter, copy_side_files
    from vime_ext.trainer.checkpoint import checkpoint_model_shape, load_model_checkpoint, resolve_checkpoint_dir
    from vime_ext.trainer.hf_weights import iter_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    shape = ModelShape.from_hf_dir(origin_hf_dir)
    ckpt = resolve_checkpoint_dir(input_dir)
    _check_same_shape(checkpoint_model_shape(ckpt), shape, str(ckpt), origin_hf_dir)
    parallel = ParallelConfig()
    init_distributed(parallel)
    model = build_gpt_model(shape, parallel, dtype=parse_dtype(dtype_name, origin_hf_dir), init_weights=False)
    iteration = load_model_checkpoint(model, ckpt)
    writer = HFCheckpointWriter(output_dir, max_shard_bytes=max_shard_bytes)
    total = len(mapping_for(shape).hf_param_names())
    for name, tensor in tqdm(iter_hf_weights(model, shape), total=total, desc="write HF weights", unit="tensor"):
        writer.add(name, tensor)
    writer.close()
    copied = copy_side_files(origin_hf_dir, output_dir)
    destroy_distributed()
    print(f"wrote HF checkpoint of iteration {iteration} to {output_dir} "
          f"({writer.total_bytes / 2**20:.1f} MiB of weights; copied {', '.join(copied) or 'no side files'}; "
          f"peak RSS {peak_rss_mib():.0f} MiB)")


def build_parser() -> CliParser:
    parser = CliParser(prog="convert_torch_dist_to_hf.py", description=__doc__)
    parser.add_argument("--input-dir", required=True, help="iter_XXXXXXX directory, or the save directory")
    parser.add_argument("--output-dir", required=True, help="where the HF checkpoint is written")
    parser.add_argument("--origin-hf-dir", required=True, help="the HF checkpoint training started from "
                        "(config and tokenizer files are copied from it)")
    parser.add_argument("--dtype", default="auto", help="auto (from the origin config.json), float32, bfloat16")
    parser.add_argument("--max-shard-size-mb", type=int, default=4096,
                        help="largest safetensors file written (MiB)")
    return parser


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.origin_hf_dir, "config.json")):
        parser.fail(f"--origin-hf-dir {args.origin_hf_dir}: no config.json there (the HF model training started "
                    "from is expected)")
    from vime_ext.trainer.checkpoint import CheckpointError, resolve_checkpoint_dir

    try:
        resolve_checkpoint_dir(args.input_dir)
    except CheckpointError as err:
        parser.fail(f"--input-dir {args.input_dir}: {err}")
    convert(args.input_dir, args.output_dir, args.origin_hf_dir, args.dtype, args.max_shard_size_mb * 2**20)


if __name__ == "__main__":
    main()
