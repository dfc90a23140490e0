"""The evaluation CLI: accuracy on the val split, zero-shot resolution transfer table and plot, clear errors."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from ssog_core import evaluate, train
from ssog_core.checkpoint import load_checkpoint
from ssog_core.data import Transformed, open_data
from tests.data_files import write_cifar

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--atoms", "2", "--batch-size", "8", "--no-progress"]
DATA = "shapes:size=16,train=32,val=24,classes=3"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    assert train.main(["--data", DATA, *TINY, "--epochs", "1", "--out", str(out)]) == 0
    return out / "last.safetensors"


def test_accuracy_line_matches_a_direct_count(checkpoint, capsys):
    assert evaluate.main(["--checkpoint", str(checkpoint)]) == 0  # --data from the checkpoint's metadata
    line = capsys.readouterr().out.strip()
    assert line.startswith("accuracy: ") and len(line.split(": ")[1]) == 6
    model, _ = load_checkpoint(checkpoint)
    val = Transformed(open_data(DATA, (16, 16)).val, (16, 16))
    import torch

    x = torch.stack([torch.from_numpy(val[i][0]) for i in range(len(val))]).permute(0, 3, 1, 2).float() / 255
    y = torch.tensor([val[i][1] for i in range(len(val))])
    with torch.no_grad():
        direct = (model(x).argmax(-1) == y).float().mean().item()
    assert line == f"accuracy: {direct:.4f}"
    assert evaluate.main(["--checkpoint", str(checkpoint), "--data", DATA, "--img-size", "16"]) == 0
    assert capsys.readouterr().out.strip() == line


def test_resolution_transfer_table_and_plot(checkpoint, tmp_path, capsys):
    plot, rows_file = tmp_path / "transfer.png", tmp_path / "rows.json"
    argv = [
        "--checkpoint",
        str(checkpoint),
        "--img-size",
        "12",
        "16",
        "24x20",
        "--plot",
        str(plot),
        "--json",
        str(rows_file),
    ]
    assert evaluate.main(argv) == 0
    out = capsys.readouterr().out
    assert "zero-shot resolution transfer" in out
    assert "16×16     4×4" in out and "(training size)" in out and "24×20     6×5" in out
    rows = json.loads(rows_file.read_text())
    assert [r["size"] for r in rows] == [[12, 12], [16, 16], [24, 20]]
    assert all(0 <= r["accuracy"] <= 1 and r["n"] == 24 for r in rows)
    with Image.open(plot) as im:
        assert im.format == "PNG" and im.width > 300


def test_evaluate_errors(checkpoint, tmp_path, capsys):
    assert evaluate.main(["--checkpoint", str(checkpoint), "--img-size", "18"]) == 2
    assert "not a positive multiple of the patch size 4" in capsys.readouterr().err
    assert evaluate.main(["--checkpoint", str(checkpoint), "--data", "shapes:classes=5"]) == 2
    assert "but the checkpoint was trained on 3" in capsys.readouterr().err
    cifar = write_cifar(tmp_path, n_train=4, n_test=4, num_classes=3)
    assert evaluate.main(["--checkpoint", str(checkpoint), "--data", f"cifar100:{cifar}"]) == 2
    assert "class0" in capsys.readouterr().err
    assert evaluate.main(["--checkpoint", str(tmp_path / "missing.safetensors")]) == 2
    assert "no such checkpoint file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(checkpoint), "--img-size", "abc"])
