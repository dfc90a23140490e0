"""Interventions: edit a trained model's geometry for one call, without changing the model.

An edit list (:data:`Edit` dataclasses, JSON through :func:`edit_from_dict` / ``to_dict``) is applied in order
inside ``with edited(model, edits, ...):``. The edits act where the field and the head outputs are computed
(:mod:`ssog_core.nn.edit_hooks`, consulted by ``SSOGAttention.field`` / ``forward`` and the dot module's output),
so the logits, :func:`~ssog_core.analysis.attention_maps`, :func:`~ssog_core.analysis.export_maps`,
rollout and the steering offsets all see the same edited model. Nothing is written into the model and
nothing outlives the block, even with many threads sharing the model (the hooks live in a context variable).

| op | meaning |
|---|---|
| ``close_gate`` | content cannot steer that tap (``mu``/``sigma``/``lambda``/``all``) of one head or every head |
| ``scale_gate`` | that tap's gate times ``factor`` (0 = closed, 1 = as trained): the playground's content gate |
| ``ablate_head`` | the head's output before the output projection is zero, or its per-position dataset mean |
| ``patch_head`` | from a source image: the head's whole output, or only its steering (where it looks) |
| ``drop_atom`` | that atom's λ is 0 and the others are renormalised |
| ``set_head`` | the head's fixed atoms are a playground head's (μ = query − key; the layer's τ is kept) |
| ``swap_axes`` | the head mirrored across the diagonal: μ, σ and the steering offsets y ↔ x |

Patch sources are run on the *unedited* model (as activation patching takes its cache from a clean run).
Dot-product and RBF models take ``ablate_head`` and ``patch_head`` with ``what="output"`` only.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ssog_core.analysis.head_spec import HeadSpec
from ssog_core.field import TAPS, Field
from ssog_core.nn.attention import SSOGAttention
from ssog_core.nn.edit_hooks import install, uninstall

MAX_EDITS = 64
MAX_GATE_FACTOR = 10.0  # beyond this the bounded offsets saturate every atom: a typo, not an experiment
DROPPED_LOG_LAMBDA = -1.0e4  # a dropped atom's log λ: its weight underflows to exactly 0 in every float type,
# while every kernel still sees finite numbers (−inf would turn the fast paths' max-free softmax into NaN)
TAP_NAMES = {"mu": "μ", "sigma": "σ", "lambda": "λ"}
_SHA = re.compile(r"^[0-9a-f]{64}$")


class EditError(ValueError):
    """An edit list that cannot be applied, with every reason in words."""


@dataclass(frozen=True)
class Edit:
    """One intervention on layer ``layer`` (0-based); subclasses name the op and its other fields."""

    op: ClassVar[str]
    layer: int

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, **asdict(self)}

    def describe(self) -> str:
        raise NotImplementedError

    def _where(self, head: int | None) -> str:
        return f"layer {self.layer}" + ("" if head is None else f", head {head}")


@dataclass(frozen=True)
class CloseGate(Edit):
    op: ClassVar[str] = "close_gate"
    tap: str = "all"
    head: int | None = None  # None: every head of the layer

    def describe(self) -> str:
        what = "all gates closed" if self.tap == "all" else f"{TAP_NAMES.get(self.tap, self.tap)} gate closed"
        return f"{self._where(self.head)}: {what}"


@dataclass(frozen=True)
class ScaleGate(CloseGate):
    """The gate scale ``s`` of a tap times ``factor``: exactly the playground's content gate for that head (the
    offsets are ``s·tanh(p)``, so scaling ``s`` scales each offset, in μ, log σ and log λ)."""

    op: ClassVar[str] = "scale_gate"
    factor: float = 1.0

    def describe(self) -> str:
        what = "all gates" if self.tap == "all" else f"{TAP_NAMES.get(self.tap, self.tap)} gate"
        return f"{self._where(self.head)}: {what} × {self.factor:g}"


@dataclass(frozen=True)
class AblateHead(Edit):
    op: ClassVar[str] = "ablate_head"
    head: int = 0
    mode: str = "zero"  # or "dataset_mean"

    def describe(self) -> str:
        return f"{self._where(self.head)}: ablated ({'zero' if self.mode == 'zero' else 'dataset mean'})"


@dataclass(frozen=True)
class PatchHead(Edit):
    op: ClassVar[str] = "patch_head"
    head: int = 0
    source: str = ""  # image name or SHA-256, resolved by the caller into ``sources``
    what: str = "output"  # or "steering"

    def describe(self) -> str:
        name = self.source[:12] + "…" if _SHA.match(self.source) else self.source
        return f"{self._where(self.head)}: {self.what} patched from {name}"


@dataclass(frozen=True)
class DropAtom(Edit):
    op: ClassVar[str] = "drop_atom"
    head: int = 0
    atom: int = 0

    def describe(self) -> str:
        return f"{self._where(self.head)}: atom {self.atom} dropped"


@dataclass(frozen=True)
class SetHead(Edit):
    op: ClassVar[str] = "set_head"
    head: int = 0
    head_spec: HeadSpec | None = None
    steered: bool = False  # the spec came from a steered query: refused (it already contains content's offsets)

    def to_dict(self) -> dict[str, Any]:
        spec = None if self.head_spec is None else self.head_spec.to_dict()
        return {"op": self.op, "layer": self.layer, "head": self.head, "head_spec": spec, "steered": self.steered}

    def describe(self) -> str:
        n = 0 if self.head_spec is None else len(self.head_spec.atoms)
        return f"{self._where(self.head)}: atoms set by hand ({n} atom{'s' * (n != 1)})"


@dataclass(frozen=True)
class SwapAxes(Edit):
    op: ClassVar[str] = "swap_axes"
    head: int = 0

    def describe(self) -> str:
        return f"{self._where(self.head)}: mirrored across the diagonal (y ↔ x)"


EDIT_TYPES: dict[str, type[Edit]] = {
    t.op: t for t in (CloseGate, ScaleGate, AblateHead, PatchHead, DropAtom, SetHead, SwapAxes)
}
OPS = tuple(EDIT_TYPES)


def _int(d: Mapping[str, Any], key: str, optional: bool = False) -> int | None:
    v = d.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v):
        raise EditError(f"{key} must be a whole number, got {v!r}")
    return int(v)


def _factor_problem(v: Any) -> str | None:
    """Why ``v`` is not a gate factor (NaN included), or ``None``."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= MAX_GATE_FACTOR:
        return f"factor must be a number from 0 to {MAX_GATE_FACTOR:g} (0 closes the gate), got {v!r}"
    return None


