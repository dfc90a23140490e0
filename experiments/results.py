"""Measure the two-stage pair and write its section of docs/RESULTS.md (+ docs/figures/): SSOG vs its dot twin on a
procedural set. The section is the first of the document; other scripts own the others, and the prose between them
is written by hand.

    python experiments/results.py [--ssog checkpoints/ssog_layouts.safetensors] \
        [--dot checkpoints/dot_layouts.safetensors]

For each checkpoint: parameters, FLOPs per forward (``ssog_core.nn.cost.count_flops``), validation accuracy at
the training size and zero-shot at other sizes (``ssog_core.cli.evaluate``); for the SSOG model the geometry of every
layer (reach, entropy, elongated heads: ``ssog_core.analysis.layer_fields``) and its steering gates against their
cold start; and where the accumulated export map is positive: the mean accumulated value on the object's patches
vs the background and vs the grid's border ring, over validation images whose object mask is known (the data
set's ``render_with_mask``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from ssog_core.analysis.measures import export_maps, layer_fields
from ssog_core.analysis.presets import ELONGATED_RATIO
from ssog_core.checkpoint.files import atomic_write, replace_section, section_markers
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.data import layouts, shapes
from ssog_core.nn.attention import gate_start
from ssog_core.nn.cost import count_flops, count_params
from ssog_core.train.accuracy import evaluate_sizes, plot_transfer

ROOT = Path(__file__).resolve().parent.parent

MARKS = section_markers("layouts-pair")  # this script's section of docs/RESULTS.md; the others' stay
COLD, WARM = gate_start(True), gate_start(False)  # a cold and a warm gate's starting scale
COVERED = 0.25  # a patch belongs to the object when at least a quarter of it is covered (bars are thin)
PROCEDURAL = {
    "shapes": (shapes.ShapesSpec, shapes.render_with_mask),
    "layouts": (layouts.LayoutsSpec, layouts.render_with_mask),
}


def object_export(model: torch.nn.Module, kind: str, spec, n: int, size: tuple[int, int]) -> dict[str, float]:
    """Accumulated export on the object's patches vs the background and the border ring, over ``n`` val images."""
    render_with_mask = PROCEDURAL[kind][1]
    p = model.config.patch_size
    gh, gw = size[0] // p, size[1] // p
    ring = np.ones((gh, gw), dtype=bool)
    ring[1:-1, 1:-1] = False
    on, off, border, wins, share, top_on_border = [], [], [], 0, [], []
    for start in range(0, n, 50):
        imgs, masks = [], []
        for i in range(start, min(n, start + 50)):
            img, _, alpha = render_with_mask(spec.seed, "val", i, spec.classes, size)
            imgs.append(torch.from_numpy(img).permute(2, 0, 1).float() / 255)
            masks.append(alpha.reshape(gh, p, gw, p).mean(axis=(1, 3)) >= COVERED)
        acc = export_maps(model, torch.stack(imgs)).accumulated.numpy()
        for a, m in zip(acc, masks, strict=True):
            if m.any() and (~m).any():
                on.append(a[m].mean())
                off.append(a[~m].mean())
                border.append(a[ring & ~m].mean() if (ring & ~m).any() else np.nan)
                wins += a[m].mean() > a[~m].mean()
                share.append((a[m] > 0).mean())
                k = max(1, int(m.sum()))  # as many top exporters as the object has patches
                top = np.argsort(a.ravel())[::-1][:k]
                top_on_border.append((ring & ~m).ravel()[top].mean())
    return {
        "object": float(np.mean(on)),
        "background": float(np.mean(off)),
        "border": float(np.nanmean(border)),
        "object_wins": wins / len(on),
        "object_positive_share": float(np.mean(share)),
        "top_on_border": float(np.mean(top_on_border)),
        "images": len(on),
    }


def geometry(model: torch.nn.Module) -> list[dict[str, float]]:
    """Per layer: mean reach and entropy of the fixed fields, elongated heads, gate scales."""
    rows = []
    for lf in layer_fields(model):
        rows.append(
            {
                "reach": float(lf.reach.mean()),
                "reach_range": (float(lf.reach.min()), float(lf.reach.max())),
                "entropy": float(lf.entropy.mean()),
                "elongated": int((lf.elongation >= ELONGATED_RATIO).sum()),
                "max_elongation": float(lf.elongation.max()),
                "gates": dict(lf.gates),
            }
        )
    return rows


