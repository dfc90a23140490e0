"""Analysis for dot / RBF models: key norms and the attention share of the largest keys, maps with registers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssog_core import ViT
from ssog_core.analysis.measures import export_maps, has_keys, key_norms
from ssog_core.nn.lm import CausalLM, LMConfig
from tests.rbf_oracle import lm_forward, vit_forward

ALPHA = 8.0  # W_k gains α along the register direction: its key becomes several times longer than any other
CFG = dict(num_classes=5, img_size=(28, 20), patch_size=4, dim=24, depth=2, num_heads=3)


def randomised(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "registers" or name.endswith("susie.weight"):
                p.normal_(0, 0.7)
    return model


def expected_stats(maps, keys, prefix: int, top_k: int, causal: bool):
    """topk / uniform / prefix shares and the norm–attention correlation, from their definitions (numpy)."""
    rows = []
    for a, k in zip(maps, keys, strict=True):
        a, n = a.numpy(), np.linalg.norm(k.numpy(), axis=-1)  # (B, H, T, T), (B, H, T)
        b, h, t, _ = a.shape
        topk, uniform, pshare, corr = (np.zeros((b, h)) for _ in range(4))
        for bi in range(b):
            for hi in range(h):
                big = np.argsort(-n[bi, hi])[:top_k]
                q_rows = a[bi, hi, prefix:]
                topk[bi, hi] = q_rows[:, big].sum(-1).mean()
                pshare[bi, hi] = q_rows[:, :prefix].sum(-1).mean()
                seen = [np.arange(t) if not causal else np.arange(prefix + i + 1) for i in range(t - prefix)]
                uniform[bi, hi] = np.mean([np.isin(big, s).sum() / len(s) for s in seen])
                corr[bi, hi] = np.corrcoef(n[bi, hi], q_rows.mean(0))[0, 1]
        rows.append([x.mean(0) for x in (topk, uniform, pshare, corr)])
    return [np.stack([r[i] for r in rows]) for i in range(4)]


@pytest.mark.parametrize("attn, extra", [("rbf", dict(susie=True)), ("dot", dict())])
def test_vit_key_norms_match_their_definitions(attn, extra):
    torch.manual_seed(0)
    model = randomised(ViT(**CFG, attn=attn, num_registers=2, **extra).double().eval())
    img = torch.rand(2, 3, 28, 20, dtype=torch.float64)
    keys: list = []
    _, maps = vit_forward(img, model.state_dict(), {**CFG, "attn": attn, "num_registers": 2, **extra}, keys)
    kn = key_norms(model, img, top_k=3)
    assert kn.prefix == 2 and kn.kinds == [attn, attn] and kn.norms[0].shape == (2, 3, 37)
    for got, k in zip(kn.norms, keys, strict=True):
        torch.testing.assert_close(got, k.norm(dim=-1).float())
    topk, uniform, pshare, corr = expected_stats(maps, keys, prefix=2, top_k=3, causal=False)
    for got, want in ((kn.topk_share, topk), (kn.uniform_share, uniform), (kn.prefix_share, pshare)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kn.norm_attention_corr.numpy(), corr, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kn.uniform_share.numpy(), 3 / 37, rtol=1e-6)
    np.testing.assert_allclose(kn.sink_ratio.numpy(), topk / uniform, rtol=1e-5)
    rows = kn.summary()
    assert len(rows) == 6 and rows[0]["max_norm"] >= rows[0]["p99_norm"] >= rows[0]["median_norm"] > 0
    edges, dens = kn.histogram(bins=16)
    assert edges.shape == (17,) and dens.shape == (2, 16)
    torch.testing.assert_close((dens * (edges[1] - edges[0])).sum(-1), torch.ones(2), rtol=0, atol=1e-5)


def test_lm_key_norms_use_the_causal_visibility():
    torch.manual_seed(0)
    cfg = dict(vocab_size=31, context=24, dim=24, depth=2, num_heads=3, attn="rbf", num_registers=1)
    model = randomised(CausalLM(LMConfig(**cfg)).double().eval())
    idx = torch.randint(0, 31, (2, 17))
    keys: list = []
    _, maps = lm_forward(idx, model.state_dict(), cfg, keys)
    kn = key_norms(model, idx, top_k=2)
    topk, uniform, pshare, corr = expected_stats(maps, keys, prefix=1, top_k=2, causal=True)
    for got, want in ((kn.topk_share, topk), (kn.uniform_share, uniform), (kn.prefix_share, pshare)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kn.norm_attention_corr.numpy(), corr, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kn.sink_ratio.numpy(), topk / uniform, rtol=1e-5)  # causal: uniform varies by row


def test_a_huge_key_hoards_dot_attention_but_not_rbf_attention():
    """The source's "magnitude bullying": give the register a key many times longer than the others, pointing
    along the mean query. Dot queries pile onto it; RBF queries see only that it is far away."""
    share, uniform = {}, {}
    for attn in ("dot", "rbf"):
        torch.manual_seed(2)
        model = ViT(**CFG, attn=attn, num_registers=1).double().eval()
        img = torch.rand(2, 3, 28, 20, dtype=torch.float64)
        block = model.blocks[0]
        with torch.no_grad():
            model.registers.normal_()
            x, grid = model.embed(img)
            h = block.norm1(x)
            q, _, _ = block.attn.queries_keys_values(h, grid)
            u = q[:, :, 1:].mean(dim=(0, 2))  # (H, hd): mean query direction of each head
            u = u / u.norm(dim=-1, keepdim=True)
            r = h[0, 0] / h[0, 0].norm()  # direction of the register's LayerNormed input
            block.attn.qkv.weight[24:48] += ALPHA * u.reshape(-1, 1) * r[None, :]  # W_k += α u rᵀ
        kn = key_norms(model, img, top_k=1)
        assert bool((kn.norms[0].argmax(-1) == 0).all())  # the register holds the largest key everywhere
        share[attn], uniform[attn] = kn.topk_share[0], kn.uniform_share[0]
    assert bool((share["dot"] > 0.5).all()), share
    assert bool((share["rbf"] < uniform["rbf"]).all()), share


def test_export_maps_for_rbf_with_registers():
    torch.manual_seed(1)
    model = randomised(ViT(**CFG, attn="rbf", num_registers=3, susie=True).double().eval())
    e = export_maps(model, torch.rand(2, 3, 28, 20, dtype=torch.float64))
    assert e.net.shape == (2, 2, 7, 5)
    torch.testing.assert_close(e.net.sum(dim=(-2, -1)), torch.zeros(2, 2), rtol=0, atol=1e-5)
    assert e.prefix_share.shape == (2, 2) and float(e.prefix_share.min()) > 0


def test_ssog_models_have_no_keys():
    model = ViT(**CFG, attn="ssog", num_atoms=2)
    assert not has_keys(model) and has_keys(ViT(**CFG, attn="rbf"))
    with pytest.raises(ValueError, match="no keys"):
        key_norms(model, torch.rand(1, 3, 28, 20))
    with pytest.raises(ValueError, match="top_k"):
        key_norms(ViT(**CFG, attn="dot"), torch.rand(1, 3, 28, 20), top_k=0)
