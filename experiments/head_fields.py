"""Every head of the bundled models as a field over displacement, and what replacing heads by their fits costs; writes
experiments/results/head_fields.json and that section of docs/RESULTS.md.

    python experiments/head_fields.py [--images 500] [--threads 1]

On the first N validation images, for each bundled matched trio (``matched_{dot,ssog_fixed,ssog}_{data}``): every
head's share explained by its 4-atom fit and by its positional field, and its mean attention distance
(:mod:`ssog_core.analysis.head_as_field`); on every model the whole model made content-blind (every head replaced
by its fit, then by its positional field: ``replace_with_field``); on the dot twin also each head replaced by its fit
one at a time (head importance's column, beside zero-ablation) and each whole layer replaced, each as edited −
unedited accuracy and log p(true) with paired bootstrap 95% intervals; on the steered SSOG model, each head's share
explained by its own fixed part (every gate closed). The fits come from the same N images. Each model's numbers
are kept in experiments/results/head_fields/ as it finishes, so a second run resumes where the first stopped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ssog_core.analysis.head_as_field import FIT_ATOMS, measure_head_fields, patch_attention, reduce_patterns, share_of
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
KINDS = ("dot", "ssog_fixed", "ssog")  # the twin, the fixed-field model, the steered model
DATASETS = ("layouts", "pointer20")
CLAIM = "content only needs to steer"


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
    """A model's numbers from an earlier run with the same checkpoint and images, if there are any."""
    if not path.is_file():
        return None
    entry = json.loads(path.read_text(encoding="utf-8"))
    same = entry.get("images", {}).get("first") == n and entry.get("checkpoint", "").endswith(checkpoint.name)
    return entry if same else None


def run_all(checkpoints: Path, out: Path, n: int, datasets: tuple[str, ...] = DATASETS) -> dict[str, dict[str, Any]]:
    """Every bundled model of the matched trios of ``datasets``, each measured once (resumed from
    ``out``/head_fields/, so runs for different datasets can go side by side)."""
    results: dict[str, dict[str, Any]] = {}
    for data in datasets:
        for kind in KINDS:
            ckpt = checkpoints / f"matched_{kind}_{data}.safetensors"
            if not ckpt.is_file():
                continue
            part = out / "head_fields" / f"{kind}_{data}.json"
            entry = kept(part, ckpt, n)
            if entry is None:
                print(f"measuring {ckpt.name} on {n} images", flush=True)
                model, meta = load_checkpoint(ckpt)
                shown = ckpt.relative_to(ROOT).as_posix() if ckpt.is_relative_to(ROOT) else str(ckpt)
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


def _mean(heads: list[dict], key: str) -> float:
    return sum(h[key] for h in heads) / len(heads)


