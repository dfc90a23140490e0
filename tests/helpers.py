"""Small helpers more than one test module needs: checkpoint weights compared tensor by tensor, and a pickle that
shows whether it was ever loaded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


def steered_vit(config: dict, seed: int) -> torch.nn.Module:
    """A float64 ViT with open gates and active probes (so steering changes the field) and atoms spread out."""
    from ssog_core import ViT

    torch.manual_seed(seed)
    model = ViT(**config, cold_init=False).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "delta" in name or "lambda_gate" in name:
                p.normal_(0, 0.4)
            elif name.endswith(".mu"):
                p.normal_(0, 1.5)
    return model


@contextmanager
def one_thread_cluster() -> Iterator[str]:
    """A Dask scheduler with one worker thread in this process, yielding its address; torch's thread count (a job
    sets it to the engine's 1, and the in-process runs compared with it use the same: a sum split over more threads
    may round otherwise) restored after."""
    from distributed import LocalCluster

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=":0",
                          silence_logs=50) as c:  # fmt: skip
            yield c.scheduler_address
    finally:
        torch.set_num_threads(threads)
