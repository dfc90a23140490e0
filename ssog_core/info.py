"""``python -m ssog_core.info``: calls only :func:`ssog_core.cli.info.main` (commands in checkpoints)."""

import sys

from ssog_core.cli.info import main

if __name__ == "__main__":
    sys.exit(main())
