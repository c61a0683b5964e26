"""``python train_async.py [flags]``: ``train.py --async-training`` (slime's launcher name for the asynchronous
loop): the next rollouts are generated while the trainer trains, under ``--max-staleness``."""

import sys

from vime_ext.train import main

if __name__ == "__main__":
    main(["--async-training", *sys.argv[1:]])
