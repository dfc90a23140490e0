"""``python -m ssog_core.convert``: calls only :func:`ssog_core.cli.convert.main` (commands in checkpoints)."""

import sys

from ssog_core.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
