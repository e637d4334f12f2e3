"""``python -m phalanx.cli ...``: the ``phalanx`` command (scripts and benchmarks start runs this way)."""

import sys

from phalanx.cli import main

if __name__ == "__main__":
    sys.exit(main())
