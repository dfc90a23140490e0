"""Tables and files about a checkpoint and its analysis: model card, atom table, predictions, CSV / npz.

Shared by the app (which shows them) and the headless CLI (which writes them), so both report the same
numbers. Everything is derived from :mod:`ssog_core.analysis.measures`, :mod:`ssog_core.nn.cost` and the checkpoint's
metadata.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor, nn

from ssog_core.analysis.head_as_field import HeadFieldStats, field_rows
from ssog_core.analysis.measures import (
    ExportMaps,
    LayerField,
    SteeringOffsets,
    density_moments,
    field_geometry,
    head_stats,
    layer_fields,
)
from ssog_core.analysis.predictions import probabilities
from ssog_core.analysis.presets import STRIP_RATIO
from ssog_core.nn.attention import gate_start
from ssog_core.nn.config import ViTConfig
from ssog_core.nn.cost import count_flops, count_params

ATOM_COLUMNS = [
    "layer",
    "head",
    "atom",
    "mu_y",
    "mu_x",
    "looks_at_dy",
    "looks_at_dx",
    "sigma_y",
    "sigma_x",
    "lambda",
    "head_entropy_nats",
    "head_radius_cells",
]


def initial_gate_scale(config: ViTConfig) -> float:
    """The value every gate scale starts from (cold or warm start)."""
    return gate_start(config.cold_init)


def layer_geometry(model: nn.Module) -> list[dict[str, Any]]:
    """Per SSOG layer: mean reach (cells), the most elongated head, strips (long/short spread ≥ STRIP_RATIO) and
    each tap's gate opening (scale ÷ its cold or warm start): the numbers a results table reads off a model."""
    start = initial_gate_scale(model.config)
    return [
        {
            "reach": float(lf.reach.mean()),
            "max_elongation": float(lf.elongation.max()),
            "strips": int((lf.elongation >= STRIP_RATIO).sum()),
            "gate_opening": {tap: float(s) / start for tap, s in lf.gates.items()},
        }
        for lf in layer_fields(model)
    ]


def head_field_layers(stats: HeadFieldStats) -> tuple[list[LayerField], list[LayerField]]:
    """Any model's heads as fields, per layer as an SSOG layer's geometry is kept (so they are drawn and tabled
    alike): the measured positional fields, each with its fitted atoms, and the fitted atoms' own fields (τ = 1).
    The positional field is kept over query − key; a layer's density is over key − query, so it is flipped. H and
    r are those of the field applied to every query (:func:`~ssog_core.analysis.head_as_field.field_rows`)."""
    gh, gw = stats.grid
    measured, fitted = [], []
    for field, fit in zip(stats.field, stats.fits, strict=True):
        density = field.flip(-2, -1)
        spread, reach = density_moments(density)
        s = head_stats(field_rows(field, stats.grid), stats.grid)
        f32 = [t.float().cpu() for t in (density, fit.mu, fit.sigma, fit.lam, s["entropy"], s["radius"], spread, reach)]
        measured.append(LayerField(f32[0], (gh - 1, gw - 1), *f32[1:4], 1.0, {}, *f32[4:]))
        fitted.append(field_geometry(fit.field(), stats.grid, "factorized", {}))
    return measured, fitted


FIT_NOTE = (
    "atoms: the factorized SSOG field (tau = 1) of K Gaussians closest to the head's renormalised patch-to-patch "
    "attention in mean KL over patch queries and images (L-BFGS from three deterministic starts); shares: 1 - mean "
    "total-variation distance to the fitted atoms (share_fit), to the positional field (share_field: the head's mean "
    "over the pairs of each displacement, a description of the head, not the closest content-blind field, so a fit "
    "can beat it) and to the uniform field over in-grid keys (share_uniform, the baseline); normalised: "
    "(share - share_uniform) / (1 - share_uniform), the part of the head's departure from uniform the field explains "
    "(null for a diffuse head, within 0.1 mean TV of uniform; entropy against max_entropy = log N says how flat)"
)


