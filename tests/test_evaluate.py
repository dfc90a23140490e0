"""The evaluation CLI: accuracy on the val split, zero-shot resolution transfer table and plot, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from ssog_core.checkpoint.format import TRANSFER_KEY, CheckpointError, load_checkpoint, read_checkpoint, update_metadata
from ssog_core.cli import evaluate, train
from ssog_core.data.sources import Transformed, open_data
from ssog_core.train import accuracy
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
    assert [r["img_size"] for r in rows] == [[12, 12], [16, 16], [24, 20]]
    assert [r["tokens"] for r in rows] == [9, 16, 30]
    assert all(set(r) == {"img_size", "tokens", "accuracy"} and 0 <= r["accuracy"] <= 1 for r in rows)
    with Image.open(plot) as im:
        assert im.format == "PNG" and im.width > 300


@pytest.mark.slow
def test_transfer_json_matches_what_train_stored_and_store_adds_it(checkpoint, tmp_path, capsys):
    """``--transfer --json`` gives the list train stored at the end of the run (same sizes, same weights, one
    implementation); ``--store`` writes it into another checkpoint's header without touching the weights."""
    stored = load_checkpoint(checkpoint)[1]["resolution_transfer"]
    path = tmp_path / "transfer.json"
    argv = ["--checkpoint", str(checkpoint), "--transfer", "--json", str(path), "--plot", str(tmp_path / "t.png")]
    assert evaluate.main(argv) == 0
    assert json.loads(path.read_text()) == stored
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(checkpoint.read_bytes())
    update_metadata(copy, {TRANSFER_KEY: "[]"})
    assert load_checkpoint(copy)[1][TRANSFER_KEY] == []
    assert (
        evaluate.main(
            ["--checkpoint", str(copy), "--img-size", "8", "16", "--plot", str(tmp_path / "u.png"), "--store"]
        )
        == 0
    )
    assert "stored 2 sizes under resolution_transfer" in capsys.readouterr().out
    config, tensors, meta = read_checkpoint(copy)
    assert [r["img_size"] for r in meta[TRANSFER_KEY]] == [[8, 8], [16, 16]]
    before = read_checkpoint(checkpoint)
    assert config == before[0] and {k: v for k, v in meta.items() if k != TRANSFER_KEY} == {
        k: v for k, v in before[2].items() if k != TRANSFER_KEY
    }
    for k, t in before[1].items():
        torch.testing.assert_close(tensors[k], t, rtol=0, atol=0)
    with pytest.raises(ValueError, match="save_checkpoint only"):
        update_metadata(copy, {"config": "{}"})
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(CheckpointError):
        update_metadata(tmp_path / "junk.safetensors", {TRANSFER_KEY: "[]"})


def test_max_images_takes_a_fixed_subset_of_every_class(checkpoint):
    rows, _ = accuracy.evaluate_sizes(checkpoint, max_images=9)
    assert rows[0]["n"] == 9
    assert accuracy.evaluate_sizes(checkpoint, max_images=9)[0] == rows  # the same images every time
    assert accuracy.evaluate_sizes(checkpoint, max_images=100)[0][0]["n"] == 24
    loader = accuracy.eval_loader(open_data(DATA, (16, 16)).val, (16, 16), 4, 0, max_images=8)
    labels = [int(y) for _, ys in loader for y in ys]
    assert len(labels) == 8 and sorted(set(labels)) == [0, 1, 2]  # label = index mod 3: a stride of 3 keeps one


def test_transfer_sizes_round_to_the_patch():
    assert accuracy.transfer_sizes((16, 16), 4) == [(8, 8), (12, 12), (16, 16), (24, 24), (32, 32)]
    assert accuracy.transfer_sizes((224, 160), 16) == [(112, 80), (160, 128), (224, 160), (336, 240), (448, 320)]
    assert accuracy.transfer_sizes((4, 4), 4) == [(4, 4), (8, 8)]  # never below one patch, duplicates dropped


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
