"""One class per intervention op: its fields (declared once), its checks against a model and its effect on a
layer. The classes register themselves in :data:`~ssog_core.interventions.edit.EDITS` by being defined.

| op | meaning |
|---|---|
| ``close_gate`` | content cannot steer that tap (``mu``/``sigma``/``lambda``/``all``) of one head or every head |
| ``scale_gate`` | that tap's gate times ``factor`` (0 = closed, 1 = as trained): the playground's content gate |
| ``ablate_head`` | the head's output before the output projection is zero, or its per-position dataset mean |
| ``patch_head`` | from a source image: the head's whole output, or only its steering (where it looks) |
| ``drop_atom`` | that atom's λ is 0 and the others are renormalised |
| ``set_head`` | the head's fixed atoms are a playground head's (μ = query − key; the layer's τ is kept) |
| ``swap_axes`` | the head mirrored across the diagonal: μ, σ and the steering offsets y ↔ x |
| ``move_atom`` | that atom's stored μ (query − key) shifted by ``(dy, dx)`` cells |
| ``replace_with_field`` | a head's attention (or every head's of a layer) is its K-atom fit or its positional field |
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ssog_core.analysis.head_as_field import FIT_ATOMS, MAX_FIT_ATOMS
from ssog_core.analysis.head_spec import HeadSpec
from ssog_core.field import TAPS, Field
from ssog_core.interventions.edit import CheckContext, Edit, EditError, LayerInputs, param
from ssog_core.nn.attention import SSOGAttention

MAX_GATE_FACTOR = 10.0  # beyond this the bounded offsets saturate every atom: a typo, not an experiment
DROPPED_LOG_LAMBDA = -1.0e4  # a dropped atom's log λ: its weight underflows to exactly 0 in every float type,
# while every kernel still sees finite numbers (−inf would turn the fast paths' max-free softmax into NaN)
TAP_NAMES = {"mu": "μ", "sigma": "σ", "lambda": "λ"}
_SHA = re.compile(r"^[0-9a-f]{64}$")

_HEAD = dict(kind="int", help="the head, from 0", low=0, required=True)


@dataclass(frozen=True)
class _Gate(Edit):
    """What the two gate ops share: a tap and one head or every head (not an op itself)."""

    tap: str = param("all", kind="choice", choices=(*TAPS, "all"), help="the steering tap whose gate it acts on")
    head: int | None = param(None, kind="int", low=0, optional=True, help="one head; left out: every head")

    @classmethod
    def takes(cls, attn: nn.Module) -> bool:
        return isinstance(attn, SSOGAttention) and bool(attn.taps)  # a gate is a steering tap's

    def _taps(self, tap: str) -> bool:
        return self.tap in (tap, "all")

    def _gate(self) -> str:
        return "all gates" if self.tap == "all" else f"{TAP_NAMES[self.tap]} gate"

    def problems(self, attn: nn.Module, model: nn.Module, ctx: CheckContext) -> list[str]:
        if not attn.taps:
            verb = self.op.split("_")[0]
            return [f"layer {self.layer} has a fixed field (no steering gates): there is no gate to {verb}"]
        if self.tap != "all" and self.tap not in attn.taps:
            return [f"layer {self.layer} has no {TAP_NAMES[self.tap]} gate (its taps: {', '.join(attn.taps)})"]
        return []


@dataclass(frozen=True)
class CloseGate(_Gate):
    """Content cannot steer that tap of one head (or every head): its atoms stay where the fixed field puts them."""

    op = "close_gate"

    def describe(self) -> str:
        what = "all gates closed" if self.tap == "all" else f"{self._gate()} closed"
        return f"{self._where(self.head)}: {what}"

    def on_probe(self, tap: str, probe: Tensor, inputs: LayerInputs) -> Tensor | None:
        if not self._taps(tap):
            return probe
        if self.head is None:
            return None  # the tap is gone: exactly the model built without it
        probe = probe.clone()
        probe[:, :, :, self.head] = 0.0
        return probe


@dataclass(frozen=True)
class ScaleGate(_Gate):
    """The gate scale ``s`` of a tap times ``factor``: exactly the playground's content gate for that head (the
    offsets are ``s·tanh(p)``, so scaling ``s`` scales each offset, in μ, log σ and log λ)."""

    op = "scale_gate"
    factor: float = param(
        1.0,
        kind="float",
        low=0.0,
        high=MAX_GATE_FACTOR,
        why="0 closes the gate",
        help="0 closed, 1 as trained",
        start=0.5,
    )

    def describe(self) -> str:
        return f"{self._where(self.head)}: {self._gate()} × {self.factor:g}"

    def on_probe(self, tap: str, probe: Tensor, inputs: LayerInputs) -> Tensor | None:
        if not self._taps(tap):
            return probe
        probe = probe.clone()
        probe[:, :, :, slice(None) if self.head is None else self.head] *= self.factor
        return probe


@dataclass(frozen=True)
class AblateHead(Edit):
    """The head's output before the output projection is zero, or its per-position mean over the validation
    images."""

    op = "ablate_head"
    dot_product = {}
    head: int = param(0, **_HEAD)
    mode: str = param("zero", kind="choice", choices=("zero", "dataset_mean"), noun="ablation mode",
                      help="zero, or each position's mean over the validation images")  # fmt: skip

    def describe(self) -> str:
        return f"{self._where(self.head)}: ablated ({'zero' if self.mode == 'zero' else 'dataset mean'})"

    def problems(self, attn: nn.Module, model: nn.Module, ctx: CheckContext) -> list[str]:
        if self.mode == "dataset_mean" and not ctx.has_means:
            return ["dataset_mean ablation needs the head means of the validation images (pass head_means)"]
        return []

    def needs_means(self) -> bool:
        return self.mode == "dataset_mean"

    def removed_head(self) -> int | None:
        return self.head

    def on_head_out(self, y: Tensor, inputs: LayerInputs) -> Tensor:
        y = y.clone()
        if self.mode == "zero":
            y[:, :, self.head] = 0.0
            return y
        if inputs.means.shape[0] != y.shape[1]:
            raise EditError("dataset-mean ablation needs images of the validation images' size")
        y[:, :, self.head] = inputs.means[:, self.head].to(y)
        return y


@dataclass(frozen=True)
class PatchHead(Edit):
    """From a source image (run on the unedited model): the head's whole output, or only its steering."""

    op = "patch_head"
    dot_product = {"what": "output"}
    head: int = param(0, **_HEAD)
    source: str = param("", kind="image", help="the source image: a bundled image's name or a SHA-256")
    what: str = param("output", kind="choice", choices=("output", "steering"), noun="patch",
                      help="the head's whole output, or only where it looks")  # fmt: skip

    def describe(self) -> str:
        name = self.source[:12] + "…" if _SHA.match(self.source) else self.source
        return f"{self._where(self.head)}: {self.what} patched from {name}"

    def problems(self, attn: nn.Module, model: nn.Module, ctx: CheckContext) -> list[str]:
        if self.source not in ctx.sources:
            return [f"patch source image {self.source!r} is not there (give a bundled image's name or a SHA-256)"]
        return []

    def sources(self) -> tuple[str, ...]:
        return (self.source,)

    def removed_head(self) -> int | None:
        return self.head if self.what == "output" else None

    def on_probe(self, tap: str, probe: Tensor, inputs: LayerInputs) -> Tensor | None:
        if self.what != "steering":
            return probe
        src = inputs.recorded[self.source].probes[tap]
        if src.shape[1:3] != probe.shape[1:3]:
            raise EditError(f"patch source {self.source!r} has another token grid than the image")
        probe = probe.clone()
        probe[:, :, :, self.head] = src[:, :, :, self.head]
        return probe

    def on_head_out(self, y: Tensor, inputs: LayerInputs) -> Tensor:
        if self.what != "output":
            return y
        src = inputs.recorded[self.source].output
        if src.shape[1] != y.shape[1]:
            raise EditError(f"patch source {self.source!r} has another token grid than the image")
        y = y.clone()
        y[:, :, self.head] = src[:, :, self.head].to(y)
        return y


