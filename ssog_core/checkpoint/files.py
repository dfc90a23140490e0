"""Writing files so that a reader never sees half of one: every checkpoint, figure, table and log goes through here."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: str | Path, write: Callable[[str], Any]) -> Path:
    """Call ``write(tmp_path)`` and move the result onto ``path`` only once it is complete.

    The temporary file (``.NAME.*.tmp``) sits beside the target, so the final rename stays on one file system
    and an interrupted write leaves the previous file intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp (or the writer) made it 0600; give it a normal file's permissions
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
