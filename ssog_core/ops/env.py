"""The environment the kernels run in: whether Triton is installed, whether its interpreter runs them.

Imports nothing else from :mod:`ssog_core.ops` (every module there may import it) and never imports Triton.
"""

from __future__ import annotations

import importlib.util
import os

# Looked up once, at import: a lookup inside the dispatch would be traced by torch.compile, and Dynamo refuses to
# trace importlib's find_spec (torch 2.11), which broke fullgraph compiles of any model with SSOG layers.
_TRITON_FOUND = importlib.util.find_spec("triton") is not None


def triton_installed() -> bool:
    """Whether the triton package is there (found without importing it, when this module was imported)."""
    return _TRITON_FOUND


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels on the CPU (``TRITON_INTERPRET=1``, read before Triton loads)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
