"""Training history: how every SSOG layer's fixed field and steering gates moved during a run (docs/DESIGN.md §4.4).

The trainer takes a :class:`History` snapshot at step 0 and then at :func:`snapshot_steps` (log-spaced over the
first tenth of the run, where a chance plateau and the gates' opening happen, then evenly), together with the mean
train loss / accuracy since the previous snapshot; every evaluation adds its validation accuracy. The history is
stored inside the checkpoint as float32 tensors named ``history.*`` (loading the model ignores them, see
:func:`split_history`), kept in ``train_state.pt`` across ``--resume`` and continued across ``--init-from`` stages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ssog_core.field import TAPS

PREFIX = "history."
FIELD_KEYS = ("mu", "sigma", "lambda", "tau")  # per snapshot: (L, H, R, 2), (L, H, R, 2), (L, H, R), (L,)
EARLY_FRACTION = 0.1  # the part of the run sampled log-spaced
EARLY_SNAPSHOTS = 40
EVEN_SNAPSHOTS = 100


def snapshot_steps(total_steps: int) -> list[int]:
    """Steps (optimizer steps done) at which a run of ``total_steps`` takes a snapshot: 0, log-spaced steps over
    the first :data:`EARLY_FRACTION`, and :data:`EVEN_SNAPSHOTS` even steps to the end (at least 100 in all once
    the run has 100 steps)."""
    early_end = max(1.0, EARLY_FRACTION * total_steps)
    early = np.geomspace(1, early_end, EARLY_SNAPSHOTS)
    even = np.linspace(0, total_steps, EVEN_SNAPSHOTS + 1)
    return sorted({0, total_steps, *(int(round(s)) for s in np.concatenate([early, even]) if s <= total_steps)})


def _ssog_layers(model: nn.Module) -> list[nn.Module]:
    return [b.attn for b in model.blocks if hasattr(b.attn, "fixed_field")]


@dataclass
class History:
    """Snapshots of one run (or several ``--init-from`` stages), steps counted over all stages.

    Attributes:
        steps: the step of each snapshot.
        fields: per key of :data:`FIELD_KEYS`, one array per snapshot (empty for a model without SSOG layers).
        gates: per steering tap, one list of per-layer gate scales per snapshot.
        train: ``[step, mean loss, mean accuracy]`` over the steps since the previous snapshot.
        val: ``[step, accuracy, loss]`` at every evaluation.
        stages: the first step of each training stage (``--init-from`` appends one).
    """

    steps: list[int] = field(default_factory=list)
    fields: dict[str, list[np.ndarray]] = field(default_factory=lambda: {k: [] for k in FIELD_KEYS})
    gates: dict[str, list[list[float]]] = field(default_factory=dict)
    train: list[list[float]] = field(default_factory=list)
    val: list[list[float]] = field(default_factory=list)
    stages: list[int] = field(default_factory=lambda: [0])
    warned: list[str] = field(default_factory=list)  # warnings already given (each is given once per run)
    _pending: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # loss·n, correct, n since the snapshot

    @property
    def offset(self) -> int:
        """The step this stage started at, over all stages."""
        return self.stages[-1]

    def add_batch(self, loss_sum: float, correct: float, count: int) -> None:
        """Accumulate one training step for the next snapshot's train loss / accuracy."""
        self._pending[0] += loss_sum
        self._pending[1] += correct
        self._pending[2] += count

    @torch.no_grad()
    def snapshot(self, model: nn.Module, step: int) -> None:
        """Record the fixed fields and gate scales of ``model`` at this stage's ``step``."""
        step += self.offset
        if self.steps and self.steps[-1] == step:
            return
        self.steps.append(step)
        layers = _ssog_layers(model)
        if layers:
            fixed = [a.fixed_field() for a in layers]
            self.fields["mu"].append(np.stack([f.mu.float().cpu().numpy() for f in fixed]))
            self.fields["sigma"].append(np.stack([f.sigma.float().cpu().numpy() for f in fixed]))
            self.fields["lambda"].append(np.stack([f.lam().float().cpu().numpy() for f in fixed]))
            self.fields["tau"].append(np.array([float(f.tau) for f in fixed], dtype=np.float32))
            scales = [a.gate_scales() for a in layers]
            for tap in TAPS:
                if all(tap in s for s in scales):
                    self.gates.setdefault(tap, []).append([float(s[tap]) for s in scales])
        loss_n, correct, n = self._pending
        if n:
            self.train.append([step, loss_n / n, correct / n])
        self._pending = [0.0, 0.0, 0.0]

    def add_validation(self, step: int, accuracy: float, loss: float) -> None:
        self.val.append([step + self.offset, accuracy, loss])

    def truncate(self, step: int) -> None:
        """Forget what was recorded after this stage's ``step`` (a resumed run repeats nothing)."""
        last = step + self.offset
        keep = sum(1 for s in self.steps if s <= last)
        self.steps = self.steps[:keep]
        self.fields = {k: v[:keep] for k, v in self.fields.items()}
        self.gates = {k: v[:keep] for k, v in self.gates.items()}
        self.train = [r for r in self.train if r[0] <= last]
        self.val = [r for r in self.val if r[0] <= last]

    def new_stage(self) -> None:
        """Continue this history with a second stage (``--init-from``), its steps counted after the last one."""
        self.stages.append(self.steps[-1] if self.steps else 0)
        self.warned = []

    # ------------------------------------------------------------------------------------------- storage

    def to_tensors(self) -> dict[str, Tensor]:
        """The history as float32 / int64 tensors named ``history.*`` (what the checkpoint stores)."""
        out = {
            "steps": torch.tensor(self.steps, dtype=torch.int64),
            "stages": torch.tensor(self.stages, dtype=torch.int64),
            "train": torch.tensor(self.train, dtype=torch.float32).reshape(-1, 3),
            "val": torch.tensor(self.val, dtype=torch.float32).reshape(-1, 3),
        }
        for key, snaps in self.fields.items():
            if snaps:
                out[f"fields.{key}"] = torch.from_numpy(np.stack(snaps).astype(np.float32))
        for tap, rows in self.gates.items():
            out[f"gates.{tap}"] = torch.tensor(rows, dtype=torch.float32)
        return {PREFIX + k: v.contiguous() for k, v in out.items()}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor]) -> History:
        """The inverse of :meth:`to_tensors` (keys with or without the ``history.`` prefix)."""
        t = {k.removeprefix(PREFIX): v for k, v in tensors.items()}
        steps = [int(s) for s in t["steps"].tolist()]
        fields = {k: [] for k in FIELD_KEYS}
        for key in FIELD_KEYS:
            if f"fields.{key}" in t:
                fields[key] = list(t[f"fields.{key}"].float().numpy())
        gates = {tap: t[f"gates.{tap}"].float().tolist() for tap in TAPS if f"gates.{tap}" in t}
        # train / val rows keep int steps (float32 holds every step below 2**24 exactly)
        train = [[int(r[0]), r[1], r[2]] for r in t["train"].tolist()]
        val = [[int(r[0]), r[1], r[2]] for r in t["val"].tolist()]
        return cls(steps, fields, gates, train, val, [int(s) for s in t["stages"].tolist()])

    def to_state(self) -> dict[str, Any]:
        """What ``train_state.pt`` keeps (tensors and plain containers: loadable with ``weights_only=True``)."""
        return {"tensors": self.to_tensors(), "warned": list(self.warned), "pending": list(self._pending)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> History:
        history = cls.from_tensors(state["tensors"])
        history.warned = list(state.get("warned", []))
        history._pending = list(state.get("pending", [0.0, 0.0, 0.0]))
        return history

    def to_json(self) -> dict[str, Any]:
        """Plain lists: ``steps``, ``gates`` (per tap: per step, per layer), ``val_acc`` ([step, acc]), ``train``
        ([step, loss, acc]), ``fields`` (per key: per step, layer, head, atom), ``stages``."""
        return {
            "steps": list(self.steps),
            "gates": {tap: rows for tap, rows in self.gates.items()},
            "val_acc": [[int(s), float(a)] for s, a, _ in self.val],
            "train": [[int(s), float(loss), float(acc)] for s, loss, acc in self.train],
            "fields": {k: [np.asarray(a).tolist() for a in v] for k, v in self.fields.items() if v},
            "stages": list(self.stages),
        }


def split_history(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], History | None]:
    """A checkpoint's tensors → (the model's own tensors, its training history or ``None``)."""
    model = {k: v for k, v in state.items() if not k.startswith(PREFIX)}
    hist = {k: v for k, v in state.items() if k.startswith(PREFIX)}
    if not hist:
        return model, None
    try:
        return model, History.from_tensors(hist)
    except (KeyError, RuntimeError, ValueError, IndexError) as e:
        raise ValueError(f"its training history (history.* tensors) is unreadable: {e}") from None


def stalled_gates(history: History, cold_scale: float, factor: float = 2.0) -> bool:
    """True when every recorded gate is still within ``factor`` × its cold start (content cannot steer yet)."""
    last = [rows[-1] for rows in history.gates.values() if rows]
    return bool(last) and all(s < factor * cold_scale for row in last for s in row)


def at_chance(accuracy: float, num_classes: int) -> bool:
    """Accuracy close to guessing: below min(1.5 / classes, 1 / classes + 0.05) (10 classes: 15%, 2: 55%)."""
    return num_classes > 1 and math.isfinite(accuracy) and accuracy < min(1.5 / num_classes, 1 / num_classes + 0.05)