def _span(heads: list[dict], key: str) -> str:
    values = [h[key] for h in heads]
    return f"{sum(values) / len(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def section(results: dict[str, dict[str, Any]], n: int, command: str) -> str:
    """The marked section of docs/RESULTS.md: the numbers, each with the command that made them."""
    lines = [
        MARKS[0],
        "## Heads as fields: how much of each head a content-blind field is",
        "",
        f"Written by `{command}` (results: `experiments/results/head_fields.json`) on the first **{n}** validation "
        "images of each model's data. *share_fit*: 1 − mean total-variation distance between a head's patch rows "
        f"and its {FIT_ATOMS}-atom factorized SSOG fit; *share_field*: the same against its positional field (its "
        "attention averaged over the query–key pairs of each displacement); distance: mean attention distance in "
        "pixels; *fixed part*: the same share against a steered head's own fixed field (every gate closed). "
        "Replacing a head by its fit (`replace_with_field`) makes it content-blind; changes are edited − unedited "
        "with paired bootstrap 95% intervals (· = within noise). The fits and fields are made from the same images "
        "they are tested on. A single model's numbers: "
        "`python -m ssog_core fields --checkpoint C --images N --atoms 4 --json out.json`.",
        "",
        "| model | unedited accuracy | share_fit mean (min–max) | share_field | fixed part | distance px | "
        "every head → fit: Δ accuracy [95%] | Δ log p(true) [95%] | every head → positional field: Δ log p(true) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, e in results.items():
        heads, blind = e["heads"], e["content_blind"]
        fixed = _span(heads, "share_fixed_part") if e["steered"] else "—"
        lines.append(
            f"| `{name}` | {e['unedited_accuracy']:.4f} | {_span(heads, 'share_fit')} | "
            f"{_span(heads, 'share_field')} | {fixed} | {_mean(heads, 'mean_distance_px'):.1f} | "
            f"{ci(blind['fit']['accuracy_change'], blind['fit']['accuracy_ci95'])} | "
            f"{ci(blind['fit']['logp_change'], blind['fit']['logp_ci95'])} | "
            f"{ci(blind['field']['logp_change'], blind['field']['logp_ci95'])} |"
        )
    for name, e in results.items():
        if "layers_replaced" not in e:
            continue
        lines += [
            "",
            f"### `{name}`: each head and each layer replaced by its fit",
            "",
            "| layer | head | distance px | share_fit | share_field | replaced: Δ accuracy | replaced: Δ log p(true) "
            "[95%] | zero-ablated: Δ log p(true) [95%] |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for h in e["heads"]:
            r, a = h["replace_with_fit"], h["ablate_head"]
            lines.append(
                f"| {h['layer']} | {h['head']} | {h['mean_distance_px']:.1f} | {h['share_fit']:.3f} | "
                f"{h['share_field']:.3f} | {0.0 - r['accuracy_drop']:+.3f} | {ci(-r['logp_drop'], _neg(r['ci95']))} | "
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
    lines += ["", f"### What this says about \u201c{CLAIM}\u201d", "", *verdict(results), "", MARKS[1]]
    return "\n".join(lines)


def _names(layers: list[int]) -> str:
    """``layer 2`` or ``layers 0, 1``."""
    return f"layer{'s' * (len(layers) > 1)} " + ", ".join(str(i) for i in layers)


def _neg(interval: list[float]) -> list[float]:
    """A drop's interval as a change's (edited − unedited)."""
    return [-interval[1], -interval[0]]


def verdict(results: dict[str, dict[str, Any]]) -> list[str]:
    """What supports and what contradicts the claim, dataset by dataset, from the numbers alone."""
    out = []
    for data in DATASETS:
        dot, fixed, steered = (results.get(f"{k}_{data}") for k in KINDS)
        if dot is None:
            continue
        heads = dot["heads"]
        free = [h for h in heads if h["replace_with_fit"]["within_noise"]]
        hurt = [h for h in heads if h["replace_with_fit"]["ci95"][0] > 0]
        blind = dot["content_blind"]["fit"]
        costly = sorted(heads, key=lambda h: -h["replace_with_fit"]["logp_drop"])[:3]
        fit, field = _mean(heads, "share_fit"), _mean(heads, "share_field")
        out.append(
            f"- **{data}, dot twin.** Replaced one at a time by its fit, {len(free)} of {len(heads)} heads change "
            f"log p(true) within noise and {len(hurt)} cost measurably (largest: "
            + "; ".join(f"L{h['layer']}H{h['head']} {0.0 - h['replace_with_fit']['logp_drop']:+.3f}" for h in costly)
            + f"). A mean {fit:.3f} of each head is its 4-atom fit ({field:.3f} its positional field), so about "
            f"{1 - fit:.2f} of its attention depends on the image. Every head made content-blind at once: accuracy "
            f"{dot['unedited_accuracy']:.4f} → {blind['accuracy']:.4f}."
        )
        layers = dot["layers_replaced"]
        quiet = [i for i, c in enumerate(layers) if c["accuracy_ci95"][0] <= 0 <= c["accuracy_ci95"][1]]
        loud = [i for i in range(len(layers)) if i not in quiet]
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
                f"mean share_fit, {_mean(fixed['heads'], 'share_fit'):.3f}, checks the instrument (they are "
                "content-blind fields by construction)."
            )
        if steered is not None:
            moved = 1 - _mean(steered["heads"], "share_fixed_part")
            fixed_acc = f", fixed field {fixed['unedited_accuracy']:.4f}" if fixed else ""
            out.append(
                f"- **{data}, steered SSOG.** Accuracy {steered['unedited_accuracy']:.4f} (dot twin "
                f"{dot['unedited_accuracy']:.4f}{fixed_acc}). Steering moves its heads a mean total-variation "
                f"distance of {moved:.3f} from their fixed part (share explained by the fixed part "
                f"{_span(steered['heads'], 'share_fixed_part')}); a mean {_mean(steered['heads'], 'share_fit'):.3f} "
                "of each head is a 4-atom content-blind fit."
            )
    return out + summary(results)


def summary(results: dict[str, dict[str, Any]]) -> list[str]:
    """The closing lines: which numbers support the claim, which contradict it, and what is not shown."""
    pro, con = [], []
    for data in DATASETS:
        dot, steered = results.get(f"dot_{data}"), results.get(f"ssog_{data}")
        if dot is None:
            continue
        layers = dot["layers_replaced"]
        quiet = [i for i, c in enumerate(layers) if c["accuracy_ci95"][0] <= 0 <= c["accuracy_ci95"][1]]
        loud = [i for i in range(len(layers)) if i not in quiet]
        if quiet:
            pro.append(f"{data}: the dot twin's {_names(quiet)}, each made content-blind, keep accuracy within noise")
        if loud:
            verb = "needs" if len(loud) == 1 else "need"
            con.append(f"{data}: the dot twin's {_names(loud)} {verb} content (content-blind, each costs accuracy)")
        if steered is not None:
            a, b = steered["unedited_accuracy"], dot["unedited_accuracy"]
            (pro if a >= b else con).append(
                f"{data}: the steered SSOG model, whose content only steers fixed atoms, scores {a:.4f} against the "
                f"dot twin's {b:.4f} (same images; no interval between two models)"
            )
    return [
        "- **Supports:** " + ("; ".join(pro) if pro else "nothing measured here") + ".",
        "- **Contradicts:** " + ("; ".join(con) if con else "nothing measured here") + ".",
        "- **Not shown:** a dot head's loss when made content-blind says how that trained model uses content, not "
        "whether steering a few atoms could supply it; the fits are tested on the images they were made from; small "
        f"models on {len([d for d in DATASETS if f'dot_{d}' in results])} synthetic task(s).",
    ]


def command_of(images: int, threads: int, data: list[str]) -> str:
    """The command that makes these results (``--data`` only when it is not every trio)."""
    which = "" if sorted(data) == sorted(DATASETS) else " --data " + " ".join(data)
    return f"python experiments/head_fields.py --images {images} --threads {threads}{which}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=500, help="the first N validation images")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", nargs="+", choices=DATASETS, default=list(DATASETS), help="which trios to measure")
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--results", type=Path, default=ROOT / "docs" / "RESULTS.md")
    args = ap.parse_args(argv)
    if args.images < 1:
        ap.error(f"--images must be at least 1, got {args.images}")
    torch.set_num_threads(args.threads)
    results = run_all(args.checkpoints, args.out, args.images, tuple(args.data))
    if not results:
        ap.error(f"no matched_*_{{{','.join(DATASETS)}}} checkpoints in {args.checkpoints}")
    runs = {"images": args.images, "threads": args.threads, "data": args.data}
    text = json.dumps({**runs, "atoms_per_head": FIT_ATOMS, "models": results}, indent=1)
    atomic_write(args.out / "head_fields.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    command = command_of(**runs)
    replace_section(args.results, MARKS, section(results, args.images, command))
    print(f"wrote {args.out / 'head_fields.json'} and the section in {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
