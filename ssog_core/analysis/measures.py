"""Interpretability quantities behind every picture (docs/DESIGN.md §3). The app only draws these.

All functions take a model and tensors, run under ``torch.inference_mode`` with eval semantics for the call (no
dropout, :func:`~ssog_core.nn.hook_points.evaluating`: the model's ``training`` is never written, another thread may
be training it), read what the attention saw at the hook points, and return plain tensors or small dataclasses:

* :func:`layer_fields` — per layer: each head's field over relative position, atoms, gate scales, stats;
* :func:`steering_offsets` — per layer: how content moved every token's atoms;
* :func:`attention_maps` — the exact per-layer, per-head attention matrices for an input, obtained by
  running each layer's own operator on an identity basis (so the picture is the computation);
* :func:`export_maps` — pull-in / pull-out / net export per layer and accumulated, and attention rollout;
* :func:`head_stats` — attention entropy and effective radius per head (:func:`query_stats` for one query).

Prefix (register) tokens: maps cover the patch tokens only. Their columns are removed from each
attention matrix and every patch row is renormalised to sum to 1; the removed mass is reported as
``prefix_share`` so nothing is hidden.

Models with keys (dot / RBF, ViT or causal LM; :func:`has_keys`): :func:`key_norms` gives the key-norm
distribution of every layer and how much attention the largest keys take — the RBF source's "magnitude
bullying" question (do a few huge keys hoard dot-product attention, and does distance attention stop it?).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ssog_core.field import Field, FieldMode, attention_matrix, displacement_density
from ssog_core.nn.attention import RBFAttention, SSOGAttention
from ssog_core.nn.hook_points import evaluating, reading, removed_heads

DEFAULT_IMAGES = (
    64  # images a mean over a model's images takes unless asked otherwise: the validation control, head fields
)
DEFAULT_ALPHA = 0.5  # residual mixing Â = α·Ā + (1 − α)·I: half of a block's output is its own residual


@contextlib.contextmanager
def _eval() -> Iterator[None]:
    with torch.inference_mode(), evaluating():
        yield


def _grid_positions(grid: tuple[int, int], device: torch.device, dtype: torch.dtype) -> Tensor:
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh, device=device), torch.arange(gw, device=device), indexing="ij")
    return torch.stack([ys.reshape(-1), xs.reshape(-1)], dim=-1).to(dtype)  # (N, 2)


def head_stats(attn: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
    """Per-head summaries of patch attention ``attn`` (``(..., H, N, N)``, rows sum to 1), averaged over queries
    (and any leading dimensions):

    * ``entropy``: mean over queries of ``−Σ_k A log A`` (nats; ``log N`` is uniform attention);
    * ``radius``: mean over queries of the RMS query–key distance ``sqrt(Σ_k A ‖p_q − p_k‖²)`` in grid cells.
    """
    pos = _grid_positions(grid, attn.device, attn.dtype)
    dist2 = torch.cdist(pos, pos).square()
    entropy, radius = _entropy_radius(attn, dist2)
    lead = tuple(range(attn.dim() - 3))
    return {"entropy": entropy.mean(dim=(*lead, -1)), "radius": radius.mean(dim=(*lead, -1))}


def _entropy_radius(attn: Tensor, dist2: Tensor) -> tuple[Tensor, Tensor]:
    """``−Σ_k A log A`` and ``sqrt(Σ_k A d²)`` over the last axis (keys)."""
    entropy = -(attn * torch.log(attn.clamp_min(1e-30))).sum(-1)
    radius = (attn * dist2).sum(-1).clamp_min(0).sqrt()
    return entropy, radius


def query_stats(row: Tensor, query: tuple[int, int]) -> dict[str, Tensor]:
    """:func:`head_stats` for one query: entropy (nats) and effective radius (grid cells) of its attention
    ``row`` (``(..., Gh, Gw)``, sums to 1 over the grid), e.g. a :func:`~ssog_core.field.query_field`."""
    gh, gw = row.shape[-2:]
    pos = _grid_positions((gh, gw), row.device, row.dtype)
    q = torch.tensor(query, device=row.device, dtype=row.dtype)
    dist2 = (pos - q).square().sum(-1)  # (N,)
    entropy, radius = _entropy_radius(row.reshape(*row.shape[:-2], gh * gw), dist2)
    return {"entropy": entropy, "radius": radius}


def ssog_layers(model: nn.Module) -> list[SSOGAttention]:
    """The SSOG attention module of every block (empty for dot / RBF models)."""
    return [b.attn for b in model.blocks if isinstance(b.attn, SSOGAttention)]


@dataclass
class LayerField:
    """One layer's learned geometry (all tensors on CPU, float32).

    Attributes:
        density: ``(H, 2E_y+1, 2E_x+1)`` attention of a centre query over key offsets ``key − query``
            (index ``[h, E_y + oy, E_x + ox]``), computed with the layer's own kernels.
        extent: ``(E_y, E_x)``.
        mu: ``(H, R, 2)`` atom centres (query − key); an atom looks at offset ``−μ``.
        sigma: ``(H, R, 2)`` atom widths σ in grid cells (the softmax width is ``σ·√τ``).
        lam: ``(H, R)`` atom weights λ.
        tau: the layer temperature.
        gates: positive scale ``s`` of each enabled tap (``{"mu": .., "sigma": .., "lambda": ..}``).
        entropy, radius: ``(H,)`` stats of the fixed field on the model's grid (:func:`head_stats`).
        spread: ``(H, 2)`` standard deviation (y, x) of the centre query's field over key displacement on
            the model's grid, in grid cells (:func:`density_moments`).
        reach: ``(H,)`` RMS key distance from that query (grid cells): how far a head reads.
    """

    density: Tensor
    extent: tuple[int, int]
    mu: Tensor
    sigma: Tensor
    lam: Tensor
    tau: float
    gates: dict[str, float]
    entropy: Tensor
    radius: Tensor
    spread: Tensor
    reach: Tensor

    @property
    def elongation(self) -> Tensor:
        """``(H,)`` ratio of the larger to the smaller of a head's two spreads: a head is elongated from
        ``presets.ELONGATED_RATIO`` (2) and a strip only from ``presets.STRIP_RATIO`` (3)."""
        return self.spread.max(-1).values / self.spread.min(-1).values.clamp_min(1e-6)


def density_moments(density: Tensor) -> tuple[Tensor, Tensor]:
    """Spread and reach of fields over key displacement ``(..., 2E_y+1, 2E_x+1)`` (centre = the query).

    Returns ``(spread, reach)``: the standard deviation along y and x ``(..., 2)`` and the RMS distance of the
    keys from the query ``(...)``, both in grid cells. The density is renormalised first, so a field cut by
    the grid's edge is measured on what the grid holds.
    """
    ny, nx = density.shape[-2:]
    p = density / density.sum(dim=(-2, -1), keepdim=True)
    oy = torch.arange(ny, dtype=p.dtype, device=p.device) - (ny - 1) / 2
    ox = torch.arange(nx, dtype=p.dtype, device=p.device) - (nx - 1) / 2
    py, px = p.sum(-1), p.sum(-2)  # marginals over y and x
    var = []
    for marginal, offsets in ((py, oy), (px, ox)):
        mean = (marginal * offsets).sum(-1, keepdim=True)
        var.append((marginal * (offsets - mean).square()).sum(-1))
    reach = ((py * oy.square()).sum(-1) + (px * ox.square()).sum(-1)).sqrt()
    return torch.stack(var, dim=-1).clamp_min(0).sqrt(), reach


def layer_field(attn: SSOGAttention, grid: tuple[int, int], extent: tuple[int, int] | None = None) -> LayerField:
    """Geometry of one SSOG layer; ``extent`` defaults to the farthest offset on ``grid``."""
    gates = {k: float(v) for k, v in attn.gate_scales().items()}
    return field_geometry(attn.fixed_field(), grid, attn.mode, gates, extent)


def field_geometry(
    field: Field, grid: tuple[int, int], mode: FieldMode, gates: dict[str, float], extent: tuple[int, int] | None = None
) -> LayerField:
    """Geometry of a fixed ``field`` with its layer's gate scales: a layer's own (:func:`layer_field`) or one a
    training history recorded (:func:`ssog_core.analysis.trajectory.snapshot_layer_fields`), measured alike."""
    gh, gw = grid
    extent = extent or (gh - 1, gw - 1)
    stats = head_stats(attention_matrix(field, grid, mode)[0], grid)
    density = displacement_density(field, extent, mode).float().cpu()
    on_grid = density if extent == (gh - 1, gw - 1) else displacement_density(field, (gh - 1, gw - 1), mode)
    spread, reach = density_moments(on_grid.double())
    return LayerField(
        density=density,
        extent=extent,
        mu=field.mu.detach().float().cpu(),  # detached: .float() on a float32 parameter returns the parameter
        sigma=field.sigma.float().cpu(),
        lam=field.lam().float().cpu(),
        tau=float(field.tau),
        gates=dict(gates),
        entropy=stats["entropy"].float().cpu(),
        radius=stats["radius"].float().cpu(),
        spread=spread.float().cpu(),
        reach=reach.float().cpu(),
    )


def layer_fields(model: nn.Module, extent: tuple[int, int] | None = None) -> list[LayerField]:
    """Geometry of every SSOG layer of ``model`` on its training grid (empty list for other models)."""
    with _eval():
        return [layer_field(a, model.config.grid, extent) for a in ssog_layers(model)]


def _layer_inputs(model: nn.Module, inputs: Tensor) -> tuple[list[Tensor], tuple[int, int], Tensor]:
    """The model's own forward on ``inputs`` (images, or a language model's token ids): what every block's attention
    saw (hook point ``attn.hook_in``, under any active edit), the token grid (``(1, T)`` for a sequence) and the
    logits."""
    with reading({i: b.attn.hook_in for i, b in enumerate(model.blocks)}) as seen:
        logits = model(inputs)
    grid = (1, inputs.shape[1]) if inputs.dim() == 2 else model.grid_for(inputs.shape[-2], inputs.shape[-1])
    return [seen[i] for i in range(len(model.blocks))], grid, logits


@dataclass
class SteeringOffsets:
    """How content moved the atoms, per layer (lists over SSOG layers; tensors on CPU).

    Attributes:
        dmu: ``(B, Gh, Gw, H, R, 2)`` change of μ (query − key convention) per token and atom.
        shift: ``(B, Gh, Gw, H, 2)`` λ-weighted mean change of *where the head looks*, ``−Σ_r λ_r Δμ_r``
            (key-space direction: draw arrows with it).
        sigma_ratio: ``(B, Gh, Gw, H, R, 2)`` steered σ / fixed σ.
        dlam: ``(B, Gh, Gw, H, R)`` steered λ − fixed λ.
        logits: ``(B, classes)`` the model's output on the same input.
    """

    dmu: list[Tensor]
    shift: list[Tensor]
    sigma_ratio: list[Tensor]
    dlam: list[Tensor]
    logits: Tensor


def steering_offsets(model: nn.Module, img: Tensor) -> SteeringOffsets:
    """Per token, head and atom: the μ, σ and λ changes content made (zero for untapped parts)."""
    with _eval():
        inputs, grid, logits = _layer_inputs(model, img)
        out = SteeringOffsets([], [], [], [], logits.float().cpu())
        for block, x in zip(model.blocks, inputs, strict=True):
            attn = block.attn
            if not isinstance(attn, SSOGAttention):
                continue
            fixed, steered = attn.field_of(x, grid, steered=False), attn.field_of(x, grid)  # both under any active edit
            if not steered.per_token:  # fixed-field layer: content moves nothing
                b, (gh, gw) = x.shape[0], grid
                steered = Field(
                    *(t.expand(b, gh, gw, *t.shape) for t in (fixed.mu, fixed.sigma, fixed.log_lam)), fixed.tau
                )
            dmu = steered.mu - fixed.mu
            lam = steered.lam()
            out.dmu.append(dmu.float().cpu())
            out.shift.append((-(lam[..., None] * dmu).sum(-2)).float().cpu())
            out.sigma_ratio.append((steered.sigma / fixed.sigma).float().cpu())
            out.dlam.append((lam - fixed.lam()).float().cpu())
        return out


@dataclass
class AttentionMaps:
    """Exact attention of every layer for an input.

    Attributes:
        attn: per layer ``(B, H, N, N)`` over patch tokens (prefix columns removed, rows renormalised).
        prefix_share: per layer ``(B, H, N)`` mass each patch query put on prefix tokens (zeros if none).
        grid: the patch grid ``(Gh, Gw)``.
        logits: ``(B, classes)``.
        removed: per layer, the heads an active intervention ablated or patched: their output is not this
            input's attention, so head means (export maps, rollout) leave them out.
    """

    attn: list[Tensor]
    prefix_share: list[Tensor]
    grid: tuple[int, int]
    logits: Tensor
    removed: list[frozenset[int]]

    def head_mean(self, layer: int) -> Tensor:
        """``(B, N, N)`` mean over the heads that remain in ``layer`` (float64); the identity when none remains
        (the attention branch then adds nothing and the block passes its residual on)."""
        a = self.attn[layer].double()
        keep = [h for h in range(a.shape[1]) if h not in self.removed[layer]]
        if not keep:
            return torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand(a.shape[0], -1, -1)
        return a[:, keep].mean(dim=1)


def query_rows(attn: Tensor, query: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """``(..., Gh, Gw)``: the row of patch query ``query`` (its grid cell) of patch attention ``(..., N, N)``, laid
    out on the patch grid: where that query looks."""
    gh, gw = grid
    if attn.shape[-1] != gh * gw or not (0 <= query[0] < gh and 0 <= query[1] < gw):
        raise ValueError(
            f"query {tuple(query)} on a {gh}×{gw} grid does not fit attention of shape {tuple(attn.shape)}"
        )
    return attn[..., query[0] * gw + query[1], :].reshape(*attn.shape[:-2], gh, gw)


def _patch_block(a: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    """Patch-to-patch part of ``a`` (``(B, H, P+N, P+N)``), rows renormalised, and the prefix share."""
    rows = a[..., prefix:, :]
    share = rows[..., :prefix].sum(-1)
    patch = rows[..., prefix:]
    return patch / patch.sum(-1, keepdim=True).clamp_min(1e-30), share


def attention_maps(model: nn.Module, img: Tensor, steered: bool = True) -> AttentionMaps:
    """Per-layer, per-head attention matrices for ``img`` (``(B, C, H, W)``).

    ``steered=False`` gives what the fixed field alone would do on the same input (SSOG layers only).
    """
    prefix = model.num_prefix_tokens
    with _eval():
        inputs, grid, logits = _layer_inputs(model, img)
        maps, shares, removed = [], [], []
        for block, x in zip(model.blocks, inputs, strict=True):
            removed.append(removed_heads(block.attn))
            if isinstance(block.attn, SSOGAttention):
                a = block.attn.attention_matrix(x, grid, steered=steered)
            else:
                a = block.attn.attention_matrix(x, grid)
            patch, share = _patch_block(a.to(torch.promote_types(a.dtype, torch.float32)), prefix)
            maps.append(patch)
            shares.append(share)
        return AttentionMaps(maps, shares, grid, logits, removed)


@dataclass
class ExportMaps:
    """The information economy of a forward pass (all arrays ``(B, L, Gh, Gw)`` unless noted).

    Attributes:
        pull_in: ``1 − Â_ii``: how much patch i reads from the others.
        pull_out: ``Σ_j Â_ji − Â_ii``: how much the others read from patch i.
        net: ``pull_out − pull_in``; positive = source (exporter), negative = gatherer. Sums to 0 per layer.
        accumulated: ``(B, Gh, Gw)`` net summed over layers.
        rollout: ``(B, Gh, Gw)`` attention rollout (Abnar & Zuidema 2020) on the same Â: the mean-pooled
            output's share of each input patch (sums to 1).
        alpha: the residual mixing used.
        stats: per-layer per-head entropy / radius ``(L, H)``.
        prefix_share: ``(B, L)`` mean attention mass patch queries put on prefix tokens.
    """

    pull_in: Tensor
    pull_out: Tensor
    net: Tensor
    accumulated: Tensor
    rollout: Tensor
    alpha: float
    grid: tuple[int, int]
    stats: dict[str, Tensor]
    prefix_share: Tensor
    logits: Tensor

    def summary(self) -> dict[str, float]:
        """Range of the accumulated map and the share of net exporters (per image, then averaged)."""
        acc = self.accumulated
        return {
            "acc_min": float(acc.amin(dim=(-2, -1)).mean()),
            "acc_max": float(acc.amax(dim=(-2, -1)).mean()),
            "exporter_share": float((acc > 0).float().mean()),
        }


def residual_mix(mean_attn: Tensor, alpha: float = DEFAULT_ALPHA) -> Tensor:
    """``Â = α·Ā + (1 − α)·I`` for ``Ā`` of shape ``(..., N, N)``."""
    eye = torch.eye(mean_attn.shape[-1], device=mean_attn.device, dtype=mean_attn.dtype)
    return alpha * mean_attn + (1.0 - alpha) * eye


def export_maps(model: nn.Module, img: Tensor, alpha: float = DEFAULT_ALPHA) -> ExportMaps:
    """Pull-in / pull-out / net export per layer, accumulated, and rollout for ``img`` (``(B, C, H, W)``)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return export_maps_of(attention_maps(model, img), alpha)


