"""Attention operators behind one entry point per family; backends are chosen in :mod:`ssog_core.ops.dispatch`."""

from ssog_core.ops.dispatch import ssog_apply

__all__ = ["ssog_apply"]
