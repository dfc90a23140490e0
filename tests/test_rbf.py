"""RBF attention: the torch path, dispatch, registers as sinks, the module and the ViT vs a dense float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch

from ssog_core import ViT, load_checkpoint, save_checkpoint
from ssog_core.nn.attention import DotAttention, RBFAttention
from ssog_core.nn.config import ViTConfig
from ssog_core.ops import dispatch
from ssog_core.ops.dispatch import (
    BackendUnavailable,
    can_run_triton_rbf,
    choose_rbf_backend,
    rbf_attention,
    rbf_triton_problem,
)
from ssog_core.ops.rbf_torch import rbf_attention_torch
from tests.rbf_oracle import rbf_weights, vit_forward

CFG = dict(num_classes=5, img_size=(28, 20), patch_size=4, dim=24, depth=2, num_heads=3)


def qkv(b=2, h=3, n=37, d=16, dv=None, dtype=torch.float64, scale=1.0):
    q, k = (torch.randn(b, h, n, d, dtype=dtype) * scale for _ in range(2))
    return q, k, torch.randn(b, h, n, dv or d, dtype=dtype)


def test_identity_distance_logits_equal_dot_logits_with_key_penalty():
    """softmax(−γ‖q − k‖²) = softmax(2γ q·k − γ‖k‖²): the query norm cancels in the softmax."""
    q, k, _ = qkv(n=29, d=24, scale=3.0)
    g = 1 / math.sqrt(24)
    dist = -g * (q[..., :, None, :] - k[..., None, :, :]).square().sum(-1)
    expanded = 2 * g * q @ k.transpose(-1, -2) - g * k.square().sum(-1)[..., None, :]
    torch.testing.assert_close(torch.softmax(dist, -1), torch.softmax(expanded, -1), rtol=1e-12, atol=1e-14)
    # the two logit matrices differ by exactly the per-query constant γ‖q‖²
    torch.testing.assert_close(expanded - dist, (g * q.square().sum(-1))[..., None].expand_as(dist))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n, d, dv", [(37, 16, 16), (61, 24, 24), (7, 24, 5)], ids=["n37-d16", "n61-d24", "n7-dv5"])
def test_torch_path_matches_dense_float64(n, d, dv, causal):
    q, k, v = qkv(n=n, d=d, dv=dv, scale=1.5)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = rbf_attention_torch(q, k, v, causal)
    want = rbf_weights(q, k, causal) @ v
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), do)
    ref = torch.autograd.grad(want, (q, k, v), do)
    for g_, r_ in zip(got, ref, strict=True):
        torch.testing.assert_close(g_, r_, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
def test_torch_path_float32_and_gradcheck():
    q, k, v = qkv(b=1, h=2, n=6, d=4)
    torch.autograd.gradcheck(lambda *t: rbf_attention_torch(*t, causal=True), [t.requires_grad_() for t in (q, k, v)])
    q32, k32, v32 = (t.detach().float() for t in (q, k, v))
    torch.testing.assert_close(
        rbf_attention_torch(q32, k32, v32).double(), rbf_weights(q, k) @ v.detach(), rtol=1e-5, atol=1e-6
    )


def test_key_norm_penalty_beats_magnitude():
    """A long key in the query's direction wins dot attention but loses RBF attention to a short aligned key."""
    q = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64).view(1, 1, 1, 4).expand(1, 1, 2, 4)
    k = torch.tensor([[1.0, 0.1, 0.0, 0.0], [12.0, 9.0, 0.0, 0.0]], dtype=torch.float64).view(1, 1, 2, 4)
    eye = torch.eye(2, dtype=torch.float64).view(1, 1, 2, 2)
    rbf = rbf_attention_torch(q.contiguous(), k, eye)[0, 0, 0]
    dot = torch.nn.functional.scaled_dot_product_attention(q.contiguous(), k, eye)[0, 0, 0]
    assert dot[1] > 0.99 and rbf[0] > 0.99


