"""Train an SSOG ViT or its dot twin with the SSOG post's matched recipe.

    python -m ssog_core.train --data cifar100:./cifar-100-python --attn ssog --out runs/ssog
    python -m ssog_core.train --data cifar100:./cifar-100-python --attn dot --out runs/dot
    python -m ssog_core.train --out runs/ssog --resume                  # continue after a kill
    torchrun --nproc_per_node 4 -m ssog_core.train --data imagefolder:/data/imagenet --out runs/in1k

The recipe (defaults): AdamW (lr 1e-3, weight decay 0.05 on every parameter, as the reference CIFAR example), linear
warm-up for 5 epochs then cosine decay to 0, updated every step; the data kind's crop + horizontal flip
(``--augment crop,flip``: a pad-4 random crop for cifar100 / shapes / layouts, an Inception random-resized crop
for imagefolder; name ``pad-crop`` or ``resized-crop`` to choose); batch 128 with drop_last; dropout 0.1.
``--batch-size`` is the global batch, split over torchrun's processes, so the schedule is the same on any number
of GPUs. On CUDA, bf16 autocast and ``torch.compile`` are on unless turned off. The transforms are printed at the
start and stored in the checkpoint metadata (``augment``, ``crop_pad``, ``transforms``).

Files in ``--out``: ``last.safetensors`` (float32 weights + config + metadata, written periodically and at
the end), ``train_state.pt`` (weights, optimizer, scheduler, RNG states and position, for ``--resume``),
``metrics.jsonl`` (one line per epoch), ``curves.png`` with ``--plot``, and ``model.safetensors`` at the end
in ``--save-dtype``. At the end the final model's zero-shot resolution transfer (``--transfer-sizes``: 0.5×–2×
the training size, at most 1000 val images each) is added to both checkpoints' headers as
``resolution_transfer`` and written to ``model.transfer.json``. Every file is written to a temporary name and
renamed, so a kill never leaves a half-written file. Ctrl-C (or SIGTERM) finishes the current step, saves, and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import (
    TRANSFER_KEY,
    CheckpointError,
    read_checkpoint_with_history,
    save_checkpoint,
    software_versions,
    unwrap,
    update_metadata,
)
from ssog_core.checkpoint.history import History, at_chance, snapshot_steps, stalled_gates
from ssog_core.data.images import parse_size
from ssog_core.data.sources import (
    CROP_PADDING,
    DataError,
    DataSource,
    EpochSampler,
    Transformed,
    describe_transforms,
    open_data,
    parse_augment,
    parse_data_spec,
    resolve_augment,
    to_float,
)
from ssog_core.field import TAPS, positive
from ssog_core.nn.attention import COLD_GATE, WARM_GATE
from ssog_core.nn.config import ATTENTION_KINDS, ViTConfig
from ssog_core.nn.vit import ViT
from ssog_core.train.accuracy import (
    autocast,
    eval_loader,
    evaluate_loader,
    evaluate_model_sizes,
    format_transfer,
    transfer_curve,
    transfer_sizes,
)

STATE_VERSION = 1
# Options that only change how a run executes, not what it computes: a resumed run may change these.
RUNTIME_OPTIONS = {
    "resume",
    "device",
    "compile",
    "amp",
    "workers",
    "plot",
    "stop_after",
    "ckpt_every",
    "save_dtype",
    "progress",
    "eval_batch_size",
    "out",
    "transfer_sizes",
}
TRANSFER_IMAGES = 1000  # val images per size of the transfer curve measured at the end (keeps it cheap)
SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


DEFAULT_PATCH = {
    "cifar100": 2,
    "imagefolder": 16,
    "shapes": 4,
    "layouts": 4,
}  # the SSOG post's 16×16 (CIFAR) and 14×14 (224²) grids


class TrainError(RuntimeError):
    """A run that cannot start or go on, with a message meant for a person."""


class DivergedError(TrainError):
    """The loss became NaN or infinite."""


# ------------------------------------------------------------------------------------------- command line


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
    ap = argparse.ArgumentParser(
        prog="python -m ssog_core.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = ap.add_argument_group("data")
    g.add_argument(
        "--data",
        type=_data,
        default="shapes",
        help="cifar100:PATH, imagefolder:PATH, shapes[:SPEC] or layouts[:SPEC] (default: shapes)",
    )
    g.add_argument("--img-size", type=parse_size, help="N or HxW (default: the data's size; 224 for imagefolder)")
    g.add_argument(
        "--augment",
        type=_augment,
        default=("crop", "flip"),
        help="comma list of pad-crop, resized-crop, crop (the data's default: pad-crop, resized-crop for "
        "imagefolder) and flip, or none (default: crop,flip)",
    )
    g.add_argument(
        "--crop-pad", type=_nonneg_int, default=CROP_PADDING, help="zero padding of pad-crop, pixels (default 4)"
    )
    g.add_argument("--workers", type=_nonneg_int, help="data loader processes (default: 4 on CUDA, 0 on CPU)")

    g = ap.add_argument_group("model")
    g.add_argument("--attn", choices=ATTENTION_KINDS, default="ssog", help="ssog (default), its dot twin, or rbf")
    g.add_argument("--field", choices=("factorized", "axial"), default="factorized")
    g.add_argument(
        "--steer", type=_steer, default=TAPS, help="content taps: mu,sigma,lambda (default) or '' (fixed field)"
    )
    g.add_argument("--atoms", type=_positive_int, default=4, help="Gaussians per head, 1-8 (default 4)")
    g.add_argument(
        "--patch-size",
        type=_positive_int,
        help="default: 2 for cifar100, 16 for imagefolder, 4 for shapes and layouts",
    )
    g.add_argument("--dim", type=_positive_int, default=256)
    g.add_argument("--depth", type=_positive_int, default=6)
    g.add_argument("--heads", type=_positive_int, default=4)
    g.add_argument("--mlp-ratio", type=_float_in(0, 64, lo_open=True), default=2.0)
    g.add_argument("--dropout", type=_float_in(0, 0.99), default=0.1)
    g.add_argument("--max-offset", type=_float_in(0, 1e4), default=4.0, help="bound on μδ, grid cells (default 4)")
    g.add_argument("--sigma-floor", type=_float_in(0, 1e4), default=0.25, help="narrowest atom, grid cells")
    g.add_argument("--warm-gates", action="store_true", help="start steering gates at softplus(-2) ≈ 0.13, not 3e-4")
    g.add_argument("--registers", type=_nonneg_int, default=0, help="register tokens (dot / rbf only)")
    g.add_argument("--qk-norm", action="store_true", help="RMS-normalise q and k per head (dot only)")
    g.add_argument("--susie", action="store_true", help="2D SuSiE position code on q and k (dot / rbf only)")
    g.add_argument("--susie-dim", type=_nonneg_int, default=0, help="channels per head with SuSiE (0: all)")

    g = ap.add_argument_group("optimisation")
    g.add_argument("--epochs", type=_positive_int, default=100)
    g.add_argument("--batch-size", type=_positive_int, default=128, help="global batch (split over processes)")
    g.add_argument("--lr", type=_float_in(0, 10, lo_open=True), default=1e-3)
    g.add_argument("--weight-decay", type=_float_in(0, 10), default=0.05)
    g.add_argument("--warmup-epochs", type=_float_in(0, 1e6), default=5.0)
    g.add_argument(
        "--gate-lr-mult", type=_float_in(0, 1e4, lo_open=True), default=1.0, help="lr multiplier of the steering gates"
    )
    g.add_argument(
        "--field-lr-mult",
        type=_float_in(0, 1e4, lo_open=True),
        default=1.0,
        help="lr multiplier of the fixed field's μ, σ, λ, τ",
    )
    g.add_argument("--seed", type=_nonneg_int, default=0)

    g = ap.add_argument_group("run")
    g.add_argument("--out", help="run folder (default: runs/ATTN-DATAKIND)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its train_state.pt")
    g.add_argument("--init-from", metavar="CHECKPOINT", help="start from these weights (same model), fresh schedule")
    g.add_argument("--ckpt-every", type=_nonneg_int, default=0, help="also save every N steps (default: each epoch)")
    g.add_argument("--stop-after", type=_positive_int, help="save and stop once N steps are done (as a kill would)")
    g.add_argument(
        "--save-dtype", choices=tuple(SAVE_DTYPES), default="float32", help="dtype of the final model.safetensors"
    )
    g.add_argument("--plot", action="store_true", help="write curves.png (train/val loss and accuracy) every epoch")
    g.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, help="torch.compile (default: on CUDA)")
    g.add_argument("--amp", action=argparse.BooleanOptionalAction, help="bf16 autocast (default: on CUDA)")
    g.add_argument("--eval-batch-size", type=_positive_int, default=256)
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm bars")
    g.add_argument(
        "--transfer-sizes",
        type=_transfer_sizes,
        default="auto",
        help="sizes of the zero-shot resolution transfer measured at the end (stored in the checkpoint as "
        f"{TRANSFER_KEY}; at most {TRANSFER_IMAGES} val images each): auto (0.5×, 0.75×, 1×, 1.5×, 2× the "
        "training size, multiples of the patch), a comma list such as 16,24x32, or none",
    )
    return ap


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, set[str]]:
    """Parsed arguments and the names the user gave explicitly (a resumed run checks those)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    explicit = set(vars(probe.parse_args(argv)))
    return args, explicit


