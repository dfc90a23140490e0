"""An independent float64 oracle for the models, written from docs/DESIGN.md §1–2 for the tests only.

It builds every attention matrix densely (N × N) from a state dict in the upstream implementation's
key layout and never calls ssog_core, so agreement with ssog_core is evidence, not tautology.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

EPS = 1e-4


def softplus(x: Tensor) -> Tensor:
    return torch.log1p(torch.exp(-x.abs())) + x.clamp_min(0)


def softmax(logits: Tensor, dim: int = -1) -> Tensor:
    e = torch.exp(logits - logits.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def log_normal(d: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    return -0.5 * math.log(2 * math.pi) - torch.log(sigma) - (d - mu) ** 2 / (2 * sigma**2)


def token_atoms(x: Tensor, p: dict[str, Tensor], grid, heads: int, atoms: int, max_offset: float, floor: float):
    """Per-token (mu, sigma, log_lam) of shape (B, Gh, Gw, H, R[, 2]) from the layer's raw parameters."""
    b = x.shape[0]
    gh, gw = grid
    mu = p["mu"].expand(b, gh, gw, heads, atoms, 2)
    sigma = (softplus(p["raw_sigma"]) + EPS + floor).expand(b, gh, gw, heads, atoms, 2)
    log_lam = p["log_lambda"].expand(b, gh, gw, heads, atoms)
    if "mu_delta.weight" in p:
        s = softplus(p["raw_mu_delta_scale"]) + EPS
        probe = (x @ p["mu_delta.weight"].T + p["mu_delta.bias"]).reshape(b, gh, gw, heads, atoms, 2)
        mu = mu + s * max_offset * torch.tanh(probe)
    if "sigma_delta.weight" in p:
        s = softplus(p["raw_sigma_delta_scale"]) + EPS
        probe = (x @ p["sigma_delta.weight"].T + p["sigma_delta.bias"]).reshape(b, gh, gw, heads, atoms, 2)
        sigma = sigma * torch.exp(s * torch.tanh(probe))
    if "lambda_gate.weight" in p:
        s = softplus(p["raw_lambda_gate_scale"]) + EPS
        probe = (x @ p["lambda_gate.weight"].T + p["lambda_gate.bias"]).reshape(b, gh, gw, heads, atoms)
        log_lam = log_lam + s * torch.tanh(probe)
    return mu, sigma, log_lam


def ssog_matrix(mu: Tensor, sigma: Tensor, log_lam: Tensor, tau: Tensor, grid, mode: str) -> Tensor:
    """Dense A (B, H, N, N) from per-token atoms: A[(i,w),(j,k)] = Σ_r λ_r(i,w) ax_r((i,w),k) ay_r((i,k),j)."""
    gh, gw = grid
    b, _, _, h, _ = log_lam.shape
    iy = torch.arange(gh, dtype=mu.dtype)
    ix = torch.arange(gw, dtype=mu.dtype)
    dy = (iy[:, None] - iy[None, :]).view(1, gh, 1, 1, 1, gh)  # query row − key row
    dx = (ix[:, None] - ix[None, :]).view(1, 1, gw, 1, 1, gw)
    ly = log_normal(dy, mu[..., 0, None], sigma[..., 0, None])  # (B, Gh, Gw, H, R, Gh)
    lx = log_normal(dx, mu[..., 1, None], sigma[..., 1, None])  # (B, Gh, Gw, H, R, Gw)
    if mode == "factorized":
        ay, ax = softmax(ly / tau), softmax(lx / tau)
        lam = softmax(log_lam)
        a = torch.einsum("biwhr,biwhrk,bikhrj->bhiwjk", lam, ax, ay)
    else:
        logw = torch.log(softmax(log_lam))[..., None]
        ay = softmax(torch.logsumexp(logw + ly, dim=-2) / tau)
        ax = softmax(torch.logsumexp(logw + lx, dim=-2) / tau)
        a = torch.einsum("biwhk,bikhj->bhiwjk", ax, ay)
    return a.reshape(b, h, gh * gw, gh * gw)


def attention_layer(
    x: Tensor, p: dict[str, Tensor], cfg: dict, grid, edit=None, layer: int = 0
) -> tuple[Tensor, Tensor]:
    """One attention layer: output (B, N, dim) and the dense matrix (B, H, N, N).

    ``edit`` (tests of interventions) may define ``atoms(layer, mu, sigma, log_lam) -> (mu, sigma, log_lam)`` on
    the per-token atoms and ``heads(layer, y) -> y`` on the per-head outputs ``(B, H, N, hd)``.
    """
    b, n, dim = x.shape
    h = cfg["num_heads"]
    hd = dim // h
    if cfg["attn"] == "dot":
        qkv = x @ p["qkv.weight"].T
        q, k, v = (t.reshape(b, n, h, hd).transpose(1, 2) for t in qkv.split(dim, dim=-1))
        a = softmax(q @ k.transpose(-1, -2) / math.sqrt(hd))
    else:
        mu, sigma, log_lam = token_atoms(
            x, p, grid, h, cfg["num_atoms"], cfg.get("max_offset", 4.0), cfg.get("sigma_floor", 0.25)
        )
        if edit is not None and hasattr(edit, "atoms"):
            mu, sigma, log_lam = edit.atoms(layer, mu, sigma, log_lam)
        tau = softplus(p["raw_temperature"]) + 0.5
        a = ssog_matrix(mu, sigma, log_lam, tau, grid, cfg.get("field", "factorized"))
        v = (x @ p["v.weight"].T).reshape(b, n, h, hd).transpose(1, 2)
    y = a @ v
    if edit is not None and hasattr(edit, "heads"):
        y = edit.heads(layer, y)
    y = y.transpose(1, 2).reshape(b, n, dim)
    return y @ p["out.weight"].T, a


