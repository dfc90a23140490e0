"""The Intervene tab's handlers, called directly on a page built once: the edit list, the one-image panels, the
validation set, head importance (a click on a cell adds that edit) and what a dot-product model offers."""

from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr
import pytest

from app.layout import build_page
from app.state import AppContext
from app.tabs import intervene
from ssog_core import save_checkpoint
from ssog_core.interventions.edit import Edit, ops_help, param
from ssog_core.nn.vit import ViT
from tests.app_fixtures import designed_ssog, dot_twin, write_images
from tests.test_app_intervene_api import SHAPES


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    root = tmp_path_factory.mktemp("iv")
    (root / "ckpt").mkdir()
    save_checkpoint(root / "ckpt" / "ssog_shapes.safetensors", designed_ssog(depth=2), SHAPES)
    fixed = ViT(replace(designed_ssog(depth=2).config, steer=()))  # the fixed field: no content taps
    save_checkpoint(root / "ckpt" / "ssog_fixed_shapes.safetensors", fixed, SHAPES)
    save_checkpoint(root / "ckpt" / "dot_shapes.safetensors", dot_twin(depth=2), SHAPES)
    write_images(root / "assets")
    return AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


@pytest.fixture(scope="module")
def ui(ctx):
    return build_page(ctx)[1].intervene


def add(ctx, ui, edits, op, layer=0, head=0, tap="mu", mode="zero", atom=0, source=intervene.CURRENT, what="output",
        factor=0.5, ckpt="ssog_shapes.safetensors", sha="x" * 64):  # fmt: skip
    given = dict(layer=layer, head=head, tap=tap, mode=mode, atom=atom, source=source, what=what, factor=factor)
    return intervene.on_add(ctx, ui, ckpt, sha, edits, op, *(given.get(f, 0) for f in ui.fields))


def test_the_edit_list_adds_moves_removes_and_reads_as_sentences(ctx, ui):
    out = add(ctx, ui, [], "close_gate", layer=1, head=-1, tap="sigma")
    out = add(ctx, ui, out[ui.edits], "swap_axes", layer=0, head=2)
    out = add(ctx, ui, out[ui.edits], "patch_head", layer=1, head=3, source="gray.png", what="steering")
    out = add(ctx, ui, out[ui.edits], "scale_gate", layer=0, head=1, tap="all", factor=0.25)
    assert out[ui.listing].splitlines() == [
        "1. layer 1: σ gate closed",
        "2. layer 0, head 2: mirrored across the diagonal (y ↔ x)",
        "3. layer 1, head 3: steering patched from gray.png",
        "4. layer 0, head 1: all gates × 0.25",
    ]
    out = {ui.edits: out[ui.edits][:3]}
    moved = intervene.on_move(ctx, ui, "ssog_shapes.safetensors", out[ui.edits], 3, by=-1)
    assert moved[ui.listing].splitlines()[1].startswith("2. layer 1, head 3")
    removed = intervene.on_move(ctx, ui, "ssog_shapes.safetensors", moved[ui.edits], 1, by=0)
    assert len(removed[ui.edits]) == 2
    bad = add(ctx, ui, [], "drop_atom", layer=5)
    assert ui.edits not in bad and "layer 5 does not exist" in bad[ui.status]


def test_apply_shows_probabilities_maps_and_the_edited_layer(ctx, ui):
    sha = ctx.open_bundled("scene.png").sha256
    edits = add(ctx, ui, [], "ablate_head", layer=1, head=2)[ui.edits]
    out = intervene.on_apply(ctx, ui, "ssog_shapes.safetensors", sha, edits)
    assert "| class | unedited | edited |" in out[ui.prediction] and "Δ log p" in out[ui.prediction]
    assert all(m in out for m in ui.maps)
    assert "head 2 (not in the mean)" in [a.text for a in out[ui.attention].layout.annotations]


