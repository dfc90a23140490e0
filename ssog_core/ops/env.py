"""The environment the kernels run in: whether Triton is installed, whether its interpreter runs them.

Imports nothing else from :mod:`ssog_core.ops` (every module there may import it) and never imports Triton.
"""

from __future__ import annotations

import importlib.util
import os


def triton_installed() -> bool:
    """Whether the triton package is there (found without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels on the CPU (``TRITON_INTERPRET=1``, read before Triton loads)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
