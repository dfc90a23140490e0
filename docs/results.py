"""Measure the demo checkpoints and write docs/RESULTS.md (+ figures): SSOG vs its dot twin on ``shapes``.

    python docs/results.py [--ssog checkpoints/ssog_shapes.safetensors] [--dot checkpoints/dot_shapes.safetensors]

For each checkpoint: parameters, FLOPs per forward (``ssog_core.info.count_flops``), validation accuracy at
the training size and zero-shot at other sizes (``ssog_core.evaluate``), the steering gate scales per layer,
and where the accumulated export map is positive: the mean accumulated value on the object's patches vs the
background, over validation images whose object mask is known (``ssog_core.shapes.render_with_mask``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ssog_core.analysis import export_maps  # noqa: E402
from ssog_core.checkpoint import atomic_write, load_checkpoint  # noqa: E402
from ssog_core.evaluate import evaluate_sizes, plot_transfer  # noqa: E402
from ssog_core.info import count_flops, count_params  # noqa: E402
from ssog_core.shapes import ShapesSpec, render_with_mask  # noqa: E402

COLD = 3.35e-4  # softplus(-8) + 1e-4: a cold gate's starting scale
WARM = 0.1270  # softplus(-2) + 1e-4


def object_export(model: torch.nn.Module, spec: ShapesSpec, n: int, size: tuple[int, int]) -> dict[str, float]:
    """Accumulated export on the object's patches vs the background, over ``n`` validation images."""
    p = model.config.patch_size
    gh, gw = size[0] // p, size[1] // p
    on, off, wins, share = [], [], 0, []
    for start in range(0, n, 50):
        imgs, masks = [], []
        for i in range(start, min(n, start + 50)):
            img, _, alpha = render_with_mask(spec.seed, "val", i, spec.classes, size)
            imgs.append(torch.from_numpy(img).permute(2, 0, 1).float() / 255)
            masks.append(alpha.reshape(gh, p, gw, p).mean(axis=(1, 3)) > 0.5)  # patches mostly covered
        acc = export_maps(model, torch.stack(imgs)).accumulated.numpy()
        for a, m in zip(acc, masks, strict=True):
            if m.any() and (~m).any():
                on.append(a[m].mean())
                off.append(a[~m].mean())
                wins += a[m].mean() > a[~m].mean()
                share.append((a[m] > 0).mean())
    return {
        "object": float(np.mean(on)),
        "background": float(np.mean(off)),
        "object_wins": wins / len(on),
        "object_positive_share": float(np.mean(share)),
        "images": len(on),
    }


def example_figure(models: dict[str, torch.nn.Module], spec: ShapesSpec, size: tuple[int, int], path: Path) -> None:
    """A few validation images with each model's accumulated export map (RdBu, zero-centred)."""
    from matplotlib.figure import Figure

    idx = [0, 3, 5, 7, 8, 11]
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
    ap.add_argument("--ssog", default=str(ROOT / "checkpoints" / "ssog_shapes.safetensors"))
    ap.add_argument("--dot", default=str(ROOT / "checkpoints" / "dot_shapes.safetensors"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[24, 32, 40, 48, 56, 64, 80])
    ap.add_argument("--export-images", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "docs"))
    args = ap.parse_args()
    torch.manual_seed(0)
    out = Path(args.out)
    rows, models, transfer = {}, {}, {}
    for name, path in (("SSOG", args.ssog), ("dot", args.dot)):
        model, meta = load_checkpoint(path)
        models[name] = model
        size = tuple(model.config.img_size)
        spec = ShapesSpec.parse(meta["data"].partition(":")[2])
        sizes = [(s, s) for s in args.sizes]
        table, _ = evaluate_sizes(path, sizes=sizes)
        transfer[name] = table
        plot_transfer(table, out / f"transfer_{name.lower()}.png", f"{name}: zero-shot resolution transfer on shapes")
        rows[name] = {
            "path": Path(path).name,
            "meta": meta,
            "params": count_params(model),
            "flops": count_flops(model),
            "acc": next(r["accuracy"] for r in table if r["trained"]),
            "export": object_export(model, spec, args.export_images, size),
            "gates": meta.get("gate_scales", {}),
            "bytes": Path(path).stat().st_size,
        }
        print(name, {k: v for k, v in rows[name].items() if k != "meta"}, flush=True)
    example_figure(models, spec, size, out / "export_maps_shapes.png")

    s = rows["SSOG"]
    cfg = s["meta"]["config"]
    lines = [
        "# Results: SSOG vs its dot-product twin on `shapes` (matched recipe)",
        "",
        "Written by `python docs/results.py` from the demo checkpoints in `checkpoints/` (see",
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
        "(bold: the training size). Plots: `docs/transfer_ssog.png`, `docs/transfer_dot.png`.",
        "",
        "## Steering gates of the SSOG model",
        "",
        f"Gate scale s = softplus(raw) + 1e-4 per layer; a cold gate starts at {COLD:.2g}, a warm one at {WARM:.3f}"
        f" (this model: {'cold' if cfg['cold_init'] else 'warm'} start).",
        "",
        "| layer | s(μδ) | s(σδ) | s(λ) |",
        "|---:|---:|---:|---:|",
    ]
    g = s["gates"]
    for layer in range(cfg["depth"]):
        lines.append(f"| {layer} | " + " | ".join(f"{g[t][layer]:.4f}" for t in ("mu", "sigma", "lambda")) + " |")
    lines += [
        "",
        "## Who exports: accumulated export maps on the object",
        "",
        "Accumulated net export (sum over layers of pull-out − pull-in, α = 0.5) on "
        f"{s['export']['images']} validation images, split by the object's mask (patches at least half covered):",
        "",
        "| model | mean on object | mean on background | images where object > background | object patches > 0 |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        e = r["export"]
        lines.append(
            f"| {name} | {e['object']:+.3f} | {e['background']:+.3f} | {100 * e['object_wins']:.0f}% | "
            f"{100 * e['object_positive_share']:.0f}% |"
        )
    lines += ["", "![accumulated export maps](export_maps_shapes.png)", ""]
    curves = {n: out / f"metrics_{n.lower()}.jsonl" for n in rows}
    if all(p.is_file() for p in curves.values()):
        logs = {n: [json.loads(line) for line in p.read_text().splitlines()] for n, p in curves.items()}
        epochs = min(len(v) for v in logs.values())
        lines += [
            "## Validation accuracy per epoch (same recipe, same steps, same learning rate at each epoch)",
            "",
            "From the runs' `metrics.jsonl` (copied to `docs/metrics_*.jsonl`; curves in `docs/curves_*.png`).",
            "",
            "| epoch | " + " | ".join(logs) + " |",
            "|---:|" + "---:|" * len(logs),
        ]
        for e in range(epochs):
            lines.append(f"| {e + 1} | " + " | ".join(f"{100 * v[e]['val_acc']:.1f}%" for v in logs.values()) + " |")
        lines.append("")
    atomic_write(out / "RESULTS.md", lambda tmp: Path(tmp).write_text("\n".join(lines)))
    print(f"wrote {out / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
