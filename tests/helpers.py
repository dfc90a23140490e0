"""Small helpers more than one test module needs: checkpoint weights compared tensor by tensor, and a pickle that
shows whether it was ever loaded."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


def weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, as stored (no model, no checks)."""
    return load_file(str(path))


def assert_same_weights(a: Path, b: Path, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Two checkpoints hold the same tensors (bit for bit by default), each compared under its own name."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=rtol, atol=atol, msg=k)


class RunsCode:
    """Unpickling this calls ``Path.touch(marker)``: a file that appears only if a pickle was ever loaded, so a
    loader must refuse the file before that happens."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))