def edit_from_dict(d: Any) -> Edit:
    """Parse one edit's JSON form; raises :class:`EditError` saying what is wrong."""
    if not isinstance(d, dict):
        raise EditError(f"an edit is a JSON object with an 'op', got {type(d).__name__}")
    op = d.get("op")
    if op not in EDIT_TYPES:
        raise EditError(f"unknown op {op!r}; expected one of {', '.join(OPS)}")
    cls = EDIT_TYPES[op]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known - {"op"})
    if unknown:
        raise EditError(f"{op} has no field {', '.join(map(repr, unknown))}; it takes {', '.join(sorted(known))}")
    kw: dict[str, Any] = {"layer": _int(d, "layer")}
    for name in known - {"layer"}:
        if name not in d:
            continue
        if name in ("head", "atom"):
            kw[name] = _int(d, name, optional=name == "head" and issubclass(cls, CloseGate))
        elif name == "head_spec":
            kw[name] = HeadSpec.from_dict(d[name])
        elif name == "steered":
            kw[name] = bool(d[name])
        elif name == "factor":
            if problem := _factor_problem(d[name]):
                raise EditError(problem)
            kw[name] = float(d[name])
        elif not isinstance(d[name], str):
            raise EditError(f"{name} must be a string, got {d[name]!r}")
        else:
            kw[name] = d[name]
    if not issubclass(cls, CloseGate) and "head" not in d:
        raise EditError(f"{op} needs a head")
    return cls(**kw)


def parse_edits(items: Any) -> list[Edit]:
    """An edit list from JSON (a list of objects, or already-parsed edits); every problem is reported at once."""
    if not isinstance(items, list | tuple):
        raise EditError(f"edits are a JSON list of objects, got {type(items).__name__}")
    if len(items) > MAX_EDITS:
        raise EditError(f"at most {MAX_EDITS} edits, got {len(items)}")
    out, problems = [], []
    for i, d in enumerate(items):
        try:
            out.append(d if isinstance(d, Edit) else edit_from_dict(d))
        except ValueError as e:
            problems.append(f"edit {i + 1}: {e}")
    if problems:
        raise EditError("; ".join(problems))
    return out


