"""Dot-product attention in every family runs fused SDPA unless its ``pattern`` point is hooked, and then the
explicit softmax; the two agree within the tolerances docs/DESIGN.md §2 states per dtype (relative to the largest
magnitude), on a 7×5 grid with prefix tokens, for the lab's dot model and a timm-convention one (class token,
register, qkv bias, LayerNorm QK-norm, LayerScale)."""

from __future__ import annotations

import pytest
import torch

from ssog_core.interventions.hooks import run_with_cache
from ssog_core.nn.attention import _QKAttention
from ssog_core.nn.config import standard_config
from ssog_core.nn.vit import ViT

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 5e-2}  # docs/DESIGN.md §2, "SDPA"
DEPTH = 3


def _random(model: ViT) -> ViT:
    """Every parameter random (norm gains near 1): no term hides behind an initial zero or one."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.5 * torch.randn(p.shape, generator=gen)
            p.copy_(1 + noise if p.dim() == 1 and "norm" in name and name.endswith("weight") else noise)
    return model.eval()


def model_of(family: str) -> ViT:
    sizes = dict(img_size=(28, 20), patch_size=4, dim=24, depth=DEPTH, num_heads=3, num_classes=5)
    if family == "lab":
        return _random(ViT(**sizes, attn="dot", num_registers=2, dropout=0.0))
    cfg = standard_config("timm", **sizes, mlp_hidden=48, qk_norm=True, layer_scale=True, num_registers=1)
    return _random(ViT(cfg))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("family", ["lab", "timm"])
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_sdpa_and_the_explicit_softmax_agree_within_the_stated_tolerance(family, dtype):
    model = model_of(family).to(dtype)
    x = torch.rand(4, 3, 28, 20, generator=torch.Generator().manual_seed(5)).to(dtype)
    last = f"blocks.{DEPTH - 1}.resid_post"
    patterns = [f"blocks.{i}.attn.pattern" for i in range(DEPTH)]
    fused_logits, fused = run_with_cache(model, x, [last])
    explicit_logits, explicit = run_with_cache(model, x, [*patterns, last])
    assert explicit[patterns[0]].shape == (4, 3, model.num_prefix_tokens + 35, model.num_prefix_tokens + 35)
    assert _relative(explicit_logits, fused_logits) <= TOLERANCE[dtype]
    assert _relative(explicit[last], fused[last]) <= TOLERANCE[dtype]
    assert _relative(explicit_logits, fused_logits) > 0 or dtype == torch.float64  # two paths, not one run twice


@pytest.mark.parametrize("family", ["lab", "timm"])
def test_no_pattern_is_formed_unless_the_point_is_hooked(family, monkeypatch):
    model, x = model_of(family), torch.rand(2, 3, 28, 20)
    want = model(x)

    def refuse(*args, **kwargs):
        raise AssertionError("the explicit softmax ran although no pattern point was hooked")

    monkeypatch.setattr(_QKAttention, "_weights", refuse)
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)
    _, cache = run_with_cache(model, x, ["blocks.0.resid_post", "blocks.1.attn.head_out"])
    assert cache["blocks.1.attn.head_out"].shape == (2, model.num_prefix_tokens + 35, 3, 8)