def vit_forward(img: Tensor, sd: dict[str, Tensor], cfg: dict, edit=None) -> tuple[Tensor, list[Tensor]]:
    """Logits and per-layer attention matrices of the ViT in ``sd`` (float64, eval mode); ``edit`` as in
    :func:`attention_layer`."""
    sd = {k: v.double() for k, v in sd.items()}
    img = img.double()
    p = cfg["patch_size"]
    b, c, hh, ww = img.shape
    gh, gw = hh // p, ww // p
    patches = torch.stack(
        [
            img[:, :, i * p : (i + 1) * p, j * p : (j + 1) * p].permute(0, 2, 3, 1).reshape(b, -1)
            for i in range(gh)
            for j in range(gw)
        ],
        dim=1,
    )  # (B, N, p·p·C), raster order, each patch flattened (row, col, channel)
    x = patches @ sd["patch_embed.weight"].T + sd["patch_embed.bias"]
    pos = sd["pos_embed"]
    size = cfg["img_size"]
    gh0, gw0 = (size // p, size // p) if isinstance(size, int) else (size[0] // p, size[1] // p)
    if (gh0, gw0) != (gh, gw):
        pos = (
            torch.nn.functional.interpolate(
                pos.reshape(1, gh0, gw0, -1).permute(0, 3, 1, 2), size=(gh, gw), mode="bilinear", align_corners=False
            )
            .permute(0, 2, 3, 1)
            .reshape(1, gh * gw, -1)
        )
    x = x + pos
    maps = []
    for layer in range(cfg["depth"]):
        pre = f"blocks.{layer}."
        lp = {k[len(pre) + 5 :]: v for k, v in sd.items() if k.startswith(pre + "attn.")}
        hx = layer_norm(x, sd[pre + "norm1.weight"], sd[pre + "norm1.bias"])
        y, a = attention_layer(hx, lp, cfg, (gh, gw), edit, layer)
        maps.append(a)
        x = x + y
        hx = layer_norm(x, sd[pre + "norm2.weight"], sd[pre + "norm2.bias"])
        x = x + gelu(hx @ sd[pre + "mlp.0.weight"].T + sd[pre + "mlp.0.bias"]) @ sd[pre + "mlp.2.weight"].T
        x = x + sd[pre + "mlp.2.bias"]
    x = layer_norm(x, sd["norm.weight"], sd["norm.bias"]).mean(dim=1)
    return x @ sd["head.weight"].T + sd["head.bias"], maps


def upstream_state_dict(cfg: dict, seed: int = 0, taps: tuple[str, ...] = ("mu", "sigma", "lambda")) -> dict:
    """Random weights in the upstream implementation's PyTorch ViT layout (key names and shapes only),
    with steering gates open and probes non-zero so that every tap matters."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.2):
        return torch.randn(shape, generator=g) * scale

    d, p, h, r = cfg["dim"], cfg["patch_size"], cfg["num_heads"], cfg.get("num_atoms", 4)
    hidden = int(d * cfg.get("mlp_ratio", 2.0))
    n = (cfg["img_size"] // p) ** 2
    sd = {"patch_embed.weight": rnd(d, p * p * 3), "patch_embed.bias": rnd(d), "pos_embed": rnd(1, n, d)}
    for i in range(cfg["depth"]):
        pre = f"blocks.{i}."
        sd |= {pre + "norm1.weight": 1 + rnd(d), pre + "norm1.bias": rnd(d)}
        if cfg["attn"] == "dot":
            sd[pre + "attn.qkv.weight"] = rnd(3 * d, d)
        else:
            sd |= {
                pre + "attn.v.weight": rnd(d, d),
                pre + "attn.mu": rnd(h, r, 2, scale=1.5),
                pre + "attn.raw_sigma": rnd(h, r, 2, scale=0.5),
                pre + "attn.log_lambda": rnd(h, r, scale=0.5),
                pre + "attn.raw_temperature": rnd(scale=0.5),
            }
            for tap, name, per in (("mu", "mu_delta", 2), ("sigma", "sigma_delta", 2), ("lambda", "lambda_gate", 1)):
                if tap in taps:
                    sd[pre + f"attn.{name}.weight"] = rnd(h * r * per, d, scale=0.3)
                    sd[pre + f"attn.{name}.bias"] = rnd(h * r * per, scale=0.3)
                    sd[pre + f"attn.raw_{name}_scale"] = torch.tensor(-0.5) + rnd(scale=0.2)
        sd[pre + "attn.out.weight"] = rnd(d, d)
        sd |= {pre + "norm2.weight": 1 + rnd(d), pre + "norm2.bias": rnd(d)}
        sd |= {pre + "mlp.0.weight": rnd(hidden, d), pre + "mlp.0.bias": rnd(hidden)}
        sd |= {pre + "mlp.2.weight": rnd(d, hidden), pre + "mlp.2.bias": rnd(d)}
    sd |= {"norm.weight": 1 + rnd(d), "norm.bias": rnd(d)}
    sd |= {"head.weight": rnd(cfg["num_classes"], d), "head.bias": rnd(cfg["num_classes"])}
    return sd
