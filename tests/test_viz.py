"""Drawing (:mod:`ssog_core.viz.figures`): colour maps, PNG bytes and cells, and figure layout and metadata."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from ssog_core.analysis.measures import layer_fields
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


@pytest.mark.slow
def test_geometry_figure_titles_do_not_overlap_and_metadata_is_stored():
    fields = layer_fields(designed_ssog(depth=6, heads=4))
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


def test_query_field_panels_are_each_on_their_own_scale():
    """A fixed field peaking at 0.02 beside a steered one at 0.8 is drawn as visibly as it: on one shared scale
    it vanished."""
    fixed, steered = np.zeros((2, 5, 5)), np.zeros((2, 5, 5))
    fixed[:, 2, 2], fixed[:, 1, 1], steered[:, 2, 3] = 0.02, 0.01, 0.8
    fig = viz.query_field_figure(Image.new("RGB", (40, 40)), fixed, steered, (2, 2), 0)
    opacity = [int(ax.images[1].get_array()[..., 3].max()) for ax in fig.axes[:4]]
    assert len(set(opacity)) == 1 and opacity[0] > 200
    assert "own scale" in fig._suptitle.get_text() or any("own scale" in t.get_text() for t in fig.texts)


def test_compare_puts_each_model_on_its_own_scale():
    """A dot twin's +20 sink patch must not flatten the SSOG map to grey: one colour scale per model."""
    import torch

    from ssog_core.analysis import ExportMaps

    def maps(peak: float) -> ExportMaps:
        net = torch.zeros(1, 2, 4, 4)
        net[0, :, 1, 1], net[0, :, 2, 2] = peak, -peak / 2
        zero = torch.zeros(1, 4, 4)
        return ExportMaps(net, net, net, net.sum(1), zero, 0.5, (4, 4), {}, torch.zeros(1, 2), torch.zeros(1, 3))

    fig = viz.compare_figure(Image.new("RGB", (40, 40)), ("A", maps(0.5)), ("B", maps(20.0)), 0)
    limits = [ax.images[-1].get_clim()[1] for ax in fig.axes if ax.images][:2]  # layer row: A, B
    assert limits[0] == 0.5 and limits[1] == 20.0


def test_the_steering_figure_draws_a_row_per_steered_tap_only():
    """A μ-only model's layer gets the μδ row alone (no empty σδ / λ rows reading "max 0.00"); a model steering every
    tap gets three; the files' figure takes the taps from the layer's gates."""
    import torch

    from ssog_core.analysis import steering_offsets
    from ssog_core.analysis.measures import layer_fields
    from ssog_core.viz.files import steering_figure

    model = designed_ssog(depth=1)
    offsets = steering_offsets(model, torch.rand(1, 3, 32, 32))
    image = Image.new("RGB", (32, 32), (90, 120, 160))

    def panels(fig) -> list[str]:
        return [ax.get_ylabel() for ax in fig.axes if ax.get_title().startswith("head 0:")]

    assert panels(viz.steering_figure(image, offsets, 0, 1.0)) == ["μδ: looks elsewhere", "σδ: widen / tighten",
                                                                  "λ: re-weighting"]  # fmt: skip
    assert panels(viz.steering_figure(image, offsets, 0, 1.0, taps=("mu",))) == ["μδ: looks elsewhere"]
    field = layer_fields(model)[0]
    assert panels(steering_figure(image, offsets, 0, field, 4.0)) == [
        {"mu": "μδ: looks elsewhere", "sigma": "σδ: widen / tighten", "lambda": "λ: re-weighting"}[t]
        for t in ("mu", "sigma", "lambda") if t in field.gates
    ]  # fmt: skip
    with pytest.raises(ValueError, match="at least one steered tap"):
        viz.steering_figure(image, offsets, 0, 1.0, taps=())


def test_the_steering_arrow_key_overlaps_no_title():
    import torch

    from ssog_core.analysis import steering_offsets

    model = designed_ssog(depth=1)
    fig = viz.steering_figure(Image.new("RGB", (32, 32), (90, 120, 160)),
                              steering_offsets(model, torch.rand(1, 3, 32, 32)), 0, 1.0)  # fmt: skip
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    key = next(a for ax in fig.axes for a in ax.artists if type(a).__name__ == "QuiverKey")
    box = key.text.get_window_extent(renderer)
    titles = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    assert titles and not any(box.overlaps(t) for t in titles)
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes[: 3 * 4])