def export_maps_of(maps: AttentionMaps, alpha: float = DEFAULT_ALPHA) -> ExportMaps:
    """:func:`compute_export_maps` from attention maps already computed (a caller that also shows them)."""
    gh, gw = maps.grid
    pull_in, pull_out, rollout = [], [], None
    entropy, radius = [], []
    for layer, a in enumerate(maps.attn):
        a_hat = residual_mix(maps.head_mean(layer), alpha)  # (B, N, N), float64 so Σ net = 0 stays exact
        diag = torch.diagonal(a_hat, dim1=-2, dim2=-1)
        pull_in.append(1.0 - diag)
        pull_out.append(a_hat.sum(dim=-2) - diag)
        rollout = a_hat if rollout is None else a_hat @ rollout
        s = head_stats(a, maps.grid)
        entropy.append(s["entropy"])
        radius.append(s["radius"])
    b = maps.logits.shape[0]
    pin = torch.stack(pull_in, 1).view(b, -1, gh, gw)
    pout = torch.stack(pull_out, 1).view(b, -1, gh, gw)
    net = pout - pin
    return ExportMaps(
        pull_in=pin.float().cpu(),
        pull_out=pout.float().cpu(),
        net=net.float().cpu(),
        accumulated=net.sum(1).float().cpu(),
        rollout=rollout.mean(dim=-2).float().view(b, gh, gw).cpu(),
        alpha=alpha,
        grid=maps.grid,
        stats={"entropy": torch.stack(entropy).cpu(), "radius": torch.stack(radius).cpu()},
        prefix_share=torch.stack([s.mean(dim=(1, 2)) for s in maps.prefix_share], 1).cpu(),
        logits=maps.logits.cpu(),
    )


