"""ssog_core modules behind the app: the playground head, presets, query statistics, report, figures and the CLI.

The playground is checked against an independent float64 numpy evaluation of the field formula (docs/DESIGN.md §1)
and against the effective attention matrix, on odd grids, so "the atom is drawn where the head looks" is proven
by the computation, not by convention.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from ssog_core import figures, report, viz
from ssog_core.analysis import compute_export_maps, head_fields, head_stats, query_stats, steering_offsets
from ssog_core.cost import count_params
from ssog_core.field import attention_matrix
from ssog_core.playground import DEFAULT_SPEC, Atom, HeadSpec, evaluate, spec_from_head
from ssog_core.presets import find_presets, head_shapes
from tests.app_fixtures import CLASS_NAMES, designed_ssog, dot_twin, shapes_image, write_checkpoints


def numpy_head(spec: HeadSpec) -> np.ndarray:
    """Independent float64 reference: softmax over keys of ℓ(q − k; μ, σ)/τ per axis, then the λ mix (or, in
    axial mode, logsumexp of log λ + ℓ over atoms inside each axis)."""
    gh, gw = spec.grid
    qy, qx = spec.query
    w = np.array([a.w for a in spec.atoms])
    lam = w / w.sum()

    def ell(d, mu, s):
        return -0.5 * math.log(2 * math.pi) - np.log(s) - (d - mu) ** 2 / (2 * s**2)

    def softmax(z):
        z = z - z.max()
        return np.exp(z) / np.exp(z).sum()

    dy = qy - np.arange(gh)
    dx = qx - np.arange(gw)
    if spec.mode == "axial":
        ly = np.logaddexp.reduce(
            [np.log(l) + ell(dy, qy - a.y, a.sy) for a, l in zip(spec.atoms, lam, strict=True)], axis=0
        )
        lx = np.logaddexp.reduce(
            [np.log(l) + ell(dx, qx - a.x, a.sx) for a, l in zip(spec.atoms, lam, strict=True)], axis=0
        )
        return np.outer(softmax(ly / spec.tau), softmax(lx / spec.tau))
    out = np.zeros((gh, gw))
    for a, l in zip(spec.atoms, lam, strict=True):
        ay = softmax(ell(dy, qy - a.y, a.sy) / spec.tau)
        ax = softmax(ell(dx, qx - a.x, a.sx) / spec.tau)
        out += l * np.outer(ay, ax)
    return out


def random_spec(rng: np.random.Generator, grid=(7, 9), atoms=4, mode="factorized") -> HeadSpec:
    gh, gw = grid
    return HeadSpec(
        grid=grid,
        query=(int(rng.integers(gh)), int(rng.integers(gw))),
        tau=float(rng.uniform(0.5, 2.5)),
        atoms=tuple(
            Atom(
                rng.uniform(-1, gh), rng.uniform(-1, gw), rng.uniform(0.3, 3), rng.uniform(0.3, 3), rng.uniform(0.1, 2)
            )
            for _ in range(atoms)
        ),
        mode=mode,
    )


@pytest.mark.parametrize("mode", ["factorized", "axial"])
@pytest.mark.parametrize("grid", [(7, 9), (5, 3), (12, 12)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_playground_matches_float64_reference_and_attention_matrix(mode, grid):
    rng = np.random.default_rng(sum(grid) + len(mode))
    for _ in range(3):
        spec = random_spec(rng, grid, atoms=int(rng.integers(1, 9)), mode=mode)
        view = evaluate(spec)
        ref = numpy_head(spec)
        np.testing.assert_allclose(view.density.numpy(), ref, rtol=1e-10, atol=1e-13)
        # the same query's row of the exact attention matrix (identity basis through apply_field)
        qy, qx = spec.query
        row = attention_matrix(spec.field(), spec.grid, spec.mode)[0, 0, qy * grid[1] + qx].view(*grid)
        np.testing.assert_allclose(view.density.numpy(), row.numpy(), rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(view.row_marginal.numpy(), ref.sum(1), atol=1e-12)
        np.testing.assert_allclose(view.col_marginal.numpy(), ref.sum(0), atol=1e-12)
        assert torch.allclose(view.row.sum(-1), torch.ones(1, dtype=torch.float64))
        assert view.width.shape == (len(spec.atoms), 2)


def test_atom_is_drawn_where_the_head_looks():
    # one narrow atom placed at key (1, 6) for the query (4, 2): the field peaks there, so μ = query − key = (3, −4)
    spec = HeadSpec((7, 9), (4, 2), 0.5, (Atom(1.0, 6.0, 0.3, 0.3, 1.0),))
    view = evaluate(spec)
    assert np.unravel_index(int(view.density.argmax()), (7, 9)) == (1, 6)
    assert view.mu[0].tolist() == [3.0, -4.0]
    assert view.density.max() > 0.99 and view.radius == pytest.approx(5.0, abs=0.05)


def test_query_stats_against_reference_and_head_stats():
    rng = np.random.default_rng(3)
    spec = random_spec(rng, (7, 5), atoms=3)
    a = attention_matrix(spec.field(), spec.grid)[0]  # (1, N, N)
    per_query = [query_stats(a[:, n].view(1, 7, 5), (n // 5, n % 5)) for n in range(35)]
    entropy = torch.stack([s["entropy"] for s in per_query]).mean(0)
    radius = torch.stack([s["radius"] for s in per_query]).mean(0)
    hs = head_stats(a, (7, 5))
    torch.testing.assert_close(entropy, hs["entropy"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(radius, hs["radius"], rtol=1e-10, atol=1e-12)
    row = a[0, 17].numpy()
    ys, xs = np.divmod(np.arange(35), 5)
    assert float(per_query[17]["entropy"][0]) == pytest.approx(-(row * np.log(row)).sum(), rel=1e-10)
    assert float(per_query[17]["radius"][0]) == pytest.approx(np.sqrt((row * ((ys - 3) ** 2 + (xs - 2) ** 2)).sum()))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(atoms=()), "1 to 8 atoms"),
        (dict(atoms=(Atom(0, 0, 1, 1, 1),) * 9), "1 to 8 atoms"),
        (dict(grid=(2, 40)), "between 3 and 96"),
        (dict(query=(30, 1)), "outside"),
        (dict(tau=0.2), "τ="),
        (dict(atoms=(Atom(0, float("nan"), 1, 1, 1),)), "non-finite"),
        (dict(atoms=(Atom(0, 0, 0.0, 1, 1),)), "σ must be"),
        (dict(atoms=(Atom(0, 0, 1, 1, -1),)), "weight must be"),
        (dict(mode="diagonal"), "mode"),
    ],
)
def test_head_spec_refuses_bad_heads(change, message):
    d = dict(grid=(24, 24), query=(12, 12), tau=1.0, atoms=DEFAULT_SPEC.atoms)
    with pytest.raises(ValueError, match=message):
        HeadSpec(**{**d, **change})


def test_head_spec_json_round_trip_and_bad_json():
    assert HeadSpec.from_dict(DEFAULT_SPEC.to_dict()) == DEFAULT_SPEC
    for bad in (None, [], {"grid": [5, 5]}, {**DEFAULT_SPEC.to_dict(), "atoms": [{"y": 1}]}):
        with pytest.raises(ValueError):
            HeadSpec.from_dict(bad)


def test_spec_from_head_reproduces_the_learned_density_on_an_odd_grid():
    model = designed_ssog(img_size=28, patch=4, dim=16, depth=2, heads=4)  # 7×7 grid
    fields = head_fields(model)
    for lf in fields:
        for h in range(4):
            spec = spec_from_head(lf, h)
            np.testing.assert_allclose(evaluate(spec).density.numpy(), lf.density[h].double().numpy(), atol=1e-6)


def test_presets_pick_the_designed_shapes():
    fields = head_fields(designed_ssog())
    presets = {p.kind: p for p in find_presets(fields)}
    assert list(presets) == ["tight local blob", "vertical strip", "horizontal strip", "broad global field"]
    assert len({(p.shape.layer, p.shape.head) for p in presets.values()}) == 4
    v, h, broad = (
        presets["vertical strip"].shape,
        presets["horizontal strip"].shape,
        presets["broad global field"].shape,
    )
    blob = presets["tight local blob"].shape
    assert v.spread_y > 2 * v.spread_x and h.spread_x > 2 * h.spread_y
    assert broad.spread_y * broad.spread_x > 4 * blob.spread_y * blob.spread_x
    assert "layer" in presets["vertical strip"].label and "head" in presets["vertical strip"].label


def test_presets_never_call_a_round_field_a_strip():
    model = designed_ssog(depth=1, heads=2)
    with torch.no_grad():  # every head round and local: only the blob kind fits
        attn = model.blocks[0].attn
        attn.raw_sigma.fill_(0.0)
        attn.mu.zero_()
    presets = find_presets(head_fields(model))
    assert [p.kind for p in presets] == ["tight local blob"]


def test_head_shapes_moments_against_numpy():
    fields = head_fields(designed_ssog(img_size=20, patch=4, dim=16, depth=1, heads=4))  # 5×5 grid
    shapes = head_shapes(fields)
    d = fields[0].density[2].double().numpy()
    oy, ox = np.mgrid[-4:5, -4:5]
    cy, cx = (d * oy).sum(), (d * ox).sum()
    s = shapes[2]
    assert (s.centre_y, s.centre_x) == pytest.approx((cy, cx))
    assert s.spread_y == pytest.approx(np.sqrt((d * (oy - cy) ** 2).sum()))
    assert s.spread_x == pytest.approx(np.sqrt((d * (ox - cx) ** 2).sum()))


def test_colorize_png_and_cells():
    a = np.array([[0.0, 0.5], [1.0, 2.0]])
    rgb = viz.colorize(a, "viridis", 0.0, 1.0)
    lut = viz._lut("viridis")
    assert rgb.dtype == np.uint8 and rgb.shape == (2, 2, 3)
    assert (rgb[0, 0] == lut[0]).all() and (rgb[1, 0] == lut[255]).all() and (rgb[1, 1] == lut[255]).all()
    png = viz.png_bytes(rgb)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), rgb)
    assert viz.data_url(png).startswith("data:image/png;base64,")
    assert viz.cell_at((0, 0), (100, 50), (5, 10)) == (0, 0)
    assert viz.cell_at((99.9, 49.9), (100, 50), (5, 10)) == (4, 9)
    assert viz.cell_at((35, 12), (100, 50), (5, 10)) == (1, 3)
    assert viz.density_rgba(np.ones((3, 4))).shape == (3, 4, 4)


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_geometry_figure_titles_do_not_overlap_and_metadata_is_stored():
    fields = head_fields(designed_ssog(depth=6, heads=4))
    fig = viz.geometry_figure(fields, "six layers")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    titles = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    assert len(titles) == 6
    assert not any(_overlap(a, b) for i, a in enumerate(titles) for b in titles[i + 1 :])
    settings = {"checkpoint": "x.safetensors", "layer": 2}
    png = viz.figure_bytes(fig, "png", settings)
    assert json.loads(Image.open(io.BytesIO(png)).info["Description"]) == settings
    svg = viz.figure_bytes(fig, "svg", settings).decode()
    assert "x.safetensors" in svg and svg.lstrip().startswith("<?xml")


def test_report_card_atoms_classes_and_files(tmp_path):
    model = designed_ssog()
    meta = {"accuracy": 0.5, "command": "python -m x", "transforms": {"train": "pad-crop", "eval": "as is"}}
    card = report.model_card(model, meta)
    assert card["parameters"] == count_params(model) and card["FLOPs per forward"] > 0
    assert card["accuracy"] == 0.5 and card["training command"] == "python -m x"
    assert card["transforms"] == "train: pad-crop; eval: as is"
    fields = head_fields(model)
    rows = report.atom_rows(fields)
    assert len(rows) == 3 * 4 * 3 and len(rows[0]) == len(report.ATOM_COLUMNS)
    assert rows[5][5] == -rows[5][3] and rows[5][6] == -rows[5][4]
    assert report.initial_gate_scale(model.config) == pytest.approx(math.log1p(math.exp(-2.0)) + 1e-4)
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5, 0.0]])
    top = report.top_classes(logits, CLASS_NAMES, k=3)
    assert list(top) == ["square", "star", "circle"] and sum(top.values()) < 1
    x = torch.rand(1, 3, 32, 32)
    maps = compute_export_maps(model, x)
    arrays = report.export_arrays(maps)
    npz = np.load(io.BytesIO(report.npz_bytes(arrays, {"alpha": 0.5})))
    assert json.loads(str(npz["settings"])) == {"alpha": 0.5}
    np.testing.assert_array_equal(npz["net"], maps.net[0].numpy())
    csv_text = report.maps_csv(maps, {"checkpoint": "c"})
    assert csv_text.startswith("# checkpoint: c\nmap,layer,row,col,value\n")
    assert len(csv_text.strip().splitlines()) == 2 + 3 * 3 * 64 + 2 * 64
    offsets = report.steering_arrays(steering_offsets(model, x))
    assert offsets["shift_0"].shape == (8, 8, 4, 2)


def test_figures_cli_writes_every_figure_with_settings(tmp_path, capsys):
    ckpts = write_checkpoints(tmp_path / "ckpt", depth=2)
    image = tmp_path / "scene.png"
    shapes_image().save(image)
    out = tmp_path / "out"
    rc = figures.main(
        ["--checkpoint", str(ckpts["ssog"]), "--twin", str(ckpts["dot"]), "--image", str(image),
         "--layer", "1", "--alpha", "0.25", "--query", "2,5", "--out-dir", str(out)]
    )  # fmt: skip
    assert rc == 0
    names = sorted(p.name for p in out.iterdir())
    for prefix in ("geometry_ssog_test", "steering_ssog_test", "export_ssog_test-dot_test", "compare_ssog_test_vs"):
        assert any(n.startswith(prefix) and n.endswith(".png") for n in names), prefix
        assert any(n.startswith(prefix) and n.endswith(".svg") for n in names), prefix
    assert any("_q2-5." in n for n in names) and any("alpha0.25" in n and n.endswith(".csv") for n in names)
    export_npz = next(out.glob("export_maps_ssog_test_*.npz"))
    settings = json.loads(str(np.load(export_npz)["settings"]))
    assert settings["alpha"] == 0.25 and settings["image"] == "scene.png" and len(settings["image_sha256"]) == 64
    # a session file restores the same view headless (its image is found by hash; here it is elsewhere)
    assert figures._find_image(settings["image_sha256"], [tmp_path / "nowhere", tmp_path]) == image
    session = {
        "format": "ssog-lab-session/1", "checkpoint": "ssog_test.safetensors",
        "image": {"sha256": "0" * 64, "name": "lost.png"},
        "playground": {"head": DEFAULT_SPEC.to_dict(), "image_underlay": True},
        "export": {"twin": "(none)", "alpha": 0.75, "layer": 0}, "steering": {"query": [1, 1]},
    }  # fmt: skip
    (tmp_path / "s.json").write_text(json.dumps(session))
    out2 = tmp_path / "out2"
    rc = figures.main(["--session", str(tmp_path / "s.json"), "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--assets-dir", str(tmp_path), "--out-dir", str(out2)])  # fmt: skip
    assert rc == 0 and "pass it with --image" in capsys.readouterr().err
    names2 = {p.name for p in out2.iterdir()}
    assert "geometry_ssog_test.svg" in names2 and any(n.startswith("playground_3atoms_tau1.00") for n in names2)
    assert figures.main(["--checkpoint", str(tmp_path / "missing.safetensors"), "--out-dir", str(out2)]) == 2
    assert "no such checkpoint" in capsys.readouterr().err


def test_dot_model_query_figure_has_one_row():
    model = dot_twin()
    x = torch.rand(1, 3, 32, 32)
    from ssog_core.analysis import attention_maps

    maps = attention_maps(model, x)
    row = figures.query_rows(maps.attn, maps.grid, 1, (3, 3))
    assert row.shape == (4, 8, 8) and row.sum() == pytest.approx(4.0, rel=1e-5)
    fig = viz.query_field_figure(shapes_image(), None, row, (3, 3), 1)
    assert len([ax for ax in fig.axes if ax.get_title()]) == 4


@pytest.mark.parametrize("gate", [0.0, 0.4, 1.0])
def test_steered_spec_carries_the_querys_own_atoms_at_every_gate(gate):
    """The playground's "content steers the head" view: its atoms are the ones the model's own field gives the
    query when every gate scale is turned down to ``gate``·s (checked by scaling the model's gate parameters
    themselves); at gate 0 its field is exactly the model's fixed-field attention row of the query."""
    from ssog_core.analysis import _layer_inputs, attention_maps, ssog_layers
    from ssog_core.field import EPS
    from ssog_core.playground import steered_spec

    model = designed_ssog(depth=2)
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    layer, head, query = 1, 2, (2, 5)
    off = steering_offsets(model, x)
    lf = head_fields(model)[layer]
    t = (0, query[0], query[1], head)
    spec = steered_spec(lf, head, model.config.grid, query, off.dmu[layer][t], off.sigma_ratio[layer][t],
                        off.dlam[layer][t], gate)  # fmt: skip
    attn = ssog_layers(model)[layer]
    scales = attn.gate_scales()
    with torch.no_grad():  # the model at gate scale g·s: every tap's scale parameter set to give it
        for tap, name in (("mu", "raw_mu_delta_scale"), ("sigma", "raw_sigma_delta_scale"),
                          ("lambda", "raw_lambda_gate_scale")):  # fmt: skip
            target = (gate * scales[tap] - EPS).clamp_min(1e-30)
            getattr(attn, name).copy_(torch.log(torch.expm1(target)).clamp_min(-80.0))
        inputs, grid, _ = _layer_inputs(model, x)
        field = attn.field(inputs[layer], grid)
    looks = torch.tensor([[query[0] - a.y, query[1] - a.x] for a in spec.atoms])  # μ = ★ − key
    atol = 1e-4 if gate else 1e-3  # gate 0 is reached up to the gate's positive floor
    torch.testing.assert_close(looks, field.mu[t].double(), atol=atol, rtol=1e-4, check_dtype=False)
    sig = torch.tensor([[a.sy, a.sx] for a in spec.atoms])
    torch.testing.assert_close(sig, field.sigma[t].double(), atol=atol, rtol=1e-4, check_dtype=False)
    lam = torch.tensor([a.w for a in spec.atoms])
    torch.testing.assert_close(lam / lam.sum(), field.lam()[t].double(), atol=atol, rtol=1e-4, check_dtype=False)
    if gate == 0:
        row = attention_maps(model, x, steered=False).attn[layer][0, head, query[0] * 8 + query[1]]
        np.testing.assert_allclose(evaluate(spec).density.numpy().ravel(), row.double().numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="gate must be in"):
        steered_spec(lf, head, model.config.grid, query, off.dmu[layer][t], off.sigma_ratio[layer][t],
                     off.dlam[layer][t], 1.5)  # fmt: skip