@pytest.mark.slow
def test_validation_and_head_importance_with_the_fixed_field_model_beside_the_gates(ctx, ui):
    edits = add(ctx, ui, [], "close_gate", layer=0, head=-1, tap="all")[ui.edits]
    first, *_, out = intervene.on_evaluate(ctx, ui, "ssog_shapes.safetensors", edits, 30)
    assert "30 validation images…" in first[ui.validation]  # said before the work starts
    assert "first **30** validation images" in out[ui.validation] and len(out[ui.per_class]) == 5
    *_, last = intervene.on_sweep(ctx, ui, "ssog_shapes.safetensors", 20, "zero")
    assert len(last[ui.heads_table]) == 2 and len(last[ui.gates_table][0]) == 4
    assert "ssog_fixed_shapes.safetensors" in last[ui.sweep_note]
    cell = intervene.on_cell(ctx, ui, "ssog_shapes.safetensors", [], "zero", False, (1, 3))
    assert cell[ui.listing] == "1. layer 1, head 2: ablated (zero)"
    gate = intervene.on_cell(ctx, ui, "ssog_shapes.safetensors", [], "zero", True, (0, 2))
    assert gate[ui.listing] == "1. layer 0: σ gate closed"
    assert intervene.on_cell(ctx, ui, "ssog_shapes.safetensors", [], "zero", True, (0, 0)) == {ui.status: gr.skip()}


def dot_ops(ctx) -> list[str]:
    """What the dot model takes, as the tab decides it (from what its layers take)."""
    return intervene.ops_for(ctx.model("dot_shapes.safetensors").model)


def test_opening_the_tab_keeps_the_op_a_person_chose_when_the_model_takes_it(ctx, ui):
    """The tab's render can land after the person picked an op (a busy server): it never puts the first op back
    over one the model takes, and replaces one it does not take (an SSOG-only op on a dot model)."""
    kept = intervene.render(ctx, ui, "ssog_shapes.safetensors", "ablate_head")[ui.op]
    assert "value" not in kept and "ablate_head" in [c if isinstance(c, str) else c[0] for c in kept["choices"]]
    assert intervene.render(ctx, ui, "ssog_shapes.safetensors", None)[ui.op]["value"] == next(iter(intervene.EDITS))
    assert intervene.render(ctx, ui, "dot_shapes.safetensors", "swap_axes")[ui.op]["value"] == dot_ops(ctx)[0]


def test_a_dot_model_offers_what_it_can(ctx, ui):
    out = intervene.render(ctx, ui, "dot_shapes.safetensors")
    assert out[ui.op]["choices"] == [(o, o) for o in dot_ops(ctx)] or out[ui.op]["choices"] == list(dot_ops(ctx))
    refused = add(ctx, ui, [], "swap_axes", ckpt="dot_shapes.safetensors")
    assert "only ablate_head and patch_head" in refused[ui.status]
    n = out[ui.n]  # a model with a validation set: up to MAX_EVAL_IMAGES of it (a folder: tests/test_app_standard_vit)
    assert (n["maximum"], n["value"], n["step"], n["label"]) == (
        intervene.MAX_EVAL_IMAGES,
        intervene.DEFAULT_EVAL_IMAGES,
        10,
        "validation images (N)",
    )
    assert out[ui.evaluation]["label"] == intervene.EVALUATION_TITLE


