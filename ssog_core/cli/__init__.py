"""Every command line: ``main(argv)`` per command. ``python -m ssog_core <command>``, ``python -m ssog_core.train``
(what checkpoints record) and the ``ssog-*`` console scripts all call these."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.runtime.jobs import Engine, Job

T = TypeVar("T")
SAY_EVERY = 10.0  # seconds between progress lines of a job on a cluster
CLUSTER_HELP = "run the heavy work on a worker of this Dask scheduler (tcp://HOST:PORT), on its CPU"


def on_cluster(address: str, fn: Callable[..., T], checkpoint: str | Path, *args: Any) -> T:
    """``fn((model, meta), *args)`` as one job on the Dask scheduler at ``address``, the checkpoint sent as bytes
    (the workers need not share this machine's files), its progress on stderr; Ctrl-C stops it there too."""
    engine = Engine.cluster(address)
    try:
        job: Job[T] = engine.submit(fn, engine.model(checkpoint, load_checkpoint), *args)
        while True:
            try:
                return job.result(timeout=SAY_EVERY)
            except TimeoutError:
                print(f"{job.note()} on {engine.where}", file=sys.stderr, flush=True)
            except KeyboardInterrupt:
                job.stop()
                raise
    finally:
        engine.close()
