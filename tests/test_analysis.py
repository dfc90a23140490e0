"""The analysis API against the dense oracle, its invariants, and the export-maps CLI."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from PIL import Image

from ssog_core import ViT, save_checkpoint
from ssog_core.analysis.measures import (
    attention_maps,
    density_moments,
    export_maps,
    head_stats,
    layer_fields,
    residual_mix,
    steering_offsets,
)
from ssog_core.cli.export_maps import main as export_main
from tests.dense_oracle import vit_forward
from tests.helpers import steered_vit

CFG = dict(num_classes=5, img_size=(28, 20), patch_size=4, dim=12, depth=3, num_heads=3, num_atoms=3)


def steered_model(**overrides) -> ViT:
    """A float64 model with open gates and active probes, so steering changes the field."""
    return steered_vit({**CFG, **overrides}, seed=1)


@pytest.mark.parametrize("overrides", [{}, {"field": "axial"}, {"attn": "dot"}])
def test_attention_maps_match_dense_oracle_on_a_non_square_grid(overrides):
    model = steered_model(**overrides)
    img = torch.rand(2, 3, 28, 20, dtype=torch.float64)
    maps = attention_maps(model, img)
    _, want = vit_forward(img, model.state_dict(), {**CFG, **overrides, "attn": overrides.get("attn", "ssog")})
    assert maps.grid == (7, 5) and len(maps.attn) == 3
    for got, ref in zip(maps.attn, want, strict=True):
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.sum(-1), torch.ones_like(got[..., 0]), rtol=0, atol=1e-5)


def test_explicit_matrix_times_values_equals_the_module_output():
    """Parity of the analysis path (A materialised) with the path the model runs (ssog_apply)."""
    model = steered_model()
    attn = model.blocks[1].attn
    x = torch.randn(2, 35, 12, dtype=torch.float64)
    a = attn.attention_matrix(x, (7, 5))
    v = attn.v(x).view(2, 35, 3, 4).transpose(1, 2)
    want = attn.out((a @ v).transpose(1, 2).reshape(2, 35, 12))
    torch.testing.assert_close(attn(x, (7, 5)), want)


def test_export_invariants():
    model = steered_model()
    img = torch.rand(3, 3, 28, 20, dtype=torch.float64)
    e = export_maps(model, img, alpha=0.5)
    assert e.net.shape == (3, 3, 7, 5) and e.accumulated.shape == (3, 7, 5)
    torch.testing.assert_close(e.net.sum(dim=(-2, -1)), torch.zeros(3, 3), rtol=0, atol=1e-5)
    assert (e.pull_in >= 0).all() and (e.pull_in <= 0.5 + 1e-6).all()  # 1 − Â_ii with Â_ii ≥ 1 − α
    torch.testing.assert_close(e.accumulated, e.net.sum(1))
    torch.testing.assert_close(e.rollout.sum(dim=(-2, -1)), torch.ones(3), rtol=0, atol=1e-5)
    s = e.summary()
    assert s["acc_min"] < 0 < s["acc_max"] and 0 < s["exporter_share"] < 1


def test_export_formulas_on_a_hand_made_matrix():
    """pull_in, pull_out and rollout from their definitions on one explicit Â."""
    a = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.5, 0.25], [0.0, 1.0, 0.0]], dtype=torch.float64)
    a_hat = residual_mix(a, alpha=0.5)
    torch.testing.assert_close(a_hat.sum(-1), torch.ones(3, dtype=torch.float64))
    diag = a_hat.diagonal()
    pull_in, pull_out = 1 - diag, a_hat.sum(0) - diag
    torch.testing.assert_close(pull_in, torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))
    torch.testing.assert_close(pull_out, torch.tensor([0.125, 0.75, 0.125], dtype=torch.float64))


def test_dot_model_with_registers_reports_prefix_share():
    torch.manual_seed(0)
    model = (
        ViT(num_classes=3, img_size=(16, 12), patch_size=4, dim=8, depth=2, num_heads=2, attn="dot", num_registers=2)
        .double()
        .eval()
    )
    img = torch.rand(1, 3, 16, 12, dtype=torch.float64)
    maps = attention_maps(model, img)
    assert maps.attn[0].shape == (1, 2, 12, 12)
    torch.testing.assert_close(maps.attn[0].sum(-1), torch.ones(1, 2, 12, dtype=torch.float64))
    assert (maps.prefix_share[0] > 0).all() and (maps.prefix_share[0] < 1).all()
    # the renormalised patch block is the dense patch-to-patch attention divided by its row mass
    x, grid = model.embed(img)
    full = model.blocks[0].attn.attention_matrix(model.blocks[0].norm1(x), grid)
    patch = full[..., 2:, 2:]
    torch.testing.assert_close(maps.attn[0], patch / patch.sum(-1, keepdim=True))
    e = export_maps(model, img)
    torch.testing.assert_close(e.net.sum(dim=(-2, -1)), torch.zeros(1, 2), rtol=0, atol=1e-5)


def test_head_stats_brute_force():
    torch.manual_seed(0)
    a = torch.softmax(torch.randn(2, 6, 6, dtype=torch.float64), -1)
    stats = head_stats(a, (2, 3))
    pos = [(i, j) for i in range(2) for j in range(3)]
    for h in range(2):
        ent = rad = 0.0
        for q in range(6):
            ent -= sum(float(a[h, q, k] * torch.log(a[h, q, k])) for k in range(6)) / 6
            d2 = sum(
                float(a[h, q, k]) * ((pos[q][0] - pos[k][0]) ** 2 + (pos[q][1] - pos[k][1]) ** 2) for k in range(6)
            )
            rad += d2**0.5 / 6
        assert abs(float(stats["entropy"][h]) - ent) < 1e-9 and abs(float(stats["radius"][h]) - rad) < 1e-9


def test_density_moments_match_a_float64_loop_on_an_odd_grid():
    torch.manual_seed(3)
    density = torch.rand(2, 7, 5, dtype=torch.float64) ** 3  # (heads, 2E_y+1, 2E_x+1), centre (3, 2)
    spread, reach = density_moments(density)
    for h in range(2):
        p = density[h] / density[h].sum()
        pts = [(float(p[i, j]), i - 3, j - 2) for i in range(7) for j in range(5)]
        my, mx = sum(w * y for w, y, _ in pts), sum(w * x for w, _, x in pts)
        sy = sum(w * (y - my) ** 2 for w, y, _ in pts) ** 0.5
        sx = sum(w * (x - mx) ** 2 for w, _, x in pts) ** 0.5
        rms = sum(w * (y * y + x * x) for w, y, x in pts) ** 0.5
        assert abs(float(spread[h, 0]) - sy) < 1e-12 and abs(float(spread[h, 1]) - sx) < 1e-12
        assert abs(float(reach[h]) - rms) < 1e-12


def test_head_fields_measure_a_strip_as_elongated():
    model = steered_model(num_atoms=1)
    attn = model.blocks[0].attn
    with torch.no_grad():  # head 0: a vertical strip, head 1: round, head 2: a horizontal band
        attn.mu.zero_()
        for h, (sy, sx) in enumerate([(2.5, 0.5), (1.0, 1.0), (0.5, 1.5)]):
            target = torch.tensor([sy, sx], dtype=torch.float64)
            lo = model.config.sigma_floor
            attn.raw_sigma[h, 0] = torch.log(torch.expm1(target - lo))
    f = layer_fields(model)[0]
    assert float(f.elongation[0]) > 2.5 and float(f.spread[0, 0]) > float(f.spread[0, 1])
    assert float(f.elongation[1]) < 1.3 and float(f.elongation[2]) > 1.8
    assert (f.reach > 0).all()


def test_head_fields_and_steering_offsets():
    model = steered_model()
    fields = layer_fields(model)
    assert len(fields) == 3
    f = fields[0]
    assert f.density.shape == (3, 13, 9) and f.extent == (6, 4)
    torch.testing.assert_close(f.lam.sum(-1), torch.ones(3))
    assert set(f.gates) == {"mu", "sigma", "lambda"} and all(v > 0.1 for v in f.gates.values())
    assert (f.radius > 0).all() and (f.entropy > 0).all()
    img = torch.rand(2, 3, 28, 20, dtype=torch.float64)
    s = steering_offsets(model, img)
    assert s.dmu[0].shape == (2, 7, 5, 3, 3, 2) and s.shift[0].shape == (2, 7, 5, 3, 2)
    assert s.dmu[0].abs().max() > 0.05 and s.dmu[0].abs().max() <= model.config.max_offset
    assert s.logits.shape == (2, 5)
    fixed = steering_offsets(steered_model(steer=()), img)
    assert fixed.dmu[0].abs().max() == 0 and torch.equal(fixed.sigma_ratio[0], torch.ones_like(fixed.sigma_ratio[0]))


@pytest.fixture
def checkpoint(tmp_path):
    model = steered_model().float()
    return save_checkpoint(tmp_path / "m.safetensors", model, {"class_names": list("abcde")})


def _photo(path, size=(40, 30), mode="RGB"):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).convert(mode).save(path)
    return path


@pytest.mark.slow
def test_export_maps_cli_single_image(tmp_path, checkpoint, capsys):
    out = tmp_path / "maps.npz"
    assert (
        export_main(["--checkpoint", str(checkpoint), "--image", str(_photo(tmp_path / "a.png")), "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "accumulated range [" in printed and "net exporters" in printed
    z = np.load(out)
    assert z["pull_in"].shape == (3, 7, 5) and z["net"].shape == (3, 7, 5) and z["accumulated"].shape == (7, 5)
    assert abs(z["net"].sum(axis=(1, 2))).max() < 1e-5 and float(z["alpha"]) == 0.5
    share = float((z["accumulated"] > 0).mean())
    assert f"{share:.1%}" in printed


def test_export_maps_cli_folder_is_batched_and_skips_bad_files(tmp_path, checkpoint, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        _photo(folder / f"{i}.png", size=(30 + i, 20), mode=["RGB", "L", "RGBA"][i])
    (folder / "broken.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "maps.npz"
    rc = export_main(
        [
            "--checkpoint",
            str(checkpoint),
            "--image",
            str(folder),
            "--out",
            str(out),
            "--img-size",
            "32x24",
            "--batch-size",
            "2",
        ]
    )
    assert rc == 0
    assert "broken.jpg" in capsys.readouterr().err
    z = np.load(out)
    assert z["net"].shape == (3, 3, 8, 6) and z["mean_net"].shape == (3, 8, 6)
    assert list(z["names"]) == ["0.png", "1.png", "2.png"]
    np.testing.assert_allclose(z["mean_accumulated"], z["accumulated"].mean(0), rtol=1e-6)


def test_export_maps_cli_errors(tmp_path, checkpoint, capsys):
    out = tmp_path / "maps.npz"
    text = tmp_path / "notes.png"
    text.write_text("hello")
    assert export_main(["--checkpoint", str(checkpoint), "--image", str(text), "--out", str(out)]) == 2
    assert "not an image" in capsys.readouterr().err
    img = _photo(tmp_path / "a.png")
    assert (
        export_main(["--checkpoint", str(tmp_path / "nope.safetensors"), "--image", str(img), "--out", str(out)]) == 2
    )
    assert "no such checkpoint" in capsys.readouterr().err
    assert (
        export_main(["--checkpoint", str(checkpoint), "--image", str(img), "--out", str(out), "--img-size", "30"]) == 2
    )
    assert "multiple of the patch size" in capsys.readouterr().err
    assert not out.exists()


def test_query_rows_lay_one_querys_row_on_the_grid_and_the_old_layer_fields_name_warns():
    from ssog_core import analysis
    from ssog_core.analysis.measures import query_rows

    attn = torch.rand(2, 3, 35, 35, generator=torch.Generator().manual_seed(0))  # a 7×5 grid
    got = query_rows(attn, (4, 2), (7, 5))
    for b, h, y, x in itertools.product(range(2), range(3), range(7), range(5)):
        assert got[b, h, y, x] == attn[b, h, 4 * 5 + 2, y * 5 + x]
    with pytest.raises(ValueError, match="does not fit"):
        query_rows(attn, (7, 0), (7, 5))
    with pytest.warns(DeprecationWarning, match="now layer_fields"):
        assert analysis.head_fields is analysis.layer_fields
