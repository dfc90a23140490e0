"""Where attention goes on ``pointer``: of the attention patch queries put on the three discs, the share on the disc
the cue points at (the *target share*), per layer and head, read through every model's ``blocks.{l}.attn.pattern``.

A model that does not tell the discs apart spreads its disc attention evenly: 1/3. Above 1/3 the layer sends
attention to the answer; read with every μ gate closed (:data:`CLOSE_MU`), it says whether steering is what sends it.

A patch's membership of a disc is the disc's mean coverage of the patch (the painted, anti-aliased area), so the
attention a query puts on disc ``d`` is ``Σ_k A[q, k] · cover_d[k]`` over patch keys ``k``. The discs lie 3.5 cells
apart with radius 1, so no patch belongs to two. An image's share pools every patch query and head of a layer
(per head too); intervals are paired 95% bootstrap intervals over the images (``effects.bootstrap_ci``), the same
draws for every layer, so two readings of the same images (a model and its twin, a model with its gates closed) are
compared image by image.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ssog_core.data.pointer import PointerDataset, Scene
from ssog_core.data.sources import DataError, open_data
from ssog_core.interventions.effects import bootstrap_ci
from ssog_core.interventions.hooks import hook_points, run_with_cache
from ssog_core.interventions.run import edited
from ssog_core.interventions.validation import EvalSet, load_eval_set
from ssog_core.runtime.jobs import Cancelled

CHANCE = 1 / 3  # three discs, none told apart
BATCH = 50
Stop = Callable[[], bool]


def close_mu(model: nn.Module) -> list[dict]:
    """Every layer's μ gate closed (an empty list for a model without μ steering)."""
    config = getattr(model, "config", None)
    if getattr(config, "attn", None) != "ssog" or "mu" not in tuple(config.steer):
        return []
    return [{"op": "close_gate", "layer": layer, "tap": "mu"} for layer in range(config.depth)]


def pointer_scenes(meta: dict[str, Any], img_size: Sequence[int]) -> PointerDataset:
    """The validation split of a ``pointer`` checkpoint's recorded data at ``img_size``; any other model is refused
    in words (:class:`DataError`)."""
    spec = meta.get("data") or ""
    source = open_data(spec, (int(img_size[0]), int(img_size[1]))) if spec.startswith("pointer") else None
    if source is None or not isinstance(source.val, PointerDataset):
        raise DataError(f"the target share is defined on pointer scenes; this model's data is {spec or 'not recorded'}")
    return source.val


def scene_discs(meta: dict[str, Any], img_size: Sequence[int], n: int) -> Tensor:
    """Each disc's coverage ``(n, 3, H, W)`` (the pointed disc first) of the first ``n`` validation images of a
    ``pointer`` checkpoint's recorded data at ``img_size``: the images that ``load_eval_set`` loads."""
    scenes = pointer_scenes(meta, img_size)
    return torch.from_numpy(np.stack([scenes.scene(i).discs for i in range(n)]))


def patch_cover(discs: Tensor, patch: int) -> Tensor:
    """``(n, 3, H, W)`` coverage → ``(n, 3, Gh·Gw)``: its mean over each patch, row-major like the tokens."""
    return F.avg_pool2d(discs.double(), patch).flatten(2)


@dataclass
class TargetShare:
    """Per image, layer and head: attention on the pointed disc ``on_target`` and on all three ``on_discs``
    (summed over patch queries); shares are their ratios."""

    on_target: np.ndarray  # (n, L, H)
    on_discs: np.ndarray  # (n, L, H)
    images: dict[str, Any]
    edits: list[dict]

    def per_image(self) -> np.ndarray:
        """``(n, L)``: each image's share per layer, every head pooled."""
        return self.on_target.sum(-1) / self.on_discs.sum(-1)

    def per_head(self) -> np.ndarray:
        """``(L, H)``: each head's share over all images pooled."""
        return self.on_target.sum(0) / self.on_discs.sum(0)

    def layers(self) -> list[dict[str, Any]]:
        """Per layer: the mean share over images with its 95% interval, and each head's pooled share."""
        shares = self.per_image()
        ci = np.atleast_2d(bootstrap_ci(shares.T))
        heads = self.per_head()
        return [
            {
                "layer": layer,
                "share": float(shares[:, layer].mean()),
                "ci95": [float(ci[layer, 0]), float(ci[layer, 1])],
                "heads": [float(h) for h in heads[layer]],
            }  # fmt: skip
            for layer in range(shares.shape[1])
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"chance": CHANCE, "images": self.images, "edits": self.edits, "layers": self.layers()}


def target_share(
    model: nn.Module, data: EvalSet, cover: Tensor, edits: Sequence[dict] = (), stop: Stop | None = None
) -> TargetShare:
    """The target share of ``model`` (with ``edits`` applied, e.g. :func:`close_mu`) on ``data``, whose discs cover
    the patches as ``cover`` ``(n, 3, N)`` says; ``stop`` is asked before each batch (true: :class:`Cancelled`)."""
    if cover.shape[0] != len(data) or cover.shape[1] != 3:
        raise ValueError(f"cover must be (n={len(data)}, 3, patches), got {tuple(cover.shape)}")
    names = [n for n in hook_points(model) if n.endswith(".attn.pattern")]
    if not names:
        raise ValueError("this model has no attention pattern hook points (blocks.{l}.attn.pattern)")
    on_target, on_discs, start = [], [], 0
    with torch.no_grad(), edited(model, list(edits)):
        for x in data.batches(model, BATCH):
            if stop is not None and stop():
                raise Cancelled("the target share was stopped")
            _, cache = run_with_cache(model, x, names)
            c = cover[start : start + len(x)]
            start += len(x)
            per_layer = []
            for name in names:
                a = cache[name].double()  # (B, H, T, T)
                n = c.shape[-1]
                if a.shape[-1] < n:
                    raise ValueError(f"{name} has {a.shape[-1]} tokens, fewer than the scene's {n} patches")
                p = a.shape[-1] - n  # prefix tokens come first
                per_layer.append(torch.einsum("bhqk,bdk->bhd", a[:, :, p:, p:], c.to(a.dtype)))  # (B, H, 3)
            on = torch.stack(per_layer, 1)  # (B, L, H, 3)
            on_target.append(on[..., 0])
            on_discs.append(on.sum(-1))
    return TargetShare(torch.cat(on_target).numpy(), torch.cat(on_discs).numpy(), data.describe(), list(edits))


