"""Train an SSOG ViT or its dot twin with the SSOG post's matched recipe.

    python -m ssog_core.train --data cifar100:./cifar-100-python --attn ssog --out runs/ssog
    python -m ssog_core.train --data cifar100:./cifar-100-python --attn dot --out runs/dot
    python -m ssog_core.train --out runs/ssog --resume                  # continue after a kill
    torchrun --nproc_per_node 4 -m ssog_core.train --data imagefolder:/data/imagenet --out runs/in1k

The recipe (defaults): AdamW (lr 1e-3, weight decay 0.05 on every parameter, as the upstream CIFAR example), linear
warm-up for 5 epochs then cosine decay to 0, updated every step; the data kind's crop + horizontal flip
(``--augment crop,flip``: a pad-4 random crop for cifar100 / shapes / layouts, an Inception random-resized crop
for imagefolder; name ``pad-crop`` or ``resized-crop`` to choose); batch 128 with drop_last; dropout 0.1.
``--batch-size`` is the global batch, split over torchrun's processes, so the schedule is the same on any number
of GPUs. On CUDA, bf16 autocast is on unless turned off; ``torch.compile`` only with ``--compile``. The transforms
are printed at the start and stored in the checkpoint metadata (``augment``, ``crop_pad``, ``transforms``).

Files in ``--out``: ``last.safetensors`` (float32 weights + config + metadata, written periodically and at
the end), ``train_state.pt`` (weights, optimizer, scheduler, RNG states and position, for ``--resume``),
``metrics.jsonl`` (one line per epoch), ``curves.png`` with ``--plot``, and ``model.safetensors`` at the end
in ``--save-dtype``. At the end the final model's zero-shot resolution transfer (``--transfer-sizes``: 0.5×–2×
the training size, at most 1000 val images each) is added to both checkpoints' headers as
``resolution_transfer`` and written to ``model.transfer.json``. Every file is written to a temporary name and
renamed, so a kill never leaves a half-written file. Ctrl-C (or SIGTERM) finishes the current step, saves, and exits.
After a stop of any kind: ``--resume`` if a ``*.safetensors`` is in ``--out`` (if the run was killed during its first
save it starts afresh, saying so), else the same command again (it replaces what the stopped run left).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ssog_core.checkpoint.format import (
    TRANSFER_KEY,
    CheckpointError,
)
from ssog_core.data.images import parse_size
from ssog_core.data.sources import (
    DataError,
    parse_augment,
    parse_data_spec,
)
from ssog_core.field import TAPS
from ssog_core.nn.config import ATTENTION_KINDS
from ssog_core.train.config import SAVE_DTYPES, TRANSFER_IMAGES, DivergedError, TrainConfig, TrainError
from ssog_core.train.distributed import init_distributed
from ssog_core.train.output import check_writable, remove_run_files, remove_unfinished
from ssog_core.train.state import resume_point
from ssog_core.train.trainer import Trainer


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for integers ``>= minimum``, with a message that says which rule was broken."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    return parse


_positive_int = _int_at_least(1)


_nonneg_int = _int_at_least(0)


def _float_in(lo: float, hi: float, lo_open: bool = False) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < lo or value > hi or (lo_open and value == lo):
            bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"{value} is outside {bound}")
        return value

    return parse


def _steer(text: str) -> tuple[str, ...]:
    taps = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in taps if t not in TAPS]
    if bad or len(set(taps)) != len(taps):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give distinct taps from {','.join(TAPS)}, or '' for the fixed field"
        )
    return tuple(t for t in TAPS if t in taps)


def _augment(text: str) -> tuple[str, ...]:
    try:
        return parse_augment(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _data(text: str) -> str:
    try:
        parse_data_spec(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _transfer_sizes(text: str) -> str | tuple[tuple[int, int], ...]:
    """``auto`` (0.5×–2× the training size), ``none``, or a comma list of sizes (N or HxW)."""
    if text in ("auto", "none"):
        return text
    return tuple(parse_size(t.strip()) for t in text.split(",") if t.strip()) or "none"


def build_parser() -> argparse.ArgumentParser:
    """The command line; every default is :class:`TrainConfig`'s."""
    c = TrainConfig()
    ap = argparse.ArgumentParser(
        prog="python -m ssog_core.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = ap.add_argument_group("data")
    g.add_argument(
        "--data",
        type=_data,
        default=c.data,
        help="cifar100:PATH, imagefolder:PATH, shapes[:SPEC] or layouts[:SPEC] (default: shapes)",
    )
    g.add_argument("--img-size", type=parse_size, help="N or HxW (default: the data's size; 224 for imagefolder)")
    g.add_argument(
        "--augment",
        type=_augment,
        default=c.augment,
        help="comma list of pad-crop, resized-crop, crop (the data's default: pad-crop, resized-crop for "
        "imagefolder) and flip, or none (default: crop,flip)",
    )
    g.add_argument(
        "--crop-pad", type=_nonneg_int, default=c.crop_pad, help="zero padding of pad-crop, pixels (default 4)"
    )
    g.add_argument("--workers", type=_nonneg_int, help="data loader processes (default: 4 on CUDA, 0 on CPU)")

    g = ap.add_argument_group("model")
    g.add_argument("--attn", choices=ATTENTION_KINDS, default=c.attn, help="ssog (default), its dot twin, or rbf")
    g.add_argument("--field", choices=("factorized", "axial"), default=c.field)
    g.add_argument(
        "--steer", type=_steer, default=c.steer, help="content taps: mu,sigma,lambda (default) or '' (fixed field)"
    )
    g.add_argument("--atoms", type=_positive_int, default=c.atoms, help="Gaussians per head, 1-8 (default 4)")
    g.add_argument(
        "--patch-size",
        type=_positive_int,
        help="default: 2 for cifar100, 16 for imagefolder, 4 for shapes and layouts",
    )
    g.add_argument("--dim", type=_positive_int, default=c.dim)
    g.add_argument("--depth", type=_positive_int, default=c.depth)
    g.add_argument("--heads", type=_positive_int, default=c.heads)
    g.add_argument("--mlp-ratio", type=_float_in(0, 64, lo_open=True), default=c.mlp_ratio)
    g.add_argument("--dropout", type=_float_in(0, 0.99), default=c.dropout)
    g.add_argument(
        "--max-offset", type=_float_in(0, 1e4), default=c.max_offset, help="bound on μδ, grid cells (default 4)"
    )
    g.add_argument("--sigma-floor", type=_float_in(0, 1e4), default=c.sigma_floor, help="narrowest atom, grid cells")
    g.add_argument("--warm-gates", action="store_true", help="start steering gates at softplus(-2) ≈ 0.13, not 3e-4")
    g.add_argument("--registers", type=_nonneg_int, default=c.registers, help="register tokens (dot / rbf only)")
    g.add_argument("--qk-norm", action="store_true", help="RMS-normalise q and k per head (dot only)")
    g.add_argument("--susie", action="store_true", help="2D SuSiE position code on q and k (dot / rbf only)")
    g.add_argument("--susie-dim", type=_nonneg_int, default=c.susie_dim, help="channels per head with SuSiE (0: all)")

    g = ap.add_argument_group("optimisation")
    g.add_argument("--epochs", type=_positive_int, default=c.epochs)
    g.add_argument("--batch-size", type=_positive_int, default=c.batch_size, help="global batch (split over processes)")
    g.add_argument("--lr", type=_float_in(0, 10, lo_open=True), default=c.lr)
    g.add_argument("--weight-decay", type=_float_in(0, 10), default=c.weight_decay)
    g.add_argument("--warmup-epochs", type=_float_in(0, 1e6), default=c.warmup_epochs)
    g.add_argument(
        "--gate-lr-mult",
        type=_float_in(0, 1e4, lo_open=True),
        default=c.gate_lr_mult,
        help="lr multiplier of the steering gates",
    )
    g.add_argument(
        "--field-lr-mult",
        type=_float_in(0, 1e4, lo_open=True),
        default=c.field_lr_mult,
        help="lr multiplier of the fixed field's μ, σ, λ, τ",
    )
    g.add_argument("--seed", type=_nonneg_int, default=c.seed)

    g = ap.add_argument_group("run")
    g.add_argument("--out", help="run folder (default: runs/ATTN-DATAKIND)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its train_state.pt")
    g.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start from these weights (same model; the image size may differ), fresh schedule",
    )
    g.add_argument(
        "--ckpt-every", type=_nonneg_int, default=c.ckpt_every, help="also save every N steps (default: each epoch)"
    )
    g.add_argument("--stop-after", type=_positive_int, help="save and stop once N steps are done (as a kill would)")
    g.add_argument(
        "--save-dtype", choices=tuple(SAVE_DTYPES), default=c.save_dtype, help="dtype of the final model.safetensors"
    )
    g.add_argument("--plot", action="store_true", help="write curves.png (train/val loss and accuracy) every epoch")
    g.add_argument(
        "--tensorboard", metavar="DIR", help="also write the history's scalars and the field grid as TensorBoard events"
    )
    g.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    g.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=c.compile,
        help="torch.compile the model (default: off, also on CUDA until a GPU run of benchmarks/gpu_check.py's "
        "compile check passes: docs/KERNELS.md §7; --no-compile turns it off once it is the default)",
    )
    g.add_argument("--amp", action=argparse.BooleanOptionalAction, help="bf16 autocast (default: on CUDA)")
    g.add_argument("--eval-batch-size", type=_positive_int, default=c.eval_batch_size)
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=c.progress, help="tqdm bars")
    g.add_argument(
        "--transfer-sizes",
        type=_transfer_sizes,
        default=c.transfer_sizes,
        help="sizes of the zero-shot resolution transfer measured at the end (stored in the checkpoint as "
        f"{TRANSFER_KEY}; at most {TRANSFER_IMAGES} val images each): auto (0.5×, 0.75×, 1×, 1.5×, 2× the "
        "training size, multiples of the patch), a comma list such as 16,24x32, or none",
    )
    return ap


