"""Interventions against float64 definitions (tests/dense_oracle.py) on odd grids, and the promise that an
edit never leaks out of its call, even with many threads sharing one model."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ssog_core import ViT
from ssog_core.analysis import report
from ssog_core.analysis.head_spec import spec_from_head
from ssog_core.analysis.measures import attention_maps, export_maps, layer_field, residual_mix, steering_offsets
from ssog_core.interventions.edit import MAX_EDITS, EditError, describe, edit_from_dict, parse_edits
from ssog_core.interventions.effects import image_effect, validation_effect
from ssog_core.interventions.importance import head_importance
from ssog_core.interventions.ops import SetHead
from ssog_core.interventions.run import edited, mean_head_outputs, record
from ssog_core.interventions.validation import EvalSet
from ssog_core.nn.attention import SSOGAttention, gate_start
from ssog_core.nn.config import ViTConfig
from tests.dense_oracle import vit_forward
from tests.helpers import steered_vit

CFG = dict(num_classes=5, img_size=(28, 20), patch_size=4, dim=12, depth=3, num_heads=3, num_atoms=3)
GRID = (7, 5)


def model_for(**overrides) -> ViT:
    """A float64 model with open gates and active probes (steering matters), on a 7×5 grid."""
    return steered_vit({**CFG, **overrides}, seed=3)


def head_field(attn, grid):
    with torch.no_grad():
        return layer_field(attn, grid)


def images(n: int = 2, seed: int = 0, size=(28, 20)) -> torch.Tensor:
    return torch.rand(n, 3, *size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def reference(model: ViT, img: torch.Tensor, edit=None, **cfg) -> tuple[torch.Tensor, list[torch.Tensor]]:
    return vit_forward(img, model.state_dict(), {**CFG, "attn": "ssog", **cfg}, edit)


class RefEdit:
    """A reference edit: per-token atoms and per-head outputs changed by plain functions of (layer, ...)."""

    def __init__(self, atoms=None, heads=None):
        if atoms is not None:
            self.atoms = atoms
        if heads is not None:
            self.heads = heads


def at(layer: int, head: int, fn):
    """An atoms edit that changes one head of one layer: ``fn(mu, sigma, log_lam)`` on that head's slices."""

    def atoms(ly, mu, sigma, log_lam):
        if ly != layer:
            return mu, sigma, log_lam
        mu, sigma, log_lam = mu.clone(), sigma.clone(), log_lam.clone()
        mu[..., head, :, :], sigma[..., head, :, :], log_lam[..., head, :] = fn(
            mu[..., head, :, :], sigma[..., head, :, :], log_lam[..., head, :]
        )
        return mu, sigma, log_lam

    return RefEdit(atoms=atoms)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_closing_every_gate_equals_the_model_built_without_steering():
    model, img = model_for(), images()
    fixed = ViT(**CFG, steer=()).double().eval()
    fixed.load_state_dict(model.state_dict(), strict=False)  # the probes and gates are simply not there
    edits = [{"op": "close_gate", "layer": i, "tap": "all"} for i in range(CFG["depth"])]
    with edited(model, edits):
        logits, maps = model(img), attention_maps(model, img)
    assert torch.equal(logits, fixed(img))
    for got, want in zip(maps.attn, attention_maps(fixed, img).attn, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("tap", ["mu", "sigma", "lambda"])
def test_closing_one_heads_gate_keeps_that_tap_fixed(tap):
    model, img = model_for(), images()
    layer, head = 1, 2
    attn = model.blocks[layer].attn
    fixed = attn.fixed_field()

    def keep_fixed(mu, sigma, log_lam):
        if tap == "mu":
            mu = fixed.mu[head].expand_as(mu)
        elif tap == "sigma":
            sigma = fixed.sigma[head].expand_as(sigma)
        else:
            log_lam = fixed.log_lam[head].expand_as(log_lam)
        return mu, sigma, log_lam

    want, want_maps = reference(model, img, at(layer, head, keep_fixed))
    with edited(model, [{"op": "close_gate", "layer": layer, "tap": tap, "head": head}]):
        close(model(img), want)
        close(attention_maps(model, img).attn[layer], want_maps[layer])


@pytest.mark.parametrize(("tap", "factor"), [("mu", 0.5), ("sigma", 0.3), ("lambda", 2.0), ("all", 0.7)])
def test_scaling_a_heads_gate_moves_its_atoms_that_fraction_of_contents_offset(tap, factor):
    """The offsets are s·tanh(p), so the gate times g puts μ, log σ and log λ that fraction of the way from the
    fixed field to the learned steered one, for that head only."""
    model, img = model_for(), images()
    layer, head = 2, 1
    fixed = model.blocks[layer].attn.fixed_field()

    def scaled(mu, sigma, log_lam):
        if tap in ("mu", "all"):
            mu = fixed.mu[head] + factor * (mu - fixed.mu[head])
        if tap in ("sigma", "all"):
            sigma = fixed.sigma[head] * (sigma / fixed.sigma[head]) ** factor
        if tap in ("lambda", "all"):
            log_lam = fixed.log_lam[head] + factor * (log_lam - fixed.log_lam[head])
        return mu, sigma, log_lam

    want, want_maps = reference(model, img, at(layer, head, scaled))
    with edited(model, [{"op": "scale_gate", "layer": layer, "tap": tap, "head": head, "factor": factor}]):
        close(model(img), want)
        close(attention_maps(model, img).attn[layer], want_maps[layer])


def test_a_gate_scaled_by_zero_is_closed_and_by_one_is_as_trained():
    model, img = model_for(), images()
    with edited(model, [{"op": "scale_gate", "layer": 1, "tap": "all", "factor": 0}]):
        zero = model(img)
    with edited(model, [{"op": "close_gate", "layer": 1, "tap": "all"}]):
        closed = model(img)
    with edited(model, [{"op": "scale_gate", "layer": 1, "factor": 1}]):
        one = model(img)
    close(zero, closed)
    close(one, model(img))  # not bit for bit: unedited, the CPU forward steers in C from the raw probes
    assert not torch.allclose(zero, one)  # the gate matters in this model, so the checks above can fail


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_drop_atom_is_the_renormalised_mixture(mode):
    model, img = model_for(field=mode), images()

    def drop(mu, sigma, log_lam):
        log_lam = log_lam.clone()
        log_lam[..., 1] = -torch.inf  # λ = 0, the others renormalised by the softmax
        return mu, sigma, log_lam

    want, want_maps = reference(model, img, at(2, 0, drop), field=mode)
    with edited(model, [{"op": "drop_atom", "layer": 2, "head": 0, "atom": 1}]):
        close(model(img), want)
        close(attention_maps(model, img).attn[2], want_maps[2])


@pytest.mark.parametrize("attn", ["ssog", "dot"])
def test_zero_ablation_equals_zeroing_that_heads_slice_of_the_output_projection(attn):
    model, img = model_for(attn=attn), images()
    layer, head, hd = 1, 1, CFG["dim"] // CFG["num_heads"]
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd[f"blocks.{layer}.attn.out.weight"][:, head * hd : (head + 1) * hd] = 0.0
    want, _ = vit_forward(img, sd, {**CFG, "attn": attn})
    with edited(model, [{"op": "ablate_head", "layer": layer, "head": head}]):
        close(model(img), want)


def test_dataset_mean_ablation_puts_the_mean_output_in_the_heads_place():
    model, img = model_for(), images(3)
    means = mean_head_outputs(model, [images(2, seed=5), images(3, seed=6)])
    seen = [record(model, images(2, seed=5)), record(model, images(3, seed=6))]
    want_mean = torch.cat([seen[0][2].output, seen[1][2].output]).mean(0)
    close(means[2], want_mean)

    def heads(layer, y):  # y is (B, H, N, hd)
        if layer == 2:
            y = y.clone()
            y[:, 0] = want_mean[:, 0]
        return y

    want, _ = reference(model, img, RefEdit(heads=heads))
    with edited(model, [{"op": "ablate_head", "layer": 2, "head": 0, "mode": "dataset_mean"}], head_means=means):
        close(model(img), want)


@pytest.mark.parametrize("what", ["output", "steering"])
def test_patching_from_the_same_image_changes_nothing(what):
    model, img = model_for(), images(1)
    before = model(img)
    with edited(model, [{"op": "patch_head", "layer": 1, "head": 2, "source": "a", "what": what}], {"a": img}):
        close(model(img), before)


def test_steering_patched_from_b_is_as_field_with_bs_offsets():
    model, a, b = model_for(), images(2, seed=1), images(1, seed=2)
    layer, head = 1, 0
    taken = {}

    def grab(ly, mu, sigma, log_lam):
        if ly == layer:
            taken["atoms"] = (mu[..., head, :, :], sigma[..., head, :, :], log_lam[..., head, :])
        return mu, sigma, log_lam

    reference(model, b, RefEdit(atoms=grab))
    want, _ = reference(model, a, at(layer, head, lambda *_: taken["atoms"]))  # the fixed atoms are shared
    patch = {"op": "patch_head", "layer": layer, "head": head, "source": "b", "what": "steering"}
    with edited(model, [patch], {"b": b}):
        close(model(a), want)


def test_output_patched_from_b_is_bs_head_output():
    model, a, b = model_for(), images(2, seed=1), images(1, seed=2)
    taken = {}

    def grab(layer, y):
        if layer == 2:
            taken["y"] = y[:, 1]
        return y

    def put(layer, y):
        if layer == 2:
            y = y.clone()
            y[:, 1] = taken["y"]
        return y

    reference(model, b, RefEdit(heads=grab))
    want, _ = reference(model, a, RefEdit(heads=put))
    with edited(model, [{"op": "patch_head", "layer": 2, "head": 1, "source": "b"}], {"b": b}):
        close(model(a), want)


def test_set_head_with_its_own_atoms_changes_nothing():
    model, img = model_for(), images()
    lf = head_field(model.blocks[1].attn, GRID)
    spec = spec_from_head(lf, 2, grid=GRID)
    before = model(img)
    with edited(model, [SetHead(layer=1, head=2, head_spec=spec)]):
        torch.testing.assert_close(model(img), before, rtol=1e-5, atol=1e-6)  # the spec holds float32 numbers


def test_set_head_puts_the_atoms_where_the_canvas_shows_them():
    """A one-atom spec looking two rows up from the ★ gives a head with μ = (2, 0), λ = 1 on that atom."""
    model = model_for()
    spec = spec_from_head(head_field(model.blocks[0].attn, GRID), 0, grid=GRID)
    qy, qx = spec.query
    one = type(spec)(spec.grid, spec.query, spec.tau, (type(spec.atoms[0])(qy - 2, qx, 0.7, 0.9, 1.0),), spec.mode)
    with edited(model, [SetHead(layer=0, head=0, head_spec=one)]):
        f = model.blocks[0].attn.field_of(torch.zeros(1, 35, 12, dtype=torch.float64), GRID, steered=False)
    torch.testing.assert_close(f.mu[0, 0], torch.tensor([2.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(f.sigma[0, 0], torch.tensor([0.7, 0.9], dtype=torch.float64))
    torch.testing.assert_close(f.lam()[0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))


def test_swapping_twice_is_the_identity_and_once_mirrors_the_steered_head():
    model, img = model_for(), images()
    swap = {"op": "swap_axes", "layer": 1, "head": 0}
    with edited(model, [swap, swap]):
        close(model(img), model_for()(img))  # to rounding: unedited, the CPU forward steers in C

    def flip(mu, sigma, log_lam):
        return mu.flip(-1), sigma.flip(-1), log_lam

    want, _ = reference(model, img, at(1, 0, flip))
    with edited(model, [swap]):
        close(model(img), want)


def test_swap_on_a_fixed_field_over_a_square_grid_transposes_token_positions():
    model = model_for(steer=(), img_size=(20, 20))
    attn, grid, n = model.blocks[0].attn, (5, 5), 25
    x = torch.randn(1, n, 12, dtype=torch.float64)
    t = torch.arange(n).view(5, 5).T.reshape(-1)  # P: token (i, w) ↔ (w, i)
    perm = torch.eye(n, dtype=torch.float64)[t]
    a = attn.attention_matrix(x, grid)
    with edited(model, [{"op": "swap_axes", "layer": 0, "head": 1}]):
        b = attn.attention_matrix(x, grid)
    close(b[0, 1], perm @ a[0, 1] @ perm.T)
    assert torch.equal(b[0, [0, 2]], a[0, [0, 2]])


def test_edited_export_maps_equal_the_definition_under_the_edit():
    model, img = model_for(), images()
    hd = CFG["dim"] // CFG["num_heads"]
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["blocks.1.attn.out.weight"][:, 0:hd] = 0.0  # head 0 of layer 1 ablated
    _, mats = vit_forward(img, sd, {**CFG, "attn": "ssog"}, at(2, 1, lambda mu, s, ll: (mu.flip(-1), s.flip(-1), ll)))
    edits = [{"op": "ablate_head", "layer": 1, "head": 0}, {"op": "swap_axes", "layer": 2, "head": 1}]
    with edited(model, edits):
        got = export_maps(model, img, alpha=0.5)
    kept = [[0, 1, 2], [1, 2], [0, 1, 2]]  # the ablated head contributes no attention to the head mean
    acc, roll = 0, None
    for layer, a in enumerate(mats):
        a_hat = residual_mix(a[:, kept[layer]].mean(1), 0.5)
        diag = torch.diagonal(a_hat, dim1=-2, dim2=-1)
        net = a_hat.sum(-2) - diag - (1 - diag)
        torch.testing.assert_close(got.net[:, layer].double(), net.view(2, *GRID), rtol=1e-5, atol=1e-6)
        acc = acc + net
        roll = a_hat if roll is None else a_hat @ roll
    torch.testing.assert_close(got.accumulated.double(), acc.view(2, *GRID), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.rollout.double(), roll.mean(-2).view(2, *GRID), rtol=1e-5, atol=1e-6)


def test_a_layer_with_every_head_ablated_passes_its_residual_on_in_the_maps():
    model, img = model_for(), images(1)
    with edited(model, [{"op": "ablate_head", "layer": 0, "head": h} for h in range(3)]):
        maps = export_maps(model, img)
    assert torch.allclose(maps.net[:, 0], torch.zeros_like(maps.net[:, 0]), atol=1e-6)


def test_steering_offsets_are_measured_from_the_edited_fixed_field():
    model, img = model_for(), images(1)
    with edited(model, [{"op": "close_gate", "layer": 1, "tap": "mu", "head": 0}]):
        off = steering_offsets(model, img)
    assert off.dmu[1][..., 0, :, :].abs().max() == 0 and off.dmu[1][..., 1, :, :].abs().max() > 0


def _everything(model, img):
    maps = export_maps(model, img)
    offsets = steering_offsets(model, img).dmu
    return [model(img), *attention_maps(model, img).attn, maps.accumulated, maps.rollout, *offsets]


@pytest.mark.slow
def test_edits_never_leak_even_from_eight_concurrent_threads():
    model, img, src = model_for(), images(2), images(1, seed=9)
    before = _everything(model, img)
    edit_sets = [
        [{"op": "close_gate", "layer": i % 3, "tap": "all"}, {"op": "swap_axes", "layer": 2, "head": i % 3}]
        + [{"op": "patch_head", "layer": 1, "head": 1, "source": "s", "what": ["output", "steering"][i % 2]}]
        for i in range(8)
    ]
    want_edited = []
    for edits in edit_sets:
        with edited(model, edits, {"s": src}):
            want_edited.append(model(img))
    with pytest.raises(RuntimeError), edited(model, edit_sets[0], {"s": src}):
        raise RuntimeError("a failure inside the block")
    assert all(torch.equal(a, b) for a, b in zip(_everything(model, img), before, strict=True))

    failures: list[str] = []
    barrier = threading.Barrier(8)

    def client(i: int) -> None:
        barrier.wait()
        for _ in range(3):
            with edited(model, edit_sets[i], {"s": src}):
                if not torch.equal(model(img), want_edited[i]):
                    failures.append(f"client {i}: edited result changed")
            if not all(torch.equal(a, b) for a, b in zip(_everything(model, img), before, strict=True)):
                failures.append(f"client {i}: an unedited result changed")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert all(torch.equal(a, b) for a, b in zip(_everything(model, img), before, strict=True))
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())


def test_a_call_runs_with_eval_semantics_without_switching_a_model_another_thread_trains():
    """Beside a thread that trains the model (dropout on), the analysis and the interventions in another thread see
    ``training`` stay True, never write it, and give the eval-mode results."""
    model, img, src = model_for(dropout=0.5), images(2, seed=2), images(1, seed=9)
    g = torch.Generator().manual_seed(4)
    data = EvalSet(torch.randint(0, 256, (12, 28, 20, 3), generator=g, dtype=torch.uint8), torch.arange(12) % 5,
                   [f"c{i}" for i in range(5)], "test")  # fmt: skip
    edits = [{"op": "ablate_head", "layer": 1, "head": 0, "mode": "dataset_mean"},
             {"op": "patch_head", "layer": 2, "head": 1, "source": "s", "what": "steering"}]  # fmt: skip

    def calls() -> list[torch.Tensor]:
        means = mean_head_outputs(model, [data.batch(0, 12, dtype=torch.float64)])
        eff = image_effect(model, img, edits, {"s": src}, means)
        val = validation_effect(model, data, edits, {"s": src}, means)
        imp = head_importance(model, data, batch_size=5)
        offsets = steering_offsets(model, img)
        cells = torch.tensor([c.logp_drop for row in imp.ablate for c in row])
        return [*means, eff.probs_edited, eff.accumulated_edited, torch.tensor(val.logp_true.change), cells,
                *offsets.dmu, offsets.logits]  # fmt: skip

    want = calls()  # the model is in eval mode here
    with torch.no_grad():
        eval_logits = model(img)
    model.train()
    stop, modes, dropped, in_call = threading.Event(), [], [], []
    tid = {}
    handle = model.blocks[0].register_forward_pre_hook(
        lambda m, a: in_call.append((threading.get_ident(), model.training))
    )

    def train() -> None:
        while not stop.is_set():
            modes.append(model.training)
            out = model(img)
            dropped.append(not torch.allclose(out, eval_logits))
            out.square().sum().backward()

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            tid["calls"] = pool.submit(threading.get_ident).result()
            got = pool.submit(calls).result()
    finally:
        stop.set()
        trainer.join()
        handle.remove()
    assert modes and all(modes) and all(dropped)  # the trainer's model trained with dropout throughout
    assert all(training for t, training in in_call if t == tid["calls"])  # never switched, not even in the call
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cold", [True, False])
def test_every_gate_starts_at_the_one_gate_start(cold):
    """The starting gate scale is computed in one place (``nn.attention.gate_start``): the module's gates, the
    report's reading and the trainer's stalled-gate warning use it."""
    want = math.log1p(math.exp(-8.0 if cold else -2.0)) + 1e-4
    assert gate_start(cold) == pytest.approx(want, rel=1e-6)
    attn = SSOGAttention(8, 2, 2, cold_init=cold)
    assert all(float(s) == gate_start(cold) for s in attn.gate_scales().values())
    assert report.initial_gate_scale(ViTConfig(cold_init=cold)) == gate_start(cold)


def test_edits_round_trip_through_json_and_read_as_sentences():
    model = model_for()
    spec = spec_from_head(head_field(model.blocks[0].attn, GRID), 1, grid=GRID)
    edits = parse_edits(
        [
            {"op": "close_gate", "layer": 5, "tap": "mu", "head": 0},
            {"op": "close_gate", "layer": 2},
            {"op": "scale_gate", "layer": 2, "tap": "sigma", "head": 1, "factor": 0.25},
            {"op": "ablate_head", "layer": 1, "head": 3, "mode": "dataset_mean"},
            {"op": "patch_head", "layer": 0, "head": 1, "source": "a" * 64, "what": "steering"},
            {"op": "drop_atom", "layer": 0, "head": 1, "atom": 2},
            {"op": "set_head", "layer": 0, "head": 1, "head_spec": spec.to_dict()},
            {"op": "swap_axes", "layer": 4, "head": 2},
        ]
    )
    assert [edit_from_dict(e.to_dict()) for e in edits] == edits
    assert describe(edits) == [
        "layer 5, head 0: μ gate closed",
        "layer 2: all gates closed",
        "layer 2, head 1: σ gate × 0.25",
        "layer 1, head 3: ablated (dataset mean)",
        "layer 0, head 1: steering patched from aaaaaaaaaaaa…",
        "layer 0, head 1: atom 2 dropped",
        "layer 0, head 1: atoms set by hand (3 atoms)",
        "layer 4, head 2: mirrored across the diagonal (y ↔ x)",
    ]


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ([{"op": "close_gate", "layer": 3}], "layer 3 does not exist"),
        ([{"op": "swap_axes", "layer": 0, "head": 3}], "head 3 does not exist"),
        ([{"op": "rotate", "layer": 0}], "unknown op 'rotate'"),
        ([{"op": "close_gate", "layer": 0, "tap": "tau"}], "unknown tap 'tau'"),
        ([{"op": "drop_atom", "layer": 0, "head": float("nan"), "atom": 0}], "head must be a whole number"),
        ([{"op": "patch_head", "layer": 0, "head": 0, "source": "nowhere.png"}], "'nowhere.png' is not there"),
        ([{"op": "swap_axes", "layer": 0, "head": 0}] * (MAX_EDITS + 1), f"at most {MAX_EDITS} edits"),
        ([{"op": "drop_atom", "layer": 0, "head": 0, "atom": a} for a in range(3)], "would have no atom left"),
        ([{"op": "ablate_head", "layer": 0, "head": 0, "mode": "dataset_mean"}], "needs the head means"),
        ([{"op": "swap_axes", "layer": 0, "head": 0, "axis": 1}], "has no field 'axis'"),
        ([{"op": "scale_gate", "layer": 0, "factor": float("nan")}], "factor must be a number from 0 to 10"),
        ([{"op": "scale_gate", "layer": 0, "factor": -0.5}], "factor must be a number"),
        ([{"op": "scale_gate", "layer": 0, "factor": "half"}], "factor must be a number"),
    ],
)
def test_bad_edits_are_refused_in_words(edits, message):
    with pytest.raises(EditError, match=message), edited(model_for(), edits):
        pass


def test_field_edits_are_refused_on_dot_and_fixed_models_with_what_works_there():
    dot_swap = [{"op": "swap_axes", "layer": 0, "head": 0}]
    with (
        pytest.raises(EditError, match="only ablate_head and patch_head with what='output'"),
        edited(model_for(attn="dot"), dot_swap),
    ):
        pass
    with pytest.raises(EditError, match="fixed field"), edited(model_for(steer=()), [{"op": "close_gate", "layer": 0}]):
        pass
    dot, img = model_for(attn="dot"), images(1)
    with edited(dot, [{"op": "patch_head", "layer": 1, "head": 0, "source": "a"}], {"a": img}):
        close(dot(img), model_for(attn="dot")(img))


def test_set_head_refuses_another_tau_a_sigma_below_the_floor_and_a_steered_query():
    model = model_for()
    spec = spec_from_head(head_field(model.blocks[0].attn, GRID), 0, grid=GRID)
    bad_tau = type(spec)(spec.grid, spec.query, spec.tau + 0.5, spec.atoms, spec.mode)
    thin = spec.with_atom(0, sy=0.1)
    for edit, message in [
        (SetHead(0, 0, bad_tau), "τ is per layer"),
        (SetHead(0, 0, thin), "below the model's floor"),
        (SetHead(0, 0, spec, steered=True), "steered query"),
    ]:
        with pytest.raises(EditError, match=message), edited(model, [edit]):
            pass


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_move_atom_equals_shifting_mu_in_the_checkpoint_by_hand(mode):
    """``move_atom`` adds (dy, dx) to the stored μ (query − key): the same model as one whose μ was shifted in its
    state dict, with content still steering the moved atom."""
    model, img = model_for(field=mode), images(2, seed=11)
    layer, head, atom, dy, dx = 1, 2, 1, 0.75, -1.25
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd[f"blocks.{layer}.attn.mu"][head, atom] += torch.tensor([dy, dx], dtype=torch.float64)
    by_hand = model_for(field=mode)
    by_hand.load_state_dict(sd)
    want, want_maps = reference(model, img, field=mode)
    moved = {"op": "move_atom", "layer": layer, "head": head, "atom": atom, "dy": dy, "dx": dx}
    with edited(model, [moved]):
        got, maps = model(img), attention_maps(model, img)
    torch.testing.assert_close(got, by_hand(img), rtol=1e-12, atol=1e-12)
    for a, b in zip(maps.attn, attention_maps(by_hand, img).attn, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, want)  # the move matters, so the check above can fail
    ref, _ = reference(by_hand, img, field=mode)  # and the shifted model is the float64 definition's
    close(got, ref)


def test_move_atom_reads_as_a_sentence_and_refuses_moves_off_the_grid():
    model = model_for()
    edit = parse_edits([{"op": "move_atom", "layer": 0, "head": 1, "atom": 2, "dy": 1, "dx": -0.5}])[0]
    assert describe([edit]) == ["layer 0, head 1: atom 2 moved by (dy, dx) = (+1, -0.5)"]
    assert edit_from_dict(edit.to_dict()) == edit and edit.to_dict()["dy"] == 1.0
    mu = model.blocks[0].attn.fixed_field().mu[1, 2].detach()
    far = {"op": "move_atom", "layer": 0, "head": 1, "atom": 2, "dy": 6.5 - float(mu[0]), "dx": 0.0}  # |μy| > 6
    for bad, message in [
        (far, r"beyond the 7-row grid \(\|μy\| ≤ 6\)"),
        ({**far, "dy": 0.0, "dx": -4.5 - float(mu[1])}, r"beyond the 5-column grid \(\|μx\| ≤ 4\)"),
        ({**far, "dy": float("inf")}, "dy must be a finite number, got inf"),
        ({**far, "dx": "left"}, "dx must be a finite number"),
        ({**far, "atom": 3}, "atom 3 does not exist"),
        ({"op": "move_atom", "layer": 0, "head": 1, "dy": 1.0}, "move_atom needs a atom"),
    ]:
        with pytest.raises(EditError, match=message), edited(model, [bad]):
            pass
    with edited(model, [{**far, "dy": 5.9 - float(mu[0])}]):  # inside the grid: taken
        pass
    with pytest.raises(EditError, match="only ablate_head and patch_head"), edited(model_for(attn="dot"), [far]):
        pass


def test_a_playground_head_goes_back_as_moves_when_only_atoms_were_dragged():
    from ssog_core.interventions.ops import MoveAtom, head_edits

    model = model_for()
    opened = spec_from_head(head_field(model.blocks[1].attn, GRID), 2, grid=GRID)
    assert head_edits(1, 2, opened, opened) == []
    a = opened.atoms[1]
    atoms = (opened.atoms[0], type(a)(a.y + 2, a.x - 1, a.sy, a.sx, a.w), *opened.atoms[2:])
    dragged = type(opened)(opened.grid, opened.query, opened.tau, atoms, opened.mode)
    assert head_edits(1, 2, opened, dragged) == [MoveAtom(1, 2, 1, -2.0, 1.0)]  # μ = query − key
    with edited(model, head_edits(1, 2, opened, dragged)):
        f = model.blocks[1].attn.field_of(torch.zeros(1, 35, 12, dtype=torch.float64), GRID, steered=False)
    torch.testing.assert_close(f.mu[2, 1], dragged.field().mu[0, 1])  # the atom sits where the canvas shows it
    wider = opened.with_atom(0, sy=opened.atoms[0].sy + 0.5)
    assert [e.op for e in head_edits(1, 2, opened, wider)] == ["set_head"]