def pointer_eval_set(model: nn.Module, meta: dict[str, Any], n: int | None = None) -> tuple[EvalSet, Tensor]:
    """The first ``n`` validation images of a ``pointer`` checkpoint's recorded data and their discs' patch
    coverage ``(n, 3, N)``; any other model is refused in words before an image is made."""
    size = model.config.img_size
    pointer_scenes(meta, size)
    data = load_eval_set(meta, size, n)
    return data, patch_cover(scene_discs(meta, size, len(data)), model.config.patch_size)


def read_target_share(
    model: nn.Module, meta: dict[str, Any], n: int | None = None, edits: Sequence[dict] = ()
) -> TargetShare:
    """:func:`target_share` on the first ``n`` validation images of a ``pointer`` checkpoint's recorded data."""
    return target_share(model, *pointer_eval_set(model, meta, n), edits)


def paired(a: TargetShare, b: TargetShare) -> list[dict[str, Any]]:
    """Per layer, the mean over images of ``a``'s share − ``b``'s, with its paired 95% interval (same images)."""
    if a.images != b.images:
        raise ValueError("a paired difference needs the same images on both sides")
    diff = a.per_image() - b.per_image()
    ci = np.atleast_2d(bootstrap_ci(diff.T))
    return [{"layer": layer, "change": float(diff[:, layer].mean()), "ci95": [float(ci[layer, 0]),
             float(ci[layer, 1])]} for layer in range(diff.shape[1])]  # fmt: skip


def target_share_report(
    model: nn.Module, meta: dict[str, Any], n: int | None = None, per_image: bool = False, stop: Stop | None = None
) -> dict[str, Any]:
    """The readout as the CLI and the app give it: per layer the share, and for a model that steers μ the share with
    every μ gate closed and the paired change (does steering send attention to the pointed disc?); ``per_image``
    adds each image's share per layer ``(n, L)``, rounded, for pairing two models image by image later. ``stop``
    is asked before each batch of each pass (one, or two for a model that steers μ)."""
    data, cover = pointer_eval_set(model, meta, n)
    unedited = target_share(model, data, cover, stop=stop)
    out: dict[str, Any] = {**unedited.to_dict(), "closed_mu": None}
    if per_image:
        out["per_image"] = np.round(unedited.per_image(), 5).tolist()
    if edits := close_mu(model):
        closed = target_share(model, data, cover, edits, stop)
        out["closed_mu"] = {"layers": closed.layers(), "change": paired(closed, unedited)}
    return out


@dataclass(frozen=True)
class ImageShare:
    """One validation image of a ``pointer`` model's data: its scene (the discs' coverage, the pointed one first)
    and its share per layer, unedited and, for a model that steers μ, with every μ gate closed."""

    index: int
    scene: Scene
    class_name: str
    shares: list[float]
    closed_mu: list[float] | None


def image_target_share(model: nn.Module, meta: dict[str, Any], index: int) -> ImageShare:
    """Validation image ``index``'s target share per layer: the row :meth:`TargetShare.per_image` gives that image
    among the first ``index + 1``, read from its scene alone."""
    size = model.config.img_size
    scenes = pointer_scenes(meta, size)
    try:
        scene = scenes.scene(int(index))
    except IndexError:
        raise ValueError(f"pick a validation image from 0 to {len(scenes) - 1}, not {index}") from None
    names = list(scenes.class_names)
    data = EvalSet(torch.from_numpy(scene.image[None].copy()), torch.tensor([scene.label]), names,
                   str(meta["data"]), meta.get("normalization"))  # fmt: skip
    cover = patch_cover(torch.from_numpy(scene.discs[None]), model.config.patch_size)

    def shares(edits: list[dict]) -> list[float]:
        return target_share(model, data, cover, edits).per_image()[0].tolist()

    edits = close_mu(model)
    return ImageShare(int(index), scene, names[scene.label], shares([]), shares(edits) if edits else None)


def report_text(report: dict[str, Any]) -> str:
    """The readout as a table, one line per layer."""
    images = report["images"]
    closed = report["closed_mu"]
    head = "layer  share [95% interval]" + ("     μ gates closed        change [95% interval]" if closed else "")
    what = f"attention on the pointed disc / on all three; {report['chance']:.3f} = not told apart"
    lines = [f"target share on the first {images['first']} validation images of {images['data']} ({what})", head]
    for i, layer in enumerate(report["layers"]):
        line = f"{layer['layer']:>5}  {layer['share']:.3f} [{layer['ci95'][0]:.3f}, {layer['ci95'][1]:.3f}]"
        if closed:
            c, d = closed["layers"][i], closed["change"][i]
            line += (f"   {c['share']:.3f} [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]"
                     f"   {d['change']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]")  # fmt: skip
        lines.append(line)
    return "\n".join(lines)