def describe(edits: Sequence[Edit]) -> list[str]:
    """One readable line per edit ("layer 5, head 0: μ gate closed")."""
    return [e.describe() for e in edits]


def edits_key(edits: Sequence[Edit]) -> str:
    """A canonical text of the edit list, for cache keys."""
    return json.dumps([e.to_dict() for e in edits], sort_keys=True)


# ---------------------------------------------------------------------------------------------- validation


def _problems(edit: Edit, model: nn.Module, sources: Mapping[str, Any], has_means: bool) -> list[str]:
    depth = len(model.blocks)
    if not 0 <= edit.layer < depth:
        return [f"layer {edit.layer} does not exist (the model has layers 0–{depth - 1})"]
    attn = model.blocks[edit.layer].attn
    heads = attn.num_heads
    head = getattr(edit, "head", None)
    if head is not None and not 0 <= head < heads:
        return [f"head {head} does not exist (layer {edit.layer} has heads 0–{heads - 1})"]
    ssog = isinstance(attn, SSOGAttention)
    if not ssog and not (isinstance(edit, AblateHead) or (isinstance(edit, PatchHead) and edit.what == "output")):
        return [
            f"{edit.op} edits the Gaussian field, which layer {edit.layer} does not have (it is dot-product "
            "attention): only ablate_head and patch_head with what='output' work on it"
        ]
    if isinstance(edit, CloseGate):
        if edit.tap not in (*TAPS, "all"):
            return [f"unknown tap {edit.tap!r}; expected mu, sigma, lambda or all"]
        if isinstance(edit, ScaleGate) and (problem := _factor_problem(edit.factor)):
            return [problem]
        if not attn.taps:
            verb = "scale" if isinstance(edit, ScaleGate) else "close"
            return [f"layer {edit.layer} has a fixed field (no steering gates): there is no gate to {verb}"]
        if edit.tap != "all" and edit.tap not in attn.taps:
            return [f"layer {edit.layer} has no {TAP_NAMES[edit.tap]} gate (its taps: {', '.join(attn.taps)})"]
    elif isinstance(edit, AblateHead):
        if edit.mode not in ("zero", "dataset_mean"):
            return [f"unknown ablation mode {edit.mode!r}; expected zero or dataset_mean"]
        if edit.mode == "dataset_mean" and not has_means:
            return ["dataset_mean ablation needs the head means of the validation images (pass head_means)"]
    elif isinstance(edit, PatchHead):
        if edit.what not in ("output", "steering"):
            return [f"unknown patch {edit.what!r}; expected output or steering"]
        if edit.source not in sources:
            return [f"patch source image {edit.source!r} is not there (give a bundled image's name or a SHA-256)"]
    elif isinstance(edit, DropAtom):
        if not 0 <= edit.atom < attn.num_atoms:
            return [f"atom {edit.atom} does not exist (heads have atoms 0–{attn.num_atoms - 1})"]
    elif isinstance(edit, SetHead):
        return _set_head_problems(edit, attn)
    return []


def _set_head_problems(edit: SetHead, attn: SSOGAttention) -> list[str]:
    spec = edit.head_spec
    if spec is None:
        return ["set_head needs a head_spec (a playground head)"]
    if edit.steered:
        return ["this head was opened from a steered query (its atoms already carry content's offsets); open it from "
                "the geometry grid to set the model's fixed atoms"]  # fmt: skip
    out = []
    tau = float(attn.fixed_field().tau.detach())
    if not math.isclose(spec.tau, tau, rel_tol=1e-5, abs_tol=1e-6):
        out.append(f"τ={spec.tau:g} differs from layer {edit.layer}'s τ={tau:.6g}: τ is per layer, keep it")
    if spec.mode != attn.mode:
        out.append(f"the head is {spec.mode}, layer {edit.layer} is {attn.mode}")
    if len(spec.atoms) > attn.num_atoms:
        out.append(f"{len(spec.atoms)} atoms: layer {edit.layer}'s heads have at most {attn.num_atoms}")
    low = [i for i, a in enumerate(spec.atoms) if min(a.sy, a.sx) < attn.sigma_floor]
    if low:
        out.append(f"atom {low[0]}'s σ is below the model's floor σ={attn.sigma_floor:g}")
    return out


