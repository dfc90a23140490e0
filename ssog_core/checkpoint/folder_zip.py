"""A model folder sent as one ``.zip`` (a timm or transformers folder: ``config.json``, ``model.safetensors``,
optionally ``preprocessor_config.json``), unpacked safely into a folder the lab opens.

Member names never become paths: only the model files are taken, by their base name, from the one folder of the
archive that holds ``config.json`` (the archive's top level or a single folder in it), and written under names this
module chooses. A member name that climbs out (``..``, an absolute path) or is a link refuses the whole archive. The
sizes the archive declares are checked against the cap before anything is written, and the bytes written are
counted again while they are (both in :mod:`ssog_core.runtime.folders`). The folder is unpacked beside its target
under a hidden temporary name, opened as a model (so an unsupported family or weights that do not fit are refused in
words), and only then renamed into place: a reader never sees half a folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from ssog_core.checkpoint.standard import load_standard
from ssog_core.checkpoint.weights import MAX_CHECKPOINT_BYTES, CheckpointError
from ssog_core.runtime.folders import FolderError, OverCap, checked_members, extract

MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "preprocessor_config.json")
MAX_FOLDER_BYTES = MAX_CHECKPOINT_BYTES + 16 * 1024**2  # the weights the lab reads, plus the JSON files beside them
TEMP_PREFIX = ".unpacking-"  # hidden: pickers and listings skip names starting with a dot


def _model_members(archive: zipfile.ZipFile, name: str) -> dict[str, zipfile.ZipInfo]:
    """The model files of the archive's folder holding ``config.json``, by base name (refused in words)."""
    try:
        infos = checked_members(archive)
    except FolderError as e:
        raise CheckpointError(f"{name} was refused: {e}") from None
    configs = [i for i in infos if PurePosixPath(i.filename).name == "config.json"]
    configs = [i for i in configs if len(PurePosixPath(i.filename).parts) <= 2]  # top level, or one folder down
    if not configs:
        raise CheckpointError(
            f"{name} holds no config.json (at its top level or in one folder): zip a model folder in timm's or "
            "transformers' layout (config.json, model.safetensors, optionally preprocessor_config.json)"
        )
    if len(configs) > 1:
        where = ", ".join(i.filename for i in configs)
        raise CheckpointError(f"{name} holds {len(configs)} model folders ({where}): zip one model folder")
    folder = PurePosixPath(configs[0].filename).parent
    return {p.name: i for i in infos if (p := PurePosixPath(i.filename)).parent == folder and p.name in MODEL_FILES}


def _size(n: int) -> str:
    return f"{n / 1024**2:,.1f} MB" if n >= 100 * 1024 else f"{n:,} bytes"


def unpack_model_zip(source: str | Path, target: str | Path, cap: int | None = None) -> Path:
    """Unpack the model folder zipped in ``source`` to the new folder ``target`` (which must not exist) and return
    it, after opening it as a model; nothing is left behind when it is refused (``CheckpointError``, in words).
    ``cap``: the most bytes the folder may take (default :data:`MAX_FOLDER_BYTES`)."""
    cap = MAX_FOLDER_BYTES if cap is None else int(cap)
    source, target = Path(source), Path(target)
    name = source.name
    if target.exists():
        raise CheckpointError(f"{target} already exists: a model folder is never unpacked over another")
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"{name} is not a readable zip file ({e})") from None
    with archive:
        members = _model_members(archive, name)
        declared = sum(i.file_size for i in members.values())
        if declared > cap:
            raise CheckpointError(
                f"{name} unpacks to {_size(declared)}, over the {_size(cap)} a model folder may take: refused "
                "before extracting"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(dir=target.parent, prefix=TEMP_PREFIX))
        folder = temp / target.name  # unpacked under its own name: the reader's messages name the folder
        try:
            folder.mkdir()
            extract(archive, members, folder, cap)
            load_standard(folder)  # an unsupported family, missing weights or weights that do not fit: refused here
            os.rename(folder, target)
        except OverCap:  # an archive may declare less than it holds
            raise CheckpointError(
                f"{name}: it unpacks to more than the {_size(cap)} a model folder may take: refused"
            ) from None
        except CheckpointError as e:
            raise CheckpointError(f"{name}: {e}") from None
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, RuntimeError) as e:
            raise CheckpointError(f"{name} could not be unpacked: {e}") from None
        finally:
            shutil.rmtree(temp, ignore_errors=True)
    return target