def test_a_head_opened_from_the_model_can_be_applied_to_it(ctx):
    from app.tabs import playground

    pg = build_page(ctx)[1].playground
    sha = ctx.open_bundled("scene.png").sha256
    out = playground.open_head(ctx, pg, "ssog_shapes.safetensors", 1, 2, False, sha)
    src, value = out[pg.model_src], out[pg.canvas]["value"]
    assert src == {"checkpoint": "ssog_shapes.safetensors", "layer": 1, "head": 2} and out[pg.apply]["visible"]
    same = playground.on_apply_model(ctx, pg, value, src, True, sha)[pg.apply_note]
    assert same.startswith("Layer 1, head 2") and same.endswith("0.0000).")  # its own atoms: no change
    moved = {**value, "atoms": [{**a, "y": a["y"] + 3} for a in value["atoms"]]}
    assert "→" in playground.on_apply_model(ctx, pg, moved, src, True, sha)[pg.apply_note]
    hotter = {**value, "tau": value["tau"] + 1}
    assert "τ is per layer" in playground.on_apply_model(ctx, pg, hotter, src, True, sha)[pg.apply_note]
    assert playground.on_apply_model(ctx, pg, value, None, True, sha) == playground.gr.skip()


def test_the_edit_list_is_a_session_section_checked_on_restore():
    """Saved through the per-tab protocol; a restored list is checked and a bad one named in the notes."""
    from types import SimpleNamespace

    from app.session_protocol import Restoring
    from app.tabs import intervene

    ui = SimpleNamespace(edits="edits", listing="listing", shown="shown")
    part = intervene.session_part(ui)
    edits = [{"op": "swap_axes", "layer": 1, "head": 0}]
    assert part.save({"edits": edits}) == {"edits": edits} and part.save({"edits": []}) == {}
    out = part.restore({"edits": edits}, Restoring(None, None))
    assert out["edits"][0]["op"] == "swap_axes" and out["listing"].startswith("1. layer 1, head 0")
    restoring = Restoring(None, None)
    out = part.restore({"edits": [{"op": "rotate", "layer": 0}]}, restoring)
    assert out["edits"] == [] and "unknown op 'rotate'" in restoring.notes[0]


def test_the_form_is_built_from_the_registry(ctx, ui):
    """move_atom (and any op defined later) is in the op list and the form without an edit to the tab."""
    from ssog_core.interventions.edit import EDITS

    assert {"dy", "dx", "atom", "factor", "tap", "mode", "source", "what"} <= set(ui.fields)
    assert "head_spec" not in ui.fields and "move_atom" in [c[0] for c in ui.op.choices]
    given = {"layer": 1, "head": 2, "atom": 0, "dy": -1.5, "dx": 0.25}
    out = intervene.on_add(ctx, ui, "ssog_shapes.safetensors", "x" * 64, [], "move_atom",
                           *(given.get(f, 0) for f in ui.fields))  # fmt: skip
    assert out[ui.listing] == "1. layer 1, head 2: atom 0 moved by (dy, dx) = (-1.5, +0.25)"
    assert out[ui.edits] == [{"op": "move_atom", "layer": 1, "head": 2, "atom": 0, "dy": -1.5, "dx": 0.25}]
    assert list(intervene.form_fields()) == list(ui.fields)
    try:

        @dataclass(frozen=True)
        class Nudge(Edit):
            """A test op."""

            op = "test_nudge"
            head: int = param(0, kind="int", low=0, required=True, help="the head")
            amount: float = param(0.0, kind="float", help="how far")

        assert "amount" in intervene.form_fields()
        assert list(intervene.op_fields("test_nudge")) == ["layer", "head", "amount"]
        assert "test_nudge: A test op." in ops_help() and "amount: float: how far" in ops_help()
    finally:
        EDITS.pop("test_nudge", None)


def test_the_top_table_keeps_the_edited_winner_and_the_maps_sit_on_the_grid(ctx, ui):
    import numpy as np

    names = [f"c{i}" for i in range(7)]
    unedited = np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05])
    edited = np.array([0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.45])  # c6: last unedited, first edited
    rows = intervene.top_table(names, unedited, edited).splitlines()
    assert rows[2:7] == [f"| c{i} | {unedited[i]:.4f} | {edited[i]:.4f} |" for i in range(5)]
    assert rows[7] == "| c6 | 0.0500 | 0.4500 |" and "Edited prediction: **c6**" in rows[-1]
    assert len(intervene.top_table(names, unedited, unedited).splitlines()) == 2 + 5 + 2  # no extra row
    sha = ctx.open_bundled("scene.png").sha256
    out = intervene.on_apply(ctx, ui, "ssog_shapes.safetensors", sha, [])
    fig = out[ui.maps[0]]
    gh, gw = np.asarray(fig.data[0].z).shape
    assert tuple(fig.layout.yaxis.range) == (gh - 0.5, -0.5) and tuple(fig.layout.xaxis.range) == (-0.5, gw - 0.5)


