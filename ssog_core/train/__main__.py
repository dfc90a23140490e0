"""``python -m ssog_core.train``: only calls :func:`ssog_core.cli.train.main` (checkpoints record this command)."""

import sys

from ssog_core.cli.train import main

sys.exit(main())
