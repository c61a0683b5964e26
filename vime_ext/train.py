"""``python -m vime_ext.train`` (and the root ``train.py``): the training loop's command, slime's flags
(``vime_ext/arguments.py``); the loop itself is ``vime_ext/driver/loop.py``."""

import sys

from vime_ext.arguments import ConfigError, parse_train_args
from vime_ext.data.prompt_dataset import DataError
from vime_ext.driver.loop import Trainer
from vime_ext.trainer.checkpoint import SaveError


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
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
