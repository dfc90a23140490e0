"""Infrastructure below the domain: what the lab's long-lived processes need, whatever they compute.

* :mod:`~ssog_core.runtime.jobs` — heavy jobs in worker processes or on a Dask cluster (:class:`~ssog_core.runtime.
  jobs.Engine`), and :class:`~ssog_core.runtime.jobs.Cancelled`, what a computation stopped by its caller raises;
* :mod:`~ssog_core.runtime.lru` — the one bounded least-recently-used map (the app's caches, a worker's models and
  its values kept between jobs);
* :mod:`~ssog_core.runtime.folders` — a folder's fingerprint, its files as one zip and back;
* :mod:`~ssog_core.runtime.memory` — glibc's malloc in a long-lived process.

It imports no other package of ``ssog_core`` (tests/test_layout.py): a job's model is opened by the loader its
caller passes in (:class:`~ssog_core.runtime.jobs.ModelRef`).
"""