# ------------------------------------------------------------------------------------------------ processes


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str | None) -> Dist:
    """One process (plain ``python -m``) or one of torchrun's: NCCL on CUDA, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    name = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise TrainError(f"--device {name!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TrainError("--device cuda was asked for, but this PyTorch sees no CUDA device")
    if world == 1:
        return Dist(0, 1, dev)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank, world, dev)


def _sync(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


# ---------------------------------------------------------------------------------------------- the output


def check_writable(out: Path) -> None:
    """Fail before anything else if ``out`` cannot be created and written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise TrainError(f"cannot write to --out {out}: {e.strerror or e}") from None


def remove_unfinished(out: Path) -> list[Path]:
    """Delete the temporary files of saves that a kill interrupted (``atomic_write`` names them ``.NAME.*.tmp``):
    the complete files they would have replaced are still there, so they hold nothing of value."""
    names = (
        "last.safetensors",
        "model.safetensors",
        "train_state.pt",
        "metrics.jsonl",
        "curves.png",
        "model.transfer.json",
    )
    stale = [p for name in names for p in out.glob(f".{name}.*.tmp") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def check_space(out: Path, need_bytes: int) -> None:
    """Fail before training if the disk of ``out`` lacks room for the checkpoints and their temporary copies."""
    free = shutil.disk_usage(out).free
    if free < need_bytes:
        raise TrainError(
            f"--out {out} has {free / 1e6:.1f} MB free, but the checkpoints need about {need_bytes / 1e6:.1f} MB: "
            "free some space or choose another --out"
        )


def _atomic_json_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in rows)))


