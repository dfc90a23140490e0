"""The Intervene tab's form shows the chosen op's fields only (from the registry), its attention panel uses the
centre query every other view uses, and the fixed-field model beside the gates comes from the one twin rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app import interventions
from app.layout import build_page
from app.state import AppContext, default_twin
from app.tabs import geometry, intervene
from ssog_core import save_checkpoint
from ssog_core.field import centre_query
from ssog_core.interventions.edit import EDITS, parse_edits
from ssog_core.nn.vit import ViT
from tests.app_fixtures import designed_ssog, dot_twin, write_images
from tests.test_app_intervene_api import SHAPES

STEERED = "ssog_shapes.safetensors"


def fixed_field(seed: int = 0) -> ViT:
    """The fixed-field variant of the test model (no content taps)."""
    return ViT(replace(designed_ssog(depth=2, seed=seed).config, steer=()))


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> AppContext:
    """A steered model and its dot twin, a real fixed-field model of the same data under a name no renaming
    finds, one of other data listed before it, and a steered model named as if it were the fixed one."""
    root = tmp_path_factory.mktemp("ivform")
    folder = root / "ckpt"
    folder.mkdir()
    save_checkpoint(folder / STEERED, designed_ssog(depth=2), SHAPES)
    save_checkpoint(folder / "dot_shapes.safetensors", dot_twin(depth=2), SHAPES)
    save_checkpoint(folder / "a_fixed_other.safetensors", fixed_field(1), {**SHAPES, "data": "shapes:val=60,seed=9"})
    save_checkpoint(folder / "baseline.safetensors", fixed_field(), SHAPES)
    save_checkpoint(folder / "ssog_fixed_shapes.safetensors", designed_ssog(depth=2, seed=2), SHAPES)  # steered
    write_images(root / "assets")
    return AppContext(folder, root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


@pytest.fixture(scope="module")
def ui(ctx):
    return build_page(ctx)[1].intervene


def shown(update: dict) -> bool:
    return update.get("visible", True)


def test_the_form_shows_the_chosen_ops_fields_only_with_that_ops_help(ui):
    first = next(iter(EDITS))
    assert {n for n, c in ui.fields.items() if c.visible} == set(intervene.op_fields(first))
    starts = [c.value for c in ui.fields.values()]
    for op in EDITS:
        out = intervene.on_op(ui, op, *starts)
        mine = intervene.op_fields(op)
        assert {n for n, c in ui.fields.items() if shown(out[c])} == set(mine), op
        for name, p in mine.items():
            assert out[ui.fields[name]]["info"].startswith(p.help), (op, name)
            assert ui.fields[name].label == name
            if p.kind == "choice":
                assert [c[0] for c in ui.fields[name].choices] == list(p.choices)
        assert "head_spec" not in mine and len(mine) < len(ui.fields)
    gate, ablate = (intervene.on_op(ui, op, *starts)[ui.fields["head"]] for op in ("close_gate", "ablate_head"))
    assert gate["minimum"] == -1 and "−1 leaves it out" in gate["info"] and ablate["minimum"] == 0
    values = {**dict(zip(ui.fields, starts, strict=True)), "head": -1, "layer": 3}
    out = intervene.on_op(ui, "ablate_head", *values.values())
    assert out[ui.fields["head"]]["value"] == 0 and "value" not in out[ui.fields["layer"]]  # kept: it fits


def test_the_attention_panel_uses_the_centre_query_of_every_other_view(ctx, ui):
    """On an even grid (8×8) the centre query is (3, 3): the Intervene panel's rows are that query's attention,
    as the geometry tab's attention maps (named by their query) and a trained head opened in the playground."""
    sha = ctx.open_bundled("scene.png").sha256
    edits = [{"op": "ablate_head", "layer": 1, "head": 2}]
    loaded = ctx.model(STEERED)
    gh, gw = loaded.config.grid
    assert (gh, gw) == (8, 8) and centre_query((gh, gw)) == (3, 3)
    fig = intervene.on_apply(ctx, ui, STEERED, sha, edits)[ui.attention]
    eff = interventions.run(ctx, loaded, interventions.request(ctx, sha, parse_edits(edits))).image
    n = 3 * gw + 3
    heads = loaded.model.blocks[0].attn.num_heads
    for h in range(heads):
        np.testing.assert_allclose(fig.data[h].z, eff.attention_unedited[h, n].reshape(gh, gw).numpy())
        np.testing.assert_allclose(fig.data[heads + h].z, eff.attention_edited[h, n].reshape(gh, gw).numpy())
    _, figure, _ = geometry.dot_view(ctx, ctx.model("dot_shapes.safetensors"), sha)
    assert "_q3-3" in Path(figure).name


def test_the_fixed_field_model_beside_the_gates_comes_from_the_twin_rule(ctx, ui):
    """No renaming in the tab: the steered model named ``ssog_fixed_shapes`` is not a fixed field, the one of
    other data is not matched, and the real one is found whatever its name."""
    assert default_twin(ctx, STEERED, "ssog_fixed") == "baseline.safetensors"
    assert default_twin(ctx, STEERED) == "dot_shapes.safetensors"
    assert default_twin(ctx, "dot_shapes.safetensors", "ssog_fixed") == "baseline.safetensors"  # name checked too
    assert not hasattr(intervene, "fixed_twin")


@pytest.mark.slow
def test_the_sweep_names_the_matched_fixed_field_model(ctx, ui):
    *_, last = intervene.on_sweep(ctx, ui, STEERED, 10, "zero")
    note = last[ui.sweep_note]
    assert "the matched fixed-field model **baseline.safetensors** reaches" in note
    assert "ssog_fixed_shapes" not in note and "a_fixed_other" not in note
