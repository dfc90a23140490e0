"""Headless figures (:mod:`ssog_core.viz.files`): the CLI writes every figure with its settings, from flags or from a
session file, and one query's attention rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ssog_core.analysis.head_spec import DEFAULT_SPEC
from ssog_core.cli import figures as figures_cli
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures
from tests.app_fixtures import dot_twin, shapes_image, write_checkpoints


@pytest.mark.slow
def test_figures_cli_writes_every_figure_with_settings(tmp_path, capsys):
    ckpts = write_checkpoints(tmp_path / "ckpt", depth=2)
    image = tmp_path / "scene.png"
    shapes_image().save(image)
    out = tmp_path / "out"
    rc = figures_cli.main(
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
    assert figures_cli._find_image(settings["image_sha256"], [tmp_path / "nowhere", tmp_path]) == image
    session = {
        "format": "ssog-lab-session/1", "checkpoint": "ssog_test.safetensors",
        "image": {"sha256": "0" * 64, "name": "lost.png"},
        "playground": {"head": DEFAULT_SPEC.to_dict(), "image_underlay": True},
        "export": {"twin": "(none)", "alpha": 0.75, "layer": 0}, "steering": {"query": [1, 1]},
    }  # fmt: skip
    (tmp_path / "s.json").write_text(json.dumps(session))
    out2 = tmp_path / "out2"
    rc = figures_cli.main(["--session", str(tmp_path / "s.json"), "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--assets-dir", str(tmp_path), "--out-dir", str(out2)])  # fmt: skip
    assert rc == 0 and "pass it with --image" in capsys.readouterr().err
    names2 = {p.name for p in out2.iterdir()}
    assert "geometry_ssog_test.svg" in names2 and any(n.startswith("playground_3atoms_tau1.00") for n in names2)
    assert figures_cli.main(["--checkpoint", str(tmp_path / "missing.safetensors"), "--out-dir", str(out2)]) == 2
    assert "no such checkpoint" in capsys.readouterr().err


def test_dot_model_query_figure_has_one_row():
    model = dot_twin()
    x = torch.rand(1, 3, 32, 32)
    from ssog_core.analysis.measures import attention_maps

    maps = attention_maps(model, x)
    row = figures.query_rows(maps.attn, maps.grid, 1, (3, 3))
    assert row.shape == (4, 8, 8) and row.sum() == pytest.approx(4.0, rel=1e-5)
    fig = viz.query_field_figure(shapes_image(), None, row, (3, 3), 1)
    assert len([ax for ax in fig.axes if ax.get_title()]) == 4
