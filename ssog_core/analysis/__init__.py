"""Inspection: what a trained model's attention does (:mod:`~ssog_core.analysis.measures`: head fields, steering
offsets, attention maps, export maps, key norms), the playground's hand-made head
(:mod:`~ssog_core.analysis.head_spec`) and its presets, the numbers behind each figure
(:mod:`~ssog_core.analysis.report`), class probabilities and their change (:mod:`~ssog_core.analysis.predictions`),
forward latency against tokens (:mod:`~ssog_core.analysis.latency`) and the app's saved sessions
(:mod:`~ssog_core.analysis.session`).

The functions are named for what they return (``head_fields``, ``steering_offsets``, ``attention_maps``,
``export_maps``, ``key_norms``); ``compute_export_maps`` is the old name of :func:`export_maps`.
"""

from ssog_core.analysis.measures import (
    DEFAULT_ALPHA,
    AttentionMaps,
    ExportMaps,
    KeyNorms,
    LayerField,
    SteeringOffsets,
    attention_maps,
    export_maps,
    head_fields,
    key_norms,
    steering_offsets,
)

compute_export_maps = export_maps  # the name before the analysis functions were named for what they return

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
    "head_fields",
    "key_norms",
    "steering_offsets",
]
