"""Every command line: ``main(argv)`` per command. ``python -m ssog_core <command>``, ``python -m ssog_core.train``
(what checkpoints record) and the ``ssog-*`` console scripts all call these."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.checkpoint.standard import resolve
from ssog_core.runtime.jobs import Engine, Job

T = TypeVar("T")
SAY_EVERY = 10.0  # seconds between progress lines of a job on a cluster
CLUSTER_HELP = "run the heavy work on a worker of this Dask scheduler (tcp://HOST:PORT), on its GPU if it has one"


def on_cluster(address: str, fn: Callable[..., T], checkpoint: str | Path, *args: Any, unit: str = "images") -> T:
    """``fn((model, meta), *args)`` as one job on the Dask scheduler at ``address``, the checkpoint sent as bytes
    (the workers need not share this machine's files; ``hf-hub:ORG/NAME`` is its folder in this machine's cache),
    its progress on stderr (counted in ``unit``); Ctrl-C stops it there too."""
    path = resolve(checkpoint)
    if not path.exists():  # refused before any scheduler is asked, in load_checkpoint's words
        raise CheckpointError(f"{path.name}: no such checkpoint file")
    engine = Engine.cluster(address)
    try:
        job: Job[T] = engine.submit(fn, engine.model(path, load_checkpoint), *args)
        while True:
            try:
                return job.result(timeout=SAY_EVERY)
            except TimeoutError:
                print(f"{job.note(unit)} on {engine.where}", file=sys.stderr, flush=True)
            except KeyboardInterrupt:
                job.stop()
                raise
    finally:
        engine.close()
