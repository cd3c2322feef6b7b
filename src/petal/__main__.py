"""``python -m petal``: the ``petal`` command, for environments without the console script."""

import sys

from petal.cli import main

sys.exit(main())
