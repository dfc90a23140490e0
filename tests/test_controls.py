"""Controls for export maps, from their definitions, on a random float64 model with a 7×5 patch grid."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from PIL import Image

from ssog_core import save_checkpoint
from ssog_core.analysis.controls import (
    blank_images,
    class_maps,
    control_maps,
    differences,
    validation_batch,
    validation_maps,
    within_noise_share,
)
from ssog_core.analysis.measures import export_maps
from ssog_core.cli.export_maps import main as export_main
from ssog_core.data.sources import DataError, open_data
from tests.test_analysis import steered_model

META = {"data": "shapes:classes=3,train=4,val=7"}  # seven validation images: all of them are used
SIZE = (28, 20)  # patch 4: a 7×5 grid


@pytest.fixture(scope="module")
def model():
    return steered_model()


@pytest.fixture(scope="module")
def img():
    torch.manual_seed(3)
    return torch.rand(2, 3, *SIZE, dtype=torch.float64)


def test_none_is_no_control(model, img):
    raw = export_maps(model, img)
    assert control_maps(model, META, img, raw, "none") is None
    with pytest.raises(ValueError, match="use one of none, blank, validation"):
        control_maps(model, META, img, raw, "baseline")


@pytest.mark.slow
def test_blank_control_is_the_maps_of_the_constant_image(model, img):
    raw = export_maps(model, img, alpha=0.7)
    c = control_maps(model, META, img, raw, "blank")
    colour = img.mean(dim=(-2, -1))  # (B, 3)
    constant = colour[:, :, None, None] * torch.ones(1, 1, *SIZE, dtype=torch.float64)
    want = export_maps(model, constant, alpha=0.7)
    assert c.control == "blank" and c.images == 1 and torch.equal(blank_images(img), constant)
    torch.testing.assert_close(c.accumulated, want.accumulated, rtol=0, atol=1e-6)
    torch.testing.assert_close(c.rollout, want.rollout, rtol=0, atol=1e-6)
    d = differences(raw, c)
    assert torch.equal(d["accumulated_difference"], raw.accumulated - c.accumulated)
    assert torch.equal(d["rollout_difference"], raw.rollout - c.rollout)


def test_blank_noise_floor_is_the_spread_over_colours_within_one_grey_level(model, img):
    """The noise floor, computed here one colour at a time: the spread of the blank maps over the 8 corners of the
    ±1/255 cube around the mean colour and the mean colour itself; differences within it are marked."""
    raw = export_maps(model, img, alpha=0.7)
    c = control_maps(model, META, img, raw, "blank")
    colour = img.mean(dim=(-2, -1))
    maps = []
    for shift in [(0, 0, 0), *itertools.product((-1, 1), repeat=3)]:
        shifted = (colour + torch.tensor(shift, dtype=colour.dtype) / 255)[:, :, None, None]
        maps.append(export_maps(model, shifted * torch.ones(1, 1, *SIZE, dtype=torch.float64), 0.7).accumulated)
    maps = torch.stack(maps)
    spread = maps.amax(0) - maps.amin(0)
    torch.testing.assert_close(c.noise, spread, rtol=0, atol=1e-6)
    assert float(spread.max()) > 0  # the colour does move the map of this (random) model
    within = differences(raw, c)["accumulated_within_noise"]
    assert torch.equal(within, (raw.accumulated - c.accumulated).abs() <= c.noise)
    torch.testing.assert_close(within_noise_share(raw, c), within.flatten(1).double().mean(1).float())
    assert within_noise_share(raw, control_maps(model, META, img, raw, "validation", n=7)) is None
    normalised = control_maps(model, {**META, "normalization": {"mean": [0.5] * 3, "std": [0.5, 0.25, 1.0]}}, img,
                              raw, "blank")  # fmt: skip
    assert not torch.equal(normalised.noise, c.noise)  # a shift of 1/255 is 1/(255·std) in normalised units


def test_validation_control_is_the_mean_of_per_image_maps(model, img):
    raw = export_maps(model, img, alpha=0.4)
    c = control_maps(model, META, img, raw, "validation", n=50)
    val = open_data(META["data"], SIZE).val
    per_image = [export_maps(model, torch.from_numpy(a).permute(2, 0, 1)[None].double() / 255, 0.4) for a, _ in
                 (val[i] for i in range(len(val)))]  # fmt: skip
    acc = torch.stack([m.accumulated[0].double() for m in per_image]).mean(0)
    roll = torch.stack([m.rollout[0].double() for m in per_image]).mean(0)
    assert c.control == "validation" and c.images == len(val) == 7 and c.accumulated.shape == (2, 7, 5)
    torch.testing.assert_close(c.accumulated.double(), acc.expand(2, 7, 5), rtol=0, atol=1e-6)
    torch.testing.assert_close(c.rollout.double(), roll.expand(2, 7, 5), rtol=0, atol=1e-6)
    assert torch.equal(differences(raw, c)["accumulated_difference"], raw.accumulated - c.accumulated)


def test_class_maps_are_class_means_raw_and_against_each_control(model):
    raw = validation_maps(model, META, 0.5, 7, SIZE)
    blank = validation_maps(model, META, 0.5, 7, SIZE, blank=True)
    labels = raw.labels
    assert labels.tolist() == [0, 1, 2, 0, 1, 2, 0] and raw.class_names == open_data(META["data"]).class_names
    mean = raw.accumulated.double().mean(0)
    for control in ("none", "blank", "validation"):
        c = class_maps(raw, control, blank)
        assert c.counts.tolist() == [3, 2, 2] and c.raw.shape == (3, 7, 5)
        for k in range(3):
            acc = raw.accumulated[labels == k].double()
            torch.testing.assert_close(c.raw[k].double(), acc.mean(0), rtol=0, atol=1e-6)
            if control == "none":
                assert c.difference is None
            else:
                shift = blank.accumulated[labels == k].double() if control == "blank" else mean
                torch.testing.assert_close(c.difference[k].double(), (acc - shift).mean(0), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="blank maps"):
        class_maps(raw, "blank")


def test_validation_needs_recorded_data():
    with pytest.raises(DataError, match="does not record its training data"):
        validation_batch({}, SIZE, 4)
    with pytest.raises(DataError, match="cannot be opened here"):
        validation_batch({"data": "shapes (test fixture)"}, SIZE, 4)
    x, labels, _ = validation_batch({"data": "shapes:classes=3,val=40", "normalization": None}, SIZE, 9)
    assert x.shape == (9, 3, *SIZE) and labels.tolist() == [i % 3 for i in range(9)]  # the first 9: every class


def test_export_maps_cli_writes_control_difference_and_class_means(tmp_path, model, capsys):
    meta = {**META, "class_names": list("abc")}
    ckpt = save_checkpoint(tmp_path / "m.safetensors", copy.deepcopy(model).float(), meta)
    photo = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(photo)
    args = ["--checkpoint", str(ckpt), "--image", str(photo)]
    assert export_main([*args, "--out", str(tmp_path / "none.npz")]) == 0
    none = dict(np.load(tmp_path / "none.npz"))
    assert not any("control" in k or "difference" in k or "class" in k for k in none)
    for control in ("blank", "validation"):
        out = tmp_path / f"{control}.npz"
        assert export_main([*args, "--control", control, "--control-images", "5", "--out", str(out)]) == 0
        z = np.load(out)
        assert str(z["control"]) == control and z["accumulated_control"].shape == (7, 5)
        np.testing.assert_array_equal(z["accumulated"], none["accumulated"])  # the raw map stays the raw map
        np.testing.assert_array_equal(z["accumulated_difference"], z["accumulated"] - z["accumulated_control"])
        np.testing.assert_array_equal(z["rollout_difference"], z["rollout"] - z["rollout_control"])
    assert "control validation" in capsys.readouterr().out
    out = tmp_path / "classes.npz"
    assert export_main(["--checkpoint", str(ckpt), "--per-class", "--control", "validation", "--out", str(out)]) == 0
    z = np.load(out)
    assert z["class_accumulated"].shape == z["class_accumulated_difference"].shape == (3, 7, 5)
    assert z["class_counts"].tolist() == [3, 2, 2] and list(z["class_names"]) == open_data(META["data"]).class_names
    assert "accumulated" not in z and int(z["control_images"]) == 7
    assert export_main(["--checkpoint", str(ckpt), "--out", str(out)]) == 2
    assert "give --image, --per-class, or both" in capsys.readouterr().err
