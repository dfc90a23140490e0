"""The target-share readout on ``pointer``: the scene's parts are where the image paints them, and the share equals an
independent float64 computation from the layers' own attention matrices, for the dot twin and SSOG alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssog_core import ViT
from ssog_core.analysis.measures import attention_maps
from ssog_core.data.pointer import CLASS_NAMES, PointerDataset, PointerSpec, render_with_mask
from ssog_core.data.sources import DataError
from ssog_core.interventions.target_share import (
    close_mu,
    paired,
    patch_cover,
    read_target_share,
    scene_discs,
    target_share,
)
from ssog_core.interventions.validation import load_eval_set

GRID = 13  # an odd board: 52 px at 4 px a cell
META = {"data": f"pointer:grid={GRID},train=8,val=40", "class_names": list(CLASS_NAMES)}


def model_of(attn: str, steer: tuple[str, ...] = (), seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    model = ViT(num_classes=6, img_size=GRID * 4, patch_size=4, dim=32, depth=2, num_heads=2, mlp_ratio=2.0,
                dropout=0.0, attn=attn, steer=steer)  # fmt: skip
    if attn == "ssog":  # open the cold gates and give the steering projections weights, so steering moves the field
        for name, p in model.named_parameters():
            if name.endswith("_scale"):
                p.data.fill_(0.0)
            elif "_delta." in name or "lambda_gate." in name:
                p.data.normal_(0.0, 0.3)
    return model.eval()


def test_a_scene_paints_its_discs_where_it_says():
    """The pointed disc and the cue make the mask ``render_with_mask`` always gave; each disc is painted in a
    palette colour where its coverage is full; the discs never share a pixel."""
    ds = PointerDataset(PointerSpec.parse(f"grid={GRID},train=4,val=6"), "val")
    for i in range(6):
        scene = ds.scene(i)
        img, label, mask = render_with_mask(0, "val", i, 6, ds.size, grid=GRID)
        assert np.array_equal(scene.image, img) and scene.label == label
        assert np.array_equal(np.maximum(scene.discs[0], scene.cue), mask)
        assert scene.discs.shape == (3, *ds.size) and (scene.discs.max(axis=(1, 2)) == 1).all()
        assert ((scene.discs > 0).sum(0) <= 1).all()
        full = scene.discs[0] == 1
        assert np.abs(img[full].astype(int) - np.asarray(img[full].mean(0), int)).max() < 60  # one colour
    with pytest.raises(IndexError):
        ds.scene(6)


def reference_shares(model, data, discs) -> np.ndarray:
    """(n, L) shares from each layer's attention matrix (the analysis' path, not the hook point), in float64 loops."""
    out = []
    for i in range(len(data)):
        maps = attention_maps(model, data.batch(i, i + 1)).attn
        cover = discs[i].double().reshape(3, GRID, 4, GRID, 4).mean((2, 4)).reshape(3, -1).numpy()
        row = []
        for a in maps:
            a = a[0].double().numpy()  # (H, N, N), patch block
            on = np.array([[sum(a[h, q, k] * cover[d, k] for k in range(a.shape[-1]) if cover[d, k] > 0)
                            for q in range(a.shape[1])] for h in range(a.shape[0]) for d in range(3)])  # fmt: skip
            on = on.reshape(a.shape[0], 3, -1).sum((0, 2))
            row.append(on[0] / on.sum())
        out.append(row)
    return np.array(out)


@pytest.mark.parametrize("attn,steer", [("dot", ()), ("ssog", ("mu", "sigma", "lambda"))])
def test_the_share_equals_the_attention_matrices(attn, steer):
    model = model_of(attn, steer)
    data = load_eval_set(META, model.config.img_size, 6)
    discs = scene_discs(META, model.config.img_size, 6)
    got = target_share(model, data, patch_cover(discs, 4))
    want = reference_shares(model, data, discs)
    np.testing.assert_allclose(got.per_image(), want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(want, 1 / 3, atol=1e-3)  # the random model does not sit exactly at chance
    layers = got.layers()
    assert [x["layer"] for x in layers] == [0, 1] and all(x["ci95"][0] <= x["share"] <= x["ci95"][1] for x in layers)
    assert all(len(x["heads"]) == 2 and all(0 < h < 1 for h in x["heads"]) for x in layers)


def test_closing_mu_reads_the_same_images_and_changes_a_steered_model_only():
    steered, fixed = model_of("ssog", ("mu",), seed=1), model_of("ssog", (), seed=1)
    assert close_mu(fixed) == [] and close_mu(model_of("dot")) == []
    assert close_mu(steered) == [{"op": "close_gate", "layer": layer, "tap": "mu"} for layer in range(2)]
    open_, closed = (read_target_share(steered, META, 8, edits) for edits in ([], close_mu(steered)))
    diff = paired(closed, open_)
    assert closed.edits == close_mu(steered) and any(abs(d["change"]) > 1e-4 for d in diff)
    assert all(d["ci95"][0] <= d["change"] <= d["ci95"][1] for d in diff)
    data = load_eval_set(META, steered.config.img_size, 8)
    assert closed.images == data.describe()
    with pytest.raises(ValueError, match="same images"):
        paired(closed, read_target_share(steered, META, 7))


def test_a_model_of_other_data_is_refused_in_words():
    with pytest.raises(DataError, match="pointer scenes"):
        read_target_share(model_of("dot"), {"data": "layouts:train=4,val=4"}, 2)
    model = model_of("dot")
    data = load_eval_set(META, model.config.img_size, 3)
    with pytest.raises(ValueError, match="cover must be"):
        target_share(model, data, torch.rand(2, 3, GRID * GRID))


def test_the_command_prints_and_writes_the_readout(tmp_path, capsys):
    from ssog_core import save_checkpoint
    from ssog_core.cli.target_share import main

    model = model_of("ssog", ("mu",), seed=2)
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, META)
    assert main(["--checkpoint", str(path), "--eval", "6", "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    report = __import__("json").loads((tmp_path / "t.json").read_text())
    assert len(report["layers"]) == 2 and len(report["closed_mu"]["change"]) == 2
    again = read_target_share(model, META, 6)
    assert report["layers"][1]["share"] == pytest.approx(again.per_image()[:, 1].mean())
    assert out[0].startswith("target share on the first 6 validation images") and out[3].split()[0] == "1"
    assert f"{report['layers'][1]['share']:.3f}" in out[3]
    assert main(["--checkpoint", str(tmp_path / "missing.safetensors")]) == 2
    assert "error:" in capsys.readouterr().err