def test_zero_register_absorbs_queries_far_from_every_key():
    """Keys clustered away from the origin; a zero key (register) first. Queries far from the cluster put their
    mass on the register, queries inside the cluster ignore it; dot attention has no such fallback."""
    d = 16
    centre = torch.zeros(d, dtype=torch.float64)
    centre[0] = 10.0
    keys = centre + 0.3 * torch.randn(20, d, dtype=torch.float64)
    k = torch.cat([torch.zeros(1, d, dtype=torch.float64), keys]).view(1, 1, 21, d)
    far = torch.randn(10, d, dtype=torch.float64)
    far[:, 0] = 0.0
    far = 8.0 * far / far.norm(dim=-1, keepdim=True)  # far from the cluster, in directions orthogonal to it
    near = centre + 0.3 * torch.randn(11, d, dtype=torch.float64)
    q = torch.cat([far, near]).view(1, 1, 21, d)
    eye = torch.eye(21, dtype=torch.float64).view(1, 1, 21, 21)
    a = rbf_attention(q, k, eye, backend="torch")[0, 0]
    assert (a[:10, 0] > 0.99).all(), a[:10, 0]
    assert (a[10:, 0] < 1e-3).all(), a[10:, 0]
    dot = torch.nn.functional.scaled_dot_product_attention(q, k, eye)[0, 0]
    assert (dot[:10, 0] < 0.5).all()  # a zero key is just one more key for dot attention


def test_zero_registers_are_keys_at_the_origin_in_the_first_block():
    model = ViT(**CFG, attn="rbf", num_registers=2, susie=True).eval()
    assert torch.equal(model.registers, torch.zeros_like(model.registers))
    x, grid = model.embed(torch.rand(2, 3, 28, 20))
    _, k, _ = model.blocks[0].attn.queries_keys_values(model.blocks[0].norm1(x), grid)
    assert torch.equal(k[:, :, :2], torch.zeros_like(k[:, :, :2]))  # SuSiE leaves registers uncoded
    dot = ViT(**CFG, attn="dot", num_registers=2)
    assert 0.01 < float(dot.registers.detach().std()) < 0.04  # N(0, 0.02²)


def test_registers_absorb_attention_through_the_model():
    """With the key projection scaled up, every token's key is far from every query, so RBF queries fall back
    to the zero register (prefix share ≈ 1); the same weights under dot attention chase the biggest key."""
    from ssog_core.analysis.measures import attention_maps

    shares = {}
    for attn in ("rbf", "dot"):
        torch.manual_seed(3)
        model = ViT(**CFG, attn=attn, num_registers=1).double().eval()
        with torch.no_grad():
            model.registers.zero_()
            model.blocks[0].attn.qkv.weight[24:48].mul_(20.0)  # rows of W_k
        shares[attn] = attention_maps(model, torch.rand(2, 3, 28, 20, dtype=torch.float64)).prefix_share[0]
    assert float(shares["rbf"].min()) > 0.99
    assert float(shares["dot"].mean()) < 0.5


@pytest.mark.parametrize("causal", [False, True])
def test_rbf_module_matrix_times_values_is_the_forward(causal):
    torch.manual_seed(0)
    attn = RBFAttention(24, 3, susie="2d", susie_dim=4, causal=causal).double()
    x = torch.randn(2, 2 + 35, 24, dtype=torch.float64)  # 2 prefix tokens + a 7×5 grid
    a = attn.attention_matrix(x, (7, 5))
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 3, 37, dtype=torch.float64))
    if causal:
        assert float(a.detach().triu(1).abs().max()) == 0.0
    _, _, v = attn.queries_keys_values(x, (7, 5))
    want = attn.out((a @ v).transpose(1, 2).reshape(2, 37, 24))
    torch.testing.assert_close(attn(x, (7, 5)), want)