def test_the_head_importance_tables_are_titled_by_layer_head_and_gate(ui):
    rows = [["layer 0", "+0.1", "+0.2", "+0.3", "+0.4"], ["layer 1", "+0.1", "+0.2", "+0.3", "+0.4"]]
    assert ui.heads_table.postprocess(rows).headers == ["layer", "head 0", "head 1", "head 2", "head 3"]
    assert ui.gates_table.postprocess([["layer 0", "a", "b", "c"]]).headers == ["layer", "μ gate", "σ gate", "λ gate"]


def test_a_closed_page_stops_the_evaluation_and_frees_the_users_slot(ctx, ui, monkeypatch):
    """The tab's Evaluate is a generator that yields while it computes: closed then (a closed page, a cancel), it
    stops the work and gives the user's heavy slot back, so their next evaluation runs."""
    import threading
    import time
    from types import SimpleNamespace

    from app import queues

    stopped = threading.Event()

    def endless(ctx, loaded, asked, stop, watch):  # validation work that ends only when told to stop
        while not stop():
            time.sleep(0.01)
        stopped.set()
        raise RuntimeError("stopped")

    real = intervene.interventions.run
    monkeypatch.setattr(intervene.interventions, "run", endless)
    who = SimpleNamespace(username="ada")
    edits = add(ctx, ui, [], "close_gate", layer=0, head=-1, tap="all")[ui.edits]
    job = intervene.on_evaluate(ctx, ui, "ssog_shapes.safetensors", edits, 30, who)
    assert "30 validation images…" in next(job)[ui.validation]
    assert "ada" not in queues._running  # the note comes before the slot is taken
    note = next(job)[ui.validation]  # computing, the slot held, the job's state on the page
    assert note == "Evaluating the edits: waiting for a heavy slot…" and queues._running["ada"] == 1
    job.close()
    assert stopped.wait(5) and "ada" not in queues._running
    monkeypatch.setattr(intervene.interventions, "run", real)
    *_, again = intervene.on_evaluate(ctx, ui, "ssog_shapes.safetensors", edits, 20, who)
    assert "first **20** validation images" in again[ui.validation]


def test_the_importance_table_of_heads_replaced_by_their_fits_shows_and_adds_that_edit(ctx, ui):
    from ssog_core.interventions.importance import Cell, HeadImportance

    cells = [[Cell(0.1 * h, 0.25 * (layer + h), (0.1, 0.3 + h)) for h in range(4)] for layer in range(2)]
    zeros = [[Cell(0.0, 0.0, (-0.1, 0.1)) for _ in range(4)] for _ in range(2)]
    imp = HeadImportance(20, "zero", 0.9, zeros, {}, cells, 3)
    out = intervene.importance_updates(ctx, ui, ctx.model("dot_shapes.safetensors"), imp)
    assert out[ui.fits_table][1] == ["layer 1", *(intervene._cell(c) for c in cells[1])]
    assert out[ui.fits_table][1][2] == "+0.500 [+0.100, +1.300]" and "its 3-atom fit" in out[ui.sweep_note]
    added = intervene.on_fit_cell(ctx, ui, "dot_shapes.safetensors", [], (1, 3))
    assert added[ui.listing] == "1. layer 1, head 2: attention replaced by its 4-atom fit"
    assert intervene.on_fit_cell(ctx, ui, "dot_shapes.safetensors", [], (0, 0)) == {ui.status: gr.skip()}
