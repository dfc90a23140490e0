"""Every head of the lab's models as a field over displacement, and what replacing heads by their fits costs; writes
experiments/results/head_fields.json and that section of docs/RESULTS.md.

    python experiments/head_fields.py [--images 200] [--threads 1] [--data layouts pointer20 ...]

The data sets (:data:`DATASETS`): the bundled `layouts` trio (``checkpoints/matched_{dot,ssog_fixed,ssog}_layouts``),
the 20×20 pointer ablation's seed-0 trio after 3,000 + 1,500 steps (``pointer20``) and the 14×14 pointer ablation's
seed-0 models (``experiments/results/models/pointer-g14-{variant}-s0…``, as ``experiments/ablation.py`` names them)
after 3,000 steps (``pointer14-early``) and after 10,000 (``pointer14-converged``); a model whose file is not there
yet (a run still training) is skipped with a note.
On the first N validation images of each model's data: every head's share explained by its 4-atom fit, by its
positional field and by the uniform field, the normalised shares, its entropy and its mean attention distance
(:mod:`ssog_core.analysis.head_as_field`); on every model the whole model made content-blind (every head replaced
by its fit, then by its positional field: ``replace_with_field``); on each dot twin also each head replaced by its fit
one at a time (head importance's column, beside zero-ablation) and each whole layer replaced, each as edited −
unedited accuracy and log p(true) with paired bootstrap 95% intervals; on each steered SSOG model, each head's share
explained by its own fixed part (every gate closed). The fits come from the same N images. Each model's numbers
are kept in experiments/results/head_fields/ as it finishes, so a second run resumes where the first stopped and
measures only what is new (a model, another N, or numbers kept in an older :data:`FORMAT`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ssog_core.analysis.head_as_field import (
    DIFFUSE_TV,
    FIT_ATOMS,
    measure_head_fields,
    normalised,
    patch_attention,
    reduce_patterns,
    share_of,
)
from ssog_core.analysis.report import heads_json
from ssog_core.checkpoint.files import atomic_write, replace_section, section_markers
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.interventions.effects import device_dtype, outcomes, validation_effect
from ssog_core.interventions.hooks import run_with_cache
from ssog_core.interventions.importance import head_importance
from ssog_core.interventions.ops import CloseGate, ReplaceWithField
from ssog_core.interventions.run import edited, mean_attention
from ssog_core.interventions.validation import EvalSet, load_eval_set

ROOT = Path(__file__).resolve().parent.parent
MARKS = section_markers("head-fields")
FORMAT = 2  # what a kept entry holds and how it was measured; an entry of another format is measured again
KINDS = ("dot", "ssog_fixed", "ssog")  # a matched trio: the twin, the fixed-field model, the steered model
LARGE = "pointer20"  # the 20×20 board's seed-0 trio, 12 + 6 epochs (in experiments/results/models/)
MATCHED = ("layouts", LARGE)  # the matched trios (dot twin, fixed field, steered)
# The 14×14 pointer ablation's rows, twin first, by the file names experiments/ablation.py gives its seed-0 models.
ABLATION = {
    "dot": "dot",
    "ssog_fixed": "fixed",
    "ssog_mu": "plus-mu",
    "ssog": "steered",
    "ssog_offset2": "steered-offset2",
}
EARLY, CONVERGED = "pointer14-early", "pointer14-converged"  # 12 epochs (3,000 steps) and 40 (10,000 steps)
DATASETS = (*MATCHED, EARLY, CONVERGED)
STEERED = ("ssog_mu", "ssog", "ssog_offset2")
VARIANT = {"dot": "dot twin", "ssog_fixed": "fixed field", "ssog_mu": "+μδ", "ssog": "steered",
           "ssog_offset2": "steered ±2"}  # fmt: skip
CLAIM = "content only needs to steer"
SOLVED = 2 / 3  # accuracy at which a pointer model has solved its task (experiments/ablation.py's PLATEAU_EXIT)
FLAT = 0.05  # a normalised fit within ±FLAT of 0: the field explains no more of the head than the uniform field


def checkpoints_of(data: str, checkpoints: Path, models: Path) -> dict[str, Path]:
    """Each model of data set ``data`` by kind: a matched trio's bundled checkpoints, the 20×20 pointer ablation's
    seed-0 trio (:data:`LARGE`), or the 14×14 pointer ablation's seed-0 models after 12 epochs (:data:`EARLY`) or 40
    (:data:`CONVERGED`)."""
    if data == LARGE:
        return {k: models / f"pointer-g20-{ABLATION[k]}-s0.safetensors" for k in KINDS}
    if data in MATCHED:
        return {k: checkpoints / f"matched_{k}_{data}.safetensors" for k in KINDS}
    if data not in (EARLY, CONVERGED):
        raise ValueError(f"unknown data set {data!r}: one of {', '.join(DATASETS)}")
    epochs = "-e40" if data == CONVERGED else ""
    return {k: models / f"pointer-g14-{name}-s0{epochs}.safetensors" for k, name in ABLATION.items()}


def effect(model: nn.Module, data: EvalSet, edits: list, before, attention) -> dict[str, Any]:
    """Edited − unedited accuracy and log p(true), with intervals and McNemar's p."""
    v = validation_effect(model, data, edits, unedited=before, attention=attention)
    return {
        "accuracy": v.accuracy.edited,
        "accuracy_change": v.accuracy.change,
        "accuracy_ci95": list(v.accuracy.ci95),
        "mcnemar_p": v.mcnemar_p,
        "logp_change": v.logp_true.change,
        "logp_ci95": list(v.logp_true.ci95),
    }


