"""``python -m phalanx ...``: the ``phalanx`` command (torchrun starts learners with ``-m phalanx``)."""

import sys

from phalanx.cli import main

if __name__ == "__main__":
    sys.exit(main())
