"""Rewrite checkpoints' metadata so that they say nothing about the machine that trained them: absolute paths made
relative to the folder the runs were started from, the platform string dropped; every tensor byte is kept.

    python checkpoints/portable_headers.py --root FOLDER_THE_RUNS_STARTED_IN checkpoints/*.safetensors

Checkpoints written since record it this way themselves (``ssog_core.checkpoint.portable``); this is for older
files. Each file is replaced atomically, and only if something changes.
"""

from __future__ import annotations

import argparse
import sys

from ssog_core.checkpoint.portable import rewrite_portable


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="the working directory the runs were started from")
    ap.add_argument("files", nargs="+", help="safetensors checkpoints")
    args = ap.parse_args(argv)
    for name in args.files:
        try:
            changed = rewrite_portable(name, args.root)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{name}: {'rewritten' if changed else 'already portable'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
