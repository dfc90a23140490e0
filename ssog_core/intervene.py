"""``python -m ssog_core.intervene``: calls only :func:`ssog_core.cli.intervene.main` (the interventions CLI)."""

import sys

from ssog_core.cli.intervene import main

if __name__ == "__main__":
    sys.exit(main())
