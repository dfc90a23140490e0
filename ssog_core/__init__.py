"""SSOG Lab core: the SSOG field, its dot and RBF siblings, a ViT, checkpoints and the analysis API.

Importing this package never imports Triton or touches CUDA.
"""

from ssog_core.checkpoint.format import CheckpointError, load_checkpoint, save_checkpoint
from ssog_core.nn.config import ViTConfig
from ssog_core.nn.vit import ViT
from ssog_core.version import __version__

__all__ = ["CheckpointError", "ViT", "ViTConfig", "__version__", "load_checkpoint", "save_checkpoint"]
