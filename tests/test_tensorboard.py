"""``train --tensorboard DIR``: the events hold the same numbers as the checkpoint's history, and the field grid."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from ssog_core import ViT
from ssog_core.checkpoint.format import read_history
from ssog_core.cli import train
from ssog_core.field import displacement_density
from ssog_core.train.config import TrainError
from ssog_core.train.tensorboard import PANEL_GAP, TensorBoardLog, field_grid
from tests.test_history import run

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def events(folder):
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


@pytest.mark.slow
def test_the_events_are_the_historys_numbers_and_the_field_grid(tmp_path):
    assert run(tmp_path / "run", "--tensorboard", str(tmp_path / "tb")) == 0
    hist = read_history(tmp_path / "run" / "model.safetensors")
    acc = events(tmp_path / "tb")
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/accuracy", "val/accuracy", "val/loss"} <= tags
    for tap, rows in hist.gates.items():
        for layer in range(len(rows[0])):
            got = acc.Scalars(f"gate/{tap}/layer{layer}")
            assert [e.step for e in got] == hist.steps
            np.testing.assert_allclose([e.value for e in got], [r[layer] for r in rows], rtol=1e-6)
    val = acc.Scalars("val/accuracy")
    assert [e.step for e in val] == [int(r[0]) for r in hist.val]
    np.testing.assert_allclose([e.value for e in val], [r[1] for r in hist.val], rtol=1e-6)
    train_loss = acc.Scalars("train/loss")
    np.testing.assert_allclose([e.value for e in train_loss], [r[1] for r in hist.train], rtol=1e-6)
    images = acc.Images("fields")
    assert [e.step for e in images] == [int(r[0]) for r in hist.val]
    # 2 heads × 2 layers of (2·3+1)² offsets on the 4×4 token grid (16 px images, patch 4), one pixel apart
    assert (images[-1].height, images[-1].width) == (2 * 7 + PANEL_GAP, 2 * 7 + PANEL_GAP)


def test_the_field_grid_is_every_heads_density_scaled_to_its_peak():
    model = ViT(num_classes=3, img_size=(20, 12), patch_size=4, dim=8, depth=2, num_heads=2, num_atoms=2)  # 5×3
    layers = [b.attn for b in model.blocks]
    img = field_grid(layers, (5, 3))
    ph, pw = 9, 5
    assert img.shape == (2 * ph + PANEL_GAP, 2 * pw + PANEL_GAP)
    for c, attn in enumerate(layers):
        density = displacement_density(attn.fixed_field(), (4, 2), attn.mode).detach().numpy()
        for h in range(2):
            y, x = h * (ph + PANEL_GAP), c * (pw + PANEL_GAP)
            np.testing.assert_allclose(img[y : y + ph, x : x + pw], density[h] / density[h].max(), rtol=1e-6)
    assert img[ph, :].max() == 0 and img[:, pw].max() == 0  # the gaps are black


def test_without_the_package_the_run_refuses_at_once_in_words(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(TrainError, match="pip install tensorboard"):
        TensorBoardLog(tmp_path / "tb")
    assert train.main(["--out", str(tmp_path / "r"), "--tensorboard", str(tmp_path / "tb"), "--epochs", "1",
                       "--data", "shapes:size=16,train=16,val=8,classes=2", "--batch-size", "8"]) != 0  # fmt: skip
    assert not (tmp_path / "r" / "model.safetensors").exists()


def test_a_folder_that_cannot_be_written_is_refused_before_training(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(TrainError, match="cannot write TensorBoard events there"):
        TensorBoardLog(tmp_path / "taken")
    assert run(tmp_path / "r", "--tensorboard", str(tmp_path / "taken")) != 0
    assert not (tmp_path / "r" / "model.safetensors").exists()
