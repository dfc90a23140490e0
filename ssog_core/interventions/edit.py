"""The base of every intervention: :class:`Edit`, its declared fields, the registry :data:`EDITS`, parsing and
the checks against a model.

An op is one frozen dataclass subclass of :class:`Edit` (in :mod:`ssog_core.interventions.ops`). Each field is
declared once with :func:`param` (kind, range, choices, help), and that one declaration drives the JSON parser,
the refusals in words, the Intervene tab's form, the CLI's help and the API's description. The class also says
what it checks against a model (:meth:`Edit.problems`) and what it does to a layer (:meth:`Edit.on_field`,
:meth:`Edit.on_probe`, :meth:`Edit.on_pattern`, :meth:`Edit.on_head_out`, applied at the hook points of
:mod:`ssog_core.nn.hook_points`).
Defining the subclass registers it: a new op is one class and its test.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

from ssog_core.analysis.head_spec import HeadSpec
from ssog_core.field import Field
from ssog_core.nn.attention import SSOGAttention

if TYPE_CHECKING:
    from ssog_core.analysis.head_as_field import MeanAttention

MAX_EDITS = 64


class EditError(ValueError):
    """An edit list that cannot be applied, with every reason in words."""


@dataclass(frozen=True)
class Param:
    """One field of an op: its kind (``int``, ``float``, ``choice``, ``text``, ``image``, ``bool``, ``head``), its
    range or choices, and its help. ``optional``: may be left out (``None``); ``required``: must be given."""

    kind: str
    help: str
    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    optional: bool = False
    required: bool = False
    noun: str = ""  # how a refusal names a bad choice ("unknown ablation mode …"); the field's name by default
    why: str = ""  # a refusal's reason for the range, in words
    form: bool = True  # a form field can hold it (a playground head comes from the playground, not from a form)
    start: Any = None  # the form's starting value (the field's default when None)

    def parse(self, name: str, v: Any) -> Any:
        """``v`` as this field holds it; raises :class:`EditError` in words."""
        if v is None and self.optional:
            return None
        if self.kind == "int":
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v):
                raise EditError(f"{name} must be a whole number, got {v!r}")
            if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
                bounds = (("from", self.low), ("to", self.high))
                said = "".join(f" {w} {b:g}" for w, b in bounds if b is not None)
                raise EditError(f"{name} must be a whole number{said}, got {v!r}")
            return int(v)
        if self.kind == "float":
            ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
            ok = ok and (self.low is None or v >= self.low) and (self.high is None or v <= self.high)
            if not ok:
                what = "a finite number" if self.low is None else f"a number from {self.low:g} to {self.high:g}"
                why = f" ({self.why})" if self.why else ""
                raise EditError(f"{name} must be {what}{why}, got {v!r}")
            return float(v)
        if self.kind == "choice":
            if v not in self.choices:
                expected = ", ".join(self.choices[:-1]) + f" or {self.choices[-1]}"
                raise EditError(f"unknown {self.noun or name} {v!r}; expected {expected}")
            return v
        if self.kind in ("text", "image"):
            if not isinstance(v, str):
                raise EditError(f"{name} must be a string, got {v!r}")
            return v
        if self.kind == "bool":
            return bool(v)
        if self.kind == "head":
            return HeadSpec.from_dict(v)
        raise AssertionError(self.kind)

    def to_json(self, v: Any) -> Any:
        return v.to_dict() if isinstance(v, HeadSpec) else v

    def meaning(self) -> tuple[Any, ...]:
        """What a value of the field is (kind, choices, range, whether a form holds it): one field name means one
        thing across the ops, so one form field and one schema serve them all. Its help and whether an op needs
        it may differ per op."""
        return self.kind, self.choices, self.low, self.high, self.form

    def json_schema(self) -> dict[str, Any]:
        """The field as JSON Schema (for the API and MCP clients), from the same declaration the parser reads."""
        if self.kind == "choice":
            out: dict[str, Any] = {"enum": list(self.choices)}
        elif self.kind == "head":
            out = {"type": "object", "additionalProperties": {}}
        else:
            out = {"type": {"int": "integer", "float": "number", "bool": "boolean"}.get(self.kind, "string")}
        out |= {k: v for k, v in (("minimum", self.low), ("maximum", self.high)) if v is not None}
        return ({"oneOf": [{"type": "null"}, out]} if self.optional else out) | {"description": self.help}

    def describe(self) -> str:
        """One line of help: kind, range or choices, and meaning."""
        if self.kind == "choice":
            kind = " | ".join(self.choices)
        elif self.low is not None and self.high is not None:
            kind = f"{self.kind} {self.low:g}…{self.high:g}"
        else:
            kind = self.kind + (f" ≥ {self.low:g}" if self.low is not None else "")
        return f"{kind}{', optional' if self.optional else ''}: {self.help}"


def param(default: Any = None, **spec: Any) -> Any:
    """A dataclass field declared with its :class:`Param` (the only place its kind and range are written)."""
    return field(default=default, metadata={"param": Param(**spec)})


@dataclass(frozen=True)
class Recorded:
    """What one unedited layer computed for a patch source: bounded probes per tap and per-head outputs."""

    probes: dict[str, Tensor]
    output: Tensor | None


@dataclass(frozen=True)
class LayerInputs:
    """What an edit's effect may read besides the activation: the layer's recorded patch sources by name, the
    per-position head means ``(N, H, D)`` for ``dataset_mean`` ablation and the layer's mean patch attention (its
    heads as fields) for ``replace_with_field``."""

    recorded: Mapping[str, Recorded]
    means: Tensor | None
    attention: MeanAttention | None = None


@dataclass(frozen=True)
class CheckContext:
    """What the checks know besides the model: the patch sources there are, whether head means are and whether the
    mean attention is."""

    sources: Mapping[str, Any]
    has_means: bool
    has_attention: bool = False


def _declared(cls: type) -> dict[str, Param]:
    """The fields of an op class while it is being defined (``@dataclass`` has not run yet): its dataclass bases'
    fields, then its own :func:`param` declarations."""
    out: dict[str, Param] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            out |= {f.name: f.metadata["param"] for f in fields(base) if "param" in f.metadata}
    for name in cls.__dict__.get("__annotations__", {}):
        value = cls.__dict__.get(name)
        if isinstance(value, dataclasses.Field) and "param" in value.metadata:
            out[name] = value.metadata["param"]
    return out


EDITS: dict[str, type[Edit]] = {}  # op name → class, in definition order (filled by Edit.__init_subclass__)


@dataclass(frozen=True)
class Edit:
    """One intervention on layer ``layer`` (0-based); a subclass names its ``op`` and declares its other fields."""

    op: ClassVar[str]
    # a dot-product layer (no field, only head outputs) takes this op: None never, {} always, {"what": "output"}
    # only with those field values (the one declaration; its words and works_on_dot_product come from it)
    dot_product: ClassVar[Mapping[str, Any] | None] = None
    layer: int = field(metadata={"param": Param("int", "the layer, from 0", low=0, required=True)})

    def __init_subclass__(cls, **kw: Any) -> None:
        """Register an op (a subclass naming its ``op``), refusing a taken name or a field name that means
        something else in an op already there (then nothing is registered)."""
        super().__init_subclass__(**kw)
        if "op" not in cls.__dict__:
            return
        if cls.op in EDITS:
            taken = EDITS[cls.op]
            raise TypeError(f"op {cls.op!r} is taken by {taken.__module__}.{taken.__qualname__}: give {cls.__name__} "
                            "another name")  # fmt: skip
        for name, p in _declared(cls).items():
            for op, other in EDITS.items():
                q = other.params().get(name)
                if q is not None and q.meaning() != p.meaning():
                    raise TypeError(
                        f"field {name!r} of op {cls.op!r} ({p.describe()}) means something else in op {op!r} "
                        f"({q.describe()}): one field name is one kind of value, so rename one of them"
                    )
        EDITS[cls.op] = cls

    # ---- the declaration

    @classmethod
    def params(cls) -> dict[str, Param]:
        """The op's fields and their declarations, in order."""
        return {f.name: f.metadata["param"] for f in fields(cls)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Edit:
        """Parse this op's JSON form (``d["op"]`` already chosen it); raises :class:`EditError` in words."""
        params = cls.params()
        unknown = sorted(set(d) - set(params) - {"op"})
        if unknown:
            raise EditError(
                f"{cls.op} has no field {', '.join(map(repr, unknown))}; it takes {', '.join(sorted(params))}"
            )
        kw = {}
        for name, p in params.items():
            if name in d:
                kw[name] = p.parse(name, d[name])
            elif p.required:
                raise EditError(
                    f"{cls.op} needs a {name}" if name != "layer" else "layer must be a whole number, got None"
                )
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, **{n: p.to_json(getattr(self, n)) for n, p in self.params().items()}}

    def describe(self) -> str:
        raise NotImplementedError

    def _where(self, head: int | None) -> str:
        return f"layer {self.layer}" + ("" if head is None else f", head {head}")

    # ---- checks against a model

    def works_on_dot_product(self) -> bool:
        """Whether a dot-product layer can take this edit (it has no field: only head outputs)."""
        only = self.dot_product
        return only is not None and all(getattr(self, k) == v for k, v in only.items())

    @classmethod
    def takes(cls, attn: nn.Module) -> bool:
        """Whether a layer with attention ``attn`` can take some edit of this op (what a page offers for a model:
        :func:`ops_for`); an edit's own values are checked by :meth:`problems`."""
        return isinstance(attn, SSOGAttention) or cls.dot_product is not None

    @classmethod
    def dot_product_words(cls) -> str:
        """What of this op a dot-product layer takes, in words ("" if nothing)."""
        if cls.dot_product is None:
            return ""
        only = " and ".join(f"{k}={v!r}" for k, v in cls.dot_product.items())
        return cls.op + (f" with {only}" if only else "")

    def problems(self, attn: nn.Module, model: nn.Module, ctx: CheckContext) -> list[str]:
        """What stops this edit on ``model`` beyond a missing layer or head (the attention of its layer given)."""
        return []

    def atoms_left(self, left: set[int], num_atoms: int) -> set[int]:
        """The atoms of its head still there after this edit, given those there before."""
        return left

    def sources(self) -> tuple[str, ...]:
        """Names of the patch source images this edit reads."""
        return ()

    def needs_means(self) -> bool:
        return False

    def needs_attention(self) -> bool:
        """Whether the effect reads the mean patch attention of the validation images (``LayerInputs.attention``)."""
        return False

    # ---- the effect on a layer (each returns new tensors, never changes its input)

    def removed_head(self) -> int | None:
        """A head whose output is no longer this input's attention (ablated or patched), for the maps' head mean."""
        return None

    def on_field(self, f: Field, inputs: LayerInputs) -> Field:
        """The layer's content-free field ``(H, R)``, edited."""
        return f

    def on_probe(self, tap: str, probe: Tensor, inputs: LayerInputs) -> Tensor | None:
        """One tap's bounded probes ``(B, Gh, Gw, H, R[, 2])``, edited; ``None`` closes the tap for every head."""
        return probe

    def on_pattern(self, a: Tensor, inputs: LayerInputs) -> Tensor:
        """The post-softmax attention ``(B, H, P + N, P + N)``, edited. An op that overrides it makes its layer form
        the pattern (an N × N matrix per head the fast paths never build), so only such ops do."""
        return a

    def on_head_out(self, y: Tensor, inputs: LayerInputs) -> Tensor:
        """The per-head output ``(B, N, H, D)`` before the output projection, edited."""
        return y


