"""``python -m vime_ext.train``: the training loop's command (``vime_ext/driver/loop.py``), slime's flags."""

from vime_ext.driver.loop import main

if __name__ == "__main__":
    main()