def check_edits(
    model: nn.Module, edits: Sequence[Edit], sources: Mapping[str, Any] | None = None, has_means: bool = False
) -> None:
    """Raise :class:`EditError` listing every edit that cannot be applied to ``model`` (checked before any work)."""
    if len(edits) > MAX_EDITS:
        raise EditError(f"at most {MAX_EDITS} edits, got {len(edits)}")
    problems = []
    dropped: dict[tuple[int, int], set[int]] = {}
    for i, e in enumerate(edits):
        found = _problems(e, model, sources or {}, has_means)
        problems += [f"edit {i + 1} ({e.op}): {p}" for p in found]
        if found:
            continue
        if not isinstance(e, DropAtom | SetHead):
            continue
        r = model.blocks[e.layer].attn.num_atoms
        if isinstance(e, DropAtom):
            dropped.setdefault((e.layer, e.head), set()).add(e.atom)
        else:
            dropped[(e.layer, e.head)] = set(range(len(e.head_spec.atoms), r))
        if len(dropped[(e.layer, e.head)]) >= r:
            problems.append(f"edit {i + 1} ({e.op}): layer {e.layer}, head {e.head} would have no atom left")
    if problems:
        raise EditError("; ".join(problems))


# ------------------------------------------------------------------------------------------------ the hooks


@dataclass
class _Recorded:
    """What one unedited layer computed for a source image: bounded probes per tap and per-head outputs."""

    probes: dict[str, Tensor] = field(default_factory=dict)
    output: Tensor | None = None


class _Recorder:
    """A hook that changes nothing and keeps what the layer computed (for patch sources and dataset means)."""

    removed_heads: frozenset[int] = frozenset()

    def __init__(self) -> None:
        self.seen = _Recorded()

    def fixed(self, f: Field) -> Field:
        return f

    def probes(self, probes: dict[str, Tensor]) -> dict[str, Tensor]:
        self.seen.probes = dict(probes)
        return probes

    def output(self, y: Tensor) -> Tensor:
        self.seen.output = y
        return y


def _set_head_atoms(f: Field, head: int, spec: HeadSpec) -> Field:
    """``f`` with ``head``'s atoms replaced by the spec's (μ = query − key, λ ∝ w); unused atoms dropped."""
    s = spec.field()  # one head, float64
    k = s.num_atoms
    mu, sigma, log_lam = f.mu.clone(), f.sigma.clone(), f.log_lam.clone()
    mu[head, :k] = s.mu[0].to(mu)
    sigma[head, :k] = s.sigma[0].to(sigma)
    log_lam[head, :k] = torch.log_softmax(s.log_lam[0], -1).to(log_lam)
    log_lam[head, k:] = DROPPED_LOG_LAMBDA
    return Field(mu, sigma, log_lam, f.tau)


class _LayerPlan:
    """The edits of one layer, in list order, as the three places the attention module consults."""

    def __init__(self, edits: list[Edit], recorded: Mapping[str, _Recorded], means: Tensor | None):
        self.edits, self.recorded, self.means = edits, recorded, means
        self.removed_heads = frozenset(
            e.head for e in edits if isinstance(e, AblateHead) or (isinstance(e, PatchHead) and e.what == "output")
        )

    def fixed(self, f: Field) -> Field:
        for e in self.edits:
            if isinstance(e, SetHead):
                f = _set_head_atoms(f, e.head, e.head_spec)
            elif isinstance(e, DropAtom):
                log_lam = f.log_lam.clone()
                log_lam[e.head, e.atom] = DROPPED_LOG_LAMBDA
                f = Field(f.mu, f.sigma, log_lam, f.tau)
            elif isinstance(e, SwapAxes):
                mu, sigma = f.mu.clone(), f.sigma.clone()
                mu[e.head], sigma[e.head] = f.mu[e.head].flip(-1), f.sigma[e.head].flip(-1)
                f = Field(mu, sigma, f.log_lam, f.tau)
        return f

    def probes(self, probes: dict[str, Tensor]) -> dict[str, Tensor]:
        probes = dict(probes)
        for e in self.edits:
            if isinstance(e, ScaleGate):
                heads = slice(None) if e.head is None else e.head
                for tap in TAPS if e.tap == "all" else (e.tap,):
                    if tap in probes:
                        probes[tap] = probes[tap].clone()
                        probes[tap][:, :, :, heads] *= e.factor
            elif isinstance(e, CloseGate):
                for tap in TAPS if e.tap == "all" else (e.tap,):
                    if tap in probes and e.head is None:
                        del probes[tap]
                    elif tap in probes:
                        probes[tap] = probes[tap].clone()
                        probes[tap][:, :, :, e.head] = 0.0
            elif isinstance(e, PatchHead) and e.what == "steering":
                source = self.recorded[e.source].probes
                for tap in probes:
                    src = source[tap]
                    if src.shape[1:3] != probes[tap].shape[1:3]:
                        raise EditError(f"patch source {e.source!r} has another token grid than the image")
                    probes[tap] = probes[tap].clone()
                    probes[tap][:, :, :, e.head] = src[:, :, :, e.head]
            elif isinstance(e, SwapAxes):
                for tap in ("mu", "sigma"):
                    if tap in probes:
                        probes[tap] = probes[tap].clone()
                        probes[tap][:, :, :, e.head] = probes[tap][:, :, :, e.head].flip(-1)
        return probes

    def output(self, y: Tensor) -> Tensor:
        if not self.removed_heads:
            return y
        y = y.clone()
        for e in self.edits:
            if isinstance(e, AblateHead) and e.mode == "zero":
                y[:, :, e.head] = 0.0
            elif isinstance(e, AblateHead):
                if self.means.shape[0] != y.shape[1]:
                    raise EditError("dataset-mean ablation needs images of the validation images' size")
                y[:, :, e.head] = self.means[:, e.head].to(y)
            elif isinstance(e, PatchHead) and e.what == "output":
                src = self.recorded[e.source].output
                if src.shape[1] != y.shape[1]:
                    raise EditError(f"patch source {e.source!r} has another token grid than the image")
                y[:, :, e.head] = src[:, :, e.head].to(y)
        return y


