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

import contextlib
import dataclasses
import math
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from tqdm import tqdm

from ssog_core.analysis.head_as_field import AtomFit, pattern_points
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import save_checkpoint
from ssog_core.checkpoint.history import History
from ssog_core.distill.report import compare, kl_per_image
from ssog_core.distill.student import DistillError, steering_parameters
from ssog_core.field import EPS, Field, axis_kernels, softplus_inverse
from ssog_core.interventions.validation import EvalSet
from ssog_core.nn.hook_points import hooked
from ssog_core.nn.vit import ViT
from ssog_core.train.optim import lr_factor
from ssog_core.train.tensorboard import TensorBoardLog
from ssog_core.train.trainer import StopRequest

STATE_VERSION = 2  # 2: the recipe holds max_gate
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
    # Each gate scale s is kept at most this after every step, so content moves an atom at most max_gate·M cells: at
    # 100× the rate, unbounded gates grew to s ≈ 60 and moved a digits student's layer-0 atoms 230–290 cells off its
    # 8×8 grid (deleting them, not steering them). 1 is the most the lab's trained models reached within 50%.
    max_gate: float = 1.0
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
        for name in ("lr", "gate_lr_mult", "temperature", "max_gate"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(f"--{name.replace('_', '-')} must be a positive number")
        for name in ("weight_decay", "rows_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                problems.append(f"--{name.replace('_', '-')} must be a number of at least 0")
        if not self.max_gate > EPS:
            problems.append(f"--max-gate must be above {EPS}")
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


ROW_FLOOR = 1e-30  # a student row value below it counts as it (log finite, no gradient): float32 underflows there


def teacher_rows(pattern: Tensor, grid: tuple[int, int], prefix: int) -> tuple[Tensor, Tensor]:
    """What the row term needs of one teacher layer's ``(B, H, P + N, P + N)`` pattern, in its dtype: the patch rows
    renormalised over patch keys (as :func:`~ssog_core.analysis.head_as_field.patch_attention` makes them), laid
    out as :class:`RowCross` takes them, ``(B·Gh·H·Gw, Gw, Gh)`` with ``[(b, i, h, k), w, j] = t[b, h, (i, w),
    (j, k)]``, and their ``Σ t·log t`` (accumulated in float64)."""
    b, h = pattern.shape[:2]
    gh, gw = grid
    rows = pattern[:, :, prefix:, prefix:]
    t = rows / rows.sum(-1, keepdim=True).clamp_min(1e-30)
    t_log_t = (t * t.clamp_min(1e-30).log()).sum(dtype=torch.float64)
    return t.view(b, h, gh, gw, gh, gw).permute(0, 2, 1, 5, 3, 4).reshape(-1, gw, gh), t_log_t


class RowCross(torch.autograd.Function):
    """``Σ t·log s`` (float64) with ``s = ax @ ay`` a batch of student rows: ``ax`` ``(M, Gw, R)``, ``ay``
    ``(M, R, Gh)``, ``t`` ``(M, Gw, Gh)`` the teacher's (:func:`teacher_rows`), ``s`` clamped at :data:`ROW_FLOOR`.
    The rows are formed again in the backward pass instead of kept (they are the size of the attention, for every
    layer until the backward), and the backward is one division and two products: autograd's chain of the clamp,
    log, product and sum keeps four such tables per layer and passes over them as many times."""

    @staticmethod
    def forward(ctx, ax: Tensor, ay: Tensor, t: Tensor) -> Tensor:
        ctx.save_for_backward(ax, ay, t)
        return (t * torch.bmm(ax, ay).clamp_min(ROW_FLOOR).log()).sum(dtype=torch.float64)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        ax, ay, t = ctx.saved_tensors
        s = torch.bmm(ax, ay)
        below = s < ROW_FLOOR
        g = torch.div(t, s, out=s).masked_fill_(below, 0.0)  # in place: the backward's one table of that size
        grad = grad.to(t.dtype)
        return torch.bmm(g, ay.transpose(1, 2)).mul_(grad), torch.bmm(ax.transpose(1, 2), g).mul_(grad), None


def row_kernels(field: Field, grid: tuple[int, int], mode: str, batch: int) -> tuple[Tensor, Tensor]:
    """The factors of a field's rows as :class:`RowCross` takes them: ``s[(i, w), (j, k)] = Σ_r λ_r(i, w)·
    ax_r(i, w)[k]·ay_r(i, k)[j]``, the weights :func:`~ssog_core.field.apply_field` applies (its row kernel for key
    column ``k`` is token ``(i, k)``'s), as ``(B·Gh·H·Gw, Gw, R)`` ``[(b, i, h, k), w, r]`` and
    ``(B·Gh·H·Gw, R, Gh)`` ``[(b, i, h, k), r, j]``: no identity basis of values (14× fewer products at 14×14)."""
    gh, gw = grid
    k = axis_kernels(field, grid, mode)
    h, r = k.ay.shape[-3:-1]
    ay = k.ay.expand(batch, gh, gw, h, r, gh).permute(0, 1, 3, 2, 4, 5).reshape(-1, r, gh)
    ax = (k.ax * k.lam[..., None]).expand(batch, gh, gw, h, r, gw).permute(0, 1, 3, 5, 2, 4).reshape(-1, gw, r)
    return ax, ay


@contextlib.contextmanager
def attention_inputs(student: ViT) -> Iterator[dict[int, Tensor]]:
    """Each layer's attention input (``blocks.{l}.attn.hook_in``) in this block's forward calls, by layer, read by
    plain forward hooks on the points: a function installed in the call's context would take every SSOG layer off
    its fused path (:func:`~ssog_core.nn.hook_points.is_plain`), hooks on ``hook_in`` do not."""
    seen: dict[int, Tensor] = {}

    def keep(layer: int) -> Callable[[nn.Module, Any, Tensor], None]:
        def fn(module: nn.Module, args: Any, out: Tensor) -> None:
            seen[layer] = out

        return fn

    handles = [b.attn.hook_in.register_forward_hook(keep(layer)) for layer, b in enumerate(student.blocks)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def rows_loss(student: ViT, inputs: dict[int, Tensor], targets: dict[int, tuple[Tensor, Tensor]],
              grid: tuple[int, int]) -> Tensor:  # fmt: skip
    """Mean over layers, heads, patch queries and pictures of ``KL(teacher row ‖ student row)`` over patch keys.

    A student patch query's row over patch keys, renormalised, is its steered field's row (the prefix masses
    cancel): each layer's are made by :class:`RowCross` from the field of its recorded input ``inputs[layer]``
    (:func:`attention_inputs`) and never kept. ``targets`` are :func:`teacher_rows`."""
    total = []
    for layer, block in enumerate(student.blocks):
        t, t_log_t = targets[layer]
        attn = block.attn
        batch = inputs[layer].shape[0]
        cross = RowCross.apply(*row_kernels(attn.field_of(inputs[layer], grid), grid, attn.mode, batch), t)
        total.append((t_log_t - cross) / (t.numel() / (grid[0] * grid[1])))  # per row
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
        self.gates = gates = [p for n, p in chosen if n.endswith("_scale")]
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
        targets: dict[int, tuple[Tensor, Tensor]] = {}
        prefix = self.student.num_prefix_tokens

        def keep(layer: int) -> Callable[[Tensor], Tensor]:  # each layer's pattern reduced as its block runs
            def fn(pattern: Tensor) -> Tensor:
                targets[layer] = teacher_rows(pattern, self.grid, prefix)
                return pattern

            return fn

        taught = {id(p): keep(layer) for layer, p in enumerate(pattern_points(self.teacher))} if rows else {}
        with torch.no_grad(), hooked(taught, replace=True):
            t_logits = self.teacher(x)
        with hooked({}, replace=True), attention_inputs(self.student) if rows else contextlib.nullcontext({}) as seen:
            s_logits = self.student(x)
        loss = r.temperature**2 * kl_per_image(t_logits, s_logits, r.temperature).mean()
        if rows:
            loss = loss + r.rows_weight * rows_loss(self.student, seen, targets, self.grid)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise DistillError(
                f"the loss became {value} at step {self.step + 1}; stopped without saving this state (the last "
                f"saved student is {self.out}). Lower --lr or --gate-lr-mult."
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._bound_gates()
        self.step += 1
        agreement = float((t_logits.argmax(-1) == s_logits.argmax(-1)).float().mean())
        self.history.add_batch(value * len(x), agreement * len(x), len(x))
        return value, agreement

    @torch.no_grad()
    def _bound_gates(self) -> None:
        """Every trained gate scale back to at most :attr:`Recipe.max_gate` (its raw parameter clamped)."""
        ceiling = float(softplus_inverse(torch.tensor(self.recipe.max_gate - EPS, dtype=torch.float64)))
        for p in self.gates:
            p.clamp_(max=ceiling)

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
