"""``python -m ssog_core.evaluate``: calls only :func:`ssog_core.cli.evaluate.main` (commands in checkpoints)."""

import sys

from ssog_core.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
