"""``python train.py [flags]``: the same as ``python -m vime_ext.train`` (see vime_ext/train.py)."""

from vime_ext.train import main

if __name__ == "__main__":
    main()
