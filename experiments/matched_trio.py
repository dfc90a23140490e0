"""The matched trio on ``layouts``: steered SSOG, fixed-field SSOG and the dot twin, trained by one command each that
differs only in ``--attn`` / ``--steer``. Writes the section between the markers in docs/RESULTS.md and
docs/figures/matched_accuracy.png.

    python experiments/matched_trio.py [--checkpoints checkpoints] [--docs docs]

Everything is read from the checkpoints: the training commands and final accuracy from their metadata, the zero-shot
resolution transfer ``train`` measured at the end (``resolution_transfer``), and the training history (validation
accuracy at every epoch, fields and gates at every snapshot), measured with ``ssog_core.analysis.trajectory``.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ssog_core.analysis.presets import STRIP_RATIO
from ssog_core.analysis.report import initial_gate_scale, layer_geometry
from ssog_core.analysis.trajectory import geometry_trajectory
from ssog_core.checkpoint.files import atomic_write, replace_section, section_markers
from ssog_core.checkpoint.format import load_checkpoint, read_history

ROOT = Path(__file__).resolve().parent.parent
TRIO = {
    "SSOG (steered, cold gates)": "matched_ssog_layouts.safetensors",
    "SSOG (fixed field)": "matched_ssog_fixed_layouts.safetensors",
    "dot twin": "matched_dot_layouts.safetensors",
}
MARKS = section_markers("matched-trio")
LEFT_CHANCE = 0.2  # validation accuracy that counts as having left the chance plateau (10 classes: 10%)


def differing_flags(commands: list[str]) -> set[str]:
    """The flags (with values) that are not in every command, ``--out`` aside."""
    parsed = []
    for cmd in commands:
        words = shlex.split(cmd)[3:]  # after "python -m ssog_core.train"
        flags, i = set(), 0
        while i < len(words):
            if words[i].startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("-"):
                flags.add(f"{words[i]} {shlex.quote(words[i + 1])}")
                i += 2
            else:
                flags.add(words[i])
                i += 1
        parsed.append({f for f in flags if not f.startswith("--out ")})
    common = set.intersection(*parsed)
    return set.union(*parsed) - common


def first_step_above(val: list[list[float]], level: float) -> int | None:
    return next((int(s) for s, a, _ in val if a >= level), None)


def accuracy_figure(histories: dict[str, object], path: Path) -> None:
    fig = Figure(figsize=(7.5, 3.4), dpi=110, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    for name, h in histories.items():
        v = np.asarray(h.val)
        ax.plot(v[:, 0], v[:, 1], marker=".", label=name)
    ax.axhline(0.1, color="black", ls=":", lw=1, label="chance (10 classes)")
    ax.set_xlabel("step")
    ax.set_ylabel("validation accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Matched trio on layouts: validation accuracy at every epoch", fontsize=9)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def noise_points(p: float, q: float, n: int) -> float:
    """Two binomial standard errors of the difference of two accuracies on ``n`` images, in points."""
    return 200 * float(np.sqrt((p * (1 - p) + q * (1 - q)) / n))


def compare(a: str, b: str, acc: dict[str, float], n: int) -> str:
    """``a`` against ``b`` in words: ahead, behind, or within the noise of ``n`` validation images."""
    gap, noise = acc[a] - acc[b], noise_points(acc[a] / 100, acc[b] / 100, n)
    if abs(gap) <= noise:
        return f"{a} and {b} are within noise ({gap:+.1f} points; two standard errors on {n:,} images: {noise:.1f})"
    return f"{a} ends {abs(gap):.1f} points {'ahead of' if gap > 0 else 'behind'} {b} (noise: {noise:.1f})"


def what_it_says(metas: dict, histories: dict, steered: list[dict]) -> str:
    """The reading, from the numbers above: who leaves chance first, who ends ahead of whom (against the binomial
    noise of the validation set), how far the gates opened, whether the runs were still improving, the geometry."""
    (s_name, f_name, d_name) = TRIO
    acc = {n: 100 * metas[n]["accuracy"] for n in TRIO}
    n_val = int(re.search(r"val=(\d+)", metas[s_name]["data"]).group(1))
    left = {n: first_step_above(histories[n].val, LEFT_CHANCE) for n in TRIO}
    order = sorted(TRIO, key=lambda n: left[n] if left[n] is not None else float("inf"))
    last_gain = {n: 100 * (histories[n].val[-1][1] - histories[n].val[-2][1]) for n in TRIO}
    learning = [n for n in TRIO if last_gain[n] > 1.0]
    strips = sum(r["strips"] for r in steered)
    opening = min(min(r["gate_opening"].values()) for r in steered)
    plateau = "; ".join(f"{n} at step {left[n]:,}" if left[n] is not None else f"{n} never" for n in order)
    return (
        f"What this says, at this budget ({metas[s_name]['step']:,} steps, one run each, so the only spread is the "
        f"validation set's): the models leave the chance plateau in this order: {plateau}. "
        f"{compare(s_name, d_name, acc, n_val)} (the SSOG post has SSOG ahead of its matched dot twin); "
        f"{compare(s_name, f_name, acc, n_val)} (the post's ablation row has steering ahead of the fixed field)"
        + (
            "; both SSOG models are at the task's ceiling, where final accuracy cannot tell steering's share"
            if min(acc[s_name], acc[f_name]) >= 99
            else ""
        )
        + f". Every steering gate opened at least ×{opening:,.0f} from its cold start. "
        + (
            f"{', '.join(learning)} still gained more than a point in the last epoch. "
            if learning
            else "No model gained more than a point in its last epoch. "
        )
        + "The steered model's fields widen with depth; "
        + (
            "no head reads as a strip, unlike the post's figure of elongated deep heads."
            if strips == 0
            else f"{strips} head(s) read as a strip, as in the post's figure of elongated deep heads."
        )  # fmt: skip
    )


def section(ckpts: Path, docs: Path) -> str:
    models, metas, histories = {}, {}, {}
    for name, file in TRIO.items():
        models[name], metas[name] = load_checkpoint(ckpts / file)
        histories[name] = read_history(ckpts / file)
    accuracy_figure(histories, docs / "figures" / "matched_accuracy.png")
    commands = [m["command"] for m in metas.values()]
    differ = sorted(differing_flags(commands))
    cold = initial_gate_scale(models[next(iter(TRIO))].config)
    lines = [
        MARKS[0],
        "## The matched trio: steered SSOG, fixed-field SSOG, dot twin (one stage each, same steps)",
        "",
        "Written by `python experiments/matched_trio.py` from `checkpoints/matched_*.safetensors`. The three "
        "training commands"
        f" differ only in {', '.join(f'`{d}`' for d in differ)} (and `--out`); the common part is",
        "",
        "    " + re.sub(r" --(attn|steer) \S+| --out \S+", "", commands[0]).replace(" --attn ssog", ""),
        "",
        "| model | checkpoint | params | steps | val accuracy | left chance (val ≥ 20%) at step | zero-shot: "
        + " | ".join(f"{r['img_size'][0]}²" for r in metas[next(iter(TRIO))]["resolution_transfer"])
        + " |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(metas[next(iter(TRIO))]["resolution_transfer"]),
    ]
    for name, file in TRIO.items():
        meta, h = metas[name], histories[name]
        params = sum(p.numel() for p in models[name].parameters())
        left = first_step_above(h.val, LEFT_CHANCE)
        transfer = " | ".join(f"{100 * r['accuracy']:.1f}" for r in meta["resolution_transfer"])
        lines.append(
            f"| {name} | `{file}` | {params:,} | {meta['step']:,} | **{100 * meta['accuracy']:.1f}%** | "
            f"{left if left is not None else 'never'} | {transfer} |"
        )
    lines += [
        "",
        "(zero-shot: validation accuracy, %, at other image sizes with no fine-tuning, ≤ 1,000 images per size, as "
        "`train` measured it at the end; the training size is 56².)",
        "",
        "![validation accuracy vs step](figures/matched_accuracy.png)",
        "",
        "Geometry of the two SSOG models' fixed fields per layer (`layer_fields`: reach = RMS key distance of a centre "
        f"query's field, cells; strip = long/short spread ≥ {STRIP_RATIO:g}); gate opening = scale ÷ the cold start "
        f"{cold:.3g} (softplus(−8) + 1e-4):",
        "",
        "| layer | steered: mean reach | most elongated | strips | s(μδ) ×cold | s(σδ) ×cold | s(λ) ×cold "
        "| fixed: mean reach | most elongated | strips |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    steered, fixed = (layer_geometry(models[n]) for n in list(TRIO)[:2])
    for layer, (s, f) in enumerate(zip(steered, fixed, strict=True)):
        gates = " | ".join(f"×{s['gate_opening'][t]:,.0f}" for t in ("mu", "sigma", "lambda"))
        lines.append(
            f"| {layer} | {s['reach']:.2f} | {s['max_elongation']:.1f}× | {s['strips']} | {gates} | "
            f"{f['reach']:.2f} | {f['max_elongation']:.1f}× | {f['strips']} |"
        )
    h = histories[list(TRIO)[0]]
    traj = geometry_trajectory(h, models[list(TRIO)[0]].config.grid)
    reach0, reach_end = traj.reach[0].mean(-1), traj.reach[-1].mean(-1)
    smallest = min(v for s in steered for v in s["gate_opening"].values())
    lines += [
        "",
        f"Steered model: mean reach per layer moved from {', '.join(f'{v:.2f}' for v in reach0)} (step 0) to "
        f"{', '.join(f'{v:.2f}' for v in reach_end)} (step {h.steps[-1]}); deepest layer / layer 0: "
        f"**{steered[-1]['reach'] / steered[0]['reach']:.2f}×**; smallest gate opening: **×{smallest:,.0f}**.",
        "",
        what_it_says(metas, histories, steered),
        MARKS[1],
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = ap.parse_args()
    text = section(args.checkpoints, args.docs)
    replace_section(args.docs / "RESULTS.md", MARKS, text)
    print(text)


if __name__ == "__main__":
    main()
