"""``--cluster ADDRESS`` of the heavy commands (intervene's validation part, evaluate): the work runs as a job on a
Dask worker, with the checkpoint sent as bytes, and gives the numbers the command gives in process."""

from __future__ import annotations

import json

import pytest

from ssog_core import save_checkpoint
from ssog_core.cli import evaluate, intervene
from tests.app_fixtures import designed_ssog
from tests.helpers import one_thread_cluster

SHAPES = {"data": "shapes:train=4,val=60,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}
EDITS = [
    {"op": "swap_axes", "layer": 1, "head": 1},
    {"op": "ablate_head", "layer": 0, "head": 2, "mode": "dataset_mean"},
]


@pytest.fixture(scope="module")
def cluster():
    """A scheduler with one worker thread in this process (:func:`tests.helpers.one_thread_cluster`)."""
    with one_thread_cluster() as address:
        yield address


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("cli") / "ssog_shapes.safetensors", designed_ssog(depth=2), SHAPES)


def test_intervene_on_a_cluster_gives_the_same_numbers(cluster, checkpoint, tmp_path, capsys):
    edits = tmp_path / "edits.json"
    edits.write_text(json.dumps(EDITS))
    outs = []
    for extra in ([], ["--cluster", cluster]):
        out = tmp_path / f"out{len(outs)}.json"
        argv = ["--checkpoint", str(checkpoint), "--edits", str(edits), "--eval", "57", "--json", str(out), *extra]
        assert intervene.main(argv) == 0
        outs.append(json.loads(out.read_text()))
    assert outs[0] == outs[1] and outs[0]["validation"]["n"] == 57
    assert outs[0]["validation"]["logp_true"]["change"] != 0  # the edits change something


def test_evaluate_on_a_cluster_gives_the_same_numbers(cluster, checkpoint, tmp_path):
    rows = []
    for extra in ([], ["--cluster", cluster]):
        out = tmp_path / f"rows{len(rows)}.json"
        argv = ["--checkpoint", str(checkpoint), "--img-size", "32", "48", "--device", "cpu", "--json", str(out),
                "--plot", str(tmp_path / "t.png"), *extra]  # fmt: skip
        assert evaluate.main(argv) == 0
        rows.append(json.loads(out.read_text()))
    assert rows[0] == rows[1] and [r["img_size"] for r in rows[0]] == [[32, 32], [48, 48]]


def test_an_unreachable_scheduler_is_an_error_in_words(checkpoint, tmp_path, capsys):
    from ssog_core.testing.app_process import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    assert evaluate.main(["--checkpoint", str(checkpoint), "--cluster", address]) == 2
    assert f"error: cannot reach the Dask scheduler at {address}" in capsys.readouterr().err


def test_export_maps_on_a_cluster_gives_the_same_arrays(cluster, checkpoint, tmp_path):
    import numpy as np

    from ssog_core.cli import export_maps
    from tests.app_fixtures import write_images

    write_images(tmp_path / "images")
    arrays = []
    for extra in ([], ["--cluster", cluster]):
        out = tmp_path / f"maps{len(arrays)}.npz"
        argv = ["--checkpoint", str(checkpoint), "--image", str(tmp_path / "images"), "--out", str(out),
                "--control", "validation", "--control-images", "20", "--per-class", *extra]  # fmt: skip
        assert export_maps.main(argv) == 0
        with np.load(out) as f:
            arrays.append({k: f[k] for k in f.files})
    assert arrays[0].keys() == arrays[1].keys() and "class_accumulated_difference" in arrays[0]
    for k, v in arrays[0].items():
        np.testing.assert_array_equal(arrays[1][k], v, err_msg=k)
    assert len(arrays[0]["names"]) > 1 and np.abs(arrays[0]["accumulated"]).max() > 0
    missing = [
        "--checkpoint",
        str(checkpoint),
        "--image",
        str(tmp_path / "nowhere.png"),
        "--out",
        str(tmp_path / "x.npz"),
    ]
    assert export_maps.main([*missing, "--cluster", cluster]) == 2
