"""SSOG Lab core: the SSOG field, its dot and RBF siblings, a ViT, checkpoints and the analysis API.

Importing this package never imports Triton or touches CUDA.
"""

__version__ = "0.1.0"

from ssog_core.checkpoint.format import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402
from ssog_core.nn.config import ViTConfig  # noqa: E402
from ssog_core.nn.vit import ViT  # noqa: E402

__all__ = ["CheckpointError", "ViT", "ViTConfig", "__version__", "load_checkpoint", "save_checkpoint"]