def parse_args(argv: list[str]) -> tuple[TrainConfig, set[str]]:
    """The run's config and the options the user gave explicitly (a resumed run checks those)."""
    args = build_parser().parse_args(argv)
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    explicit = set(vars(probe.parse_args(argv)))
    return TrainConfig.from_dict(vars(args)), explicit


def run(argv: list[str]) -> int:
    config, explicit = parse_args(argv)
    d = init_distributed(config.device)
    try:
        if config.out is None:
            config = dataclasses.replace(config, out=f"runs/{config.attn}-{parse_data_spec(config.data)[0]}")
        out = Path(config.out)
        check_writable(out)
        command = "python -m ssog_core.train " + shlex.join(argv)
        state = None
        if config.resume:
            config, command, state = resume_point(out, config, explicit, d.is_primary)
        elif checkpoints := sorted(p.name for p in out.glob("*.safetensors")):
            raise TrainError(
                f"{out} already holds a training run ({', '.join(checkpoints)}): pass --resume to continue it, "
                "or choose another --out"
            )
        elif d.is_primary and (replaced := remove_run_files(out)):
            print(
                f"replacing the leftovers of a run in {out} that never wrote a checkpoint "
                f"({', '.join(p.name for p in replaced)})",
                file=sys.stderr,
            )
        if d.is_primary and (stale := remove_unfinished(out)):
            print(f"removed {len(stale)} unfinished temporary file(s) of an interrupted save in {out}", file=sys.stderr)
        return Trainer(config, d, command, state).fit()
    finally:
        if d.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except (TrainError, DataError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, DivergedError) else 2