def edit_from_dict(d: Any) -> Edit:
    """Parse one edit's JSON form; raises :class:`EditError` saying what is wrong."""
    if not isinstance(d, dict):
        raise EditError(f"an edit is a JSON object with an 'op', got {type(d).__name__}")
    op = d.get("op")
    if not isinstance(op, str) or op not in EDITS:
        raise EditError(f"unknown op {op!r:.60}; expected one of {', '.join(EDITS)}")
    return EDITS[op].from_dict(d)


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


def dot_product_ops() -> list[str]:
    """The ops a dot-product model takes (it has no field: only head outputs)."""
    return [op for op, cls in EDITS.items() if cls.dot_product is not None]


def ops_for(model: nn.Module) -> list[str]:
    """The ops some layer of ``model`` takes (:meth:`Edit.takes`), in registry order."""
    return [op for op, cls in EDITS.items() if any(cls.takes(block.attn) for block in model.blocks)]


OP_SAID = "the op; allOf says which fields each op takes (if op is …, then …) and which it needs"


def edits_schema() -> dict[str, Any]:
    """An edit list as JSON Schema, from the registry, for API and MCP clients: every field name with its kind,
    choices and range (a name means one thing in every op), and per op (``if`` that op ``then``) its fields as it
    declares them, their defaults and the ones it needs. ``if``/``then`` rather than ``oneOf``: a validator then
    says which field is wrong ("'beta' is not one of …"), not only that an edit fits no op."""
    takers: dict[str, list[str]] = {}
    for op, cls in EDITS.items():
        for name in cls.params():
            takers.setdefault(name, []).append(op)
    props = {"op": {"enum": list(EDITS), "description": OP_SAID}}
    props |= {name: _any_op(name, ops) for name, ops in takers.items()}
    return {
        "type": "array",
        "maxItems": MAX_EDITS,
        "description": "edits applied in order: JSON objects, each with an op and that op's fields",
        "items": {
            "type": "object",
            "properties": props,
            "required": ["op"],
            "allOf": [
                {"if": {"properties": {"op": {"const": op}}, "required": ["op"]}, "then": _op_schema(op, cls)}
                for op, cls in EDITS.items()
            ],
        },
    }


