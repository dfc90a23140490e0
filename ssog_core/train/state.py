"""The resume state (``train_state.pt``): its version, the RNG states of every process, reading it back, where a
resumed run continues and its config."""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ssog_core.checkpoint.format import CheckpointError, read_checkpoint
from ssog_core.checkpoint.portable import PATH_ARGS
from ssog_core.data.sources import PROCEDURAL
from ssog_core.train.config import RUNTIME_OPTIONS, TrainConfig, TrainError

STATE_VERSION = 1


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "gauss": [int(np_state[3]), float(np_state[4])],
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["gauss"][0], n["gauss"][1]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resume_point(
    out: Path, now: TrainConfig, explicit: set[str], talk: bool
) -> tuple[TrainConfig, str, dict[str, Any] | None]:
    """Where ``--resume`` continues the run in ``out``: its config, command and resume state.

    A save writes ``last.safetensors`` before ``train_state.pt``, so a kill between the two writes of the first
    save leaves a checkpoint without a state: the run then starts afresh with the checkpoint's settings (saying so
    when ``talk``), which ends where the uninterrupted run would.
    """
    if (out / "train_state.pt").exists():
        state = load_train_state(out / "train_state.pt")
        return resume_config(now, explicit, state["args"]), state["command"], state
    found = sorted(out.glob("*.safetensors"), key=lambda p: p.name != "last.safetensors")
    if not found:
        raise TrainError(
            f"nothing to resume in {out}: no checkpoint was written there yet; start the run without --resume"
        )
    try:
        meta = read_checkpoint(found[0])[2]
    except CheckpointError as e:
        raise TrainError(f"cannot resume from {found[0]}: {e}") from None
    if not isinstance(meta.get("train_args"), dict) or not isinstance(meta.get("command"), str):
        raise TrainError(f"{found[0]} records no training settings: it was not written by a training run")
    if talk:
        print(
            f"{out} holds {found[0].name} but no complete training state yet (the run was stopped during its first "
            "save): starting it afresh with its settings",
            file=sys.stderr,
        )
    return resume_config(now, explicit, meta["train_args"]), meta["command"], None


def load_train_state(path: Path) -> dict[str, Any]:
    """The resume file, read without unpickling anything but tensors and plain containers."""
    if not path.is_file():
        raise TrainError(f"nothing to resume: {path} does not exist (was the run started with this --out?)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises many types for a bad file; all mean "unusable")
        raise TrainError(f"{path} is not a readable training state (truncated or corrupt?): {e}") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise TrainError(f"{path} is not a training state of this version of SSOG Lab")
    return state


def same_setting(name: str, now: Any, then: Any) -> bool:
    """Whether a setting given now is the saved run's. A setting naming a file or folder (``--data KIND:PATH``
    included) compares as the path it names, symbolic links followed, relative to the working directory: the
    relative form a checkpoint records (its metadata is made portable) and the absolute form a person types for
    the same folder are one recipe."""
    if now == then:
        return True
    if name not in PATH_ARGS or not (isinstance(now, str) and isinstance(then, str)):
        return False
    if name == "data":
        kind, _, now = now.partition(":")
        then_kind, _, then = then.partition(":")
        if kind != then_kind or kind in PROCEDURAL:  # a procedural kind's text is its options, not a path
            return False
    return os.path.realpath(now) == os.path.realpath(then)


def resume_config(now: TrainConfig, explicit: set[str], saved: Mapping[str, Any]) -> TrainConfig:
    """The saved run's config (``saved``: its stored ``args``, of any earlier version), with the runtime options of
    ``now``; ``explicit``: the options given on this command line. Refuses changes to the recipe."""
    current = now.to_dict()
    changed = []
    for name in sorted(explicit - RUNTIME_OPTIONS):
        then = saved.get(name)
        if not same_setting(name, current[name], list(then) if isinstance(then, tuple) else then):
            changed.append(f"--{name.replace('_', '-')} {then!r} -> {getattr(now, name)!r}")
    if changed:
        raise TrainError("a resumed run must keep its recipe; these differ from the saved run: " + "; ".join(changed))
    merged = {**current, **saved}  # settings newer than the saved run keep their defaults
    for name in RUNTIME_OPTIONS:  # how to run now: as given now (or its default), never the saved value
        merged[name] = current[name]
    return TrainConfig.from_dict(merged)
