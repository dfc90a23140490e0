"""Attention modules: SSOG (Gaussian field, content steers), its dot-product twin, and RBF (distance) attention.

Every module has the same interface, so one :class:`~ssog_core.nn.vit.Block` serves them all and the attention is a
part of the one :class:`~ssog_core.nn.vit.ViT` that its config chooses (:func:`build_attention`):
``forward(x, grid)`` maps ``(B, P + N, dim)`` to ``(B, P + N, dim)``, and ``attention_matrix(x, grid)`` returns the
exact ``(B, H, P + N, P + N)`` post-softmax weights (prefix tokens first; SSOG has none, but a distilled student's,
``prefix_dot``). A new kind of attention is one module here with that interface and its float64 test
(docs/DESIGN.md §2).

Each module's hook point ``pattern`` holds those weights. The fast paths (fused SDPA, the RBF kernels, SSOG's field
operator) never form them, so a module forms them only while something is installed at the point
(:func:`~ssog_core.nn.hook_points.is_hooked`: a reader, a replacement, an edit) and then mixes the values with
what the point passes on: a replaced pattern is the attention the output is made from.

Parameter names and layouts match the upstream implementation's PyTorch ViT, so its state dicts load
without renaming (docs/DESIGN.md §4); a standard ViT's weights are renamed to them when read
(:mod:`ssog_core.checkpoint.standard`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ssog_core.field import TAPS, Field, apply_field, base_field, bound, check_grid, positive, steer
from ssog_core.nn.config import LAB_EPS, QK_NORMS, ViTConfig
from ssog_core.nn.hook_points import HookPoint, is_hooked, is_plain
from ssog_core.nn.susie import SuSiE
from ssog_core.ops import rbf_attention, ssog_apply
from ssog_core.ops.dispatch import steering_backend
from ssog_core.ops.rbf_torch import rbf_gamma
from ssog_core.ops.ssog_cpu import apply_cpu_steering

# tap → (probe layer name, gate parameter name, probe outputs per atom)
_TAP_PARAMS = {
    "mu": ("mu_delta", "raw_mu_delta_scale", 2),
    "sigma": ("sigma_delta", "raw_sigma_delta_scale", 2),
    "lambda": ("lambda_gate", "raw_lambda_gate_scale", 1),
}
COLD_GATE, WARM_GATE = -8.0, -2.0  # softplus(-8) ≈ 3e-4 (geometry starts frozen), softplus(-2) ≈ 0.13


def gate_start(cold_init: bool) -> float:
    """The scale ``s`` every gate starts from: cold (4.35e-4, content barely steers) or warm (0.13)."""
    return float(positive(torch.tensor(COLD_GATE if cold_init else WARM_GATE)))


def _identity_values(x: Tensor, num_heads: int) -> Tensor:
    """Values ``(B, N, H, N)`` whose channel c is the indicator of token c: the operator's output is A."""
    b, n, _ = x.shape
    eye = torch.eye(n, device=x.device, dtype=x.dtype)
    return eye[None, :, None, :].expand(b, n, num_heads, n)


