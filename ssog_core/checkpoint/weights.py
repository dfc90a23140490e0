"""The safetensors file under every checkpoint kind (the lab's ViT, its language model, standard ViT folders):
reading it with clear errors, writing it atomically, and checking that a state dict fits a model, each problem in
words. Nothing here unpickles, and nothing here knows a model config, so every reader builds on it."""

from __future__ import annotations

import pickle
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from ssog_core.checkpoint.files import atomic_write

MAX_CHECKPOINT_BYTES = 2 * 1024**3  # far above any ViT this project trains; refuses absurd uploads early
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with a message meant for a person."""


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module behind ``torch.compile`` and DistributedDataParallel wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def software_versions() -> dict[str, str]:
    """The library versions a checkpoint records (and nothing else about the machine that wrote it)."""
    import numpy as np

    from ssog_core.version import __version__

    return {
        "ssog_lab": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def cpu_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """What a checkpoint stores of ``model``: its tensors on the CPU, contiguous, floating-point ones in ``dtype``
    when given; ``torch.compile`` / DDP wrappers are unwrapped, so no ``_orig_mod.`` or ``module.`` in the keys."""
    state = {}
    for name, t in unwrap(model).state_dict().items():
        t = t.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        state[name] = t.contiguous()
    return state


def write_safetensors(path: str | Path, state: Mapping[str, Tensor], header: Mapping[str, str]) -> Path:
    """The one safetensors writer (ViT and language-model checkpoints): tensors and header, written atomically."""
    tensors, entries = dict(state), dict(header)
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=entries))


def state_dict_problems(model: nn.Module, state: Mapping[str, Tensor]) -> list[str]:
    """Every missing, unexpected, mis-shaped or non-finite tensor of ``state`` for ``model``."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = []
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected)}")
    for k, shape in expected.items():
        if k in state and tuple(state[k].shape) != shape:
            problems.append(f"{k} has shape {tuple(state[k].shape)}, expected {shape}")
    for k, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            problems.append(f"{k} contains NaN or infinite values")
        elif t.is_floating_point() and t.dtype not in WEIGHT_DTYPES:
            problems.append(f"{k} has dtype {t.dtype}; expected one of float32/float16/bfloat16")
    return problems


def load_weights(model: nn.Module, state: Mapping[str, Tensor], source: str, attn: str) -> nn.Module:
    """``model`` in eval mode holding ``state`` as float32, after checking every tensor fits (one
    :class:`CheckpointError` naming ``source``, its attention kind ``attn`` and every problem otherwise)."""
    problems = state_dict_problems(model, state)
    if problems:
        raise CheckpointError(f"{source} does not match its config ({attn}): " + "; ".join(problems))
    model.load_state_dict({k: v.float() for k, v in state.items()}, assign=True)
    return model.eval()


def read_safetensors(path: str | Path) -> tuple[dict[str, str], dict[str, Tensor]]:
    """Header and tensors of any safetensors file this project writes, with clear errors for bad files.

    The one reader for ViT and language-model checkpoints: missing, empty, oversized, pickle-based and
    truncated files are refused with a message that names the file.
    """
    path = Path(path)
    name = path.name
    if not path.is_file():
        raise CheckpointError(f"{name}: no such checkpoint file")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{name} is empty (0 bytes)")
    if size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{name} is {size / 1e9:.1f} GB, over the {MAX_CHECKPOINT_BYTES / 1e9:.0f} GB limit")
    if path.suffix in (".pt", ".pth", ".bin", ".ckpt", ".pkl"):
        raise CheckpointError(
            f"{name} is a pickle-based file; SSOG Lab never unpickles. Convert a upstream-implementation "
            "state dict with `python -m ssog_core convert REF.pt --config '{...}' OUT.safetensors`"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{name} is not a readable safetensors file (truncated or corrupt?): {e}") from None
    return header, state


_WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile and DistributedDataParallel


def clean_state_dict(obj: Any) -> dict[str, Tensor]:
    """The tensors of a loaded ``.pt`` object, unwrapped from training dicts and wrapper prefixes."""
    if isinstance(obj, Mapping):
        for key in ("model", "state_dict", "model_state_dict"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError("the file does not hold a state dict (a mapping of names to tensors)")
    state = {}
    for name, t in obj.items():
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
        state[name] = t
    return state


def _unpickler_detail(message: str) -> str:
    """What torch's weights-only unpickler stumbled on (e.g. the function a pickle would call), without its
    advice to retry with ``weights_only=False``, which is exactly what must never be done with such a file."""
    found = re.search(r"Unsupported global: GLOBAL (\S+)", message)
    if found:
        return f" (it would call {found.group(1)})"
    found = re.search(r"WeightsUnpickler error:\s*(.+)", message)
    return f" ({found.group(1).strip()[:120]})" if found else ""


def read_weights_only(path: str | Path) -> dict[str, Tensor]:
    """Read a pickled PyTorch state dict (an upstream ``.pt``, a ``pytorch_model.bin``) safely
    (``weights_only=True``: tensors and plain containers only)."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise CheckpointError(f"{path.name}: missing or empty file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path.name} was refused: it contains objects other than tensors and plain containers, "
            f"so loading it could run code{_unpickler_detail(str(e))}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path.name} is not a readable PyTorch file (truncated or corrupt?): {e}") from None
    return clean_state_dict(obj)
