"""Named hook points: run_with_cache reads what the float64 definition computes, run_with_hooks replaces it for one
call and thread, edits and hooks meet at the same points, and nnsight reaches them as modules."""

from __future__ import annotations

import threading

import pytest
import torch

from ssog_core import ViT
from ssog_core.interventions.hooks import hook_points, run_with_cache, run_with_hooks
from ssog_core.interventions.run import edited
from ssog_core.nn.hook_points import HookPoint
from tests.dense_oracle import vit_forward
from tests.test_interventions import CFG, RefEdit, images, model_for


def test_every_point_is_named_by_its_module_path_and_holds_no_parameters():
    model = model_for()
    names = list(hook_points(model))
    for layer in range(CFG["depth"]):
        want = [f"blocks.{layer}.attn.{p}" for p in ("field", "probes.mu", "probes.sigma", "probes.lambda", "head_out")]
        assert set(want) | {f"blocks.{layer}.resid_post"} <= set(names)
    assert all(not list(m.parameters()) and not list(m.buffers()) for m in hook_points(model).values())
    assert not any("field" in k or "probes" in k or "head_out" in k or "resid_post" in k for k in model.state_dict())
    dot = model_for(attn="dot")
    assert "blocks.0.attn.head_out" in hook_points(dot) and "blocks.0.attn.field" not in hook_points(dot)


def test_the_cache_holds_what_the_definition_computes():
    model, img = model_for(), images(2, seed=4)
    logits, cache = run_with_cache(model, img)
    assert set(cache) == set(hook_points(model))
    # a call with hooks takes the per-token field, a plain forward may steer inside the C kernels: the same numbers
    # to float64 rounding (tests/test_ops_cpu.py checks the C steering against the definition)
    torch.testing.assert_close(logits, model(img), rtol=0, atol=1e-12)
    seen = {}

    def grab(layer, y):  # y is (B, H, N, hd) in the definition
        seen[layer] = y
        return y

    want, _ = vit_forward(img, model.state_dict(), {**CFG, "attn": "ssog"}, RefEdit(heads=grab))
    torch.testing.assert_close(logits, want, rtol=1e-9, atol=1e-10)
    hd = CFG["dim"] // CFG["num_heads"]
    for layer in range(CFG["depth"]):
        y = cache[f"blocks.{layer}.attn.head_out"]
        assert y.shape == (2, 35, CFG["num_heads"], hd)
        torch.testing.assert_close(y, seen[layer].transpose(1, 2), rtol=1e-9, atol=1e-10)
        fixed = model.blocks[layer].attn.fixed_field()
        assert torch.equal(cache[f"blocks.{layer}.attn.field"].mu, fixed.mu)
        assert cache[f"blocks.{layer}.attn.probes.mu"].shape == (2, 7, 5, CFG["num_heads"], CFG["num_atoms"], 2)
    x, grid = model.embed(img)
    for layer, block in enumerate(model.blocks):
        x = block(x, grid)
        torch.testing.assert_close(cache[f"blocks.{layer}.resid_post"], x, rtol=0, atol=1e-12)
    names = ["blocks.1.resid_post"]
    assert list(run_with_cache(model, img, names)[1]) == names


def test_a_hook_replaces_the_activation_for_that_call_only():
    model, a, b = model_for(), images(2, seed=1), images(2, seed=2)
    before = model(a)
    last = f"blocks.{CFG['depth'] - 1}.resid_post"
    _, cache_b = run_with_cache(model, b, [last])
    # the last block's output of b in a's run: the head then sees b's stream exactly
    replaced = run_with_hooks(model, a, {last: lambda act, name: cache_b[name]})
    torch.testing.assert_close(replaced, model(b), rtol=0, atol=1e-12)  # hooked vs plain path: float64 rounding

    def zero_head(y, name):
        assert name == "blocks.1.attn.head_out"
        y = y.clone()
        y[:, :, 2] = 0.0
        return y

    by_hand = run_with_hooks(model, a, {"blocks.1.attn.head_out": zero_head})
    with edited(model, [{"op": "ablate_head", "layer": 1, "head": 2}]):
        assert torch.equal(by_hand, model(a))
    assert not torch.allclose(by_hand, before)
    assert torch.equal(model(a), before)


def test_a_probe_point_returning_none_closes_that_tap():
    model, img = model_for(), images()
    fixed = ViT(**CFG, steer=()).double().eval()
    fixed.load_state_dict(model.state_dict(), strict=False)
    taps = {f"blocks.{i}.attn.probes.{t}": (lambda a, n: None) for i in range(3) for t in ("mu", "sigma", "lambda")}
    assert torch.equal(run_with_hooks(model, img, taps), fixed(img))


