"""Drawing (:mod:`ssog_core.viz.figures`): colour maps, PNG bytes and cells, and figure layout and metadata."""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image

from ssog_core.analysis.measures import head_fields
from ssog_core.viz import figures as viz
from ssog_core.viz import raster
from tests.app_fixtures import designed_ssog


def test_colorize_png_and_cells():
    a = np.array([[0.0, 0.5], [1.0, 2.0]])
    rgb = raster.colorize(a, "viridis", 0.0, 1.0)
    lut = raster._lut("viridis")
    assert rgb.dtype == np.uint8 and rgb.shape == (2, 2, 3)
    assert (rgb[0, 0] == lut[0]).all() and (rgb[1, 0] == lut[255]).all() and (rgb[1, 1] == lut[255]).all()
    png = raster.png_bytes(rgb)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), rgb)
    assert raster.data_url(png).startswith("data:image/png;base64,")
    assert raster.cell_at((0, 0), (100, 50), (5, 10)) == (0, 0)
    assert raster.cell_at((99.9, 49.9), (100, 50), (5, 10)) == (4, 9)
    assert raster.cell_at((35, 12), (100, 50), (5, 10)) == (1, 3)
    assert raster.density_rgba(np.ones((3, 4))).shape == (3, 4, 4)


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