def fixed_part_share(model: nn.Module, data: EvalSet, grid: tuple[int, int]) -> torch.Tensor:
    """``(L, H)`` share of each steered head explained by its own fixed part: 1 − mean TV between the head's patch
    rows and the rows it has with every gate closed (content-blind, so one image gives them)."""
    p, depth = model.num_prefix_tokens, len(model.blocks)
    names = [f"blocks.{i}.attn.pattern" for i in range(depth)]
    with torch.no_grad(), edited(model, [CloseGate(i) for i in range(depth)]):
        _, cache = run_with_cache(model, data.batch(0, 1, *device_dtype(model)), names)
    fixed = [patch_attention(cache[n], grid, p)[0][0] for n in names]
    sums = torch.zeros(depth, model.blocks[0].attn.num_heads, dtype=torch.float64)

    def add(layer: int, pattern: torch.Tensor) -> None:
        attn = patch_attention(pattern, grid, p)[0]
        sums[layer] += share_of(attn, fixed[layer]).cpu() * attn.shape[0]

    images = reduce_patterns(model, data.batches(model), add)
    return sums / images


def measure(model: nn.Module, data: EvalSet, checkpoint: str) -> dict[str, Any]:
    """One model's heads as fields on ``data`` (at the model's own image size) and what making the whole model
    content-blind costs; for a dot-product (or RBF) model also every head and every layer replaced, for a steered
    one each head's share explained by its fixed part."""
    steered = any(getattr(b.attn, "taps", ()) for b in model.blocks)
    attn_kind = model.config.attn
    attention = mean_attention(model, data.batches(model))  # the fields and replace_with_field share it, fits too
    stats = measure_head_fields(model, lambda: data.batches(model), FIT_ATOMS, attention=attention)
    grid, heads = stats.grid, heads_json(stats)
    before = outcomes(model, data)
    entry: dict[str, Any] = {
        "format": FORMAT,
        "checkpoint": checkpoint,
        "steered": steered,
        "images": data.describe(),
        "grid": list(grid),
        "patch_px": list(stats.patch),
        "atoms_per_head": FIT_ATOMS,
        "unedited_accuracy": float(before.correct(data.labels).double().mean()),
    }
    if steered:
        fixed = fixed_part_share(model, data, grid)
        for h in heads:
            h["share_fixed_part"] = float(fixed[h["layer"], h["head"]])
    elif attn_kind != "ssog":  # a fixed-field model's heads are content-blind already: the whole model is enough
        imp = head_importance(model, data, attention=attention)
        for h in heads:
            h["replace_with_fit"] = imp.replace[h["layer"]][h["head"]].to_dict()
            h["ablate_head"] = imp.ablate[h["layer"]][h["head"]].to_dict()
        entry["layers_replaced"] = [
            effect(model, data, [ReplaceWithField(i, None, "fit", FIT_ATOMS)], before, attention)
            for i in range(len(model.blocks))
        ]
    entry["content_blind"] = {
        how: effect(
            model,
            data,
            [ReplaceWithField(i, None, how, FIT_ATOMS) for i in range(len(model.blocks))],
            before,
            attention,
        )
        for how in ("fit", "field")
    }
    entry["heads"] = heads
    return entry


