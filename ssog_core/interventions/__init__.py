"""Interventions: edit a trained model for one call, without changing it, and measure what changes.

* :mod:`~ssog_core.interventions.edit` — the base :class:`Edit`, declared fields, the registry :data:`EDITS`,
  parsing and checks; :mod:`~ssog_core.interventions.ops` — one class per op (``close_gate``, ``scale_gate``,
  ``ablate_head``, ``patch_head``, ``drop_atom``, ``set_head``, ``swap_axes``, ``move_atom``,
  ``replace_with_field``).
* :mod:`~ssog_core.interventions.hooks` — the named hook points, :func:`run_with_cache`, :func:`run_with_hooks`.
* :mod:`~ssog_core.interventions.run` — :func:`edited` (an edit list for one ``with`` block) and the unedited
  recordings it needs.
* :mod:`~ssog_core.interventions.validation` — the validation images an effect is measured on;
  :mod:`~ssog_core.interventions.effects` — effects with intervals, McNemar and noise marks;
  :mod:`~ssog_core.interventions.importance` — head importance.
* :mod:`~ssog_core.interventions.result` — :func:`run_intervention`, the one entry the app, the CLI, the notebook
  and MCP call, and its :class:`InterventionResult`.
"""

from ssog_core.interventions import ops  # noqa: F401  (defines and registers the ops)
from ssog_core.interventions.edit import EDITS, Edit, EditError, check_edits, describe, edit_from_dict, parse_edits
from ssog_core.interventions.effects import ImageEffect, ValidationEffect, image_effect, validation_effect
from ssog_core.interventions.hooks import hook_points, run_with_cache, run_with_hooks
from ssog_core.interventions.importance import HeadImportance, head_importance
from ssog_core.interventions.result import InterventionResult, run_intervention
from ssog_core.interventions.run import edited
from ssog_core.interventions.validation import EvalSet, load_eval_set

__all__ = [
    "EDITS",
    "Edit",
    "EditError",
    "EvalSet",
    "HeadImportance",
    "ImageEffect",
    "InterventionResult",
    "ValidationEffect",
    "check_edits",
    "describe",
    "edit_from_dict",
    "edited",
    "head_importance",
    "hook_points",
    "image_effect",
    "load_eval_set",
    "parse_edits",
    "run_intervention",
    "run_with_cache",
    "run_with_hooks",
    "validation_effect",
]
