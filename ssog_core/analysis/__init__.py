"""Inspection: what a trained model's attention does (:mod:`~ssog_core.analysis.measures`: layer fields, steering
offsets, attention maps, export maps, key norms), the playground's hand-made head
(:mod:`~ssog_core.analysis.head_spec`) and its presets, the numbers behind each figure
(:mod:`~ssog_core.analysis.report`), class probabilities and their change (:mod:`~ssog_core.analysis.predictions`),
forward latency against tokens (:mod:`~ssog_core.analysis.latency`) and the app's saved sessions
(:mod:`~ssog_core.analysis.session`).

The functions are named for what they return (``layer_fields``, ``steering_offsets``, ``attention_maps``,
``export_maps``, ``key_norms``); ``compute_export_maps`` is the old name of :func:`export_maps`, ``head_fields`` the
old name of :func:`layer_fields` (with a deprecation warning: "head fields" now means any head fitted as a field,
:mod:`~ssog_core.analysis.head_as_field`).
"""

import warnings
from typing import Any

from ssog_core.analysis.measures import (
    DEFAULT_ALPHA,
    AttentionMaps,
    ExportMaps,
    KeyNorms,
    LayerField,
    SteeringOffsets,
    attention_maps,
    export_maps,
    key_norms,
    layer_fields,
    steering_offsets,
)

compute_export_maps = export_maps  # the name before the analysis functions were named for what they return


def __getattr__(name: str) -> Any:
    """``head_fields``, the old name of :func:`layer_fields`, with a deprecation warning."""
    if name == "head_fields":
        warnings.warn("ssog_core.analysis.head_fields is now layer_fields", DeprecationWarning, stacklevel=2)
        return layer_fields
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_ALPHA",
    "AttentionMaps",
    "ExportMaps",
    "KeyNorms",
    "LayerField",
    "SteeringOffsets",
    "attention_maps",
    "compute_export_maps",
    "export_maps",
    "key_norms",
    "layer_fields",
    "steering_offsets",
]