def _any_op(name: str, ops: list[str]) -> dict[str, Any]:
    """Field ``name`` as any of ``ops`` may hold it (null too when one of them may leave it out), with each op's
    help."""
    params = [EDITS[op].params()[name] for op in ops]
    helps: dict[str, list[str]] = {}
    for op, p in zip(ops, params, strict=True):
        helps.setdefault(p.help, []).append(op)
    said = params[0].help if len(helps) == 1 else " | ".join(f"{', '.join(o)}: {h}" for h, o in helps.items())
    optional = any(p.optional for p in params)
    return dataclasses.replace(params[0], optional=optional, help=said).json_schema()


def _op_schema(op: str, cls: type[Edit]) -> dict[str, Any]:
    """What ``op`` takes: its fields as it declares them, their defaults, and the ones it needs."""
    params, defaults = cls.params(), {f.name: f.default for f in fields(cls)}
    props: dict[str, Any] = {}
    for name, p in params.items():
        given = not p.required and defaults[name] not in (dataclasses.MISSING, None)
        props[name] = p.json_schema() | ({"default": p.to_json(defaults[name])} if given else {})
    return {
        "title": op,
        "description": _summary(cls),
        "properties": props,
        "required": [name for name, p in params.items() if p.required],
    }


def _summary(cls: type[Edit]) -> str:
    """The first paragraph of an op's docstring, on one line."""
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def ops_help() -> str:
    """Every op and its fields, from the registry: the CLI's help and the API's description."""
    lines = []
    for op, cls in EDITS.items():
        lines.append(f"{op}: {_summary(cls)}")
        lines += [f"    {name}: {p.describe()}" for name, p in cls.params().items()]
    return "\n".join(lines)