def test_modules_need_a_grid_that_fits_for_susie():
    attn = DotAttention(24, 3, susie="2d")
    with pytest.raises(ValueError, match="needs the token grid"):
        attn(torch.randn(1, 12, 24))
    with pytest.raises(ValueError, match="cannot hold a 4×4 grid"):
        attn(torch.randn(1, 12, 24), (4, 4))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(attn="rbf"),
        dict(attn="rbf", num_registers=2, susie=True),
        dict(attn="rbf", num_registers=1, susie=True, susie_dim=4),
        dict(attn="dot", num_registers=2, susie=True, qk_norm=True),
    ],
    ids=["rbf", "rbf-reg2-susie", "rbf-reg1-susie4", "dot-reg2-susie-qknorm"],
)
def test_vit_matches_dense_oracle(overrides):
    torch.manual_seed(0)
    model = ViT(**CFG, **overrides).double().eval()
    with torch.no_grad():  # random registers and SuSiE weights, so that neither is a no-op
        for name, p in model.named_parameters():
            if name == "registers" or name.endswith("susie.weight"):
                p.normal_(0, 0.7)
    img = torch.rand(2, 3, 28, 20, dtype=torch.float64)
    want, maps = vit_forward(img, model.state_dict(), {**CFG, **overrides})
    torch.testing.assert_close(model(img), want, rtol=1e-9, atol=1e-10)
    from ssog_core.analysis.measures import attention_maps

    got = attention_maps(model, img)
    prefix = overrides.get("num_registers", 0)
    for a, ref in zip(got.attn, maps, strict=True):
        rows = ref[:, :, prefix:]
        patch = rows[..., prefix:] / rows[..., prefix:].sum(-1, keepdim=True)
        torch.testing.assert_close(a, patch, rtol=1e-9, atol=1e-10)


def test_vit_trains_and_every_parameter_gets_a_gradient():
    model = ViT(**CFG, attn="rbf", num_registers=2, susie=True)
    loss = torch.nn.functional.cross_entropy(model(torch.rand(3, 3, 28, 20)), torch.tensor([0, 1, 2]))
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, missing
    assert float(model.registers.grad.abs().sum()) > 0  # zero registers still learn


def test_vit_with_susie_runs_on_a_larger_grid():
    model = ViT(**CFG, attn="rbf", susie=True, num_registers=1).eval()
    out = model(torch.rand(1, 3, 36, 44))
    assert out.shape == (1, 5) and torch.isfinite(out).all()


def test_checkpoint_round_trip_rbf(tmp_path):
    model = ViT(**CFG, attn="rbf", num_registers=2, susie=True).eval()
    with torch.no_grad():
        model.registers.normal_()
    path = save_checkpoint(tmp_path / "rbf.safetensors", model)
    loaded, meta = load_checkpoint(path)
    img = torch.rand(2, 3, 28, 20)
    assert meta["config"]["susie"] is True and meta["config"]["attn"] == "rbf"
    torch.testing.assert_close(loaded(img), model(img), rtol=0, atol=0)


def test_config_validation_and_old_configs():
    with pytest.raises(ValueError, match="qk_norm is for attn='dot'"):
        ViTConfig(attn="rbf", qk_norm=True)
    with pytest.raises(ValueError, match="SuSiE codes positions"):
        ViTConfig(attn="ssog", susie=True)
    with pytest.raises(ValueError, match="multiple of 4"):
        ViTConfig(attn="rbf", dim=24, num_heads=4, susie=True)  # head dim 6
    with pytest.raises(ValueError, match="unknown model config field"):
        ViTConfig.from_dict({"attn": "rbf", "susie_width": 8})
    old = ViTConfig(attn="dot").to_dict()
    for key in ("susie", "susie_dim", "qk_norm"):  # configs written before these fields still load
        old.pop(key)
    assert ViTConfig.from_dict(old) == ViTConfig(attn="dot")


