"""``python -m fencelock``: the same as the ``fencelock`` command."""

from fencelock.cli import console_main

if __name__ == "__main__":
    console_main()
