"""``python -m ssog_core.export_maps``: calls only :func:`ssog_core.cli.export_maps.main` (commands in checkpoints)."""

import sys

from ssog_core.cli.export_maps import main

if __name__ == "__main__":
    sys.exit(main())
