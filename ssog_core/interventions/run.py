"""An edit list applied to a model for one ``with`` block: :func:`edited`, and the unedited recordings it needs
(patch sources, dataset means, the mean patch attention).

The edits act at the hook points (:mod:`ssog_core.interventions.hooks`), so the logits,
:func:`~ssog_core.analysis.measures.attention_maps`, :func:`~ssog_core.analysis.measures.export_maps`, rollout and
the steering offsets all see the same edited model, a compiled one too. Nothing is written into the model and
nothing outlives the block, even with many threads sharing the model; work handed to another thread or a pool
inside the block sees the edits when wrapped with :func:`~ssog_core.nn.hook_points.in_context`. Patch sources are
run on the *unedited* model (as activation patching takes its cache from a clean run). Dot-product and RBF models
take ``ablate_head``, ``patch_head`` with ``what="output"`` and ``replace_with_field``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

from ssog_core.analysis.head_as_field import MeanAttention
from ssog_core.analysis.head_as_field import mean_attention as reduce_mean_attention
from ssog_core.field import Field
from ssog_core.interventions.edit import Edit, EditError, LayerInputs, Recorded, check_edits, parse_edits
from ssog_core.nn.hook_points import HookPoint, PointFn, evaluating, hooked, reading


def record(model: nn.Module, img: Tensor) -> list[Recorded]:
    """What every layer of the *unedited* model computes on ``img``: bounded probes and per-head outputs."""
    points: dict[tuple[int, str | None], HookPoint] = {}
    for i, block in enumerate(model.blocks):
        points[(i, None)] = block.attn.head_out
        for tap, point in getattr(block.attn, "probes", {}).items():
            points[(i, tap)] = point
    with torch.inference_mode(), evaluating(), reading(points, replace=True) as seen:  # replace: the unedited model
        model(img)
    probes: list[dict[str, Tensor]] = [{} for _ in model.blocks]
    for (layer, tap), a in seen.items():
        if tap is not None:
            probes[layer][tap] = a
    return [Recorded(probes[i], seen.get((i, None))) for i in range(len(model.blocks))]


def mean_head_outputs(model: nn.Module, batches: Iterable[Tensor]) -> list[Tensor]:
    """Per layer, each head's mean output per token position ``(N, H, D)`` over the images (unedited model):
    what ``ablate_head`` with ``mode="dataset_mean"`` puts in an ablated head's place."""
    sums: list[Tensor] | None = None
    count = 0
    for x in batches:
        outs = [s.output.double().sum(0) for s in record(model, x)]
        sums = outs if sums is None else [a + b for a, b in zip(sums, outs, strict=True)]
        count += x.shape[0]
    if sums is None or count == 0:
        raise EditError("the dataset mean needs at least one image")
    return [s / count for s in sums]


def mean_attention(model: nn.Module, batches: Iterable[Tensor]) -> list[MeanAttention]:
    """Per layer, the *unedited* model's patch attention averaged over the images (one size): what
    ``replace_with_field`` puts in a head's place is made from it
    (:func:`~ssog_core.analysis.head_as_field.mean_attention`, the reduction every head field is made from)."""
    try:
        with hooked({}, replace=True):  # the unedited model, inside any edit block
            return reduce_mean_attention(model, batches)
    except ValueError as e:
        raise EditError(str(e)) from None


def _layer_points(attn: nn.Module, edits: list[Edit], inputs: LayerInputs) -> dict[int, PointFn]:
    """The functions the layer's hook points run: each edit's effect, in list order."""

    def on_field(f: Field) -> Field:
        for e in edits:
            f = e.on_field(f, inputs)
        return f

    def on_probe(tap: str) -> PointFn:
        def fn(p: Tensor) -> Tensor | None:
            for e in edits:
                p = e.on_probe(tap, p, inputs)
                if p is None:
                    return None
            return p

        return fn

    def on_pattern(a: Tensor) -> Tensor:
        for e in edits:
            a = e.on_pattern(a, inputs)
        return a

    def on_head_out(y: Tensor) -> Tensor:
        for e in edits:
            y = e.on_head_out(y, inputs)
        return y

    points = {id(attn.head_out): on_head_out}
    if any(type(e).on_pattern is not Edit.on_pattern for e in edits):  # only then is the pattern formed
        points[id(attn.pattern)] = on_pattern
    if isinstance(getattr(attn, "field", None), nn.Module):
        points[id(attn.field)] = on_field
    for tap, point in getattr(attn, "probes", {}).items():
        points[id(point)] = on_probe(tap)
    return points


@contextlib.contextmanager
def edited(
    model: nn.Module,
    edits: Sequence[Edit | dict],
    sources: Mapping[str, Tensor] | None = None,
    head_means: Sequence[Tensor] | None = None,
    attention: Sequence[MeanAttention] | None = None,
) -> Iterator[list[Edit]]:
    """Run ``model`` with ``edits`` applied, for this block and this thread only.

    Args:
        model: a :class:`~ssog_core.nn.vit.ViT`; it is never modified.
        edits: edits (or their JSON dicts, for scripts), applied in order.
        sources: patch sources: the name an edit gives → the model input ``(1, C, H, W)`` of that image.
        head_means: per layer ``(N, H, D)`` from :func:`mean_head_outputs`, for ``dataset_mean`` ablation.
        attention: per layer from :func:`mean_attention`, for ``replace_with_field``.
    Yields the parsed edits. Raises :class:`~ssog_core.interventions.edit.EditError` (before any work) for edits
    that cannot be applied. An inner ``edited`` block replaces the outer one's edits while it runs.
    """
    parsed = parse_edits(list(edits))
    check_edits(model, parsed, sources, head_means is not None, attention is not None)
    used = sorted({name for e in parsed for name in e.sources()})
    recorded = {name: record(model, sources[name]) for name in used}
    points: dict[int, PointFn] = {}
    removed: dict[int, frozenset[int]] = {}
    for layer, block in enumerate(model.blocks):
        mine = [e for e in parsed if e.layer == layer]
        if mine:
            inputs = LayerInputs(
                {name: rec[layer] for name, rec in recorded.items()},
                None if head_means is None else head_means[layer],
                None if attention is None else attention[layer],
            )
            points |= _layer_points(block.attn, mine, inputs)
            removed[id(block.attn)] = frozenset(h for e in mine if (h := e.removed_head()) is not None)
    with hooked(points, removed, replace=True):
        yield parsed
