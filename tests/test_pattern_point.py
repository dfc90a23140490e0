"""The attention pattern point ``blocks.{l}.attn.pattern`` on every lab model (SSOG, dot, RBF; registers first; the
causal language model): what it holds is the float64 dense definition, a replacement is what mixes the values, and
nothing is formed (the fused paths stay as they were) unless something is installed at that very point."""

from __future__ import annotations

import math

import pytest
import torch

from ssog_core import ViT
from ssog_core.interventions.hooks import run_with_cache, run_with_hooks
from ssog_core.interventions.run import edited
from ssog_core.nn.attention import SSOGAttention, _QKAttention
from ssog_core.nn.lm import CausalLM, LMConfig
from tests.dense_oracle import attention_layer, softmax
from tests.test_interventions import CFG, images, model_for

F64 = dict(rtol=1e-9, atol=1e-12)
KINDS = {"ssog": 0, "dot": 2, "rbf": 2}  # attention → register (prefix) tokens
GRID = (7, 5)


def lab_model(kind: str) -> torch.nn.Module:
    """A float64 model of ``kind`` on a 7×5 grid: SSOG steered (open gates), dot and RBF with two random registers."""
    model = model_for(attn=kind, num_registers=KINDS[kind])
    if KINDS[kind]:
        with torch.no_grad():
            model.registers.normal_(0, 1, generator=torch.Generator().manual_seed(2))
    return model


def dense_pattern(kind: str, model: torch.nn.Module, layer: int, x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, T)`` from the layer's weights and its LayerNormed input ``x``, written out densely."""
    attn = model.blocks[layer].attn
    if kind != "rbf":  # the oracle's layer: SSOG from its atoms, dot from q·k (tests/dense_oracle.py)
        p = {k.removeprefix(f"blocks.{layer}.attn."): v for k, v in model.state_dict().items()
             if k.startswith(f"blocks.{layer}.attn.")}  # fmt: skip
        return attention_layer(x, p, {**CFG, "attn": kind}, GRID)[1]
    b, t, dim = x.shape
    h, hd = attn.num_heads, dim // attn.num_heads
    q, k = (part.reshape(b, t, h, hd).transpose(1, 2) for part in (x @ attn.qkv.weight.T).split(dim, -1)[:2])
    distance = ((q[:, :, :, None] - k[:, :, None]) ** 2).sum(-1)  # ‖q_i − k_j‖², (B, H, T, T)
    return softmax(-distance / math.sqrt(hd))


def values(model: torch.nn.Module, layer: int, x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, head_dim)`` the layer's values for its LayerNormed input ``x``."""
    attn = model.blocks[layer].attn
    b, t, dim = x.shape
    w = attn.v.weight if isinstance(attn, SSOGAttention) else attn.qkv.weight[2 * dim :]
    return (x @ w.T).reshape(b, t, attn.num_heads, -1).transpose(1, 2)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_cached_pattern_is_the_dense_definition_and_its_product_the_fused_output(kind):
    model, x = lab_model(kind), images(2, seed=1)
    names = [f"blocks.{i}.attn.{p}" for i in range(CFG["depth"]) for p in ("hook_in", "pattern")]
    logits, cache = run_with_cache(model, x, names)
    torch.testing.assert_close(logits, model(x), **F64)  # pattern @ V (formed) = the fused path (not formed)
    t = KINDS[kind] + GRID[0] * GRID[1]
    for layer in range(CFG["depth"]):
        a = cache[f"blocks.{layer}.attn.pattern"]
        assert a.shape == (2, CFG["num_heads"], t, t)
        want = dense_pattern(kind, model, layer, cache[f"blocks.{layer}.attn.hook_in"])
        torch.testing.assert_close(a, want, **F64)
    maps = model.blocks[1].attn.attention_matrix(cache["blocks.1.attn.hook_in"], GRID)
    torch.testing.assert_close(maps, cache["blocks.1.attn.pattern"], rtol=0, atol=0)  # the same weights


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_replaced_pattern_is_what_mixes_the_values(kind):
    """A hook returning another pattern gives the logits of that pattern times the layer's values, put in as the head
    outputs (float64, computed outside the module)."""
    model, x = lab_model(kind), images(2, seed=3)
    t = KINDS[kind] + GRID[0] * GRID[1]
    gen = torch.Generator().manual_seed(7)
    other = torch.softmax(3 * torch.randn(2, CFG["num_heads"], t, t, generator=gen, dtype=torch.float64), -1)
    _, cache = run_with_cache(model, x, ["blocks.1.attn.hook_in"])
    mixed = (other @ values(model, 1, cache["blocks.1.attn.hook_in"])).transpose(1, 2)
    want = run_with_hooks(model, x, {"blocks.1.attn.head_out": lambda y, n: mixed})
    got = run_with_hooks(model, x, {"blocks.1.attn.pattern": lambda a, n: other})
    torch.testing.assert_close(got, want, **F64)
    assert (got - model(x)).abs().max() > 1e-3  # it changed the output


