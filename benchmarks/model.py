"""Whole-model latency: an SSOG ViT (all taps) against its dot twin, side by side in one run.

    python benchmarks/model.py                       # CPU: d384, 196 and 1024 tokens, batch 2, forward
    python benchmarks/model.py --mode train          # a training step: forward, cross-entropy, backward, AdamW
    python benchmarks/model.py --model d64-4L --batch 64 --mode train --threads 2   # the small CPU models
    python benchmarks/model.py --device cuda --batch 64 --dtype bfloat16

``--model``: ``d384`` (the SSOG post's 12-layer ImageNet model, patch 16, sizes from ``--img``) or one of the small
models people train on a CPU (:data:`SMALL`: d64 / 4 layers / 64 tokens, d128 / 6 layers / 196 tokens, d64 /
6 layers / 196 tokens), each at its own image size. ``--mode forward``: both models in eval mode under
``torch.inference_mode``. ``--mode train``: train mode, forward + loss + backward + ``AdamW.step`` (the fused
optimizer ``train`` builds; gradients freed between steps). ``--compile`` wraps both models in ``torch.compile``
(warm-up then includes compilation).
The two are measured interleaved (SSOG, dot, SSOG, dot, ..., the order flipping every round) so that
load from other processes hits both alike; the table reports the median of each and the median of the
per-round ratios. On CUDA every run is timed with CUDA events after a synchronise, and the growth of the
latency from the smallest to the largest size is reported too. Writes ``model_<tag>.csv`` and
``model_<tag>.md`` into ``--out`` (tag: the device type, ``_train`` appended in train mode).
"""

from __future__ import annotations

import argparse
import platform
import statistics
from pathlib import Path

import torch

from ssog_core.checkpoint.files import atomic_write
from ssog_core.nn.config import SEED_CONFIGS, ViTConfig
from ssog_core.nn.vit import ViT
from ssog_core.ops.dispatch import choose_ssog_backend
from ssog_core.train.config import TrainConfig
from ssog_core.train.optim import make_optimizer

from common import add_run_flags, apply_run_flags, load_average, provenance, timer, write_csv

OPTIMIZER = TrainConfig(lr=1e-4, weight_decay=0.05, gate_lr_mult=1.0)  # train's AdamW (fused), no multipliers
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# small models people train on a CPU: (SSOG config with all taps, gates open; image side). The dot twin is the
# same config with attn="dot".
_SMALL = dict(num_classes=100, num_heads=4, mlp_ratio=2.0, num_atoms=4, cold_init=False)
SMALL: dict[str, tuple[ViTConfig, int]] = {
    "d64-4L": (ViTConfig(**_SMALL, dim=64, depth=4, img_size=16, patch_size=2), 16),  # 8×8 = 64 tokens
    "d128-6L": (ViTConfig(**_SMALL, dim=128, depth=6, img_size=28, patch_size=2), 28),  # 14×14 = 196 tokens
    "d64-6L": (ViTConfig(**_SMALL, dim=64, depth=6, img_size=56, patch_size=4), 56),  # 14×14 = 196 tokens
}


def configs(model: str, img: int) -> dict[str, ViTConfig]:
    """The SSOG config and its dot twin for ``--model`` at image side ``img``."""
    if model == "d384":
        ssog, dot = SEED_CONFIGS["d384-ssog-all"][0], SEED_CONFIGS["d384-dot"][0]
    else:
        ssog = SMALL[model][0]
        dot = ViTConfig(**{**ssog.to_dict(), "attn": "dot", "steer": (), "num_atoms": 4, "cold_init": True})
    return {"ssog": ssog.replace(img_size=(img, img)), "dot": dot.replace(img_size=(img, img))}


