"""``python -m ssog_core intervene``: edits from a file, one image and the validation set, the /intervene JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from ssog_core import save_checkpoint
from ssog_core.cli.intervene import main
from tests.test_interventions import model_for

META = {"data": "shapes:train=4,val=30,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}


def files(tmp_path):
    ckpt = tmp_path / "m.safetensors"
    save_checkpoint(ckpt, model_for().float(), META)
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (28, 20, 3), dtype=np.uint8)).save(tmp_path / name)
    return ckpt


@pytest.mark.slow
def test_cli_reports_one_image_and_the_validation_set(tmp_path, capsys):
    ckpt = files(tmp_path)
    edits = [{"op": "swap_axes", "layer": 2, "head": 0}, {"op": "patch_head", "layer": 1, "head": 1, "source": "b.png"}]
    (tmp_path / "edits.json").write_text(json.dumps(edits))
    out = tmp_path / "out.json"
    args = ["--checkpoint", str(ckpt), "--edits", str(tmp_path / "edits.json"), "--image", str(tmp_path / "a.png")]
    assert main([*args, "--eval", "20", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "layer 2, head 0: mirrored across the diagonal (y ↔ x)" in text and "validation images (20)" in text
    result = json.loads(out.read_text())
    assert set(result) == {"unedited", "edited", "accumulated_export", "validation"}
    assert len(result["edited"]["probs"]) == 5 and result["unedited"]["label"] in META["class_names"]
    assert np.array(result["accumulated_export"]["edited"]).shape == (7, 5)
    v = result["validation"]
    assert v["n"] == 20 and set(v["accuracy"]) == {"unedited", "edited", "ci95", "mcnemar_p"}
    assert len(v["per_class"]) == 5
    assert v["images"] == {"data": META["data"], "split": "validation", "first": 20}


def test_cli_refuses_bad_edits_in_words(tmp_path, capsys):
    ckpt = files(tmp_path)
    (tmp_path / "edits.json").write_text(json.dumps([{"op": "swap_axes", "layer": 9, "head": 0}]))
    assert main(["--checkpoint", str(ckpt), "--edits", str(tmp_path / "edits.json"), "--eval", "5"]) == 2
    assert "layer 9 does not exist" in capsys.readouterr().err


def test_cli_help_lists_every_op_and_the_default_images_exist(capsys):
    from pathlib import Path

    from ssog_core.cli.intervene import DEFAULT_ASSETS
    from ssog_core.interventions.edit import EDITS

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(f"\n{op}: " in text for op in EDITS) and "move_atom" in text
    root = Path(__file__).resolve().parents[1]
    assert (root / DEFAULT_ASSETS).is_dir() and any((root / DEFAULT_ASSETS).glob("*.png"))
