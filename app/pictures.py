"""The pictures a model is measured on, as the page chooses them: the model's recorded data (its validation set; the
bundled pictures for a model that records none), the bundled pictures, or pictures the user uploaded (a folder, a
``.zip`` or picture files). A choice becomes the core's :class:`~ssog_core.interventions.validation.Pictures`
(:func:`chosen`), which every measurement on many images takes (head fields, validation effects, head importance);
each result names the images it was made from (:meth:`~ssog_core.interventions.validation.EvalSet.words`).

Uploaded pictures are kept as a folder of this server's upload folder, named after the upload; member names of a
``.zip`` never become paths (each picture is written under a name made here), every picture is decoded with the
pixel cap before it is kept, and the folder is renamed into place once complete.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from app.state import AppContext, AppError
from ssog_core.data.images import IMAGE_SUFFIXES, MAX_BYTES, ImageError, load_image
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, Pictures, picture_count

RECORDED = "the model's recorded data"  # its validation set, or the bundled pictures for a model that records none
BUNDLED = "the bundled pictures"
UPLOADED = "uploaded: "  # the prefix of a folder of pictures uploaded to this server
FOLDER = "pictures"  # where uploaded pictures live, inside the app's upload folder
MAX_UPLOAD_BYTES = 512 * 1024**2  # all the pictures of one upload together


def root(ctx: AppContext) -> Path:
    return ctx.upload_dir / FOLDER


def choices(ctx: AppContext) -> list[str]:
    """What the page's pictures chooser offers: the recorded data, the bundled pictures, then every upload."""
    folders = sorted(p.name for p in root(ctx).iterdir() if p.is_dir() and not p.name.startswith(".")) if root(
        ctx
    ).is_dir() else []  # fmt: skip
    return [RECORDED, BUNDLED, *(UPLOADED + name for name in folders)]


def chosen(ctx: AppContext, choice: str | None) -> Pictures:
    """The core's pictures for a chooser value (empty: the recorded data); an unknown one is refused in words."""
    if not choice or choice == RECORDED:
        return Pictures(bundled=ctx.assets_dir)
    if choice == BUNDLED:
        return Pictures(folder=ctx.assets_dir, bundled=ctx.assets_dir)
    name = choice[len(UPLOADED) :] if choice.startswith(UPLOADED) else ""
    folder = root(ctx) / name
    if not name or "/" in name or "\\" in name or name.startswith(".") or not folder.is_dir():
        offered = ", ".join(repr(c) for c in choices(ctx))
        raise AppError(f"no pictures {choice!r} on this server: choose one of {offered}")
    return Pictures(folder=folder, bundled=ctx.assets_dir)


def count(ctx: AppContext, choice: str | None) -> int:
    """How many pictures a chooser value's folder holds (at most the most measured; its recorded data: the bundled
    pictures, which a model that records none is measured on)."""
    pictures = chosen(ctx, choice)
    return picture_count(pictures.folder or pictures.bundled)


def add(ctx: AppContext, files: list[str]) -> str:
    """Keep uploaded pictures as a new folder and return its chooser value: picture files (a folder's, or several
    picked at once) or one ``.zip`` of pictures. Files that are not pictures by their suffix are left out; a
    picture that does not decode refuses the upload, named."""
    paths = [Path(f) for f in files or [] if f]
    if not paths:
        raise AppError("no pictures uploaded")
    if len(paths) == 1 and paths[0].suffix.lower() == ".zip":
        stem, members = paths[0].stem, _zip_members(paths[0])
    else:
        stem = paths[0].parent.name if len(paths) > 1 else paths[0].stem
        members = [(p.name, p.read_bytes()) for p in sorted(paths, key=lambda p: p.name) if _is_picture(p.name)]
    if not members:
        raise AppError(f"the upload holds no pictures ({', '.join(sorted(s.lstrip('.') for s in IMAGE_SUFFIXES))})")
    if len(members) > MAX_EVAL_IMAGES:
        raise AppError(f"the upload holds {len(members)} pictures: at most {MAX_EVAL_IMAGES} are measured")
    root(ctx).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".uploading-", dir=root(ctx)))
    try:
        for i, (name, data) in enumerate(members):
            try:
                load_image(data, max_pixels=ctx.max_pixels)
            except ImageError as e:
                raise AppError(str(e).replace("image", name, 1)) from None
            (tmp / f"{i:04d}_{_safe(PurePosixPath(name).stem)}{PurePosixPath(name).suffix.lower()}").write_bytes(data)
        dest = _target(ctx, stem)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return UPLOADED + dest.name


def _is_picture(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in IMAGE_SUFFIXES and not PurePosixPath(name).name.startswith(".")


def _zip_members(path: Path) -> list[tuple[str, bytes]]:
    """The pictures of a ``.zip`` by their member names (in name order), each read with the size caps."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = sorted((i for i in archive.infolist() if not i.is_dir() and _is_picture(i.filename)),
                           key=lambda i: i.filename)  # fmt: skip
            if sum(i.file_size for i in infos) > MAX_UPLOAD_BYTES:
                raise AppError(f"{path.name} unpacks to over {MAX_UPLOAD_BYTES // 1024**2} MB of pictures")
            out = []
            for info in infos:
                with archive.open(info) as f:
                    data = f.read(MAX_BYTES + 1)  # an archive may declare less than it holds
                if len(data) > MAX_BYTES:
                    raise AppError(f"{info.filename} is over the {MAX_BYTES // 1024**2} MB limit for pictures")
                out.append((info.filename, data))
            return out
    except (zipfile.BadZipFile, OSError) as e:
        raise AppError(f"{path.name} is not a readable .zip: {e}") from None


def _safe(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in stem)[:80] or "pictures"


def _target(ctx: AppContext, stem: str) -> Path:
    """A new folder name for an upload called ``stem``."""
    base = _safe(stem)
    dest, n = root(ctx) / base, 1
    while dest.exists():
        n += 1
        dest = root(ctx) / f"{base}_{n}"
    return dest
