"""The training loop of one run: data, model, optimiser and schedule, checkpoints, metrics and history, from a
:class:`~ssog_core.train.config.TrainConfig` (the command line is :mod:`ssog_core.cli.train`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import sys
import time
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
    unwrap,
    update_metadata,
)
from ssog_core.checkpoint.history import History, at_chance, snapshot_steps, stalled_gates
from ssog_core.data.sources import (
    DataSource,
    EpochSampler,
    Transformed,
    describe_transforms,
    open_data,
    resolve_augment,
    to_float,
)
from ssog_core.nn.attention import gate_start
from ssog_core.nn.config import ViTConfig
from ssog_core.nn.vit import ViT, resize_pos_embed
from ssog_core.train.accuracy import (
    autocast,
    eval_loader,
    evaluate_loader,
    evaluate_model_sizes,
    format_transfer,
    transfer_curve,
    transfer_sizes,
)
from ssog_core.train.config import DEFAULT_PATCH, SAVE_DTYPES, TRANSFER_IMAGES, DivergedError, TrainConfig, TrainError
from ssog_core.train.distributed import Dist, sync
from ssog_core.train.optim import lr_factor, make_optimizer
from ssog_core.train.output import check_space, plot_curves, write_json_lines
from ssog_core.train.state import STATE_VERSION, rng_state, set_rng_state
from ssog_core.train.tensorboard import TensorBoardLog


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


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to save and stop after the current step."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
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


def model_config(cfg: TrainConfig, data: DataSource) -> ViTConfig:
    """The model ``cfg`` describes for ``data`` (its number of classes); ``img_size`` and ``patch_size`` resolved."""
    try:
        return ViTConfig(
            num_classes=data.num_classes,
            img_size=cfg.img_size,
            patch_size=cfg.patch_size,
            dim=cfg.dim,
            depth=cfg.depth,
            num_heads=cfg.heads,
            mlp_ratio=cfg.mlp_ratio,
            dropout=cfg.dropout,
            attn=cfg.attn,
            num_atoms=cfg.atoms,
            field=cfg.field,
            steer=cfg.steer,
            max_offset=cfg.max_offset,
            sigma_floor=cfg.sigma_floor,
            cold_init=not cfg.warm_gates,
            num_registers=cfg.registers,
            qk_norm=cfg.qk_norm,
            susie=cfg.susie,
            susie_dim=cfg.susie_dim,
        )
    except ValueError as e:
        raise TrainError(str(e)) from None


class Trainer:
    """One training run: data, model, optimizer, schedule, checkpoints, metrics."""

    def _init_from(self, path: str) -> None:
        """Start from a checkpoint's weights (a second stage with a fresh schedule); the architectures must match,
        the image size may differ (progressive resizing: the position embedding is resized to this run's grid as
        resolution transfer resizes it; nothing else depends on the grid)."""
        try:
            config, state, _, history = read_checkpoint_with_history(path)
        except CheckpointError as e:
            raise TrainError(f"--init-from: {e}") from None
        theirs, mine = config.to_dict(), self.config.to_dict()
        diff = sorted(k for k in theirs.keys() | mine.keys() if theirs.get(k) != mine.get(k))
        if set(diff) - {"img_size"}:
            raise TrainError(f"--init-from {path}: its model differs from this run's in {', '.join(diff)}")
        state = {k: v.float() for k, v in state.items()}
        state["pos_embed"] = resize_pos_embed(state["pos_embed"], config.grid, self.config.grid)
        self.model.load_state_dict(state)
        if history is not None:  # this stage's snapshots continue the earlier stage's
            history.new_stage()
            self.history = history

    def __init__(self, config: TrainConfig, d: Dist, command: str, state: dict[str, Any] | None):
        """``config``: the run's settings (``img_size`` / ``patch_size`` left ``None`` take the data's defaults:
        ``self.cfg`` holds them resolved; ``self.config`` is the model's); ``command``: the line that started the
        run (stored in the checkpoints); ``state``: a resume state (:func:`~ssog_core.train.state.load_train_state`)."""
        self.d, self.command = d, command
        self.out = Path(config.out)
        self.data = open_data(config.data, config.img_size)
        cfg = self.cfg = dataclasses.replace(
            config,
            img_size=config.img_size or self.data.native_size or (224, 224),
            patch_size=config.patch_size or DEFAULT_PATCH[self.data.kind],
        )
        self.config = model_config(cfg, self.data)
        if cfg.batch_size % d.world:
            raise TrainError(f"--batch-size {cfg.batch_size} must be divisible by the {d.world} processes")
        self.local_batch = cfg.batch_size // d.world
        torch.manual_seed(cfg.seed)  # the same initial weights in every process
        self.model = ViT(self.config).to(d.device)
        self.history = History()
        if cfg.init_from and state is None:
            self._init_from(cfg.init_from)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        if d.is_primary:  # last.safetensors (4 B/param) + train_state.pt (16 B/param), each with a temporary copy
            check_space(self.out, need_bytes=2 * 20 * self.num_params + 16 * 1024**2)
        sync(d)
        self.optimizer = make_optimizer(self.model, cfg)
        self.transfer_sizes = self._choose_transfer_sizes()
        self.augment = resolve_augment(cfg.augment, self.data.kind)
        self.transforms = describe_transforms(self.data.kind, self.augment, cfg.crop_pad, cfg.img_size)
        self.train_set = Transformed(self.data.train, cfg.img_size, self.augment, cfg.seed, cfg.crop_pad)
        self.sampler = EpochSampler(self.train_set, d.world, d.rank, cfg.seed)
        self.steps_per_epoch = self.sampler.num_samples // self.local_batch
        if self.steps_per_epoch == 0:
            raise TrainError(
                f"the training split has {len(self.train_set)} images, fewer than one batch of {cfg.batch_size}: "
                "lower --batch-size"
            )
        self.total_steps = cfg.epochs * self.steps_per_epoch
        warmup = round(cfg.warmup_epochs * self.steps_per_epoch)
        self.warmup_steps = max(1, min(warmup, self.total_steps - 1))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, self.warmup_steps, self.total_steps)
        )
        cuda = d.device.type == "cuda"
        self.workers = cfg.workers if cfg.workers is not None else (4 if cuda else 0)
        self.amp = cuda if cfg.amp is None else cfg.amp
        self.step, self.metrics, self.resumed_from = 0, [], None
        self.running: dict[str, float] = {}  # this epoch's sums so far: images, loss·n, correct
        self.snapshot_steps = set(snapshot_steps(self.total_steps))
        self.cold_gate_scale = gate_start(self.config.cold_init)
        if state is not None:
            self._restore(state)
        torch.manual_seed(cfg.seed + 1_000_003 * d.rank + self.step)  # dropout: different in every process
        if state is not None:
            set_rng_state(state["rng"][d.rank])
        self.compiled: nn.Module = self.model
        if cfg.compile:  # opt-in: docs/KERNELS.md §7 says why it is not the default on CUDA
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
        self.val_loader = eval_loader(self.data.val, cfg.img_size, cfg.eval_batch_size, self.workers, d.rank, d.world)
        self.tensorboard = TensorBoardLog(cfg.tensorboard) if cfg.tensorboard and d.is_primary else None

    def _choose_transfer_sizes(self) -> list[tuple[int, int]]:
        """The sizes of the final transfer curve, checked now rather than after hours of training."""
        chosen = self.cfg.transfer_sizes
        if chosen == "none":
            return []
        if chosen == "auto":
            return transfer_sizes(tuple(self.cfg.img_size), self.cfg.patch_size)
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
        mine = rng_state()
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
            "data": self.cfg.data,
            "img_size": list(self.cfg.img_size),
            "epochs": self.step / self.steps_per_epoch,
            "epochs_planned": self.cfg.epochs,
            "step": self.step,
            "accuracy": accuracy,
            "val_loss": val_loss,
            "finished": finished,
            "processes": self.d.world,
            "augment": list(self.augment),
            "crop_pad": self.cfg.crop_pad,
            "transforms": self.transforms,
            "train_args": self.cfg.to_dict(),
            "gate_scales": gate_summary(self.model),
        }

    def save(self, finished: bool = False) -> None:
        """Checkpoint + training state, atomically (collective: every process calls it)."""
        rng = self._gather_rng()
        if self.d.is_primary:
            with self._writing("the checkpoint"):
                last = self.metrics[-1] if self.metrics else {}
                evaluated = last.get("step") == self.step  # a mid-epoch save has no accuracy of its own weights
                acc, vloss = (last["val_acc"], last["val_loss"]) if evaluated else (None, None)
                save_checkpoint(
                    self.out / "last.safetensors", self.model, self.meta(acc, vloss, finished), history=self.history
                )
                state = {
                    "version": STATE_VERSION,
                    "args": self.cfg.to_dict(),
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
        sync(self.d)

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
        if self.d.is_primary:
            tqdm.write(text, file=sys.stderr)

    def _train_step(self, x: torch.Tensor, y: torch.Tensor, stop: StopRequest) -> tuple[float, float, bool]:
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
        if self.tensorboard is not None:
            self.tensorboard.snapshot(self.history)
        if (
            self.step >= 0.1 * self.total_steps
            and "gates" not in self.history.warned
            and stalled_gates(self.history, self.cold_gate_scale)
        ):
            self.history.warned.append("gates")
            self.log(
                f"warning: after {self.step} steps (10% of the run) every steering gate is still within 2x its "
                f"starting scale {self.cold_gate_scale:.3g}: content cannot steer the fields yet. Give the gates a "
                "larger --gate-lr-mult or start them warm with --warm-gates."
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
                f"{self.step} steps (20% of the run). Try another --lr or a shorter --warmup-epochs: for SSOG a "
                "lower peak --lr can end the plateau sooner (checkpoints/MODEL_CARD.md), as can --field-lr-mult "
                "and --gate-lr-mult; and check the labels."
            )

    def _stop(self, why: str) -> None:
        self.save()
        self.log(f"{why}: saved {self.out / 'last.safetensors'} at step {self.step}; continue with --resume")

    def fit(self) -> int:
        a, spe = self.cfg, self.steps_per_epoch
        self.log(
            f"{a.attn} ViT {self.config.dim}/{self.config.depth}/{self.config.num_heads}, {self.num_params:,} params, "
            f"{self.config.grid[0]}×{self.config.grid[1]} tokens; {a.data}: {len(self.train_set)} train / "
            f"{len(self.data.val)} val images, {self.data.num_classes} classes; {spe} steps/epoch × {a.epochs} epochs; "
            f"{self.d.world} process(es) on {self.d.device}, amp={self.amp}"
        )
        self.log(f"transforms: train {self.transforms['train']}; eval {self.transforms['eval']}")
        if self.resumed_from is not None:
            self.log(f"resuming at step {self.step} (epoch {self.step // spe + 1}, batch {self.step % spe})")
        try:
            with StopRequest() as stop:
                if self.step == 0:
                    self._snapshot()
                while self.step < self.total_steps:
                    if a.stop_after is not None and self.step >= a.stop_after:
                        self._stop(f"stopped after {self.step} steps (--stop-after)")
                        return 0
                    code = self._run_epoch(stop)
                    if code is not None:
                        return code
            self.finish()
            return 0
        finally:  # every way out of the run (done, stopped, NaN, an error) closes the event file
            if self.tensorboard is not None:
                self.tensorboard.close()

    def _run_epoch(self, stop: StopRequest) -> int | None:
        """Train from the current step to the end of its epoch, then evaluate and save; an exit code if stopped."""
        a, spe = self.cfg, self.steps_per_epoch
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
            disable=not (self.d.is_primary and a.progress),
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
        if self.tensorboard is not None:
            self.tensorboard.validation(self.history, self.model, self.config.grid)
        self._check_chance(val["accuracy"])
        self.save()
        if self.d.is_primary:
            with self._writing("metrics.jsonl / curves.png"):
                write_json_lines(self.out / "metrics.jsonl", self.metrics)
                if self.cfg.plot:
                    plot_curves(self.metrics, self.out / "curves.png", f"{self.cfg.attn} on {self.cfg.data}")
        gate_text = "".join(f" s({k})={np.mean(v):.3g}" for k, v in gates.items())
        self.log(
            f"epoch {epoch + 1}: train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f} | val loss "
            f"{row['val_loss']:.4f} acc {row['val_acc']:.4f} | {row['img_per_s']:.0f} img/s{gate_text}"
        )

    def finish(self) -> None:
        """Final checkpoints, then the transfer curve added to them (a failure there leaves them complete)."""
        if self.d.is_primary:
            last = self.metrics[-1] if self.metrics else {}
            meta = self.meta(last.get("val_acc"), last.get("val_loss"), finished=True)
            with self._writing("the final checkpoints"):
                save_checkpoint(self.out / "last.safetensors", self.model, meta, history=self.history)
                dtype = SAVE_DTYPES[self.cfg.save_dtype]
                save_checkpoint(self.out / "model.safetensors", self.model, meta, dtype=dtype, history=self.history)
            self.log(
                f"done: val accuracy {last.get('val_acc', float('nan')):.4f}; wrote {self.out / 'model.safetensors'}"
            )
        sync(self.d)
        if not self.transfer_sizes:
            return
        rows = evaluate_model_sizes(
            self.model,
            self.cfg.data,
            self.transfer_sizes,
            self.data.class_names,
            self.cfg.eval_batch_size,
            self.d.device,
            self.workers,
            self.amp,
            TRANSFER_IMAGES,
            self.d.rank,
            self.d.world,
        )
        if self.d.is_primary:
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
        sync(self.d)