# --- Key magnitudes ("magnitude bullying": do a few huge keys hoard attention in dot models, not in RBF?) ---

DEFAULT_TOP_K = 4  # a handful of keys: the attention-sink pattern is one or two tokens per head


def has_keys(model: nn.Module) -> bool:
    """Whether every layer of ``model`` has queries and keys (dot or RBF attention; SSOG has none)."""
    return all(hasattr(b.attn, "queries_keys_values") for b in model.blocks)


@dataclass
class KeyNorms:
    """Key magnitudes per layer and how much attention the largest keys receive (tensors on CPU, float32).

    Attributes:
        norms: per layer ``(B, H, P + N)``: ``‖k‖`` of every key the logits see (after QK-norm and SuSiE),
            prefix (register) keys first.
        prefix: P, the number of prefix keys.
        top_k: how many largest-norm keys ``topk_share`` follows.
        topk_share: ``(L, H)`` attention mass that non-prefix queries put on the ``top_k`` keys of largest
            norm (per image and head), averaged over queries and images.
        uniform_share: ``(L, H)`` the same keys' share under uniform attention over the keys each query may
            see: ``topk_share / uniform_share`` ≫ 1 means big keys hoard attention.
        prefix_share: ``(L, H)`` mass non-prefix queries put on the prefix keys (zeros if none).
        norm_attention_corr: ``(L, H)`` Pearson correlation, over keys, between ``‖k‖`` and the mean attention
            a key receives from non-prefix queries (averaged over images).
        kinds: the attention kind of each layer (``"dot"`` or ``"rbf"``).
    """

    norms: list[Tensor]
    prefix: int
    top_k: int
    topk_share: Tensor
    uniform_share: Tensor
    prefix_share: Tensor
    norm_attention_corr: Tensor
    kinds: list[str]

    @property
    def sink_ratio(self) -> Tensor:
        """``(L, H)`` ``topk_share / uniform_share``: how many times the attention uniform attention would give the
        ``top_k`` largest-norm keys they take (≫ 1: big keys hoard attention, an attention sink)."""
        return self.topk_share / self.uniform_share.clamp_min(1e-12)

    def histogram(self, bins: int = 40) -> tuple[Tensor, Tensor]:
        """Shared bin edges ``(bins + 1,)`` and per-layer densities ``(L, bins)`` of all key norms (heads pooled)."""
        top = max(max(float(n.max()) for n in self.norms), 1e-6) * (1 + 1e-6)  # the largest norm falls inside
        edges = torch.linspace(0.0, top, bins + 1)
        width = edges[1] - edges[0]
        dens = [
            torch.histc(n.flatten(), bins, float(edges[0]), float(edges[-1])) / (n.numel() * width) for n in self.norms
        ]
        return edges, torch.stack(dens)

    def summary(self) -> list[dict[str, float | int | str]]:
        """One row per layer and head: norm quantiles, top-k and prefix shares, and the norm–attention correlation."""
        rows = []
        for layer, n in enumerate(self.norms):
            q = torch.quantile(n.transpose(0, 1).flatten(1), torch.tensor([0.5, 0.99, 1.0]), dim=1)  # (3, H)
            for head in range(n.shape[1]):
                rows.append(
                    {
                        "layer": layer,
                        "head": head,
                        "attn": self.kinds[layer],
                        "median_norm": float(q[0, head]),
                        "p99_norm": float(q[1, head]),
                        "max_norm": float(q[2, head]),
                        "max_over_median": float(q[2, head] / q[0, head].clamp_min(1e-12)),
                        "topk_share": float(self.topk_share[layer, head]),
                        "uniform_share": float(self.uniform_share[layer, head]),
                        "prefix_share": float(self.prefix_share[layer, head]),
                        "norm_attention_corr": float(self.norm_attention_corr[layer, head]),
                    }
                )
        return rows