def fields_json(stats: HeadFieldStats, checkpoint: str) -> dict[str, Any]:
    """Every head of ``checkpoint`` as a field, as ``python -m ssog_core fields`` writes it and the app's
    ``/head_fields`` returns it: ``checkpoint``; ``images`` (which images, as their chooser describes them, with
    ``measured``, how many, and their ``size``); ``measured_on`` (the same in words); ``grid``, ``patch_px``,
    ``num_prefix_tokens``, ``atoms_per_head``, ``max_entropy`` (``log N``), ``method`` and ``heads``
    (:func:`heads_json`)."""
    return {
        "checkpoint": str(checkpoint),
        "images": {**stats.pictures, "measured": stats.images, "size": list(stats.size)},
        "measured_on": stats.measured_on,
        "grid": list(stats.grid),
        "patch_px": list(stats.patch),
        "num_prefix_tokens": stats.num_prefix,
        "atoms_per_head": stats.atoms,
        "max_entropy": stats.max_entropy,
        "method": FIT_NOTE,
        "heads": heads_json(stats),
    }


def heads_json(stats: HeadFieldStats) -> list[dict[str, Any]]:
    """Every head as a field, one JSON object per head, layer by layer (the ``heads`` of :func:`fields_json`)."""
    out = []
    norm_fit, norm_field, diffuse = stats.normalised_fit, stats.normalised_field, stats.diffuse
    for layer, fit in enumerate(stats.fits):
        for head in range(fit.mu.shape[0]):
            atoms = [
                {"mu_y": float(m[0]), "mu_x": float(m[1]), "sigma_y": float(s[0]), "sigma_x": float(s[1]),
                 "weight": float(w)}
                for m, s, w in zip(fit.mu[head], fit.sigma[head], fit.lam[head], strict=True)
            ]  # fmt: skip
            out.append(
                {
                    "layer": layer,
                    "head": head,
                    "mean_distance_px": float(stats.mean_distance_px[layer, head]),
                    "share_fit": float(stats.share_fit[layer, head]),
                    "share_field": float(stats.share_field[layer, head]),
                    "share_uniform": float(stats.share_uniform[layer, head]),
                    "normalised_fit": None if diffuse[layer, head] else float(norm_fit[layer, head]),
                    "normalised_field": None if diffuse[layer, head] else float(norm_field[layer, head]),
                    "diffuse": bool(diffuse[layer, head]),
                    "entropy": float(stats.entropy[layer, head]),
                    "prefix_share": float(stats.prefix_share[layer, head]),
                    "atoms": atoms,
                }
            )
    return out


def atom_rows(fields: Sequence[LayerField]) -> list[list[float | int]]:
    """One row per layer, head and atom (columns :data:`ATOM_COLUMNS`); looks-at is the key offset ``−μ``."""
    rows = []
    for layer, lf in enumerate(fields):
        heads, atoms = lf.lam.shape
        for h in range(heads):
            for r in range(atoms):
                my, mx = (float(v) for v in lf.mu[h, r])
                sy, sx = (float(v) for v in lf.sigma[h, r])
                rows.append(
                    [
                        layer,
                        h,
                        r,
                        my,
                        mx,
                        -my,
                        -mx,
                        sy,
                        sx,
                        float(lf.lam[h, r]),
                        float(lf.entropy[h]),
                        float(lf.radius[h]),
                    ]
                )
    return rows


def gate_rows(fields: Sequence[LayerField]) -> list[dict[str, float]]:
    """Per layer: τ and the scale of each enabled tap."""
    return [{"layer": i, "tau": lf.tau, **{f"s_{k}": v for k, v in lf.gates.items()}} for i, lf in enumerate(fields)]


