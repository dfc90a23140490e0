"""Shared test settings: deterministic seeds, offline and quiet Gradio, and the environment Dask changes put back."""

import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

# A Dask LocalCluster made in this process sets these in os.environ for its worker processes (one BLAS thread
# each) and leaves them there: a later test's subprocess would then sum with one BLAS thread where this process
# sums with several, and training would not repeat bit for bit.
DASK_SETS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_", "PYTHONHASHSEED")
_START = {key: os.environ.get(key) for key in DASK_SETS}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _dask_environ() -> Iterator[None]:
    """Each test starts with the values these had when the session started (after any module fixture's cluster)."""
    for key, value in _START.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    yield