def _atom_problems(attn: nn.Module, atom: int) -> list[str]:
    if not 0 <= atom < attn.num_atoms:
        return [f"atom {atom} does not exist (heads have atoms 0–{attn.num_atoms - 1})"]
    return []


@dataclass(frozen=True)
class DropAtom(Edit):
    """That atom's λ is 0 and the others are renormalised."""

    op = "drop_atom"
    head: int = param(0, **_HEAD)
    atom: int = param(0, kind="int", low=0, required=True, help="the atom, from 0")

    def describe(self) -> str:
        return f"{self._where(self.head)}: atom {self.atom} dropped"

    def problems(self, attn: nn.Module, model: nn.Module, ctx: CheckContext) -> list[str]:
        return _atom_problems(attn, self.atom)

    def atoms_left(self, left: set[int], num_atoms: int) -> set[int]:
        return left - {self.atom}

    def on_field(self, f: Field, inputs: LayerInputs) -> Field:
        log_lam = f.log_lam.clone()
        log_lam[self.head, self.atom] = DROPPED_LOG_LAMBDA
        return Field(f.mu, f.sigma, log_lam, f.tau)


@dataclass(frozen=True)
class SetHead(Edit):
    """The head's fixed atoms are a playground head's (μ = query − key, λ ∝ w; the layer's τ is kept)."""

    op = "set_head"
    head: int = param(0, **_HEAD)
    head_spec: HeadSpec | None = param(
        None, kind="head", required=True, form=False, help="a playground head (its JSON)"
    )
    steered: bool = param(False, kind="bool", form=False, help="the head came from a steered query (refused)")

    def describe(self) -> str:
        n = 0 if self.head_spec is None else len(self.head_spec.atoms)
        return f"{self._where(self.head)}: atoms set by hand ({n} atom{'s' * (n != 1)})"

    def problems(self, attn: nn.Module, model: nn.Module, ctx: CheckContext) -> list[str]:
        spec = self.head_spec
        if spec is None:
            return ["set_head needs a head_spec (a playground head)"]
        if self.steered:
            return ["this head was opened from a steered query (its atoms already carry content's offsets); open it "
                    "from the geometry grid to set the model's fixed atoms"]  # fmt: skip
        out = []
        tau = float(attn.fixed_field().tau.detach())
        if not math.isclose(spec.tau, tau, rel_tol=1e-5, abs_tol=1e-6):
            out.append(f"τ={spec.tau:g} differs from layer {self.layer}'s τ={tau:.6g}: τ is per layer, keep it")
        if spec.mode != attn.mode:
            out.append(f"the head is {spec.mode}, layer {self.layer} is {attn.mode}")
        if len(spec.atoms) > attn.num_atoms:
            out.append(f"{len(spec.atoms)} atoms: layer {self.layer}'s heads have at most {attn.num_atoms}")
        low = [i for i, a in enumerate(spec.atoms) if min(a.sy, a.sx) < attn.sigma_floor]
        if low:
            out.append(f"atom {low[0]}'s σ is below the model's floor σ={attn.sigma_floor:g}")
        return out

    def atoms_left(self, left: set[int], num_atoms: int) -> set[int]:
        return set(range(min(len(self.head_spec.atoms), num_atoms)))

    def on_field(self, f: Field, inputs: LayerInputs) -> Field:
        s = self.head_spec.field()  # one head, float64
        k, h = s.num_atoms, self.head
        mu, sigma, log_lam = f.mu.clone(), f.sigma.clone(), f.log_lam.clone()
        mu[h, :k] = s.mu[0].to(mu)
        sigma[h, :k] = s.sigma[0].to(sigma)
        log_lam[h, :k] = torch.log_softmax(s.log_lam[0], -1).to(log_lam)
        log_lam[h, k:] = DROPPED_LOG_LAMBDA
        return Field(mu, sigma, log_lam, f.tau)