def _pearson(x: Tensor, y: Tensor) -> Tensor:
    """Correlation along the last dim (0 where either side is constant)."""
    x, y = x - x.mean(-1, keepdim=True), y - y.mean(-1, keepdim=True)
    den = (x.square().sum(-1) * y.square().sum(-1)).sqrt()
    return torch.where(den > 0, (x * y).sum(-1) / den.clamp_min(1e-30), torch.zeros_like(den))


def key_norms(model: nn.Module, inputs: Tensor, top_k: int = DEFAULT_TOP_K) -> KeyNorms:
    """Key norms of every layer and the attention the largest keys receive.

    Args:
        model: a dot or RBF :class:`~ssog_core.nn.vit.ViT` (images ``(B, C, H, W)``) or
            :class:`~ssog_core.nn.lm.CausalLM` (token ids ``(B, T)``).
        inputs: the images or token ids.
        top_k: number of largest-norm keys (per image and head) whose attention share is reported.
    Raises:
        ValueError: for SSOG models (their attention has no keys) or ``top_k < 1``.
    """
    if not has_keys(model):
        raise ValueError("this model's attention has no keys (SSOG): key norms exist for dot and RBF models only")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    prefix = model.num_prefix_tokens
    with _eval():
        xs, grid, _ = _layer_inputs(model, inputs)
        norms, topk, uniform, pshare, corr, kinds = [], [], [], [], [], []
        for block, x in zip(model.blocks, xs, strict=True):
            attn = block.attn
            _, k, _ = attn.queries_keys_values(x, grid)
            a = attn.attention_matrix(x, grid).double()[:, :, prefix:]  # (B, H, N_q, P + N): non-prefix queries
            n = k.double().norm(dim=-1)  # (B, H, P + N)
            n_keys = n.shape[-1]
            visible = torch.ones(a.shape[-2], n_keys, dtype=torch.float64, device=a.device)
            if getattr(attn, "causal", False):
                visible = visible.tril(prefix)  # query prefix + i sees keys up to prefix + i
            uniform_rows = visible / visible.sum(-1, keepdim=True)
            kk = min(top_k, n_keys)
            big = torch.zeros_like(n).scatter_(-1, n.topk(kk, dim=-1).indices, 1.0)  # (B, H, P + N) indicator
            topk.append((a * big[:, :, None]).sum(-1).mean(dim=(0, 2)))
            uniform.append((uniform_rows * big[:, :, None]).sum(-1).mean(dim=(0, 2)))
            pshare.append(a[..., :prefix].sum(-1).mean(dim=(0, 2)))
            corr.append(_pearson(n, a.mean(-2)).mean(0))
            norms.append(n.float().cpu())
            kinds.append("rbf" if isinstance(attn, RBFAttention) else "dot")
        return KeyNorms(
            norms, prefix, top_k, *(torch.stack(t).float().cpu() for t in (topk, uniform, pshare, corr)), kinds
        )
