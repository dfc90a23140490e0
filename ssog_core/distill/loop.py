"""The distillation run: the student learns to match the teacher's logits on unlabelled pictures (docs/DESIGN.md
§2.5), with the training run's guarantees (:mod:`ssog_core.train.trainer`): a progress bar, TensorBoard events, the
first SIGINT / SIGTERM saving and stopping after the current step, checkpoints and the resume state written
atomically (the student first, then its state), and ``--resume`` continuing bit for bit.

The loss is ``T²·KL(p_teacher^T ‖ p_student^T)`` at temperature ``T``, plus, with ``rows_weight`` > 0, that weight
times the mean over layers, heads, patch queries and pictures of ``KL(teacher row ‖ student row)`` over patch keys
(rows renormalised). Each step takes ``batch_size`` pictures drawn without replacement by a generator seeded with
the seed and the step, so a resumed run draws what the uninterrupted one would. The student runs in eval mode (no
dropout: the teacher's outputs are the target, not the labels'); the learning rate warms up linearly over the first
:data:`WARMUP_FRACTION` of the steps, then follows a cosine to 0 (:func:`~ssog_core.train.optim.lr_factor`).
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from ssog_core.analysis.head_as_field import AtomFit, patch_attention, pattern_points
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import save_checkpoint
from ssog_core.checkpoint.history import History
from ssog_core.distill.report import compare, kl_per_image
from ssog_core.distill.student import DistillError, steering_parameters
from ssog_core.interventions.validation import EvalSet
from ssog_core.nn.hook_points import reading
from ssog_core.nn.vit import ViT
from ssog_core.train.optim import lr_factor
from ssog_core.train.tensorboard import TensorBoardLog
from ssog_core.train.trainer import StopRequest

STATE_VERSION = 1
TRAIN_CHOICES = ("steering", "fields", "all")
WARMUP_FRACTION = 0.05
SNAPSHOTS = 20  # history snapshots (fields, gates, loss) over a run


@dataclass(frozen=True)
class Recipe:
    """What a distillation does; a resumed run keeps it (the CLI's flags of the same names)."""

    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    gate_lr_mult: float = 100.0  # a cold gate has no gradient until its probes move; then it opens in tens of steps
    weight_decay: float = 0.0
    temperature: float = 1.0
    rows_weight: float = 1.0  # without the row term the KL can fall while the steered rows move away from the teacher's
    train: str = "steering"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        for name in ("steps", "batch_size"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                problems.append(f"--{name.replace('_', '-')} must be a whole number of at least 1")
        for name in ("lr", "gate_lr_mult", "temperature"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(f"--{name.replace('_', '-')} must be a positive number")
        for name in ("weight_decay", "rows_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                problems.append(f"--{name.replace('_', '-')} must be a number of at least 0")
        if self.train not in TRAIN_CHOICES:
            problems.append(f"--train takes {', '.join(TRAIN_CHOICES)}, not {self.train!r}")
        if problems:
            raise DistillError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def state_path(out: Path) -> Path:
    """The resume state beside the student ``out``."""
    return out.with_name(out.name.removesuffix(".safetensors") + ".state.pt")


def load_state(out: Path) -> dict[str, Any]:
    """The resume state of the student ``out``, read without unpickling anything but tensors and plain containers."""
    path = state_path(out)
    if not path.is_file():
        raise DistillError(
            f"nothing to resume: {path} does not exist (the run never saved, or was started with another --out); "
            "start it without --resume"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises many types for a bad file; all mean "unusable")
        raise DistillError(f"{path} is not a readable distillation state (truncated or corrupt?): {e}") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise DistillError(f"{path} is not a distillation state of this version of SSOG Lab")
    return state


def rows_loss(teacher_patterns: dict[int, Tensor], student_patterns: dict[int, Tensor], grid: tuple[int, int],
              prefix: int) -> Tensor:  # fmt: skip
    """Mean over layers, heads, patch queries and pictures of ``KL(teacher row ‖ student row)`` over patch keys."""
    total = []
    for layer, s in student_patterns.items():
        t = patch_attention(teacher_patterns[layer], grid, prefix)[0]
        rows = s[:, :, prefix:, prefix:]
        rows = rows / rows.sum(-1, keepdim=True).clamp_min(1e-30)
        total.append((t * (t.clamp_min(1e-30).log() - rows.double().clamp_min(1e-30).log())).sum(-1).mean())
    return torch.stack(total).mean().float()


class Distiller:
    """One distillation run (module doc): ``setup`` is what the student's metadata and the report record (teacher,
    pictures, recipe); ``state`` a resume state (:func:`load_state`) or ``None`` for a fresh run."""

    def __init__(
        self,
        teacher: ViT,
        student: ViT,
        fits: list[AtomFit],
        pictures: EvalSet,
        held_out: EvalSet,
        recipe: Recipe,
        out: Path,
        setup: dict[str, Any],
        state: dict[str, Any] | None = None,
        tensorboard: str | None = None,
        progress: bool = True,
        ckpt_every: int = 50,
    ):
        if len(pictures) < 1 or len(held_out) < 1:
            raise DistillError("distillation needs at least one picture to train on and one held out")
        self.teacher, self.student, self.fits = teacher.eval(), student.eval(), fits
        self.pictures, self.held_out, self.recipe, self.out = pictures, held_out, recipe, Path(out)
        self.setup, self.progress, self.ckpt_every = setup, progress, ckpt_every
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        chosen = steering_parameters(student, recipe.train)
        names = {n for n, _ in chosen}
        for name, p in student.named_parameters():
            p.requires_grad_(name in names)
        gates = [p for n, p in chosen if n.endswith("_scale")]
        rest = [p for n, p in chosen if not n.endswith("_scale")]
        groups = [{"params": rest, "lr": recipe.lr, "base": recipe.lr}]
        if gates:
            groups.append(
                {"params": gates, "lr": recipe.lr * recipe.gate_lr_mult, "base": recipe.lr * recipe.gate_lr_mult}
            )
        self.optimizer = torch.optim.AdamW(groups, lr=recipe.lr, weight_decay=recipe.weight_decay)
        self.warmup = max(1, round(WARMUP_FRACTION * recipe.steps))
        self.step, self.history, self.step0 = 0, History(), None
        self.snapshot_steps = {round(i * recipe.steps / SNAPSHOTS) for i in range(SNAPSHOTS + 1)}
        if state is not None:
            self.student.load_state_dict(state["student"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.step, self.step0 = int(state["step"]), state["step0"]
            self.history = History.from_state(state["history"])
            self.history.truncate(self.step)
        self.tensorboard = TensorBoardLog(tensorboard) if tensorboard else None
        self.grid = student.grid_for(*pictures.images.shape[1:3])

    def meta(self, finished: bool) -> dict[str, Any]:
        """The student's metadata: an ordinary lab checkpoint's, with ``distill`` (the setup, the step, step 0's
        held-out comparison)."""
        teacher_meta = self.setup["teacher_meta"]
        return {
            "class_names": teacher_meta.get("class_names"),
            "normalization": teacher_meta.get("normalization"),
            "data": teacher_meta.get("data"),
            "img_size": list(self.student.config.img_size),
            "command": self.setup["command"],
            "step": self.step,
            "finished": finished,
            "distill": {k: v for k, v in {**self.setup, "step0": self.step0}.items() if k != "teacher_meta"},
        }

    def save(self, finished: bool = False) -> None:
        """The student, then the resume state, each written atomically."""
        save_checkpoint(self.out, self.student, self.meta(finished), history=self.history)
        state = {
            "version": STATE_VERSION,
            "recipe": self.recipe.to_dict(),
            "setup": {k: v for k, v in self.setup.items() if k != "teacher_meta"},
            "step": self.step,
            "step0": self.step0,
            "student": {k: v.detach().cpu() for k, v in self.student.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "history": self.history.to_state(),
            "fits": [{"mu": f.mu, "sigma": f.sigma, "lam": f.lam, "loss": f.loss} for f in self.fits],
        }
        atomic_write(state_path(self.out), lambda tmp: torch.save(state, tmp))

    def batch(self, step: int) -> Tensor:
        """The pictures of optimizer step ``step`` (module doc)."""
        n, b = len(self.pictures), min(self.recipe.batch_size, len(self.pictures))
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.recipe.seed * 1_000_003 + step))[:b]
        p = next(self.student.parameters())
        chosen = dataclasses.replace(self.pictures, images=self.pictures.images[order], labels=None)
        return chosen.batch(0, b, p.device, p.dtype)

    def train_step(self) -> tuple[float, float]:
        """One optimizer step; the loss and the batch's agreement."""
        r = self.recipe
        x = self.batch(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = group["base"] * lr_factor(self.step, self.warmup, r.steps)
        rows = r.rows_weight > 0
        t_points = dict(enumerate(pattern_points(self.teacher))) if rows else {}
        s_points = dict(enumerate(pattern_points(self.student))) if rows else {}
        with torch.no_grad(), reading(t_points, replace=True) as taught:
            t_logits = self.teacher(x)
        with reading(s_points, replace=True) as learnt:
            s_logits = self.student(x)
        loss = r.temperature**2 * kl_per_image(t_logits, s_logits, r.temperature).mean()
        if rows:
            loss = loss + r.rows_weight * rows_loss(taught, learnt, self.grid, self.student.num_prefix_tokens)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise DistillError(
                f"the loss became {value} at step {self.step + 1}; stopped without saving this state (the last "
                f"saved student is {self.out}). Lower --lr or --gate-lr-mult."
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.step += 1
        agreement = float((t_logits.argmax(-1) == s_logits.argmax(-1)).float().mean())
        self.history.add_batch(value * len(x), agreement * len(x), len(x))
        return value, agreement

    def _snapshot(self) -> None:
        self.history.snapshot(self.student, self.step)
        if self.tensorboard is not None:
            self.tensorboard.snapshot(self.history)

    def run(self, stop_after: int | None = None, on_step: Callable[[int, float, float], None] | None = None) -> int:
        """Train to the recipe's last step (or ``stop_after`` steps), saving every ``ckpt_every`` steps and at the
        end; 0 when done or stopped as asked, 130 when a signal stopped it. ``on_step(step, loss, agreement)`` is
        called after every step (a heavy job's progress; it may raise to end the run there)."""
        r = self.recipe
        try:
            if self.step0 is None:  # a fresh run: step 0's comparison, and a student to resume from at once
                self.step0 = compare(self.teacher, self.student, self.held_out)
                self._snapshot()
                self.save()
            bar = tqdm(total=r.steps, initial=self.step, desc="distill", unit="step", disable=not self.progress,
                       dynamic_ncols=True, file=sys.stderr)  # fmt: skip
            with StopRequest() as stop, bar:
                while self.step < r.steps:
                    if stop_after is not None and self.step >= stop_after:
                        self.save()
                        return 0
                    loss, agreement = self.train_step()
                    if on_step is not None:
                        on_step(self.step, loss, agreement)
                    bar.set_postfix(loss=f"{loss:.4f}", agree=f"{agreement:.2f}", refresh=False)
                    bar.update()
                    if self.step in self.snapshot_steps:
                        self._snapshot()
                    if stop.signal is not None:
                        self.save()
                        tqdm.write(
                            f"interrupted ({signal.Signals(stop.signal).name}): saved {self.out} at step "
                            f"{self.step}; continue with --resume",
                            file=sys.stderr,
                        )
                        return 130
                    if self.ckpt_every and self.step % self.ckpt_every == 0 and self.step < r.steps:
                        self.save()
            self._snapshot()
            self.save(finished=True)
            return 0
        finally:
            if self.tensorboard is not None:
                self.tensorboard.close()