@dataclass(frozen=True)
class SwapAxes(Edit):
    """The head mirrored across the diagonal: μ, σ and the steering offsets y ↔ x."""

    op = "swap_axes"
    head: int = param(0, **_HEAD)

    def describe(self) -> str:
        return f"{self._where(self.head)}: mirrored across the diagonal (y ↔ x)"

    def on_field(self, f: Field, inputs: LayerInputs) -> Field:
        mu, sigma = f.mu.clone(), f.sigma.clone()
        mu[self.head], sigma[self.head] = f.mu[self.head].flip(-1), f.sigma[self.head].flip(-1)
        return Field(mu, sigma, f.log_lam, f.tau)

    def on_probe(self, tap: str, probe: Tensor, inputs: LayerInputs) -> Tensor | None:
        if tap not in ("mu", "sigma"):
            return probe
        probe = probe.clone()
        probe[:, :, :, self.head] = probe[:, :, :, self.head].flip(-1)
        return probe


@dataclass(frozen=True)
class MoveAtom(Edit):
    """That atom's stored μ (query − key, in grid cells) shifted: μy += dy, μx += dx (content still steers it)."""

    op = "move_atom"
    head: int = param(0, **_HEAD)
    atom: int = param(0, kind="int", low=0, required=True, help="the atom, from 0")
    dy: float = param(0.0, kind="float", help="rows added to μy (query − key: + looks further up)")
    dx: float = param(0.0, kind="float", help="columns added to μx (query − key: + looks further left)")

    def describe(self) -> str:
        return f"{self._where(self.head)}: atom {self.atom} moved by (dy, dx) = ({self.dy:+g}, {self.dx:+g})"

    def problems(self, attn: nn.Module, model: nn.Module, ctx: CheckContext) -> list[str]:
        if found := _atom_problems(attn, self.atom):
            return found
        gh, gw = model.config.grid
        mu = attn.fixed_field().mu[self.head, self.atom].detach().double()
        y, x = float(mu[0]) + self.dy, float(mu[1]) + self.dx
        out = []
        if abs(y) > gh - 1:
            out.append(
                f"atom {self.atom} would look {y:+.3g} rows away (μy), beyond the {gh}-row grid (|μy| ≤ {gh - 1})"
            )
        if abs(x) > gw - 1:
            out.append(f"atom {self.atom} would look {x:+.3g} columns away (μx), beyond the {gw}-column grid "
                       f"(|μx| ≤ {gw - 1})")  # fmt: skip
        return out

    def on_field(self, f: Field, inputs: LayerInputs) -> Field:
        mu = f.mu.clone()
        mu[self.head, self.atom, 0] += self.dy
        mu[self.head, self.atom, 1] += self.dx
        return Field(mu, f.sigma, f.log_lam, f.tau)


