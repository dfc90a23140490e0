"""``python -m ssog_core.lm_train``: calls only :func:`ssog_core.cli.lm_train.main` (commands in checkpoints)."""

import sys

from ssog_core.cli.lm_train import main

if __name__ == "__main__":
    sys.exit(main())
