"""What a control adds to the export tab's render (target ≤ 1 s), as the app computes it with one thread.

    python benchmarks/export_control.py [--checkpoint-dir checkpoints] [--out benchmarks/results/export_control.md]

The export tab with a control draws, for the SSOG checkpoint and its dot twin on a 224² picture, each model's
control maps and the figure of raw, control and raw − control (``viz.control_figure``). ``blank`` computes the
maps of the blank image (once per picture, cached beside the maps); ``validation`` subtracts the validation mean,
which the app makes once per checkpoint and α (``cache.validation``) — that first computation is measured too.
Needs the demo checkpoints (their recorded data is the validation set). Wall time and the process's CPU time are
both recorded, with the load average: on a shared 2-core box the wall time moves with what else runs, while the CPU
time (one torch thread) is what the render costs on an idle core.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch
from app_latency import summary, test_image

from ssog_core.analysis.controls import blank_control, validation_maps
from ssog_core.analysis.measures import DEFAULT_IMAGES, export_maps
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.data.images import model_input
from ssog_core.viz import figures as viz
from ssog_core.viz import raster
from ssog_core.viz.files import EXPORT_WIDTH

from common import write_report

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("ssog_layouts", "dot_layouts")
REPEAT = 3


def timed(fn, repeat: int = REPEAT) -> dict[str, dict[str, float]]:
    """Wall and CPU milliseconds of ``repeat`` calls after one warm-up call."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return {"wall": summary(wall), "cpu": summary(cpu)}


def bench(folder: Path) -> dict:
    torch.set_num_threads(1)  # the app's default: one thread per request
    img = test_image(224)
    models = [(name, *load_checkpoint(folder / f"{name}.safetensors")) for name in NAMES]
    inputs = {name: model_input([img], model.config.img_size, meta)[0] for name, model, meta in models}
    raw = {name: export_maps(model, inputs[name]) for name, model, _ in models}
    display = raster.model_view(img, models[0][1].config.img_size, EXPORT_WIDTH)
    first, val = {}, {}
    for name, model, meta in models:
        t, c = time.perf_counter(), time.process_time()
        val[name] = validation_maps(model, meta)
        first[name] = {"wall": time.perf_counter() - t, "cpu": time.process_time() - c}

    def blank() -> None:
        rows = [(n, raw[n], blank_control(m, inputs[n])) for n, m, _ in models]
        viz.figure_rgb(viz.control_figure(display, rows, "bench.png"))

    def validation() -> None:
        rows = [(n, raw[n], val[n].control()) for n, _, _ in models]
        viz.figure_rgb(viz.control_figure(display, rows, "bench.png"))

    return {
        "blank": timed(blank),
        "validation_cached": timed(validation),
        "validation_first_s": first,
        "grid": list(models[0][1].config.grid),
    }


def render_table(r: dict) -> str:
    first = ", ".join(f"{n} {s['cpu']:.1f} s CPU ({s['wall']:.1f} s wall)" for n, s in r["validation_first_s"].items())
    rows = [
        ("control blank: both models' blank-image maps + the control figure", r["blank"], "≤ 1 s"),
        ("control validation (mean cached): the control figure", r["validation_cached"], "≤ 1 s"),
    ]
    lines = [
        "# What a control adds to the export tab",
        "",
        f"Measured {r['when']} on {r['machine']}, one torch thread; load average before/after {r['load_before']} / "
        f"{r['load_after']} (a shared 2-core box: other jobs ran too). Demo checkpoints {', '.join(NAMES)} "
        f"({r['grid'][0]}×{r['grid'][1]} patches), a 224² picture. Command: `{r['command']}`.",
        "",
        "| what | CPU time, median | wall time, median (p10–p90) | target |",
        "|---|---:|---:|---|",
        *[
            f"| {a} | {s['cpu']['median'] / 1e3:.2f} s | {s['wall']['median'] / 1e3:.2f} s "
            f"({s['wall']['p10'] / 1e3:.2f}–{s['wall']['p90'] / 1e3:.2f}) | {t} |"
            for a, s, t in rows
        ],  # fmt: skip
        "",
        f"Once per checkpoint and α (then cached): the validation mean over {DEFAULT_IMAGES} validation "
        f"images took {first}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint-dir", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "export_control.md")
    args = ap.parse_args(argv)
    load_before = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    results = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "command": "python benchmarks/export_control.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "load_before": load_before,
        **bench(args.checkpoint_dir),
    }
    results["load_after"] = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    write_report(args.out, results, render_table(results))


if __name__ == "__main__":
    main()