def head_edits(layer: int, head: int, opened: HeadSpec, edited: HeadSpec) -> list[Edit]:
    """The edits that put a playground head back into the model it was opened from: nothing when it is unchanged,
    one ``move_atom`` per dragged atom when only atom positions changed, else ``set_head`` with the whole head."""
    same = (opened.grid, opened.query, opened.tau, opened.mode, len(opened.atoms)) == (
        edited.grid, edited.query, edited.tau, edited.mode, len(edited.atoms))  # fmt: skip
    if not same or any((a.sy, a.sx, a.w) != (b.sy, b.sx, b.w) for a, b in zip(opened.atoms, edited.atoms, strict=True)):
        return [SetHead(layer, head, edited)]
    # μ = query − key: a key moved by +d moves μ by −d
    return [
        MoveAtom(layer, head, r, a.y - b.y, a.x - b.x)
        for r, (a, b) in enumerate(zip(opened.atoms, edited.atoms, strict=True))
        if (a.y, a.x) != (b.y, b.x)
    ]


@dataclass(frozen=True)
class ReplaceWithField(Edit):
    """The head's attention is content-blind: each patch query's row over the patch keys is a field over displacement
    (query − key), its K-atom fit or its positional field (renormalised over the in-grid keys), both from its mean
    patch attention over the validation images (:mod:`ssog_core.analysis.head_as_field`); what a patch query puts on
    each prefix token (class, distillation, register) is the head's mean over those images, and the field gets the
    rest; a prefix query, which has no grid position for a field to say where it looks, gets its mean row. So no query
    of the head scores content, and a model that reads out its class token is edited too."""

    op = "replace_with_field"
    dot_product = {}
    head: int | None = param(None, kind="int", low=0, optional=True, help="one head; left out: every head")
    replacement: str = param("fit", kind="choice", choices=("fit", "field"), noun="replacement",
                             help="the head's K-atom fit, or its positional field")  # fmt: skip
    atoms: int = param(FIT_ATOMS, kind="int", low=1, high=MAX_FIT_ATOMS, help="the fit's Gaussian atoms (fit only)")

    def describe(self) -> str:
        by = f"{self.atoms}-atom fit" if self.replacement == "fit" else "positional field"
        whose = "attention" if self.head is not None else "every head's attention"
        return f"{self._where(self.head)}: {whose} replaced by its {by}"

    @classmethod
    def takes(cls, attn: nn.Module) -> bool:
        return isinstance(getattr(attn, "pattern", None), nn.Module)

    def problems(self, attn: nn.Module, model: nn.Module, ctx: CheckContext) -> list[str]:
        if not self.takes(attn):
            return [f"layer {self.layer} has no attention pattern point (blocks.{self.layer}.attn.pattern)"]
        if not ctx.has_attention:
            return ["replace_with_field needs the mean attention of the validation images (pass attention)"]
        return []

    def needs_attention(self) -> bool:
        return True

    def on_pattern(self, a: Tensor, inputs: LayerInputs) -> Tensor:
        ref = inputs.attention
        p, (gh, gw) = ref.num_prefix, ref.grid
        if a.shape[-1] != p + gh * gw:
            raise EditError(f"replace_with_field needs images of the validation images' size ({gh}×{gw} patches)")
        heads = slice(None) if self.head is None else slice(self.head, self.head + 1)
        rows = ref.rows(self.replacement, self.atoms)[heads].to(a)  # (h, N, N)
        on_prefix = ref.prefix_mass[heads].to(a)  # (h, N, P): the mean over the images, per patch query
        a = a.clone()
        a[:, heads, :p] = ref.prefix_rows[heads].to(a)
        a[:, heads, p:, :p] = on_prefix
        a[:, heads, p:, p:] = (1.0 - on_prefix.sum(-1, keepdim=True)) * rows
        return a