def kept(path: Path, checkpoint: Path, n: int) -> dict[str, Any] | None:
    """A model's numbers from an earlier run with the same checkpoint, images and :data:`FORMAT`, if there are any."""
    if not path.is_file():
        return None
    entry = json.loads(path.read_text(encoding="utf-8"))
    same = entry.get("images", {}).get("first") == n and entry.get("checkpoint", "").endswith(checkpoint.name)
    return entry if same and entry.get("format") == FORMAT else None


def run_all(
    checkpoints: Path, out: Path, n: int, datasets: tuple[str, ...] = DATASETS, models: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Every model of ``datasets`` whose file is there (:func:`checkpoints_of`; ``models`` defaults to
    ``out``/models), each measured once (resumed from ``out``/head_fields/, so runs for different data sets can go
    side by side); a missing one is named and skipped."""
    results: dict[str, dict[str, Any]] = {}
    for data in datasets:
        for kind, ckpt in checkpoints_of(data, checkpoints, models or out / "models").items():
            shown = ckpt.relative_to(ROOT).as_posix() if ckpt.is_relative_to(ROOT) else str(ckpt)
            if not ckpt.is_file():
                print(f"skipping {kind}_{data}: no {shown} (yet)", flush=True)
                continue
            part = out / "head_fields" / f"{kind}_{data}.json"
            entry = kept(part, ckpt, n)
            if entry is None:
                print(f"measuring {ckpt.name} on {n} images", flush=True)
                model, meta = load_checkpoint(ckpt)
                entry = measure(model, load_eval_set(meta, tuple(model.config.img_size), n), shown)
                text = json.dumps(entry, indent=1)
                part.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(part, lambda tmp, t=text: Path(tmp).write_text(t, encoding="utf-8"))
            results[f"{kind}_{data}"] = entry
    return results


# ------------------------------------------------------------------------------------------- the section


def ci(value: float, interval: list[float], digits: int = 3) -> str:
    noise = " ·" if interval[0] <= 0 <= interval[1] else ""
    return f"{value:+.{digits}f} [{interval[0]:+.{digits}f}, {interval[1]:+.{digits}f}]{noise}"


def norm(share: float, uniform: float) -> float | None:
    """``share`` against the uniform field's ``uniform`` (:func:`normalised`); ``None`` for a diffuse head."""
    value = float(normalised(torch.tensor(share, dtype=torch.float64), torch.tensor(uniform, dtype=torch.float64)))
    return None if math.isnan(value) else value


def _values(heads: list[dict], key: str) -> list[float]:
    """The heads' ``key``, leaving out the heads that have none (a normalised share of a diffuse head)."""
    return [h[key] for h in heads if h[key] is not None]


def _mean(heads: list[dict], key: str) -> float:
    values = _values(heads, key)
    return sum(values) / len(values) if values else math.nan


def _span(heads: list[dict], key: str) -> str:
    """``mean (min–max)`` over the heads that have ``key`` (— when none has: every head diffuse)."""
    values = _values(heads, key)
    return f"{sum(values) / len(values):.3f} ({min(values):.3f}–{max(values):.3f})" if values else "—"


def _fixed_part(heads: list[dict]) -> list[dict]:
    """Each steered head's fixed-part share normalised against its uniform share, as ``normalised_fixed_part``."""
    return [{**h, "normalised_fixed_part": norm(h["share_fixed_part"], h["share_uniform"])} for h in heads]


def _normalised(heads: list[dict], key: str) -> str:
    """A normalised share's mean over the heads that are not diffuse, and how many are."""
    diffuse = sum(h["diffuse"] for h in heads)
    if diffuse == len(heads):
        return "diffuse"
    return f"{_mean(heads, key):.3f}" + (f" ({diffuse} diffuse)" if diffuse else "")


def _heads_named(heads: list[dict]) -> str:
    return ", ".join(f"L{h['layer']}H{h['head']}" for h in heads)


def _layers(heads: list[dict]) -> list[list[dict]]:
    return [[h for h in heads if h["layer"] == i] for i in range(max(h["layer"] for h in heads) + 1)]


def _max_entropy(entry: dict[str, Any]) -> float:
    """``log N``: the uniform field's entropy on the model's grid."""
    return math.log(entry["grid"][0] * entry["grid"][1])


def definitions(n: int, command: str) -> str:
    return (
        f"Written by `{command}` (results: `experiments/results/head_fields.json`) on the first **{n}** validation "
        "images of each model's data. *share_fit*: 1 − mean total-variation (TV) distance between a head's patch rows "
        f"and its {FIT_ATOMS}-atom factorized SSOG fit; *share_field*: the same against its *positional field*, each "
        "displacement's mean over the query–key pairs that have it and over the images — a description of the head, "
        "not the content-blind field closest to it, so a fit can explain more of a head than its positional field "
        "does; *uniform*: the same share of the uniform field (every in-grid key alike), what a head with no geometry "
        "at all scores, the baseline every share is read against; *normalised*: (share − uniform) / (1 − uniform), "
        "the part of the head's distance from the uniform field that the field closes (0: no better than uniform, "
        f"1: the head itself); a head within {DIFFUSE_TV} mean TV of uniform is *diffuse*: its normalised shares are "
        "not defined and means over heads leave it out (its entropy is given against the uniform field's, ln N); "
        "distance: mean attention distance in pixels; *fixed part*: the share against a steered head's own fixed "
        "field (every gate closed). Shares are means (min–max) over a model's heads. `replace_with_field` makes every "
        "query of a head content-blind: each patch row becomes the fit (or positional field), a patch query's mass "
        "on prefix tokens its mean over the images, a prefix query's row its mean row (these models have no prefix "
        "tokens: they average their patch tokens, so only the patch rows change). Changes are edited − unedited with "
        "paired bootstrap 95% intervals (· = within noise). The fits and fields are made from the same images they "
        "are tested on. A single model's numbers: `python -m ssog_core fields --checkpoint C --images N --atoms 4 "
        "--json out.json`."
    )


def section(results: dict[str, dict[str, Any]], n: int, command: str) -> str:
    """The marked section of docs/RESULTS.md: the numbers, each with the command that made them."""
    lines = [
        MARKS[0],
        "## Heads as fields: how much of each head a content-blind field is",
        "",
        definitions(n, command),
        "",
        "| model | unedited accuracy | diffuse heads | uniform | share_fit | normalised fit | share_field | "
        "normalised field | fixed part; normalised | distance px | every head → fit: Δ accuracy [95%] | "
        "Δ log p(true) [95%] | every head → positional field: Δ log p(true) [95%] |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, e in results.items():
        heads, blind = e["heads"], e["content_blind"]
        fixed = "—"
        if e["steered"]:
            parts = _fixed_part(heads)
            fixed = f"{_span(parts, 'share_fixed_part')}; {_mean(parts, 'normalised_fixed_part'):.3f}"
        lines.append(
            f"| `{name}` | {e['unedited_accuracy']:.4f} | {sum(h['diffuse'] for h in heads)} of {len(heads)} | "
            f"{_span(heads, 'share_uniform')} | {_span(heads, 'share_fit')} | {_span(heads, 'normalised_fit')} | "
            f"{_span(heads, 'share_field')} | {_span(heads, 'normalised_field')} | {fixed} | "
            f"{_mean(heads, 'mean_distance_px'):.1f} | "
            f"{ci(blind['fit']['accuracy_change'], blind['fit']['accuracy_ci95'])} | "
            f"{ci(blind['fit']['logp_change'], blind['fit']['logp_ci95'])} | "
            f"{ci(blind['field']['logp_change'], blind['field']['logp_ci95'])} |"
        )
    for data in MATCHED:
        e = results.get(f"dot_{data}")
        if e is not None:
            lines += ["", *head_table(f"dot_{data}", e)]
    lines += ["", f"### What this says about \u201c{CLAIM}\u201d", "", *verdict(results)]
    lines += ["", *pointer14(results, n), "", MARKS[1]]
    return "\n".join(lines)


def head_table(name: str, e: dict[str, Any]) -> list[str]:
    """A dot twin's heads, each replaced by its fit and zero-ablated, and its layers, each replaced whole."""
    lines = [
        f"### `{name}`: each head and each layer replaced by its fit",
        "",
        f"| layer | head | distance px | entropy (max {_max_entropy(e):.2f}) | uniform | share_fit | normalised fit "
        "| share_field | normalised field | replaced: Δ accuracy | replaced: Δ log p(true) [95%] | zero-ablated: "
        "Δ log p(true) [95%] |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for h in e["heads"]:
        r, a = h["replace_with_fit"], h["ablate_head"]
        fit, field = (
            ["diffuse"] * 2 if h["diffuse"] else [f"{h[k]:.3f}" for k in ("normalised_fit", "normalised_field")]
        )
        lines.append(
            f"| {h['layer']} | {h['head']} | {h['mean_distance_px']:.1f} | {h['entropy']:.2f} | "
            f"{h['share_uniform']:.3f} | {h['share_fit']:.3f} | {fit} | {h['share_field']:.3f} | {field} | "
            f"{0.0 - r['accuracy_drop']:+.3f} | {ci(-r['logp_drop'], _neg(r['ci95']))} | "
            f"{ci(-a['logp_drop'], _neg(a['ci95']))} |"
        )
    lines += [
        "",
        "| layer replaced whole | Δ accuracy [95%] | McNemar p | Δ log p(true) [95%] |",
        "|---:|---:|---:|---:|",
    ]
    for i, c in enumerate(e["layers_replaced"]):
        lines.append(
            f"| {i} | {ci(c['accuracy_change'], c['accuracy_ci95'])} | {c['mcnemar_p']:.3g} | "
            f"{ci(c['logp_change'], c['logp_ci95'])} |"
        )
    return lines


def _names(layers: list[int]) -> str:
    """``layer 2`` or ``layers 0, 1``."""
    return f"layer{'s' * (len(layers) > 1)} " + ", ".join(str(i) for i in layers)


def _neg(interval: list[float]) -> list[float]:
    """A drop's interval as a change's (edited − unedited)."""
    return [-interval[1], -interval[0]]


def _quiet(entry: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The layers that, made content-blind one at a time, keep accuracy within noise, and the others."""
    layers = entry["layers_replaced"]
    quiet = [i for i, c in enumerate(layers) if c["accuracy_ci95"][0] <= 0 <= c["accuracy_ci95"][1]]
    return quiet, [i for i in range(len(layers)) if i not in quiet]


def _diffuse(entry: dict[str, Any]) -> str:
    """A sentence: which heads are diffuse, with their entropy against the uniform field's."""
    diffuse = [h for h in entry["heads"] if h["diffuse"]]
    if not diffuse:
        return "No head is diffuse."
    low, high = min(h["entropy"] for h in diffuse), max(h["entropy"] for h in diffuse)
    return (
        f"{len(diffuse)} of {len(entry['heads'])} heads are diffuse ({_heads_named(diffuse)}: entropy "
        f"{low:.2f}–{high:.2f} nats against ln N = {_max_entropy(entry):.2f}, share_fit "
        f"{min(h['share_fit'] for h in diffuse):.3f}–{max(h['share_fit'] for h in diffuse):.3f} against the uniform "
        f"field's {min(h['share_uniform'] for h in diffuse):.3f}–{max(h['share_uniform'] for h in diffuse):.3f}): "
        "a high share of theirs says they are flat, not that they are geometric."
    )


def verdict(results: dict[str, dict[str, Any]]) -> list[str]:
    """What supports and what contradicts the claim, matched trio by trio, from the numbers alone."""
    out = []
    for data in MATCHED:
        dot, fixed, steered = (results.get(f"{k}_{data}") for k in KINDS)
        if dot is None:
            continue
        heads = dot["heads"]
        free = [h for h in heads if h["replace_with_fit"]["within_noise"]]
        hurt = [h for h in heads if h["replace_with_fit"]["ci95"][0] > 0]
        blind = dot["content_blind"]["fit"]
        costly = sorted(heads, key=lambda h: -h["replace_with_fit"]["logp_drop"])[:3]
        geometric = [h for h in heads if not h["diffuse"]]
        out.append(
            f"- **{data}, dot twin.** Replaced one at a time by its fit, {len(free)} of {len(heads)} heads change "
            f"log p(true) within noise and {len(hurt)} cost measurably (largest: "
            + "; ".join(f"L{h['layer']}H{h['head']} {0.0 - h['replace_with_fit']['logp_drop']:+.3f}" for h in costly)
            + f"). {_diffuse(dot)} "
            + (
                ("Its" if len(geometric) == len(heads) else f"The other {len(geometric)}")
                + f" heads' fits close a mean {_mean(geometric, 'normalised_fit'):.3f} of "
                f"their distance from uniform (positional field {_mean(geometric, 'normalised_field'):.3f}; "
                f"share_fit {_mean(geometric, 'share_fit'):.3f} against the uniform field's "
                f"{_mean(geometric, 'share_uniform'):.3f}); what the fit leaves is attention that depends on the "
                "image or on where the query is, beyond the displacement. "
                if geometric
                else ""
            )
            + f"Every head made content-blind at once: accuracy {dot['unedited_accuracy']:.4f} → "
            f"{blind['accuracy']:.4f}."
        )
        layers = dot["layers_replaced"]
        quiet, loud = _quiet(dot)
        out.append(
            f"- **{data}, dot twin, layer by layer.** Made content-blind one layer at a time, "
            + (
                f"{_names(quiet)} keep{'s' * (len(quiet) == 1)} accuracy within noise"
                if quiet
                else "no layer keeps accuracy within noise"
            )
            + (
                f" (log p(true) changes {min(layers[i]['logp_change'] for i in quiet):+.3f} to "
                f"{max(layers[i]['logp_change'] for i in quiet):+.3f})"
                if quiet
                else ""
            )
            + (
                f"; {_names(loud)} cost{'s' * (len(loud) == 1)} accuracy ("
                + ", ".join(f"{layers[i]['accuracy_change']:+.3f}" for i in loud)
                + ")"
                if loud
                else ""
            )
            + "."
        )
        if fixed is not None:
            better = fixed["unedited_accuracy"] > blind["accuracy"]
            out.append(
                f"- **{data}, the fixed-field model.** Trained content-blind, `ssog_fixed_{data}` scores "
                f"{fixed['unedited_accuracy']:.4f} on the same images, "
                + ("above" if better else "not above")
                + f" the dot twin made content-blind after training ({blind['accuracy']:.4f}): the twin's drop "
                "measures how its weights came to use content, not what a content-blind model can learn. Its heads' "
                f"mean share_fit, {_mean(fixed['heads'], 'share_fit'):.3f} (normalised "
                f"{_mean(fixed['heads'], 'normalised_fit'):.3f}; {sum(h['diffuse'] for h in fixed['heads'])} diffuse), "
                "checks the instrument (they are content-blind fields by construction)."
            )
        if steered is not None:
            parts = _fixed_part(steered["heads"])
            fixed_acc = f", fixed field {fixed['unedited_accuracy']:.4f}" if fixed else ""
            out.append(
                f"- **{data}, steered SSOG.** Accuracy {steered['unedited_accuracy']:.4f} (dot twin "
                f"{dot['unedited_accuracy']:.4f}{fixed_acc}). Its heads' own fixed parts explain "
                f"{_span(parts, 'share_fixed_part')} of them (the uniform field "
                f"{_span(parts, 'share_uniform')}; normalised {_span(parts, 'normalised_fixed_part')}): steering "
                f"moves them a mean total-variation distance of {1 - _mean(parts, 'share_fixed_part'):.3f} from their "
                f"fixed part. A mean {_mean(parts, 'share_fit'):.3f} of each head is a 4-atom content-blind fit "
                f"(normalised {_mean(parts, 'normalised_fit'):.3f})."
            )
    return out + summary(results)


def summary(results: dict[str, dict[str, Any]]) -> list[str]:
    """The closing lines: which numbers support the claim, which contradict it, and what is not shown."""
    pro, con = [], []
    for data in DATASETS:
        dot = results.get(f"dot_{data}")
        if dot is None:
            continue
        quiet, loud = _quiet(dot)
        if quiet:
            heads = [h for h in dot["heads"] if h["layer"] in quiet]
            flat = sum(h["diffuse"] for h in heads)
            pro.append(
                f"{data}: the dot twin's {_names(quiet)}, each made content-blind, keep accuracy within noise "
                f"({flat} of {len(heads)} of their heads diffuse)"
            )
        if loud:
            verb = "needs" if len(loud) == 1 else "need"
            con.append(f"{data}: the dot twin's {_names(loud)} {verb} content (content-blind, each costs accuracy)")
        for kind in ("ssog_fixed", *STEERED):
            other = results.get(f"{kind}_{data}")
            if other is None:
                continue
            a, b = other["unedited_accuracy"], dot["unedited_accuracy"]
            name = "fixed-field SSOG model, whose attention never sees content"
            if kind != "ssog_fixed":
                name = f"{VARIANT[kind]} SSOG model, whose content only steers fixed atoms"
            (pro if a >= b else con).append(
                f"{data}: the {name}, scores {a:.4f} against the dot twin's {b:.4f} (same "
                "images; no interval between two models)"
            )
    tasks = len({d.split("-")[0].rstrip("0123456789") for d in DATASETS if f"dot_{d}" in results})
    return [
        "- **Supports:** " + ("; ".join(pro) if pro else "nothing measured here") + ".",
        "- **Contradicts:** " + ("; ".join(con) if con else "nothing measured here") + ".",
        "- **Not shown:** a dot head's loss when made content-blind says how that trained model uses content, not "
        "whether steering a few atoms could supply it; the fits are tested on the images they were made from; one "
        f"seed per model, small models on {tasks} synthetic task(s).",
    ]


def pointer14(results: dict[str, dict[str, Any]], n: int) -> list[str]:
    """The 14×14 pointer ablation's seed-0 models per layer, after 3,000 and after 10,000 steps, and what differs."""
    kinds = [k for k in ABLATION if f"{k}_{EARLY}" in results or f"{k}_{CONVERGED}" in results]
    if not kinds:
        return []
    missing = [VARIANT[k] for k in ABLATION if f"{k}_{CONVERGED}" not in results]
    lines = [
        "### The 14×14 pointer models after 3,000 and after 10,000 steps (seed 0)",
        "",
        f"`{EARLY}`: the ablation's seed-0 runs of 12 epochs (3,000 steps, the early-learning table); "
        f"`{CONVERGED}`: the same recipe for 40 epochs (10,000 steps; `python experiments/ablation.py train`), "
        f"models in `experiments/results/models/pointer-g14-*-s0{{,-e40}}.safetensors`. Per layer, the mean over its "
        "heads; normalised fit over the heads that are not diffuse."
        + (f" Not there yet at 10,000 steps: {', '.join(missing)} (still training)." if missing else ""),
        "",
        "| variant | layer | 3,000 steps: uniform | share_fit | normalised fit | distance px | 10,000 steps: "
        "uniform | share_fit | normalised fit | distance px |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        early, late = results.get(f"{kind}_{EARLY}"), results.get(f"{kind}_{CONVERGED}")
        depth = len(_layers((early or late)["heads"]))
        for layer in range(depth):
            cells = []
            for e in (early, late):
                if e is None:
                    cells += ["—"] * 4
                    continue
                heads = _layers(e["heads"])[layer]
                cells += [
                    f"{_mean(heads, 'share_uniform'):.3f}",
                    f"{_mean(heads, 'share_fit'):.3f}",
                    _normalised(heads, "normalised_fit"),
                    f"{_mean(heads, 'mean_distance_px'):.1f}",
                ]
            lines.append(f"| {VARIANT[kind]} | {layer} | " + " | ".join(cells) + " |")
    lines += ["", *converged_reading(results, kinds, n)]
    return lines


def converged_reading(results: dict[str, dict[str, Any]], kinds: list[str], n: int) -> list[str]:
    """Per variant, what changed from 3,000 to 10,000 steps, from the numbers alone."""
    out = []
    for kind in kinds:
        early, late = results.get(f"{kind}_{EARLY}"), results.get(f"{kind}_{CONVERGED}")
        if early is None or late is None:
            continue
        blind = late["content_blind"]["fit"]

        def diffuse(e: dict[str, Any]) -> int:
            return sum(h["diffuse"] for h in e["heads"])

        out.append(
            f"- **{VARIANT[kind]}.** Accuracy {early['unedited_accuracy']:.4f} → {late['unedited_accuracy']:.4f} "
            f"(first {n} images); diffuse heads {diffuse(early)} → {diffuse(late)} of {len(late['heads'])}; normalised "
            f"fit {_mean(early['heads'], 'normalised_fit'):.3f} → {_mean(late['heads'], 'normalised_fit'):.3f}; "
            f"mean distance {_mean(early['heads'], 'mean_distance_px'):.1f} → "
            f"{_mean(late['heads'], 'mean_distance_px'):.1f} px. At 10,000 steps every head made content-blind: "
            f"Δ accuracy {ci(blind['accuracy_change'], blind['accuracy_ci95'])}"
            + (
                f"; its heads' own fixed parts explain {_mean(_fixed_part(late['heads']), 'share_fixed_part'):.3f} "
                f"(normalised {_mean(_fixed_part(late['heads']), 'normalised_fixed_part'):.3f})"
                if late["steered"]
                else ""
            )
            + "."
        )
    return out + solved_reading(results)


def solved_reading(results: dict[str, dict[str, Any]]) -> list[str]:
    """What the 10,000-step models say, by rules on the numbers: which solved the task (at least :data:`SOLVED` of
    the images right), what a solved steered one loses made content-blind when the fixed field solved it too, and
    whether the dot twin's heads have any geometric part at either schedule."""
    late = {k: results[f"{k}_{CONVERGED}"] for k in ABLATION if f"{k}_{CONVERGED}" in results}
    if not late:
        return []
    solved = [k for k, e in late.items() if e["unedited_accuracy"] >= SOLVED]
    unsolved = [k for k in late if k not in solved]
    out = [
        "- **At 10,000 steps** "
        + (", ".join(VARIANT[k] for k in solved) + " solved the task" if solved else "no variant solved the task")
        + f" (at least {SOLVED:.3g} of these images right)"
        + ("; " + ", ".join(VARIANT[k] for k in unsolved) + " did not" if unsolved else "")
        + "."
    ]
    fixed = late.get("ssog_fixed")
    for kind in (k for k in solved if k in STEERED):
        blind = late[kind]["content_blind"]["fit"]
        if blind["accuracy_ci95"][1] < 0 and "ssog_fixed" in solved:
            out.append(
                f"- **{VARIANT[kind]}**, every head made content-blind, loses {-blind['accuracy_change']:.3f} of "
                f"accuracy ({ci(blind['accuracy_change'], blind['accuracy_ci95'])}), although the fixed field solves "
                f"the same task with content-blind attention ({fixed['unedited_accuracy']:.4f}): the task does not "
                "need steering at this schedule (one seed), but this model, trained with it, rests on it."
            )
    early = results.get(f"dot_{EARLY}")
    if "dot" in late and early is not None:
        values = [h["normalised_fit"] for e in (early, late["dot"]) for h in e["heads"] if not h["diffuse"]]
        first = [h["entropy"] for h in late["dot"]["heads"] if h["layer"] == 0]
        if values and max(abs(v) for v in values) < FLAT:
            out.append(
                "- **The dot twin's heads have no geometric part** at either schedule: every head that is not diffuse "
                f"has a normalised fit within ±{FLAT} ({min(values):+.3f} to {max(values):+.3f}), however sharp (layer "
                f"0's entropy {min(first):.2f}–{max(first):.2f} nats against ln N = {_max_entropy(late['dot']):.2f} "
                "at 10,000 steps): where they look is not a fixed displacement."
            )
    return out


def command_of(images: int, threads: int, data: list[str]) -> str:
    """The command that makes these results (``--data`` only when it is not every data set)."""
    which = "" if sorted(data) == sorted(DATASETS) else " --data " + " ".join(data)
    return f"python experiments/head_fields.py --images {images} --threads {threads}{which}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=200, help="the first N validation images")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", nargs="+", choices=DATASETS, default=list(DATASETS), help="which data sets to measure")
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints", help="the matched trios' folder")
    ap.add_argument("--models", type=Path, default=ROOT / "experiments" / "results" / "models",
                    help="the ablation's kept models")  # fmt: skip
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--results", type=Path, default=ROOT / "docs" / "RESULTS.md")
    args = ap.parse_args(argv)
    if args.images < 1:
        ap.error(f"--images must be at least 1, got {args.images}")
    torch.set_num_threads(args.threads)
    results = run_all(args.checkpoints, args.out, args.images, tuple(args.data), args.models)
    if not results:
        ap.error(f"none of the models of {', '.join(args.data)} is in {args.checkpoints} or {args.models}")
    runs = {"images": args.images, "threads": args.threads, "data": args.data}
    text = json.dumps({**runs, "atoms_per_head": FIT_ATOMS, "models": results}, indent=1)
    atomic_write(args.out / "head_fields.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    command = command_of(**runs)
    replace_section(args.results, MARKS, section(results, args.images, command))
    print(f"wrote {args.out / 'head_fields.json'} and the section in {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