def model_card(model: nn.Module, meta: Mapping[str, Any], flops: bool = True) -> dict[str, Any]:
    """What a reader wants first: architecture, size, cost, how it was trained and how well it does."""
    cfg: ViTConfig = model.config
    card: dict[str, Any] = {
        "attention": cfg.attn,
        "field": cfg.field if cfg.attn == "ssog" else None,
        "steering taps": ", ".join(cfg.steer) if cfg.attn == "ssog" and cfg.steer else None,
        "atoms per head": cfg.num_atoms if cfg.attn == "ssog" else None,
        "dim / depth / heads": f"{cfg.dim} / {cfg.depth} / {cfg.num_heads}",
        "image size / patch / grid": f"{cfg.img_size[0]}×{cfg.img_size[1]} / {cfg.patch_size} / "
        f"{cfg.grid[0]}×{cfg.grid[1]}",
        "classes": cfg.num_classes,
        "parameters": count_params(model),
        "FLOPs per forward": count_flops(model) if flops else None,
    }
    for key, label in (
        ("accuracy", "accuracy"),
        ("val_accuracy", "accuracy"),
        ("data", "data"),
        ("epochs", "epochs"),
        ("transforms", "transforms"),
        ("command", "training command"),
        ("converted_from", "converted from"),
    ):
        if key in meta and label not in card:
            card[label] = meta[key]
    if isinstance(card.get("transforms"), Mapping):  # {"train": ..., "eval": ...} as one readable line
        card["transforms"] = "; ".join(f"{k}: {v}" for k, v in card["transforms"].items())
    software = meta.get("software")
    if isinstance(software, Mapping):
        card["software"] = ", ".join(f"{k} {v}" for k, v in software.items())
    return {k: v for k, v in card.items() if v is not None}


def top_classes(logits: Tensor, class_names: Sequence[str], k: int = 5) -> dict[str, float]:
    """Softmax probabilities of the ``k`` most likely classes of the first image."""
    p = probabilities(logits[0])
    values, idx = p.topk(min(k, p.numel()))
    return {class_names[i]: float(v) for v, i in zip(values, idx, strict=True)}


def export_arrays(maps: ExportMaps) -> dict[str, np.ndarray]:
    """The raw arrays of one image's export maps (first image of the batch)."""
    return {
        "pull_in": maps.pull_in[0].numpy(),
        "pull_out": maps.pull_out[0].numpy(),
        "net": maps.net[0].numpy(),
        "accumulated": maps.accumulated[0].numpy(),
        "rollout": maps.rollout[0].numpy(),
        "prefix_share": maps.prefix_share[0].numpy(),
        "entropy": maps.stats["entropy"].numpy(),
        "radius": maps.stats["radius"].numpy(),
        "alpha": np.float64(maps.alpha),
        "grid": np.array(maps.grid),
    }


def steering_arrays(offsets: SteeringOffsets) -> dict[str, np.ndarray]:
    """Per SSOG layer ``l``: ``dmu_l``, ``shift_l``, ``sigma_ratio_l``, ``dlam_l`` of the first image."""
    out: dict[str, np.ndarray] = {"logits": offsets.logits[0].numpy()}
    for l in range(len(offsets.dmu)):
        out[f"dmu_{l}"] = offsets.dmu[l][0].numpy()
        out[f"shift_{l}"] = offsets.shift[l][0].numpy()
        out[f"sigma_ratio_{l}"] = offsets.sigma_ratio[l][0].numpy()
        out[f"dlam_{l}"] = offsets.dlam[l][0].numpy()
    return out


def npz_bytes(arrays: Mapping[str, np.ndarray], settings: Mapping[str, Any]) -> bytes:
    """A compressed ``.npz`` of ``arrays`` plus a ``settings`` entry (JSON text) describing how they were made."""
    import json

    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays, settings=np.array(json.dumps(dict(settings))))
    return buf.getvalue()


def maps_csv(maps: ExportMaps, settings: Mapping[str, Any]) -> str:
    """Long-format CSV (``map, layer, row, col, value``) of one image's export maps, settings as comments."""
    buf = io.StringIO()
    for k, v in settings.items():
        buf.write(f"# {k}: {v}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["map", "layer", "row", "col", "value"])
    arrays = export_arrays(maps)
    for name in ("pull_in", "pull_out", "net"):
        a = arrays[name]
        for (l, i, j), v in np.ndenumerate(a):
            w.writerow([name, l, i, j, f"{v:.6g}"])
    for name in ("accumulated", "rollout"):
        for (i, j), v in np.ndenumerate(arrays[name]):
            w.writerow([name, "", i, j, f"{v:.6g}"])
    return buf.getvalue()


def atoms_csv(fields: Sequence[LayerField], settings: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    for k, v in settings.items():
        buf.write(f"# {k}: {v}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(ATOM_COLUMNS)
    for row in atom_rows(fields):
        w.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in row])
    return buf.getvalue()