def test_dispatch_on_cpu(monkeypatch):
    q, k, v = qkv(b=1, h=1, n=5, d=8, dtype=torch.float32)
    monkeypatch.delenv("RBF_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert choose_rbf_backend(q, k, v) == "torch"
    assert not can_run_triton_rbf(q, k, v)
    assert "need CUDA" in rbf_triton_problem(q, k, v)
    with pytest.raises(BackendUnavailable, match="RBF triton backend cannot run this input: .*need CUDA"):
        rbf_attention(q, k, v, backend="triton")
    with pytest.raises(BackendUnavailable, match="need CUDA"):
        can_run_triton_rbf(q, k, v, raise_error=True)
    monkeypatch.setenv("RBF_BACKEND", "triton")
    with pytest.raises(BackendUnavailable, match="need CUDA"):
        rbf_attention(q, k, v)
    monkeypatch.setenv("RBF_BACKEND", "cuda")
    with pytest.raises(BackendUnavailable, match="RBF_BACKEND='cuda' is not one of triton, torch"):
        rbf_attention(q, k, v)
    with pytest.raises(BackendUnavailable, match="backend='flash' is not one of"):
        rbf_attention(q, k, v, backend="flash")
    monkeypatch.setenv("RBF_BACKEND", "torch")
    torch.testing.assert_close(rbf_attention(q, k, v), rbf_attention_torch(q, k, v))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # interpretable on CPU: chosen automatically, as for SSOG
    monkeypatch.delenv("RBF_BACKEND")
    assert can_run_triton_rbf(q, k, v)
    assert choose_rbf_backend(q, k, v) == "triton"
    assert choose_rbf_backend(q, k, v, backend="torch") == "torch"  # the per-call argument wins
    assert rbf_triton_problem(q, k, torch.randn(1, 1, 5, 3)).startswith("value width 3")
    big = torch.empty(300, 300, 2, 8)
    assert "grid limit" in rbf_triton_problem(big, big, big)
    assert "float64" in rbf_triton_problem(*qkv(b=1, h=1, n=5, d=8))


def test_bad_inputs_get_clear_errors():
    q, k, v = qkv(b=1, h=2, n=5, d=8)
    with pytest.raises(ValueError, match=r"\(B, H, N, D\)"):
        rbf_attention(q, k[:, :, :4], v)
    with pytest.raises(ValueError, match="one floating dtype"):
        rbf_attention(q, k.float(), v)


def test_dispatch_without_triton(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_installed", lambda: False)
    q, k, v = qkv(b=1, h=1, n=5, d=8, dtype=torch.float32)
    assert rbf_triton_problem(q, k, v) == "triton is not installed"
    with pytest.raises(BackendUnavailable, match="not installed"):
        rbf_attention(q, k, v, backend="triton")


@pytest.mark.slow
def test_rbf_module_compiles_with_fullgraph():
    """Backend choice and SuSiE trace without graph breaks (the Triton op's own compile test runs interpreted)."""
    torch.manual_seed(0)
    attn = RBFAttention(32, 2, susie="1d", causal=True)
    x = torch.randn(2, 1 + 10, 32, requires_grad=True)
    compiled = torch.compile(attn, fullgraph=True, backend="aot_eager")
    y = compiled(x, (1, 10))
    torch.testing.assert_close(y, attn(x, (1, 10)))
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    (want,) = torch.autograd.grad(attn(x, (1, 10)).square().sum(), x)
    torch.testing.assert_close(gx, want)


def test_torch_path_keeps_the_key_penalty_in_fp32_for_bf16():
    """Long bf16 keys: −‖k‖²/2 rounded to bf16 would shift logits by up to γ·2⁻⁸·‖k‖² (a 4 % output error here)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=gen).mul(s).bfloat16() for s in (3.0, 3.0, 1.0))
    want = rbf_weights(q.double(), k.double()) @ v.double()
    k.requires_grad_()
    out = rbf_attention_torch(q, k, v)
    assert ((out.double() - want).abs().max() / want.abs().max()).item() < 5e-3
    (gk,) = torch.autograd.grad(out.float().square().sum(), k)
    assert torch.isfinite(gk).all() and gk.abs().sum() > 0
