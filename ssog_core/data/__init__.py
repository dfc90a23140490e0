"""Data: the training and evaluation sources (:mod:`~ssog_core.data.sources`: CIFAR-100, image folders, the two
procedural sets of :mod:`~ssog_core.data.shapes` and :mod:`~ssog_core.data.layouts`) and image files
(:mod:`~ssog_core.data.images`). Imports nothing else from SSOG Lab."""

from ssog_core.data.sources import DataError, DataSource, open_data

__all__ = ["DataError", "DataSource", "open_data"]