def _never_formed(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a pattern was formed with nothing installed at its point")

    monkeypatch.setattr(SSOGAttention, "_weights", refuse)
    monkeypatch.setattr(_QKAttention, "_weights", refuse)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_without_anything_at_the_point_no_pattern_is_formed_and_the_output_is_the_fused_one(kind, monkeypatch):
    """float32, as models run: with nothing installed the output is bit for bit the fused path's, and neither hooks
    at other points nor an edit that does not act on patterns form the pattern."""
    torch.manual_seed(0)
    model = ViT(**{**CFG, "attn": kind, "num_registers": KINDS[kind]}, cold_init=False).eval()
    x = images(2, seed=4).float()
    with torch.no_grad():
        plain = model(x)
        _, formed = run_with_cache(model, x, ["blocks.0.attn.pattern"])  # (formed here: the point is read)
        _never_formed(monkeypatch)
        assert torch.equal(model(x), plain)
        others = ["blocks.0.attn.hook_in", "blocks.1.attn.head_out", "blocks.2.resid_post"]
        logits, cache = run_with_cache(model, x, others)
        assert set(cache) == set(others)
        torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-6)  # SSOG: the per-token field, not the C steering
        with edited(model, [{"op": "ablate_head", "layer": 1, "head": 0}]):
            model(x)
    assert formed["blocks.0.attn.pattern"].dtype == torch.float32


def test_float32_pattern_path_matches_the_fused_path_to_float32_rounding():
    for kind in KINDS:
        torch.manual_seed(1)
        model = ViT(**{**CFG, "attn": kind, "num_registers": KINDS[kind]}, cold_init=False).eval()
        x = images(2, seed=5).float()
        with torch.no_grad():
            logits, _ = run_with_cache(model, x, ["blocks.2.attn.pattern"])
            torch.testing.assert_close(logits, model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attn", ["dot", "rbf"])
def test_a_language_models_pattern_is_causal_and_registers_come_first(attn):
    torch.manual_seed(2)
    model = CausalLM(LMConfig(vocab_size=11, context=9, dim=12, depth=2, num_heads=3, num_registers=2, attn=attn))
    model = model.double().eval()
    with torch.no_grad():
        model.registers.normal_(0, 1)
    ids = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(3))
    logits, cache = run_with_cache(model, ids, ["blocks.1.attn.pattern", "blocks.1.attn.hook_in"])
    torch.testing.assert_close(logits, model(ids), **F64)
    a = cache["blocks.1.attn.pattern"]
    assert a.shape == (2, 3, 9, 9)
    x = cache["blocks.1.attn.hook_in"]
    attn_module = model.blocks[1].attn
    q, k, _ = attn_module.queries_keys_values(x, (1, 7))
    gamma = 1 / math.sqrt(q.shape[-1])
    scores = (
        q @ k.transpose(-2, -1) * gamma if attn == "dot" else -gamma * ((q[:, :, :, None] - k[:, :, None]) ** 2).sum(-1)
    )
    later = torch.ones(9, 9, dtype=torch.bool).triu(1)  # registers first: each token sees itself and what precedes it
    torch.testing.assert_close(a, softmax(scores.masked_fill(later, -math.inf)), **F64)
    assert torch.equal(a[..., later], torch.zeros_like(a[..., later]))
