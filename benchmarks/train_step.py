"""The ablation sweep's training step: steered SSOG, the fixed field and the dot twin side by side in one run.

    python benchmarks/train_step.py                          # 1 thread, CPU clock: grids 14, 20 (the sweep's), 24
    python benchmarks/train_step.py --grid 24 --rounds 15    # one grid, more rounds
    python benchmarks/train_step.py --trained                # the bundled converged pointer14 models, 14×14

The sweep's model (dim 64, 4 layers, 4 heads, 4 atoms, mlp 2, patch 4, dropout 0, cold gates; batch 64) at each
grid of ``--grid`` (``G`` → ``4G`` px images, ``G²`` tokens), in its three variants: ``steered`` (all three taps,
``train``'s default), ``fixed`` (``--steer ''``) and ``dot`` (``--attn dot``). A step is what the trainer's
``_train_step`` does: forward, cross-entropy on float logits, ``zero_grad``, backward, fused ``AdamW.step``.

The sweep's runs use one thread each, two runs at once on a 2-core machine, so the default is ``--threads 1
--clock cpu``: the calling thread's CPU time, which time slices lost to other processes do not inflate. The three
variants run interleaved (the order rotating every round) so that load hits all alike; the table reports each
variant's median and the median (IQR) of the per-round ratios to the dot twin of the same round. Writes
``train_step_<tag>.csv`` and ``.md`` into ``--out`` (tag: ``cpu_<threads>thread``).

``--trained`` starts the three variants from the bundled converged seed-0 runs of the sweep
(``checkpoints/matched_{ssog,ssog_fixed,dot}_pointer14``, 14×14) instead of a fresh initialisation: a trained field
is sharp, and what its far weights cost (denormal arithmetic in the C kernels before they flushed it) a fresh
model never shows. Tag ``cpu_<threads>thread_trained``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch

from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.nn.config import ViTConfig
from ssog_core.nn.vit import ViT
from ssog_core.train.config import TrainConfig
from ssog_core.train.optim import make_optimizer
from ssog_core.train.trainer import loss_fn

from common import add_run_flags, apply_run_flags, load_average, provenance, timer, write_csv

PATCH = 4
SWEEP = ViTConfig(num_classes=10, dim=64, depth=4, num_heads=4, num_atoms=4, mlp_ratio=2.0, patch_size=PATCH,
                  dropout=0.0)  # fmt: skip
VARIANTS = {"steered": {}, "fixed": {"steer": ()}, "dot": {"attn": "dot"}}  # what the sweep's commands change
CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
TRAINED = {"steered": "matched_ssog_pointer14", "fixed": "matched_ssog_fixed_pointer14", "dot": "matched_dot_pointer14"}
TRAINED_GRID = 14
OPTIMIZER = TrainConfig(gate_lr_mult=10.0, field_lr_mult=3.0)  # the matched trio's groups (one fused step each)


def models_for(grid: int, trained: bool) -> dict[str, torch.nn.Module]:
    """The three variants, fresh (seed 0) at ``grid``, or the bundled converged runs (their own 14×14 grid)."""
    if trained:
        return {name: load_checkpoint(CHECKPOINTS / f"{TRAINED[name]}.safetensors")[0] for name in VARIANTS}
    img = grid * PATCH
    models = {}
    for name, change in VARIANTS.items():
        torch.manual_seed(0)
        models[name] = ViT(SWEEP.replace(img_size=(img, img), **change))
    return models


def measure(grid: int, batch: int, rounds: int, device: torch.device, clock: str, trained: bool = False) -> dict:
    """Interleaved training-step times of the three variants on a ``grid × grid`` token grid."""
    img = grid * PATCH
    models = {name: m.to(device).train() for name, m in models_for(grid, trained).items()}
    optims = {name: make_optimizer(m, OPTIMIZER) for name, m in models.items()}
    classes = models["dot"].config.num_classes
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, img, img, generator=g).to(device)
    labels = torch.randint(0, classes, (batch,), generator=g).to(device)

    def step(name: str) -> None:
        loss = loss_fn(models[name](x), labels)
        optims[name].zero_grad(set_to_none=True)
        loss.backward()
        optims[name].step()

    clock_fn = timer(device, clock)
    names = list(VARIANTS)
    for name in names:  # warm-up: allocator, the C kernels' compilation and scratch, AdamW state
        for _ in range(2):
            step(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    load_before = load_average()
    for i in range(rounds):
        for name in names[i % 3 :] + names[: i % 3]:
            times[name].append(clock_fn(lambda n=name: step(n)))
    row: dict[str, float | str] = {"grid": f"{grid}×{grid}", "tokens": grid * grid, "img": img}
    for name in names:
        row[f"{name}_ms"] = statistics.median(times[name]) * 1e3
    for name in ("steered", "fixed"):
        ratios = [s / d for s, d in zip(times[name], times["dot"], strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        row[f"{name}_ratio"], row[f"{name}_q1"], row[f"{name}_q3"] = statistics.median(ratios), q1, q3
    row["load_avg"] = f"{load_before}→{load_average()}"
    return row


def table(rows: list[dict], args: argparse.Namespace, command: str, stamp: str) -> list[str]:
    cpu = platform.processor() or "cpu"
    start = "the bundled converged pointer14 models (10,000 steps)" if args.trained else "fresh, seed 0"
    lines = [
        f"Training step of the ablation sweep's ViT (dim {SWEEP.dim}, {SWEEP.depth} layers, {SWEEP.num_heads} heads, "
        f"{SWEEP.num_atoms} atoms, mlp {SWEEP.mlp_ratio:g}, patch {PATCH}, dropout 0, cold gates), batch {args.batch}, "
        f"{start}, fp32, {cpu}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.clock} clock, "
        f"{args.rounds} interleaved rounds; ratios: median (IQR) of the per-round ratios to the dot twin. "
        f"{stamp}, `{command}`.",
        "",
        "| grid (tokens) | steered ms | fixed ms | dot ms | steered/dot | IQR | fixed/dot | IQR | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['grid']} ({r['tokens']}) | {r['steered_ms']:.1f} | {r['fixed_ms']:.1f} | {r['dot_ms']:.1f} | "
            f"**{r['steered_ratio']:.3f}** | {r['steered_q1']:.3f}–{r['steered_q3']:.3f} | "
            f"**{r['fixed_ratio']:.3f}** | {r['fixed_q1']:.3f}–{r['fixed_q3']:.3f} | {r['load_avg']} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", type=int, nargs="+", default=[14, 20, 24], help="token grid sides (image side = 4×)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds per grid (≥ 2)")
    ap.add_argument("--trained", action="store_true", help="the bundled converged pointer14 models (14×14 only)")
    add_run_flags(ap)
    ap.set_defaults(threads=1, clock="cpu")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the table reports an IQR)")
    if args.trained:
        if "--grid" in (argv if argv is not None else sys.argv[1:]) and args.grid != [TRAINED_GRID]:
            ap.error(f"--trained measures the bundled models at their own grid, {TRAINED_GRID}×{TRAINED_GRID}")
        args.grid = [TRAINED_GRID]
    command, stamp = provenance(argv)
    device = torch.device("cpu")
    apply_run_flags(ap, args, device)

    rows = []
    for grid in args.grid:
        row = measure(grid, args.batch, args.rounds, device, args.clock, args.trained)
        rows.append(row)
        print(
            f"{row['grid']}: steered {row['steered_ms']:.1f} ms, fixed {row['fixed_ms']:.1f} ms, dot "
            f"{row['dot_ms']:.1f} ms; steered/dot {row['steered_ratio']:.3f}, fixed/dot {row['fixed_ratio']:.3f}, "
            f"load {row['load_avg']}",
            flush=True,
        )
    tag = args.tag or f"cpu_{torch.get_num_threads()}thread" + ("_trained" if args.trained else "")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / f"train_step_{tag}.csv", rows, list(rows[0]))
    lines = table(rows, args, command, stamp)
    atomic_write(args.out / f"train_step_{tag}.md", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