class SSOGAttention(nn.Module):
    """A few Gaussian atoms per head over relative position; content may only steer them.

    Args:
        dim: token width; ``dim = num_heads · head_dim``.
        num_heads: heads, each with its own atoms.
        num_atoms: Gaussians per head (1–8).
        field: ``"factorized"`` (per-atom separable passes) or ``"axial"`` (atoms mixed per axis).
        steer: enabled content taps, any subset of ``("mu", "sigma", "lambda")``.
        max_offset: bound on content's shift of an atom, in grid cells.
        sigma_floor: narrowest atom width, in grid cells.
        cold_init: gates start at −8 (cold) instead of −2 (warm).
        backend: ``"triton"``, ``"cpu"``, ``"torch"``, ``"definition"`` or ``None`` for automatic
            (:mod:`ssog_core.ops.dispatch`).
        num_prefix: prefix tokens (class, distillation, registers) before the grid, a distilled student's
            (docs/DESIGN.md §2.5): their queries score content by dot product over every token (``qk``, the
            teacher's query and key projections); each patch query puts a content-blind mass on each prefix key,
            ``softmax([prefix_logits, 0])`` per head, and the rest on the field's patch row.
        qkv_bias, proj_bias: biases of the value (and ``qk``) and output projections (a standard ViT's).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_atoms: int = 4,
        field: str = "factorized",
        steer: tuple[str, ...] = TAPS,
        max_offset: float = 4.0,
        sigma_floor: float = 0.25,
        cold_init: bool = True,
        backend: str | None = None,
        num_prefix: int = 0,
        qkv_bias: bool = False,
        proj_bias: bool = False,
    ):
        super().__init__()
        self.dim, self.num_heads, self.num_atoms = dim, num_heads, num_atoms
        self.backend = backend
        self.head_dim = dim // num_heads
        self.mode = field
        self.taps = tuple(t for t in TAPS if t in steer)
        self.max_offset, self.sigma_floor = max_offset, sigma_floor
        self.num_prefix = num_prefix

        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.out = nn.Linear(dim, dim, bias=proj_bias)
        if num_prefix:
            self.qk = nn.Linear(dim, 2 * dim, bias=qkv_bias)  # the prefix queries' q, every token's k
            self.prefix_logits = nn.Parameter(torch.zeros(num_heads, num_prefix))  # against the field's logit 0
        self.mu = nn.Parameter(torch.randn(num_heads, num_atoms, 2) * 0.5)
        self.raw_sigma = nn.Parameter(torch.full((num_heads, num_atoms, 2), -0.5))
        self.log_lambda = nn.Parameter(torch.zeros(num_heads, num_atoms))
        self.raw_temperature = nn.Parameter(torch.tensor(-1.0))
        gate0 = COLD_GATE if cold_init else WARM_GATE
        for tap in self.taps:
            probe, gate, per_atom = _TAP_PARAMS[tap]
            layer = nn.Linear(dim, num_heads * num_atoms * per_atom)
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
            self.add_module(probe, layer)
            self.register_parameter(gate, nn.Parameter(torch.tensor(gate0)))
        # hook points (identity unless a call installs a function: docs/DESIGN.md §0, ssog_core.interventions)
        self.hook_in = HookPoint()  # the input x (B, N, dim) the attention sees: the block's LayerNormed stream
        self.field = HookPoint()  # the content-free field (H, R) that content steers
        self.probes = nn.ModuleDict({tap: HookPoint() for tap in self.taps})  # bounded probes per tap
        self.pattern = HookPoint()  # post-softmax attention (B, H, N, N), formed only while something is installed
        self.head_out = HookPoint()  # per-head output (B, N, H, head_dim) before the output projection

    def fixed_field(self) -> Field:
        """The content-free field ``(H, R)``: what every query does before content steers it."""
        return base_field(self.mu, self.raw_sigma, self.log_lambda, self.raw_temperature, self.sigma_floor)

    def gate_scales(self) -> dict[str, Tensor]:
        """The positive scale ``s`` of each enabled tap."""
        return {tap: positive(getattr(self, _TAP_PARAMS[tap][1])) for tap in self.taps}

    def prefix_mass(self) -> Tensor:
        """``(H, P + 1)``: the mass every patch query puts on each prefix key, then on its field row (sums to 1)."""
        logits = self.prefix_logits
        return torch.softmax(torch.cat([logits, logits.new_zeros(logits.shape[0], 1)], -1), -1)

    def field_of(self, x: Tensor, grid: tuple[int, int], steered: bool = True) -> Field:
        """The field each patch query of ``x`` (``(B, N, dim)`` or, prefix first, ``(B, P + N, dim)``: LayerNormed
        block input) applies, through the hook points ``field`` and ``probes.{tap}`` (where this call's
        interventions act; a probe point that returns ``None`` closes that tap)."""
        if self.num_prefix and x.shape[1] == self.num_prefix + grid[0] * grid[1]:
            x = x[:, self.num_prefix :]
        fixed = self.field(self.fixed_field())
        if not (steered and self.taps):
            return fixed
        b = x.shape[0]
        gh, gw = grid
        h, r = self.num_heads, self.num_atoms
        raw = self._raw_probes(x)
        bounded = bound(raw, out=None if torch.is_grad_enabled() else raw)  # in place when nothing records it
        probes = {}
        for tap, part in zip(self.taps, bounded.split(list(self._probe_widths().values()), dim=-1), strict=True):
            probe = self.probes[tap](part.view((b, gh, gw, h, r, 2) if _TAP_PARAMS[tap][2] == 2 else (b, gh, gw, h, r)))
            if probe is not None:
                probes[tap] = probe
        if not probes:  # every gate closed: exactly the fixed field
            return fixed
        return steer(fixed, probes, self.gate_scales(), self.max_offset)

    def _probe_widths(self) -> dict[str, int]:
        """Each enabled tap's number of probe outputs per token."""
        return {tap: getattr(self, _TAP_PARAMS[tap][0]).out_features for tap in self.taps}

    def _raw_probes(self, x: Tensor) -> Tensor:
        """Every enabled tap's raw probe outputs ``(B, N, P)``, the taps one after another: one GEMM for all (weights
        concatenated at run time; the stored layout stays one Linear per tap)."""
        layers = [getattr(self, _TAP_PARAMS[tap][0]) for tap in self.taps]
        return F.linear(x, torch.cat([m.weight for m in layers]), torch.cat([m.bias for m in layers]))

    def _layout_field(self) -> Field:
        """The fixed field's raw parameters as a :class:`Field`: the shapes, dtypes and devices the backend choice
        reads, without computing anything."""
        return Field(self.mu, self.raw_sigma, self.log_lambda, self.raw_temperature)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        check_grid(x.shape[1] - self.num_prefix, grid)
        x = self.hook_in(x)
        b, n, _ = x.shape
        v = self.v(x).view(b, n, self.num_heads, self.head_dim)
        y = self.head_out(self._attend_prefixed(x, v, grid) if self.num_prefix else self.attend(x, v, grid))
        return self.out(y.reshape(b, n, self.dim))

    def _prefix_queries_keys(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The prefix queries ``(B, H, P, head_dim)`` and every token's keys ``(B, H, P + N, head_dim)``."""
        b, n, _ = x.shape
        p, h, d = self.num_prefix, self.num_heads, self.head_dim
        wq, wk = self.qk.weight.split(self.dim)
        bq, bk = (None, None) if self.qk.bias is None else self.qk.bias.split(self.dim)
        q = F.linear(x[:, :p], wq, bq).view(b, p, h, d).transpose(1, 2)
        return q, F.linear(x, wk, bk).view(b, n, h, d).transpose(1, 2)

    def _attend_prefixed(self, x: Tensor, v: Tensor, grid: tuple[int, int]) -> Tensor:
        """:meth:`attend` with prefix tokens first (``(B, P + N, H, head_dim)`` in and out): the prefix queries by
        dot product over every key, each patch query ``Σ_p m_p·v_p + m_field·(field row · patch values)``."""
        p = self.num_prefix
        if is_hooked(self.pattern):  # read or replaced: the weights formed, the values mixed by what the point gives
            return (self.pattern(self._prefixed_weights(x, grid)) @ v.transpose(1, 2)).transpose(1, 2)
        q, k = self._prefix_queries_keys(x)
        heads = v.transpose(1, 2)  # (B, H, P + N, head_dim)
        prefix_out = F.scaled_dot_product_attention(q, k, heads).transpose(1, 2)  # (B, P, H, head_dim)
        mass = self.prefix_mass().to(v.dtype)  # (H, P + 1)
        on_field = self.attend(x[:, p:], v[:, p:].contiguous(), grid) * mass[:, p, None]
        on_prefix = torch.einsum("hp,bphd->bhd", mass[:, :p], v[:, :p])[:, None]
        return torch.cat([prefix_out, on_field + on_prefix], 1)

    def _prefixed_weights(self, x: Tensor, grid: tuple[int, int], steered: bool = True) -> Tensor:
        """``(B, H, P + N, P + N)``: the prefix queries' softmax rows, then each patch query's prefix masses and its
        field row (the definition operator) scaled by the field's mass."""
        p, b = self.num_prefix, x.shape[0]
        q, k = self._prefix_queries_keys(x)
        wide = torch.promote_types(q.dtype, torch.float32)
        prefix_rows = torch.softmax((q.to(wide) @ k.to(wide).transpose(-2, -1)) * q.shape[-1] ** -0.5, -1)
        mass = self.prefix_mass().to(x.dtype)
        field_rows = self._weights(x[:, p:], self.field_of(x, grid, steered), grid) * mass[None, :, p, None, None]
        n = field_rows.shape[-1]
        patch_rows = torch.cat([mass[None, :, None, :p].expand(b, -1, n, -1), field_rows], -1)
        return torch.cat([prefix_rows.to(x.dtype), patch_rows], 2)

    def attend(self, x: Tensor, v: Tensor, grid: tuple[int, int]) -> Tensor:
        """The attention of :meth:`forward` between its projections: values ``v`` ``(B, N, H, head_dim)`` mixed by
        the field of ``x`` (the fixed field steered by ``x``'s probes), ``(B, N, H, head_dim)`` — what the op
        benchmarks time, the field's preparation included."""
        if is_hooked(self.pattern):  # read or replaced: the weights formed, the values mixed by what the point gives
            return (self.pattern(self._weights(x, self.field_of(x, grid), grid)) @ v.transpose(1, 2)).transpose(1, 2)
        fused = self.taps and is_plain([self.field, *self.probes.values()])
        chosen = steering_backend(v, self._layout_field(), grid, self.mode, self.backend) if fused else None
        if chosen == "cpu":  # the C kernels take the raw probes and steer in C: no per-token field in between
            return apply_cpu_steering(
                v, self.fixed_field(), self._raw_probes(x), self._probe_widths(), self.gate_scales(), self.max_offset,
                grid,
            )  # fmt: skip
        if chosen == "triton" and self.mode == "factorized":  # the steering in one kernel each way
            return self._steered_triton(x, v, grid)
        return ssog_apply(v, self.field_of(x, grid), grid, self.mode, self.backend)

    def _steered_triton(self, x: Tensor, v: Tensor, grid: tuple[int, int]) -> Tensor:
        """``ssog_apply(v, field_of(x, grid))`` on the Triton kernels in two ops: ``ssog::steer`` builds the per-token
        field from the raw probe outputs (one GEMM, the biases added in the kernel), the fixed field's and the gates'
        raw parameters; ``ssog::fwd`` applies it."""
        from ssog_core.ops.ssog_triton import apply_triton_steering

        layers = {tap: getattr(self, _TAP_PARAMS[tap][0]) for tap in self.taps}
        raw = F.linear(x, torch.cat([m.weight for m in layers.values()]))
        gates = {tap: getattr(self, _TAP_PARAMS[tap][1]) for tap in self.taps}
        biases = {tap: m.bias for tap, m in layers.items()}
        fixed = (self.mu, self.raw_sigma, self.log_lambda, self.raw_temperature)
        return apply_triton_steering(
            v, raw, self._probe_widths(), fixed, gates, biases, self.max_offset, self.sigma_floor, grid
        )

    def attention_matrix(self, x: Tensor, grid: tuple[int, int], steered: bool = True) -> Tensor:
        """Exact ``(B, H, P + N, P + N)`` weights for input ``x`` (prefix rows first, :meth:`_prefixed_weights`),
        through the ``pattern`` point (what the output is made
        from, under any edit); ``steered=False`` gives the fixed field's, which no point sees.

        Always the explicit definition operator (:func:`~ssog_core.field.apply_field` on an identity basis),
        whatever backend :func:`~ssog_core.ops.ssog_apply` picks for ``forward``; a test proves ``A·V``
        equals the dispatched output.
        """
        check_grid(x.shape[1] - self.num_prefix, grid)
        if self.num_prefix:
            weights = self._prefixed_weights(x, grid, steered)
        else:
            weights = self._weights(x, self.field_of(x, grid, steered), grid)
        return self.pattern(weights) if steered else weights

    def _weights(self, x: Tensor, field: Field, grid: tuple[int, int]) -> Tensor:
        """``(B, H, N, N)``: the definition operator applied to an identity basis of values."""
        return apply_field(_identity_values(x, self.num_heads), field, grid, self.mode).permute(0, 2, 1, 3)


class _QKAttention(nn.Module, ABC):
    """Shared body of the dot and RBF modules: ``qkv`` and ``out`` projections (biases optional, none in the lab's
    models), optional QK-norm (:data:`~ssog_core.nn.config.QK_NORMS`), optional SuSiE position code, optional
    causal mask.

    Tokens are ``[prefix..., grid raster...]``: whatever precedes the ``Gh·Gw`` grid tokens is a prefix
    (register) token, which SuSiE leaves uncoded (see :mod:`ssog_core.nn.susie`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qk_norm: str | None = None,
        susie: str | None = None,
        susie_dim: int = 0,
        causal: bool = False,
        qkv_bias: bool = False,
        proj_bias: bool = False,
        eps: float = LAB_EPS,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if qk_norm not in (None, *QK_NORMS):
            raise ValueError(f"qk_norm={qk_norm!r} is not one of {QK_NORMS} or None")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qk_norm, self.causal = qk_norm, causal
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        if qk_norm == "layernorm":
            self.q_norm = nn.LayerNorm(self.head_dim, eps=eps)
            self.k_norm = nn.LayerNorm(self.head_dim, eps=eps)
        self.out = nn.Linear(dim, dim, bias=proj_bias)
        self.susie = SuSiE(num_heads, self.head_dim, susie_dim, susie) if susie else None
        self.hook_in = HookPoint()  # the input x (B, P + N, dim) the attention sees: the block's LayerNormed stream
        self.pattern = HookPoint()  # post-softmax attention (B, H, P + N, P + N), formed only while installed
        self.head_out = HookPoint()  # per-head output (B, P + N, H, head_dim) before the output projection

    def queries_keys_values(self, x: Tensor, grid: tuple[int, int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The q, k, v ``(B, H, N, head_dim)`` the logits see (after QK-norm and the position code)."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.qk_norm == "rms":  # unit RMS per head: key magnitudes can no longer dominate the logits
            q, k = F.rms_norm(q, (self.head_dim,)), F.rms_norm(k, (self.head_dim,))
        elif self.qk_norm == "layernorm":  # timm's: LayerNorm with gain and bias per head
            q, k = self.q_norm(q), self.k_norm(k)
        if self.susie is not None:
            if grid is None:
                raise ValueError("SuSiE needs the token grid: pass grid=(Gh, Gw), or (1, T) for a sequence")
            q, k = self.susie(q, k, grid)
        return q, k, v

    @abstractmethod
    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of ``(B, H, N, D)`` queries and keys over values ``(B, H, N, Dv)`` (the fast path)."""

    @abstractmethod
    def _logits(self, q: Tensor, k: Tensor) -> Tensor:
        """The ``(B, H, N, N)`` pre-softmax scores whose softmax :meth:`_attend` mixes the values with."""

    def _weights(self, q: Tensor, k: Tensor) -> Tensor:
        """``(B, H, N, N)`` post-softmax weights formed explicitly (scores in at least float32, the causal mask
        applied), in the dtype of ``q``."""
        wide = torch.promote_types(q.dtype, torch.float32)
        logits = self._logits(q.to(wide), k.to(wide))
        if self.causal:
            n = q.shape[-2]
            later = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            logits = logits.masked_fill(later, float("-inf"))
        return torch.softmax(logits, dim=-1).to(q.dtype)

    def forward(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        x = self.hook_in(x)
        b, n, _ = x.shape
        q, k, v = self.queries_keys_values(x, grid)
        # read or replaced: the weights formed, the values mixed by what the point gives
        y = self.pattern(self._weights(q, k)) @ v if is_hooked(self.pattern) else self._attend(q, k, v)
        y = self.head_out(y.transpose(1, 2))
        return self.out(y.reshape(b, n, self.dim))

    def attention_matrix(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """Exact ``(B, H, N, N)`` weights, formed explicitly, through the ``pattern`` point (what the output is made
        from, under any edit)."""
        q, k, _ = self.queries_keys_values(x, grid)
        return self.pattern(self._weights(q, k))


class DotAttention(_QKAttention):
    """Scaled dot-product attention: the lab's matched baseline and every standard ViT's attention (fused SDPA
    unless the ``pattern`` point is hooked; then the explicit softmax, whose agreement with SDPA docs/DESIGN.md §2
    states per dtype).

    Args:
        dim, num_heads: token width and heads.
        qk_norm: normalise q and k per head: ``"rms"`` (no gain, the lab's) or ``"layernorm"`` (gain and bias,
            timm's); the usual cure for key-magnitude dominance. ``None``: none.
        susie: ``"1d"`` / ``"2d"`` adds the SuSiE position code (:mod:`ssog_core.nn.susie`); ``None`` for none.
        susie_dim: channels per head carrying the code (0: the whole head).
        causal: each token attends to itself and earlier tokens only.
        qkv_bias, proj_bias: biases of the qkv and output projections (a standard ViT's; the lab's have none).
        eps: the QK LayerNorms' epsilon.
    """

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def _logits(self, q: Tensor, k: Tensor) -> Tensor:
        return (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # SDPA's default scale


class RBFAttention(_QKAttention):
    """Distance attention ``softmax(−γ‖q − k‖²)``, γ = 1/√head_dim (:mod:`ssog_core.ops.rbf_torch`).

    Arguments as :class:`DotAttention`, without QK-norm (with unit-RMS keys every ``‖k‖²`` is the same
    and RBF attention collapses to dot-product attention with scale 2γ), plus ``backend`` (``"torch"``,
    ``"triton"`` or ``None`` for automatic).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        susie: str | None = None,
        susie_dim: int = 0,
        causal: bool = False,
        backend: str | None = None,
    ):
        super().__init__(dim, num_heads, qk_norm=None, susie=susie, susie_dim=susie_dim, causal=causal)
        self.backend = backend

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return rbf_attention(q, k, v, causal=self.causal, backend=self.backend)

    def _logits(self, q: Tensor, k: Tensor) -> Tensor:
        """``−γ‖q − k‖²`` but each query's own ``−γ‖q‖²``, which the softmax drops (:mod:`ssog_core.ops.rbf_torch`)."""
        gamma = rbf_gamma(q.shape[-1])
        return 2.0 * gamma * (q @ k.transpose(-2, -1)) - gamma * k.square().sum(-1)[..., None, :]


def build_attention(cfg: ViTConfig) -> nn.Module:
    """The attention module a config asks for."""
    if cfg.attn == "ssog":
        return SSOGAttention(
            cfg.dim, cfg.num_heads, cfg.num_atoms, cfg.field, cfg.steer, cfg.max_offset, cfg.sigma_floor, cfg.cold_init,
            num_prefix=cfg.num_prefix_tokens, qkv_bias=cfg.qkv_bias, proj_bias=cfg.proj_bias,
        )  # fmt: skip
    susie = "2d" if cfg.susie else None
    if cfg.attn == "dot":
        return DotAttention(
            cfg.dim,
            cfg.num_heads,
            qk_norm=cfg.qk_norm_kind if cfg.qk_norm else None,
            susie=susie,
            susie_dim=cfg.susie_dim,
            qkv_bias=cfg.qkv_bias,
            proj_bias=cfg.proj_bias,
            eps=cfg.eps,
        )
    if cfg.attn == "rbf":
        return RBFAttention(cfg.dim, cfg.num_heads, susie=susie, susie_dim=cfg.susie_dim)
    raise ValueError(f"attention {cfg.attn!r} is not available in this build")