def example_figure(models: dict[str, torch.nn.Module], kind: str, spec, size: tuple[int, int], path: Path) -> None:
    """A few validation images with each model's accumulated export map (RdBu, zero-centred)."""
    from matplotlib.figure import Figure

    render_with_mask = PROCEDURAL[kind][1]
    idx = [0, 3, 4, 6, 8, 9]
    fig = Figure(figsize=(2 * len(idx), 2 * (1 + len(models))), dpi=100)
    axes = fig.subplots(1 + len(models), len(idx))
    for col, i in enumerate(idx):
        img, _, _ = render_with_mask(spec.seed, "val", i, spec.classes, size)
        axes[0, col].imshow(img)
        x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255
        for row, (name, model) in enumerate(models.items(), start=1):
            acc = export_maps(model, x).accumulated[0].numpy()
            lim = np.abs(acc).max()
            axes[row, col].imshow(acc, cmap="RdBu_r", vmin=-lim, vmax=lim)
            axes[row, 0].set_ylabel(f"{name}\naccumulated net", fontsize=8)
    axes[0, 0].set_ylabel("image", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("red = exporter (others read from it), blue = gatherer", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ssog", default=str(ROOT / "checkpoints" / "ssog_layouts.safetensors"))
    ap.add_argument("--dot", default=str(ROOT / "checkpoints" / "dot_layouts.safetensors"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[28, 40, 56, 72, 84, 112])
    ap.add_argument("--export-images", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "docs"), help="where RESULTS.md and figures/ are")
    ap.add_argument("--results", default=str(ROOT / "experiments" / "results"), help="where the numbers are")
    args = ap.parse_args()
    torch.manual_seed(0)
    out = Path(args.out)
    rows, models, transfer = {}, {}, {}
    for name, path in (("SSOG", args.ssog), ("dot", args.dot)):
        model, meta = load_checkpoint(path)
        models[name] = model
        size = tuple(model.config.img_size)
        kind, _, rest = meta["data"].partition(":")
        spec = PROCEDURAL[kind][0].parse(rest)
        sizes = [(s, s) for s in args.sizes]
        table, _ = evaluate_sizes(path, sizes=sizes)
        transfer[name] = table
        figure = out / "figures" / f"transfer_{name.lower()}.png"
        plot_transfer(table, figure, f"{name}: zero-shot resolution transfer on {kind}")
        rows[name] = {
            "path": Path(path).name,
            "meta": meta,
            "params": count_params(model),
            "flops": count_flops(model),
            "acc": next(r["accuracy"] for r in table if r["trained"]),
            "export": object_export(model, kind, spec, args.export_images, size),
            "geometry": geometry(model),
            "gates": meta.get("gate_scales", {}),
            "bytes": Path(path).stat().st_size,
        }
        print(name, {k: v for k, v in rows[name].items() if k != "meta"}, flush=True)
    example_figure(models, kind, spec, size, out / "figures" / f"export_maps_{kind}.png")

    s = rows["SSOG"]
    cfg = s["meta"]["config"]
    lines = [
        f"# Results: SSOG vs its dot-product twin on `{kind}` (matched recipe)",
        "",
        "Written by `python experiments/results.py` from `checkpoints/ssog_layouts.safetensors` and",
        "`checkpoints/dot_layouts.safetensors`, the SSOG / dot pair trained in two stages (see",
        "`checkpoints/MODEL_CARD.md` for how they were trained). CPU, float32 evaluation, validation split of",
        f"`{s['meta']['data']}` ({cfg['num_classes']} classes); accuracy at other sizes is zero-shot (no fine-tuning:",
        "only the position embedding is resized; the Gaussian fields are re-evaluated on the new grid).",
        "",
        f"Model: ViT d{cfg['dim']}, {cfg['depth']} layers, {cfg['num_heads']} heads, mlp_ratio {cfg['mlp_ratio']:g}, "
        f"patch {cfg['patch_size']} on {cfg['img_size'][0]}×{cfg['img_size'][1]} images "
        f"({cfg['img_size'][0] // cfg['patch_size']}×{cfg['img_size'][1] // cfg['patch_size']} tokens). "
        f"SSOG: {cfg['field']} field, {cfg['num_atoms']} atoms, taps {'+'.join(cfg['steer'])}.",
        "",
        "| model | params | FLOPs / forward | epochs trained | val accuracy | checkpoint (fp16) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        m = r["meta"]
        lines.append(
            f"| {name} | {r['params']:,} | {r['flops'] / 1e6:.1f} M | {m['epochs']:g} of {m['epochs_planned']} "
            f"| {100 * r['acc']:.2f}% | {r['bytes'] / 1e6:.2f} MB |"
        )
    lines += ["", "(epochs: of the checkpoint's last training stage; a run in stages is described in the model card.)"]
    header = " | ".join(f"{a}²" for a in args.sizes)
    lines += ["", "Zero-shot resolution transfer (validation accuracy, %):", "", f"| model | {header} |"]
    lines.append("|---|" + "---:|" * len(args.sizes))
    for name, table in transfer.items():
        cells = " | ".join(
            f"**{100 * t['accuracy']:.1f}**" if t["trained"] else f"{100 * t['accuracy']:.1f}" for t in table
        )
        lines.append(f"| {name} | {cells} |")
    lines += [
        "",
        "(bold: the training size). Plots: `docs/figures/transfer_ssog.png`, `docs/figures/transfer_dot.png`.",
        "",
        "## What the SSOG model learned: geometry per layer",
        "",
        "From `ssog_core.analysis.measures.layer_fields`, on each head's fixed (unsteered) field as a density over key",
        "displacement on the model's grid: *reach* = RMS key distance from the query (grid cells), *elongated* =",
        f"the field's standard deviations along y and x differ by ≥ {ELONGATED_RATIO:g}× (either way round); "
        "entropy in",
        "nats.",
        f"Gate scale s = softplus(raw) + 1e-4; a cold gate starts at {COLD:.3g}, a warm one at {WARM:.3f} "
        f"(this model: {'cold' if cfg['cold_init'] else 'warm'} start); ×cold = s / {COLD:.3g}.",
        "",
        "| layer | mean reach | reach min–max | mean entropy | elongated heads | most elongated "
        "| s(μδ) | s(σδ) | s(λ) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    geo = s["geometry"]
    for layer, g in enumerate(geo):
        gates = " | ".join(f"{g['gates'][t]:.3f} (×{g['gates'][t] / COLD:,.0f})" for t in ("mu", "sigma", "lambda"))
        lo, hi = g["reach_range"]
        lines.append(
            f"| {layer} | {g['reach']:.2f} | {lo:.2f}–{hi:.2f} | {g['entropy']:.2f} | {g['elongated']} of "
            f"{cfg['num_heads']} | {g['max_elongation']:.1f}× | {gates} |"
        )
    lines += [
        "",
        f"Deepest layer's mean reach / layer 0's: **{geo[-1]['reach'] / geo[0]['reach']:.2f}×**; elongated heads in "
        f"all: **{sum(g['elongated'] for g in geo)}**; smallest gate growth over its cold start: "
        f"**×{min(g['gates'][t] for g in geo for t in g['gates']) / COLD:,.0f}**.",
    ]
    lines += [
        "",
        "## Who exports: accumulated export maps on the object",
        "",
        "Accumulated net export (sum over layers of pull-out − pull-in, α = 0.5) on "
        f"{s['export']['images']} held-out validation images, split by the object's mask (patches at least "
        f"{COVERED:.0%} covered). *Border* is the background on the grid's outer ring; *top exporters on the border*"
        " is the share of the k strongest exporters (k = the object's patch count) that are border background.",
        "",
        "| model | mean on object | mean on background | mean on border | images where object > background (raw map) "
        "| object patches > 0 | top exporters on the border |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        e = r["export"]
        lines.append(
            f"| {name} | {e['object']:+.3f} | {e['background']:+.3f} | {e['border']:+.3f} | "
            f"{100 * e['object_wins']:.1f}% | {100 * e['object_positive_share']:.0f}% | "
            f"{100 * e['top_on_border']:.0f}% |"
        )
    lines += [
        "",
        "These are raw maps, and a raw map mixes position with content: a blank picture has an accumulated map too. "
        "How much of the table is position is measured in the next section, against a control (a blank image, and "
        "the validation mean).",
        "",
        f"![accumulated export maps](figures/export_maps_{kind}.png)",
        "",
    ]
    curves = {n: Path(args.results) / f"metrics_{n.lower()}.jsonl" for n in rows}
    if all(p.is_file() for p in curves.values()):
        logs = {n: [json.loads(line) for line in p.read_text().splitlines()] for n, p in curves.items()}
        epochs = min(len(v) for v in logs.values())
        lines += [
            "## Validation accuracy per epoch (same recipe, same steps, same learning rate at each epoch)",
            "",
            "From the runs' `metrics.jsonl` (copied to `experiments/results/metrics_*.jsonl`; curves in "
            "`docs/figures/curves_*.png`).",
            "",
            "| epoch | " + " | ".join(logs) + " |",
            "|---:|" + "---:|" * len(logs),
        ]
        for e in range(epochs):
            lines.append(f"| {e + 1} | " + " | ".join(f"{100 * v[e]['val_acc']:.1f}%" for v in logs.values()) + " |")
        lines.append("")
    replace_section(out / "RESULTS.md", MARKS, "\n".join([MARKS[0], *lines]).rstrip("\n") + "\n" + MARKS[1])
    print(f"wrote the section of {out / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