@contextlib.contextmanager
def _hooks(hooks: Mapping[int, Any]) -> Iterator[None]:
    token = install(hooks)
    try:
        yield
    finally:
        uninstall(token)


def record(model: nn.Module, img: Tensor) -> list[_Recorded]:
    """What every layer of the *unedited* model computes on ``img``: bounded probes and per-head outputs."""
    recorders = [_Recorder() for _ in model.blocks]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), _hooks({id(b.attn): r for b, r in zip(model.blocks, recorders, strict=True)}):
            model(img)
    finally:
        model.train(was_training)
    return [r.seen for r in recorders]


def mean_head_outputs(model: nn.Module, batches: Iterable[Tensor]) -> list[Tensor]:
    """Per layer, each head's mean output per token position ``(N, H, D)`` over the images (unedited model):
    what ``ablate_head`` with ``mode="dataset_mean"`` puts in an ablated head's place."""
    sums: list[Tensor] | None = None
    count = 0
    for x in batches:
        seen = record(model, x)
        outs = [s.output.double().sum(0) for s in seen]
        sums = outs if sums is None else [a + b for a, b in zip(sums, outs, strict=True)]
        count += x.shape[0]
    if sums is None or count == 0:
        raise EditError("the dataset mean needs at least one image")
    return [s / count for s in sums]


@contextlib.contextmanager
def edited(
    model: nn.Module,
    edits: Sequence[Edit | dict],
    sources: Mapping[str, Tensor] | None = None,
    head_means: Sequence[Tensor] | None = None,
) -> Iterator[list[Edit]]:
    """Run ``model`` with ``edits`` applied, for this block and this thread only.

    Args:
        model: a :class:`~ssog_core.vit.ViT`; it is never modified.
        edits: edits or their JSON dicts, applied in order.
        sources: patch sources: the name an edit gives → the model input ``(1, C, H, W)`` of that image.
        head_means: per layer ``(N, H, D)`` from :func:`mean_head_outputs`, for ``dataset_mean`` ablation.
    Yields the parsed edits. Raises :class:`EditError` (before any work) for edits that cannot be applied.
    An inner ``edited`` block replaces the outer one's edits while it runs.
    """
    parsed = parse_edits(list(edits))
    check_edits(model, parsed, sources, head_means is not None)
    used = {e.source for e in parsed if isinstance(e, PatchHead)}
    recorded = {name: record(model, sources[name]) for name in sorted(used)}
    hooks = {}
    for layer, block in enumerate(model.blocks):
        mine = [e for e in parsed if e.layer == layer]
        if mine:
            by_source = {name: rec[layer] for name, rec in recorded.items()}
            means = None if head_means is None else head_means[layer]
            hooks[id(block.attn)] = _LayerPlan(mine, by_source, means)
    with _hooks(hooks):
        yield parsed
