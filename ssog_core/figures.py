"""``python -m ssog_core.figures``: calls only :func:`ssog_core.cli.figures.main` (commands in checkpoints)."""

import sys

from ssog_core.cli.figures import main

if __name__ == "__main__":
    sys.exit(main())
