"""Writing files so that a reader never sees half of one: every checkpoint, figure, table and log goes through here,
and so does every marked section of a document (docs/RESULTS.md), each rewritten in place by the script that owns
it: several scripts and hand-written prose share one file."""

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


def section_markers(name: str) -> tuple[str, str]:
    """The begin and end markers of the section ``name``."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def replace_section(path: Path, markers: tuple[str, str], block: str, before: str | None = None) -> None:
    """Put ``block`` (the section, its two markers included) in place of the section between ``markers`` in the
    document ``path``, atomically: a reader, or a crash during the write, sees the old file or the new one.

    Where the document has neither marker (or does not exist) the section is added: just before the text
    ``before`` where the document holds it, else at the end. A document with one marker only, either marker twice
    or the end before the begin is refused (``ValueError``): a hand edit broke the section, and writing anyway
    would duplicate it or swallow text.
    """
    begin, end = markers
    if not (block.startswith(begin) and block.endswith(end)):
        raise ValueError(f"a section written to {path} must start with {begin} and end with {end}")
    text = ""
    if path.is_file():
        with open(path, encoding="utf-8", newline="") as f:  # as it is, line ends included
            text = f.read()
    counts = (text.count(begin), text.count(end))
    if counts == (1, 1) and text.index(begin) < text.index(end):
        new = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    elif counts != (0, 0):
        order = ", the end first" if counts == (1, 1) else ""
        raise ValueError(
            f"{path} holds {begin} {counts[0]}× and {end} {counts[1]}×{order}: put each marker there once, the "
            "begin first, and write the section again"
        )
    elif before is not None and before in text:
        at = text.index(before)
        new = text[:at] + block + "\n\n" + text[at:]
    else:
        new = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(new, encoding="utf-8", newline=""))