def plot_curves(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Train/val loss and accuracy per epoch (PNG, matplotlib Agg)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4), dpi=110)
    ep = [r["epoch"] for r in rows]
    for i, (key, label) in enumerate((("loss", "loss"), ("acc", "accuracy"))):
        ax = fig.add_subplot(1, 2, i + 1)
        ax.plot(ep, [r[f"train_{key}"] for r in rows], marker=".", label="train")
        ax.plot(ep, [r[f"val_{key}"] for r in rows], marker=".", label="val")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


# -------------------------------------------------------------------------------------------- optimisation


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine to 0 at ``total`` (step = optimizer steps done)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


FIELD_PARAMETERS = ("mu", "raw_sigma", "log_lambda", "raw_temperature")  # the fixed field of an SSOG layer


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW with weight decay on every parameter (the reference implementation's recipe).

    The steering gates and the fixed field's parameters (μ, σ, λ, τ) get their own learning-rate multipliers:
    under Adam a parameter moves about one learning rate per step, so a short run cannot open a cold gate or
    move an atom by several grid cells without them. The fused implementation updates every parameter in one
    kernel: an SSOG layer has 15 parameter tensors (a dot layer 2), and the per-tensor loop cost 4.4 ms of a
    115 ms d64 training step on 2 CPU threads.
    """
    field_mult = getattr(args, "field_lr_mult", 1.0)
    gates, field, rest = [], [], []
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        is_field = leaf in FIELD_PARAMETERS and field_mult != 1.0  # no extra group by default: old runs resume
        (gates if leaf.endswith("_scale") else field if is_field else rest).append(p)
    groups = [{"params": rest, "lr": args.lr}]
    for params, mult in ((gates, args.gate_lr_mult), (field, field_mult)):
        if params:
            groups.append({"params": params, "lr": args.lr * mult})
    return torch.optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay, fused=True)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target)


def gate_summary(model: nn.Module) -> dict[str, list[float]]:
    """The steering gate scales s(μδ), s(σδ), s(λ) of every SSOG layer."""
    out: dict[str, list[float]] = {}
    for block in unwrap(model).blocks:
        scales = getattr(block.attn, "gate_scales", None)
        for tap, s in (scales() if scales else {}).items():
            out.setdefault(tap, []).append(round(float(s.detach()), 6))
    return out


# ----------------------------------------------------------------------------------------- state and resume


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "gauss": [int(np_state[3]), float(np_state[4])],
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["gauss"][0], n["gauss"][1]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_train_state(path: Path) -> dict[str, Any]:
    """The resume file, read without unpickling anything but tensors and plain containers."""
    if not path.is_file():
        raise TrainError(f"nothing to resume: {path} does not exist (was the run started with this --out?)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises many types for a bad file; all mean "unusable")
        raise TrainError(f"{path} is not a readable training state (truncated or corrupt?): {e}") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise TrainError(f"{path} is not a training state of this version of SSOG Lab")
    return state


def _resume_args(args: argparse.Namespace, explicit: set[str], saved: dict[str, Any]) -> argparse.Namespace:
    """The saved run's arguments, with the runtime options given now; refuses changes to the recipe."""
    changed = []
    for name in sorted(explicit - RUNTIME_OPTIONS):
        now, then = getattr(args, name), saved.get(name)
        if (list(now) if isinstance(now, tuple) else now) != (list(then) if isinstance(then, tuple) else then):
            changed.append(f"--{name.replace('_', '-')} {then!r} -> {now!r}")
    if changed:
        raise TrainError("a resumed run must keep its recipe; these differ from the saved run: " + "; ".join(changed))
    merged = {**vars(args), **saved}  # options newer than the saved run keep their defaults
    for name in RUNTIME_OPTIONS:  # how to run now: as given now (or its default), never the saved value
        merged[name] = getattr(args, name)
    for name in ("steer", "augment", "img_size"):
        if merged.get(name) is not None:
            merged[name] = tuple(merged[name])
    return argparse.Namespace(**merged)


def _plain_args(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()}


# ------------------------------------------------------------------------------------------------- training


class _StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to save and stop after the current step."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))  # a second one stops at once

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def model_config(args: argparse.Namespace, data: DataSource) -> ViTConfig:
    try:
        return ViTConfig(
            num_classes=data.num_classes,
            img_size=args.img_size,
            patch_size=args.patch_size,
            dim=args.dim,
            depth=args.depth,
            num_heads=args.heads,
            mlp_ratio=args.mlp_ratio,
            dropout=args.dropout,
            attn=args.attn,
            num_atoms=args.atoms,
            field=args.field,
            steer=args.steer,
            max_offset=args.max_offset,
            sigma_floor=args.sigma_floor,
            cold_init=not args.warm_gates,
            num_registers=args.registers,
            qk_norm=args.qk_norm,
            susie=args.susie,
            susie_dim=args.susie_dim,
        )
    except ValueError as e:
        raise TrainError(str(e)) from None


class Trainer:
    """One training run: data, model, optimizer, schedule, checkpoints, metrics."""

    def _init_from(self, path: str) -> None:
        """Start from a checkpoint's weights (a second stage with a fresh schedule); the architectures must match."""
        try:
            config, state, _, history = read_checkpoint_with_history(path)
        except CheckpointError as e:
            raise TrainError(f"--init-from: {e}") from None
        if config.to_dict() != self.config.to_dict():
            diff = sorted(k for k, v in config.to_dict().items() if self.config.to_dict().get(k) != v)
            raise TrainError(f"--init-from {path}: its model differs from this run's in {', '.join(diff)}")
        self.model.load_state_dict({k: v.float() for k, v in state.items()})
        if history is not None:  # this stage's snapshots continue the earlier stage's
            history.new_stage()
            self.history = history

    def __init__(self, args: argparse.Namespace, d: Dist, command: str, state: dict[str, Any] | None):
        self.args, self.d, self.command = args, d, command
        self.out = Path(args.out)
        self.data = open_data(args.data, args.img_size)
        if args.img_size is None:
            args.img_size = self.data.native_size or (224, 224)
        if args.patch_size is None:
            args.patch_size = DEFAULT_PATCH[self.data.kind]
        self.config = model_config(args, self.data)
        if args.batch_size % d.world:
            raise TrainError(f"--batch-size {args.batch_size} must be divisible by the {d.world} processes")
        self.local_batch = args.batch_size // d.world
        torch.manual_seed(args.seed)  # the same initial weights in every process
        self.model = ViT(self.config).to(d.device)
        self.history = History()
        if getattr(args, "init_from", None) and state is None:
            self._init_from(args.init_from)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        if d.main:  # last.safetensors (4 B/param) + train_state.pt (16 B/param), each with a temporary copy
            check_space(self.out, need_bytes=2 * 20 * self.num_params + 16 * 1024**2)
        _sync(d)
        self.optimizer = make_optimizer(self.model, args)
        self.transfer_sizes = self._choose_transfer_sizes()
        self.augment = resolve_augment(args.augment, self.data.kind)
        self.transforms = describe_transforms(self.data.kind, self.augment, args.crop_pad, args.img_size)
        self.train_set = Transformed(self.data.train, args.img_size, self.augment, args.seed, args.crop_pad)
        self.sampler = EpochSampler(self.train_set, d.world, d.rank, args.seed)
        self.steps_per_epoch = self.sampler.num_samples // self.local_batch
        if self.steps_per_epoch == 0:
            raise TrainError(
                f"the training split has {len(self.train_set)} images, fewer than one batch of {args.batch_size}: "
                "lower --batch-size"
            )
        self.total_steps = args.epochs * self.steps_per_epoch
        warmup = round(args.warmup_epochs * self.steps_per_epoch)
        self.warmup_steps = max(1, min(warmup, self.total_steps - 1))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, self.warmup_steps, self.total_steps)
        )
        cuda = d.device.type == "cuda"
        self.workers = args.workers if args.workers is not None else (4 if cuda else 0)
        self.amp = cuda if args.amp is None else args.amp
        self.step, self.metrics, self.resumed_from = 0, [], None
        self.running: dict[str, float] = {}  # this epoch's sums so far: images, loss·n, correct
        self.snapshot_steps = set(snapshot_steps(self.total_steps))
        self.cold_gate_scale = float(positive(torch.tensor(COLD_GATE if self.config.cold_init else WARM_GATE)))
        if state is not None:
            self._restore(state)
        torch.manual_seed(args.seed + 1_000_003 * d.rank + self.step)  # dropout: different in every process
        if state is not None:
            _set_rng_state(state["rng"][d.rank])
        self.compiled: nn.Module = self.model
        if args.compile if args.compile is not None else cuda:
            self.compiled = torch.compile(self.model)
        self.net = self.compiled
        if d.world > 1:
            self.net = DistributedDataParallel(self.compiled, device_ids=[d.device.index] if cuda else None)
        self.loader = DataLoader(
            self.train_set,
            batch_size=self.local_batch,
            sampler=self.sampler,
            drop_last=True,
            num_workers=self.workers,
            pin_memory=cuda,
            generator=torch.Generator(),  # keeps the loader from drawing on the global RNG
        )
        self.val_loader = eval_loader(self.data.val, args.img_size, args.eval_batch_size, self.workers, d.rank, d.world)

    def _choose_transfer_sizes(self) -> list[tuple[int, int]]:
        """The sizes of the final transfer curve, checked now rather than after hours of training."""
        chosen = getattr(self.args, "transfer_sizes", "auto")
        if chosen == "none":
            return []
        if chosen == "auto":
            return transfer_sizes(tuple(self.args.img_size), self.args.patch_size)
        sizes = [tuple(s) for s in chosen]
        try:
            for s in sizes:
                self.model.grid_for(*s)
        except ValueError as e:
            raise TrainError(f"--transfer-sizes: {e}") from None
        return sizes

    # ---------------------------------------------------------------------------------------------- state

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        self.metrics = [r for r in state["metrics"] if r["step"] <= self.step]
        self.running = dict(state["running"])
        if "history" in state:  # runs started before histories resume without one
            self.history = History.from_state(state["history"])
            self.history.truncate(self.step)
        if len(state["rng"]) != self.d.world:
            raise TrainError(
                f"the run was saved by {len(state['rng'])} processes; "
                f"resume it with the same number (now {self.d.world})"
            )
        self.resumed_from = self.step

    def _gather_rng(self) -> list[dict[str, Any]]:
        mine = _rng_state()
        if self.d.world == 1:
            return [mine]
        every: list[Any] = [None] * self.d.world
        dist.all_gather_object(every, mine)
        return every

    def meta(self, accuracy: float | None, val_loss: float | None, finished: bool) -> dict[str, Any]:
        return {
            "class_names": self.data.class_names,
            "normalization": None,  # pixels in [0, 1], as the model was trained
            "command": self.command,
            "data": self.args.data,
            "img_size": list(self.args.img_size),
            "epochs": self.step / self.steps_per_epoch,
            "epochs_planned": self.args.epochs,
            "step": self.step,
            "accuracy": accuracy,
            "val_loss": val_loss,
            "finished": finished,
            "processes": self.d.world,
            "augment": list(self.augment),
            "crop_pad": self.args.crop_pad,
            "transforms": self.transforms,
            "train_args": _plain_args(self.args),
            "gate_scales": gate_summary(self.model),
            "software": {**software_versions(), "numpy": np.__version__, "platform": platform.platform()},
        }

    def save(self, finished: bool = False) -> None:
        """Checkpoint + training state, atomically (collective: every process calls it)."""
        rng = self._gather_rng()
        if self.d.main:
            with self._writing("the checkpoint"):
                last = self.metrics[-1] if self.metrics else {}
                evaluated = last.get("step") == self.step  # a mid-epoch save has no accuracy of its own weights
                acc, vloss = (last["val_acc"], last["val_loss"]) if evaluated else (None, None)
                save_checkpoint(
                    self.out / "last.safetensors", self.model, self.meta(acc, vloss, finished), history=self.history
                )
                state = {
                    "version": STATE_VERSION,
                    "args": _plain_args(self.args),
                    "command": self.command,
                    "step": self.step,
                    "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "rng": rng,
                    "metrics": self.metrics,
                    "running": self.running,
                    "history": self.history.to_state(),
                }
                atomic_write(self.out / "train_state.pt", lambda tmp: torch.save(state, tmp))
        _sync(self.d)

    @contextlib.contextmanager
    def _writing(self, what: str) -> Any:
        """Turn a failed write (disk full, folder gone or made read-only) into a clear stop: ``atomic_write`` has
        already removed its temporary file, so the last complete checkpoint is what remains."""
        try:
            yield
        except OSError as e:
            last = self.out / "last.safetensors"
            kept = f"the last complete checkpoint, {last}, is intact" if last.exists() else "no checkpoint was saved"
            raise TrainError(
                f"could not write {what} at step {self.step}: {e.strerror or e}; {kept}. "
                "Free some space (or fix the folder) and continue with --resume"
            ) from None

    # ---------------------------------------------------------------------------------------------- loop

    def log(self, text: str) -> None:
        if self.d.main:
            tqdm.write(text, file=sys.stderr)

    def _train_step(self, x: torch.Tensor, y: torch.Tensor, stop: _StopRequest) -> tuple[float, float, bool]:
        """One optimizer step; returns (summed loss, correct, stop requested), all reduced over processes."""
        x, y = to_float(x.to(self.d.device, non_blocking=True)), y.to(self.d.device, non_blocking=True)
        with autocast(self.d.device, self.amp):
            logits = self.net(x)
        loss = loss_fn(logits, y)
        stats = torch.stack(
            [
                loss.detach() * len(y),
                (logits.argmax(-1) == y).sum().float(),
                torch.tensor(float(stop.signal is not None), device=loss.device),
            ]
        ).double()
        if self.d.world > 1:
            dist.all_reduce(stats)
        loss_sum, correct, stopping = stats.tolist()
        if not math.isfinite(loss_sum):
            raise FloatingPointError(loss_sum)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.history.add_batch(loss_sum, correct, len(y) * self.d.world)
        if self.step in self.snapshot_steps:
            self._snapshot()
        return loss_sum, correct, stopping > 0

    def _snapshot(self) -> None:
        """Record the fields and gates now; warn once if every gate is still shut after a tenth of the run."""
        self.history.snapshot(self.model, self.step)
        if (
            self.step >= 0.1 * self.total_steps
            and "gates" not in self.history.warned
            and stalled_gates(self.history, self.cold_gate_scale)
        ):
            self.history.warned.append("gates")
            self.log(
                f"warning: after {self.step} steps (10% of the run) every steering gate is still within 2x its "
                f"starting scale {self.cold_gate_scale:.3g}: content cannot steer the fields yet. Give the gates a "
                "larger --gate-lr-mult (the bundled models use 10) or start them warm with --warm-gates."
            )

    def _check_chance(self, accuracy: float) -> None:
        """Warn once if validation accuracy is still at chance after a fifth of the run."""
        if (
            self.step >= 0.2 * self.total_steps
            and "chance" not in self.history.warned
            and at_chance(accuracy, self.data.num_classes)
        ):
            self.history.warned.append("chance")
            self.log(
                f"warning: validation accuracy {accuracy:.1%} is still at chance (1/{self.data.num_classes}) after "
                f"{self.step} steps (20% of the run). Try a higher --lr or a shorter --warmup-epochs; for SSOG "
                "also --field-lr-mult and --gate-lr-mult (the bundled models use 10); and check the labels."
            )

    def _stop(self, why: str) -> None:
        self.save()
        self.log(f"{why}: saved {self.out / 'last.safetensors'} at step {self.step}; continue with --resume")

    def fit(self) -> int:
        a, spe = self.args, self.steps_per_epoch
        self.log(
            f"{a.attn} ViT {self.config.dim}/{self.config.depth}/{self.config.num_heads}, {self.num_params:,} params, "
            f"{self.config.grid[0]}×{self.config.grid[1]} tokens; {a.data}: {len(self.train_set)} train / "
            f"{len(self.data.val)} val images, {self.data.num_classes} classes; {spe} steps/epoch × {a.epochs} epochs; "
            f"{self.d.world} process(es) on {self.d.device}, amp={self.amp}"
        )
        self.log(f"transforms: train {self.transforms['train']}; eval {self.transforms['eval']}")
        if self.resumed_from is not None:
            self.log(f"resuming at step {self.step} (epoch {self.step // spe + 1}, batch {self.step % spe})")
        with _StopRequest() as stop:
            if self.step == 0:
                self.history.snapshot(self.model, 0)
            while self.step < self.total_steps:
                if a.stop_after is not None and self.step >= a.stop_after:
                    self._stop(f"stopped after {self.step} steps (--stop-after)")
                    return 0
                code = self._run_epoch(stop)
                if code is not None:
                    return code
        self.finish()
        return 0

    def _run_epoch(self, stop: _StopRequest) -> int | None:
        """Train from the current step to the end of its epoch, then evaluate and save; an exit code if stopped."""
        a, spe = self.args, self.steps_per_epoch
        epoch, batch0 = divmod(self.step, spe)
        self.sampler.set_position(epoch, batch0 * self.local_batch)
        self.net.train()
        if not (batch0 and self.running):  # a resumed epoch keeps the sums of its first part
            self.running = {"seen": 0, "loss_sum": 0.0, "correct": 0.0}
        t0, c0, seen_now = time.perf_counter(), time.process_time(), 0
        bar = tqdm(
            total=spe,
            initial=batch0,
            desc=f"epoch {epoch + 1}/{a.epochs}",
            unit="step",
            disable=not (self.d.main and a.progress),
            dynamic_ncols=True,
            file=sys.stderr,
        )
        with bar:
            for x, y in self.loader:
                try:
                    batch_loss, batch_correct, stopping = self._train_step(x, y, stop)
                except FloatingPointError as e:
                    last = self.out / "last.safetensors"
                    kept = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint was saved yet"
                    raise DivergedError(
                        f"the loss became {e.args[0]} at step {self.step + 1} (epoch {epoch + 1}); stopped "
                        f"without saving this state; {kept}. Lower --lr or check the data."
                    ) from None
                r = self.running
                seen_now += len(y) * self.d.world
                r["seen"] += len(y) * self.d.world
                r["loss_sum"] += batch_loss
                r["correct"] += batch_correct
                bar.set_postfix(
                    loss=f"{r['loss_sum'] / r['seen']:.3f}",
                    img_s=f"{seen_now / (time.perf_counter() - t0):.0f}",
                    lr=f"{self.scheduler.get_last_lr()[0]:.2e}",
                    refresh=False,
                )
                bar.update()
                if stopping:
                    self._stop(f"interrupted ({signal.Signals(stop.signal).name if stop.signal else 'signal'})")
                    return 130
                mid_epoch = self.step % spe != 0
                if a.ckpt_every and self.step % a.ckpt_every == 0 and mid_epoch:
                    self.save()
                if a.stop_after is not None and self.step >= a.stop_after and mid_epoch:
                    self._stop(f"stopped after {self.step} steps (--stop-after)")
                    return 0
        self._end_epoch(epoch, t0, c0, seen_now)
        return None

    def _end_epoch(self, epoch: int, t0: float, c0: float, seen_now: int) -> None:
        """Evaluate, log and save; ``epoch_cpu_s`` (this process's CPU time) stays comparable on a shared machine."""
        train_time = time.perf_counter() - t0
        val = evaluate_loader(self.compiled, self.val_loader, self.d.device, self.amp)
        row = {
            "epoch": epoch + 1,
            "step": self.step,
            "lr": self.scheduler.get_last_lr()[0],
            "train_loss": self.running["loss_sum"] / max(self.running["seen"], 1),
            "train_acc": self.running["correct"] / max(self.running["seen"], 1),
            "val_loss": val["loss"],
            "val_acc": val["accuracy"],
            "epoch_time_s": round(time.perf_counter() - t0, 3),
            "epoch_cpu_s": round(time.process_time() - c0, 3),
            "img_per_s": round(seen_now / max(train_time, 1e-9), 1),
        }
        gates = gate_summary(self.model)
        if gates:
            row["gates"] = gates
        self.metrics.append(row)
        self.history.add_validation(self.step, val["accuracy"], val["loss"])
        self._check_chance(val["accuracy"])
        self.save()
        if self.d.main:
            with self._writing("metrics.jsonl / curves.png"):
                _atomic_json_lines(self.out / "metrics.jsonl", self.metrics)
                if self.args.plot:
                    plot_curves(self.metrics, self.out / "curves.png", f"{self.args.attn} on {self.args.data}")
        gate_text = "".join(f" s({k})={np.mean(v):.3g}" for k, v in gates.items())
        self.log(
            f"epoch {epoch + 1}: train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f} | val loss "
            f"{row['val_loss']:.4f} acc {row['val_acc']:.4f} | {row['img_per_s']:.0f} img/s{gate_text}"
        )

    def finish(self) -> None:
        """Final checkpoints, then the transfer curve added to them (a failure there leaves them complete)."""
        if self.d.main:
            last = self.metrics[-1] if self.metrics else {}
            meta = self.meta(last.get("val_acc"), last.get("val_loss"), finished=True)
            with self._writing("the final checkpoints"):
                save_checkpoint(self.out / "last.safetensors", self.model, meta, history=self.history)
                dtype = SAVE_DTYPES[self.args.save_dtype]
                save_checkpoint(self.out / "model.safetensors", self.model, meta, dtype=dtype, history=self.history)
            self.log(
                f"done: val accuracy {last.get('val_acc', float('nan')):.4f}; wrote {self.out / 'model.safetensors'}"
            )
        _sync(self.d)
        if not self.transfer_sizes:
            return
        rows = evaluate_model_sizes(
            self.model,
            self.args.data,
            self.transfer_sizes,
            self.data.class_names,
            self.args.eval_batch_size,
            self.d.device,
            self.workers,
            self.amp,
            TRANSFER_IMAGES,
            self.d.rank,
            self.d.world,
        )
        if self.d.main:
            curve = transfer_curve(rows)
            with self._writing("the resolution-transfer curve"):
                for name in ("last.safetensors", "model.safetensors"):
                    update_metadata(self.out / name, {TRANSFER_KEY: json.dumps(curve)})
                atomic_write(
                    self.out / "model.transfer.json", lambda tmp: Path(tmp).write_text(json.dumps(curve, indent=1))
                )
            self.log(
                f"zero-shot resolution transfer (≤{TRANSFER_IMAGES} val images per size):\n{format_transfer(rows)}"
            )
        _sync(self.d)


def run(argv: list[str]) -> int:
    args, explicit = parse_args(argv)
    d = init_distributed(args.device)
    try:
        if args.out is None:
            args.out = f"runs/{args.attn}-{parse_data_spec(args.data)[0]}"
        out = Path(args.out)
        check_writable(out)
        command = "python -m ssog_core.train " + shlex.join(argv)
        state = None
        if args.resume:
            state = load_train_state(out / "train_state.pt")
            args = _resume_args(args, explicit, state["args"])
            command = state["command"]
        elif (out / "train_state.pt").exists() or (out / "last.safetensors").exists():
            raise TrainError(
                f"{out} already holds a training run: pass --resume to continue it, or choose another --out"
            )
        if d.main and (stale := remove_unfinished(out)):
            print(f"removed {len(stale)} unfinished temporary file(s) of an interrupted save in {out}", file=sys.stderr)
        trainer = Trainer(args, d, command, state)
        return trainer.fit()
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


if __name__ == "__main__":
    sys.exit(main())
