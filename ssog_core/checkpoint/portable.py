"""Checkpoint metadata that says nothing about the machine it was made on: paths relative to the working directory,
and of the software only its versions (no platform string, host or user names)."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ssog_core.checkpoint.files import atomic_write

PATH_ARGS = ("data", "out", "init_from", "tensorboard")  # the training settings (``train_args``) that name files
MACHINE_DETAILS = ("platform",)  # ``software`` entries of earlier checkpoints that describe the machine


def relative_path(text: str, root: str | Path | None = None) -> str:
    """``text`` relative to ``root`` (default: the working directory) if it is an absolute path, or a data spec
    ``KIND:PATH`` whose path is; anything else unchanged."""
    root = Path.cwd() if root is None else Path(root)
    if os.path.isabs(text):
        return os.path.relpath(text, root)
    kind, sep, rest = text.partition(":")
    if sep and kind.isidentifier() and os.path.isabs(rest):
        return f"{kind}:{os.path.relpath(rest, root)}"
    return text


def portable_argv(argv: Sequence[str], root: str | Path | None = None) -> list[str]:
    """A command line's arguments with every absolute path (also in ``--opt=PATH`` and ``KIND:PATH``) made relative."""
    out = []
    for arg in argv:
        option, eq, value = arg.partition("=")
        if arg.startswith("--") and eq:
            out.append(f"{option}={relative_path(value, root)}")
        else:
            out.append(relative_path(arg, root))
    return out


def portable_meta(meta: Mapping[str, Any], root: str | Path | None = None) -> dict[str, Any]:
    """``meta`` (a checkpoint's metadata) with its paths made relative to ``root`` and machine details dropped."""
    meta = dict(meta)
    if isinstance(meta.get("software"), Mapping):
        meta["software"] = {k: v for k, v in meta["software"].items() if k not in MACHINE_DETAILS}
    if isinstance(meta.get("command"), str):
        meta["command"] = shlex.join(portable_argv(shlex.split(meta["command"]), root))
    if isinstance(meta.get("data"), str):
        meta["data"] = relative_path(meta["data"], root)
    if isinstance(meta.get("train_args"), Mapping):
        args = dict(meta["train_args"])
        for name in PATH_ARGS:
            if isinstance(args.get(name), str):
                args[name] = relative_path(args[name], root)
        meta["train_args"] = args
    return meta


def rewrite_portable(path: str | Path, root: str | Path) -> bool:
    """Rewrite the ``meta`` header entry of a safetensors checkpoint with :func:`portable_meta` (paths relative to
    ``root``, the folder its run was started from), keeping every tensor byte as it is: only the JSON header before
    them changes. The new file replaces the old one atomically. Returns whether anything changed."""
    path = Path(path)
    blob = path.read_bytes()
    size = int.from_bytes(blob[:8], "little") if len(blob) >= 8 else -1
    try:
        header = json.loads(blob[8 : 8 + size]) if 0 < size <= len(blob) - 8 else None
        meta = json.loads(header["__metadata__"]["meta"])
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"{path.name} is not a safetensors checkpoint with a JSON 'meta' header entry") from None
    portable = portable_meta(meta, root)
    if portable == meta:
        return False
    header["__metadata__"]["meta"] = json.dumps(portable)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensors start 8-byte aligned, as safetensors writes them
    data = blob[8 + size :]
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(len(text).to_bytes(8, "little") + text + data))
    return True
