"""A folder as one thing: its fingerprint (a cache key that changes when a file in it changes), its files as one zip
(what a job sends to a worker that shares no files, and what a model folder's hash is taken of), and the safe way
from a zip back to a folder's files. A file stands for itself wherever a folder may be given.

Member names of an archive never become paths by themselves: a name that climbs out (``..``, an absolute path, a
drive) or a link refuses the whole archive, and each member is written under a base name the caller chose, the bytes
counted while they are written (an archive may declare fewer than it holds)."""

from __future__ import annotations

import io
import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

CHUNK = 1024**2
FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # every packed file's date: equal folders pack, and hash, alike


class FolderError(ValueError):
    """A folder or an archive refused, with a sentence that says why."""


class OverCap(FolderError):
    """An archive that unpacks to more bytes than its caller allows."""


def folder_files(folder: Path) -> list[Path]:
    """The files directly in ``folder`` (sub-folders are no part of it), by name."""
    return sorted(f for f in folder.iterdir() if f.is_file())


def fingerprint(path: str | Path) -> tuple[str, int, int]:
    """(path, modification time, size) of a file; of a folder, its newest file's time and its files' total size:
    a file changed, added or removed gives another fingerprint."""
    path = Path(path)
    stats = [f.stat() for f in folder_files(path)] if path.is_dir() else [path.stat()]
    return str(path), max((st.st_mtime_ns for st in stats), default=0), sum(st.st_size for st in stats)


def pack(path: str | Path) -> bytes:
    """A file's bytes; a folder's files as one uncompressed zip with fixed dates, so equal folders pack alike
    (:class:`FolderError` for a folder without files)."""
    path = Path(path)
    if not path.is_dir():
        return path.read_bytes()
    files = folder_files(path)
    if not files:
        raise FolderError(f"{path.name} is an empty folder")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for f in files:
            z.writestr(zipfile.ZipInfo(f.name, date_time=FIXED_DATE), f.read_bytes())
    return buf.getvalue()


def checked_members(archive: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """The archive's file members, each name checked: one that points outside the archive or is a link refuses the
    whole archive (:class:`FolderError`)."""
    infos = [i for i in archive.infolist() if not i.is_dir()]
    for info in infos:
        parts = PurePosixPath(info.filename.replace("\\", "/")).parts
        if info.filename.startswith(("/", "\\")) or ".." in parts or (parts and parts[0].endswith(":")):
            raise FolderError(f"member {info.filename!r} points outside the archive")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise FolderError(f"member {info.filename!r} is a link")
    return infos


def extract(archive: zipfile.ZipFile, members: Mapping[str, zipfile.ZipInfo], folder: Path, cap: int) -> int:
    """Write each member into ``folder`` under its key (a base name the caller chose), at most ``cap`` bytes in
    all (:class:`OverCap` past it); the bytes written."""
    written = 0
    for base, info in members.items():
        with archive.open(info) as src, open(folder / base, "wb") as out:
            while chunk := src.read(CHUNK):
                written += len(chunk)
                if written > cap:
                    raise OverCap(f"it unpacks to more than the {cap:,} bytes allowed")
                out.write(chunk)
    return written


def unpack(data: bytes, folder: Path, cap: int) -> Path:
    """The files :func:`pack` made of a folder, written into the existing empty ``folder`` (at most ``cap``
    bytes); a member in a sub-folder, climbing out or a link refuses them (:class:`FolderError`)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {}
        for info in checked_members(z):
            parts = PurePosixPath(info.filename.replace("\\", "/")).parts
            if len(parts) != 1:
                raise FolderError(f"member {info.filename!r} is not a file of one folder")
            members[parts[0]] = info
        extract(z, members, folder, cap)
    return folder