def measure(
    img: int,
    batch: int,
    rounds: int,
    device: torch.device,
    dtype: torch.dtype,
    clock: str = "wall",
    mode: str = "forward",
    model: str = "d384",
    compile_models: bool = False,
) -> dict[str, float]:
    """Interleaved latencies (a forward, or a training step) of the SSOG model and its dot twin at one size.

    A 16-bit ``dtype`` runs under autocast with float32 parameters (as mixed-precision inference does: the
    attention values are 16-bit, the SSOG field parameters stay float32).
    """
    torch.manual_seed(0)
    models, steps, optims = {}, {}, {}
    for name, cfg in configs(model, img).items():
        models[name] = ViT(cfg).to(device=device).train(mode == "train")
        steps[name] = torch.compile(models[name]) if compile_models else models[name]
        optims[name] = make_optimizer(models[name], OPTIMIZER) if mode == "train" else None
    x = torch.rand(batch, 3, img, img, device=device)
    labels = torch.randint(0, cfg.num_classes, (batch,), device=device)
    half = dtype != torch.float32

    def run(name: str) -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=half):
            out = steps[name](x)
        if mode == "train":
            torch.nn.functional.cross_entropy(out.float(), labels).backward()
            optims[name].step()
            optims[name].zero_grad(set_to_none=True)

    clock_fn = timer(device, clock)
    times: dict[str, list[float]] = {"ssog": [], "dot": []}
    with torch.inference_mode(mode == "forward"):
        for name in models:  # warm-up (allocator, kernel selection, autotuning, compilation)
            for _ in range(3 if compile_models else 2):
                run(name)
        for i in range(rounds):
            order = ("ssog", "dot") if i % 2 == 0 else ("dot", "ssog")
            for name in order:
                times[name].append(clock_fn(lambda n=name: run(n)))
    ratios = [s / d for s, d in zip(times["ssog"], times["dot"], strict=True)]
    blk = models["ssog"].blocks[0].attn
    grid = models["ssog"].grid_for(img, img)
    v = torch.zeros(batch, grid[0] * grid[1], blk.num_heads, blk.head_dim, device=device, dtype=dtype)
    with torch.no_grad():
        field = blk.field(torch.zeros(batch, v.shape[1], blk.dim, device=device), grid)
    return {
        "tokens": grid[0] * grid[1],
        "img": img,
        "ssog_ms": statistics.median(times["ssog"]) * 1e3,
        "dot_ms": statistics.median(times["dot"]) * 1e3,
        "ratio_of_medians": statistics.median(times["ssog"]) / statistics.median(times["dot"]),
        "median_ratio": statistics.median(ratios),
        "ratio_q1": statistics.quantiles(ratios, n=4)[0] if len(ratios) > 1 else ratios[0],
        "ratio_q3": statistics.quantiles(ratios, n=4)[2] if len(ratios) > 1 else ratios[0],
        "backend": choose_ssog_backend(v, field, grid, blk.mode),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--model", choices=("d384", *SMALL), default="d384", help="d384, or a small CPU model")
    ap.add_argument("--img", type=int, nargs="+", help="image sides (d384: patch 16, default 224 512 → 196, 1024 "
                    "tokens; small models: their own size)")  # fmt: skip
    ap.add_argument("--compile", action="store_true", help="torch.compile both models")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per size")
    ap.add_argument("--mode", choices=("forward", "train"), default="forward", help="train: a whole AdamW step")
    add_run_flags(ap)
    args = ap.parse_args(argv)
    command, stamp = provenance(argv)
    device = torch.device(args.device)
    apply_run_flags(ap, args, device)
    dtype = DTYPES[args.dtype]

    sizes = args.img or ([224, 512] if args.model == "d384" else [SMALL[args.model][1]])
    rows = []
    for img in sizes:
        load_before = load_average()
        row = measure(img, args.batch, args.rounds, device, dtype, args.clock, args.mode, args.model, args.compile)
        row["load_avg"] = f"{load_before}→{load_average()}"
        rows.append(row)
        print(
            f"{row['tokens']:>6} tokens: ssog {row['ssog_ms']:8.1f} ms  dot {row['dot_ms']:8.1f} ms  "
            f"ratio {row['median_ratio']:.3f} (IQR {row['ratio_q1']:.3f}–{row['ratio_q3']:.3f}), "
            f"backend {row['backend']}, load {row['load_avg']}",
            flush=True,
        )

    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or "_".join(
        [device.type, *([args.model] if args.model != "d384" else []), *(["train"] if args.mode == "train" else [])]
    )
    fields = list(rows[0])

    write_csv(args.out / f"model_{tag}.csv", rows, fields)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    what = "forward" if args.mode == "forward" else "training step (forward + loss + backward + AdamW)"
    c = configs(args.model, sizes[0])["ssog"]
    lines = [
        f"Whole {args.model} ViT {what} ({c.depth} layers, dim {c.dim}, {c.num_heads} heads, patch {c.patch_size}, "
        f"mlp {c.mlp_ratio:g}, SSOG R{c.num_atoms} all taps vs dot twin{', torch.compile' if args.compile else ''}), "
        f"batch {args.batch}, {args.dtype}, {dev_name}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.clock} clock, {args.rounds} interleaved rounds. {stamp}, `{command}`.",
        "",
        "| tokens | SSOG ms | dot ms | SSOG/dot (median of rounds) | IQR | SSOG backend | load avg |",
        "|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']} | {r['ssog_ms']:.1f} | {r['dot_ms']:.1f} | {r['median_ratio']:.3f} | "
            f"{r['ratio_q1']:.3f}–{r['ratio_q3']:.3f} | {r['backend']} | {r['load_avg']} |"
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        lines += [
            "",
            f"Latency growth {first['tokens']} → {last['tokens']} tokens: SSOG "
            f"{last['ssog_ms'] / first['ssog_ms']:.2f}×, dot {last['dot_ms'] / first['dot_ms']:.2f}×.",
        ]
    atomic_write(args.out / f"model_{tag}.md", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
