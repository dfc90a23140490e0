"""Named hook points: run_with_cache reads what the float64 definition computes, run_with_hooks replaces it for one
call and thread, edits and hooks meet at the same points, and nnsight reaches them as modules; a compiled model runs
them (and compiles to one graph with none installed), the cache is detached, work carried to a pool sees them, and
the documented table matches every point's shape."""

from __future__ import annotations

import inspect
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from app.common import stoppable  # before nnsight's test: importing gradio after nnsight fails in anyio
from ssog_core import ViT
from ssog_core.analysis.measures import attention_maps
from ssog_core.interventions import hooks as hooks_module
from ssog_core.interventions.hooks import hook_points, run_with_cache, run_with_hooks
from ssog_core.interventions.run import edited
from ssog_core.nn.hook_points import HookPoint, in_context
from ssog_core.nn.lm import CausalLM, LMConfig
from ssog_core.nn.vit import Block
from tests.dense_oracle import layer_norm, vit_forward
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
        torch.testing.assert_close(logits, model(img), rtol=0, atol=1e-12)  # the cache forms the patterns: A·V
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


@pytest.mark.slow
def test_edits_and_hooks_act_on_a_compiled_model():
    """A compile wrapper is looked through for names and its compiled forward runs the installed functions (a graph
    break at each point while something is installed; eager backend: no C compiler needed)."""
    torch._dynamo.reset()
    model, img = model_for(depth=2), images(2, seed=5)
    compiled = torch.compile(model, backend="eager")
    plain = model(img)
    torch.testing.assert_close(compiled(img), plain, rtol=1e-9, atol=1e-10)  # compiled with nothing installed
    edits = [{"op": "ablate_head", "layer": 1, "head": 2}, {"op": "close_gate", "layer": 0, "tap": "mu"}]
    with edited(model, edits):
        want = model(img)
    assert not torch.allclose(want, plain)
    with edited(compiled, edits):
        torch.testing.assert_close(compiled(img), want, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(compiled(img), plain, rtol=1e-9, atol=1e-10)  # nothing outlives the block

    assert list(hook_points(compiled)) == list(hook_points(model))  # no "_orig_mod." in the names
    last = "blocks.1.resid_post"
    doubled = run_with_hooks(compiled, img, {last: lambda a, n: 2 * a})
    torch.testing.assert_close(doubled, run_with_hooks(model, img, {last: lambda a, n: 2 * a}), rtol=1e-9, atol=1e-10)
    logits, cache = run_with_cache(compiled, img, [last, "blocks.0.attn.hook_in"])
    _, want_cache = run_with_cache(model, img, [last, "blocks.0.attn.hook_in"])
    torch.testing.assert_close(logits, plain, rtol=1e-9, atol=1e-10)
    for name, a in want_cache.items():
        torch.testing.assert_close(cache[name], a, rtol=1e-9, atol=1e-10)
    torch._dynamo.reset()


@pytest.mark.slow
def test_a_compiled_training_forward_has_no_graph_break_with_nothing_installed():
    """fullgraph=True refuses any graph break: the points and the dropout trace as plain ops, also after an edit
    block has ended."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ViT(**{**CFG, "depth": 2}, cold_init=False, dropout=0.2).train()
    img = images(2, seed=1).float()
    with edited(model, [{"op": "ablate_head", "layer": 0, "head": 1}]):
        model(img)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    loss = compiled(img).square().sum()
    loss.backward()
    assert model.blocks[0].attn.mu.grad is not None
    assert torch._dynamo.explain(model)(img).graph_break_count == 0
    torch._dynamo.reset()


def test_the_cache_holds_detached_tensors_unless_asked_to_keep_the_graphs():
    model, img = model_for(), images(2, seed=3)
    logits, cache = run_with_cache(model, img)
    assert logits.requires_grad  # the forward itself records as usual
    field = cache["blocks.0.attn.field"]
    tensors = [a for a in cache.values() if isinstance(a, torch.Tensor)] + [field.mu, field.sigma, field.log_lam]
    assert tensors and not any(t.requires_grad for t in tensors)
    _, kept = run_with_cache(model, img, ["blocks.1.resid_post", "blocks.0.attn.field"], detach=False)
    torch.testing.assert_close(kept["blocks.1.resid_post"], cache["blocks.1.resid_post"], rtol=0, atol=1e-12)  # A·V
    assert kept["blocks.0.attn.field"].mu.requires_grad
    kept["blocks.1.resid_post"].sum().backward()
    assert model.blocks[0].attn.v.weight.grad is not None


def test_work_handed_to_a_pool_or_a_stoppable_thread_inside_an_edit_sees_it():
    model, img = model_for(), images(2, seed=6)
    plain = model(img)
    with edited(model, [{"op": "ablate_head", "layer": 2, "head": 1}]):
        want = model(img)
        with ThreadPoolExecutor(2) as pool:
            carried = [pool.submit(in_context(model), img) for _ in range(4)]  # one wrapped callable, many calls
            bare = pool.submit(model, img)
            got = [f.result() for f in carried]
        in_thread = [r for r in stoppable(lambda stop: model(img), poll=0.01) if r is not None]
    assert not torch.equal(want, plain)
    assert all(torch.equal(g, want) for g in got) and torch.equal(in_thread[-1], want)
    assert torch.equal(bare.result(), plain)  # a bare submission starts in an empty context: unedited


@pytest.mark.parametrize("attn", ["ssog", "dot"])
def test_hook_in_is_the_layernormed_stream_the_attention_sees(attn):
    model, img = model_for(attn=attn), images(2, seed=8)
    names = [f"blocks.{i}.attn.hook_in" for i in range(CFG["depth"])]
    _, cache = run_with_cache(model, img, names + [f"blocks.{i}.resid_post" for i in range(CFG["depth"])])
    sd = model.state_dict()
    x, _ = model.embed(img)
    for i in range(CFG["depth"]):
        want = layer_norm(x, sd[f"blocks.{i}.norm1.weight"], sd[f"blocks.{i}.norm1.bias"])  # the oracle's LN
        torch.testing.assert_close(cache[names[i]], want.detach(), rtol=1e-12, atol=1e-12)
        x = cache[f"blocks.{i}.resid_post"]
    # what the attention sees is what it reads: a replaced input changes the block's output
    zeroed = run_with_hooks(model, img, {names[1]: lambda a, n: torch.zeros_like(a)})
    assert not torch.allclose(zeroed, model(img))
    for fn in (ViT.forward_features, Block.forward, CausalLM.forward):
        assert "attn_inputs" not in inspect.signature(fn).parameters


def _table_shapes() -> dict[str, str]:
    """Point name pattern → its documented shape, from the table in ``ssog_core.interventions.hooks``."""
    rows = re.findall(r"^\| ``([^`]+)`` \| (.*) \|$", hooks_module.__doc__, flags=re.M)
    return {name: (re.findall(r"``(\([^`]*\))``", text) or [""])[-1] for name, text in rows}


@pytest.mark.parametrize("which", ["ssog", "dot with registers", "language model"])
def test_the_documented_table_lists_every_point_with_its_shape(which):
    """Every point a model has is in the docstring table, and each plain tensor's shape is the documented one,
    prefix (register) tokens included."""
    torch.manual_seed(0)
    if which == "language model":
        model = CausalLM(LMConfig(vocab_size=11, context=9, dim=12, depth=2, num_heads=3, num_registers=2))
        x, sizes = torch.randint(0, 11, (2, 7)), dict(B=2, P=2, N=7)
    else:
        extra = {"attn": "dot", "num_registers": 2} if which == "dot with registers" else {}
        model = ViT(**{**CFG, **extra})
        x, sizes = images(2).float(), dict(B=2, P=extra.get("num_registers", 0), N=35, Gh=7, Gw=5)
    sizes |= dict(H=3, head_dim=4, dim=12, R=CFG["num_atoms"])
    table = _table_shapes()
    _, cache = run_with_cache(model, x)
    assert set(cache) == set(hook_points(model))
    for name, a in cache.items():
        pattern = re.sub(r"\.\d+\.", ".{l}.", name)
        pattern = re.sub(r"probes\.\w+$", "probes.{tap}", pattern)
        assert pattern in table, f"{pattern} is not in the table"
        shape = table[pattern]
        if isinstance(a, torch.Tensor) and "[" not in shape:
            want = tuple(eval(part, {}, dict(sizes)) for part in shape.strip("()").split(", "))  # noqa: S307
            assert a.shape == want, f"{name}: {tuple(a.shape)} is not the documented {shape}"


class _MaxPooled(ViT):
    """A ViT whose forward pools differently: what the analysis reports must be this model's own logits."""

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(img).amax(dim=1))


def test_the_analysis_reads_the_attention_inputs_in_the_models_own_forward():
    model, img = model_for(), images(2, seed=2)
    pooled = _MaxPooled(**CFG, cold_init=False).double().eval()
    pooled.load_state_dict(model.state_dict())
    maps = attention_maps(pooled, img)
    torch.testing.assert_close(maps.logits, pooled(img).detach(), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(maps.logits, model(img))
    _, cache = run_with_cache(model, img, ["blocks.2.attn.hook_in"])
    want = model.blocks[2].attn.attention_matrix(cache["blocks.2.attn.hook_in"], (7, 5))
    torch.testing.assert_close(maps.attn[2], want, rtol=1e-12, atol=1e-12)  # SSOG: no prefix to strip
