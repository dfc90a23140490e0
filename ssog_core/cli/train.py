"""``python -m ssog_core.train`` / ``ssog-train``: the training command line."""

from ssog_core.train.trainer import main

__all__ = ["main"]