def _common_problems(edit: Edit, model: nn.Module) -> list[str]:
    depth = len(model.blocks)
    if not 0 <= edit.layer < depth:
        return [f"layer {edit.layer} does not exist (the model has layers 0–{depth - 1})"]
    attn = model.blocks[edit.layer].attn
    head = getattr(edit, "head", None)
    if head is not None and not 0 <= head < attn.num_heads:
        return [f"head {head} does not exist (layer {edit.layer} has heads 0–{attn.num_heads - 1})"]
    if not isinstance(attn, SSOGAttention) and not edit.works_on_dot_product():
        what = " and ".join(w for cls in EDITS.values() if (w := cls.dot_product_words()))
        return [
            f"{edit.op} edits the Gaussian field, which layer {edit.layer} does not have (it is dot-product "
            f"attention): only {what} work on it"
        ]
    return []


def check_edits(
    model: nn.Module,
    edits: Sequence[Edit],
    sources: Mapping[str, Any] | None = None,
    has_means: bool = False,
    has_attention: bool = False,
) -> None:
    """Raise :class:`EditError` listing every edit that cannot be applied to ``model`` (checked before any work)."""
    if len(edits) > MAX_EDITS:
        raise EditError(f"at most {MAX_EDITS} edits, got {len(edits)}")
    ctx = CheckContext(sources or {}, has_means, has_attention)
    problems = []
    left: dict[tuple[int, int], set[int]] = {}
    for i, e in enumerate(edits):
        found = _common_problems(e, model)
        if not found:
            found = e.problems(model.blocks[e.layer].attn, model, ctx)
        problems += [f"edit {i + 1} ({e.op}): {p}" for p in found]
        head = getattr(e, "head", None)
        if found or head is None:
            continue
        r = getattr(model.blocks[e.layer].attn, "num_atoms", 0)
        remaining = e.atoms_left(left.get((e.layer, head), set(range(r))), r)
        left[(e.layer, head)] = remaining
        if r and not remaining:
            problems.append(f"edit {i + 1} ({e.op}): layer {e.layer}, head {head} would have no atom left")
    if problems:
        raise EditError("; ".join(problems))