def test_inside_an_edit_the_cache_sees_the_edited_model():
    model, img = model_for(), images()
    with edited(model, [{"op": "ablate_head", "layer": 2, "head": 0}, {"op": "close_gate", "layer": 1, "tap": "mu"}]):
        logits, cache = run_with_cache(model, img)
        assert torch.equal(logits, model(img))
    assert cache["blocks.2.attn.head_out"][:, :, 0].abs().max() == 0
    assert cache["blocks.2.attn.head_out"][:, :, 1].abs().max() > 0
    assert "blocks.1.attn.probes.mu" not in cache and "blocks.1.attn.probes.sigma" in cache


def test_hooks_never_leak_between_threads():
    model, img = model_for(), images(2)
    before = model(img)
    scales = [0.0, 0.5, 2.0, 3.0]
    want = [run_with_hooks(model, img, {"blocks.0.resid_post": lambda a, n, s=s: a * s}) for s in scales]
    failures = []
    barrier = threading.Barrier(len(scales))

    def client(i: int) -> None:
        barrier.wait()
        for _ in range(3):
            got = run_with_hooks(model, img, {"blocks.0.resid_post": lambda a, n: a * scales[i]})
            if not torch.equal(got, want[i]):
                failures.append(i)
            if not torch.equal(model(img), before):
                failures.append(f"unhooked {i}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(scales))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures and torch.equal(model(img), before)


def test_an_unknown_point_is_refused_in_words():
    with pytest.raises(KeyError, match="no hook point 'blocks.9.resid_post'"):
        run_with_hooks(model_for(), images(1), {"blocks.9.resid_post": lambda a, n: a})


def test_nnsight_reads_a_layer_and_sets_a_heads_output():
    nnsight = pytest.importorskip("nnsight")
    model, img = model_for(), images(2, seed=7)
    wrapped = nnsight.NNsight(model)
    with wrapped.trace(img):
        stream = wrapped.blocks[1].resid_post.output.save()
        wrapped.blocks[2].attn.head_out.output[:, :, 1] = 0.0
        logits = wrapped.output.save()
    stream, logits = (getattr(t, "value", t) for t in (stream, logits))
    assert torch.equal(stream, run_with_cache(model, img, ["blocks.1.resid_post"])[1]["blocks.1.resid_post"])

    def zero(y, name):
        y = y.clone()
        y[:, :, 1] = 0.0
        return y

    assert torch.equal(logits, run_with_hooks(model, img, {"blocks.2.attn.head_out": zero}))
    assert not torch.allclose(logits, model(img))


def test_a_point_is_the_identity_without_hooks():
    x = torch.randn(3, 4)
    assert HookPoint()(x) is x


def test_plain_forward_hooks_reach_the_field_and_probes_where_the_c_kernels_steer():
    """On the CPU a steered float32 forward steers inside the C kernels and skips the per-token field, but only
    while the points are plain: a forward hook on a field or probe point sees (and may change) every call."""
    torch.manual_seed(0)
    model = ViT(num_classes=3, img_size=(28, 20), patch_size=4, dim=16, depth=2, num_heads=2, attn="ssog",
                cold_init=False).eval()  # fmt: skip  # a 7×5 grid, open gates
    x = torch.rand(2, 3, 28, 20)
    attn = model.blocks[1].attn
    with torch.no_grad():
        plain = model(x)
        seen = []
        handles = [attn.field.register_forward_hook(lambda m, i, o: seen.append("field")),
                   attn.probes["mu"].register_forward_hook(lambda m, i, o: seen.append("mu"))]  # fmt: skip
        hooked = model(x)
        for h in handles:
            h.remove()
        assert seen == ["field", "mu"]
        torch.testing.assert_close(hooked, plain, rtol=1e-5, atol=1e-6)  # the same model, by the unfused path
        handle = attn.probes["mu"].register_forward_hook(lambda m, i, o: torch.ones_like(o))  # the far bound
        moved = model(x)
        handle.remove()
        _, cache = run_with_cache(model, x, names=["blocks.1.attn.probes.mu"])
    assert not torch.allclose(moved, plain, atol=1e-4)  # the hook's replacement was used
    assert cache["blocks.1.attn.probes.mu"].shape[:3] == (2, 7, 5)
