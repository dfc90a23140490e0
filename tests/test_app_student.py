"""A distilled student is an ordinary lab checkpoint in every view. A dot teacher that reads out its class token is
trained here, its student distilled by the app's own job and written into the checkpoint folder by the service (so
the student has SSOG attention *and* a class token, ``prefix_dot``), then opened through the app's handlers: the
playground (its heads' presets), geometry (fields, gates, its report read back, and a report that is not its own
named in words), steering, export maps beside its teacher, compare, training history, intervene. And one fit for
both: the app's student's step-0 atoms are ``python -m ssog_core fields``' atoms, bit for bit."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from ssog_core import ViT, load_checkpoint, save_checkpoint
from ssog_core.analysis.head_as_field import AtomFit
from ssog_core.analysis.head_spec import HeadSpec, evaluate
from ssog_core.analysis.measures import export_maps, steering_offsets
from ssog_core.cli.distill import main as distill_main
from ssog_core.cli.fields import main as fields_main
from ssog_core.distill import job
from ssog_core.distill.loop import Recipe
from ssog_core.distill.student import field_parameters
from ssog_core.field import centre_query
from ssog_core.interventions import heavy
from ssog_core.interventions.ops import AblateHead, CloseGate, ScaleGate
from ssog_core.interventions.run import edited
from ssog_core.interventions.validation import Pictures
from ssog_core.nn.hook_points import reading
from ssog_core.testing.oracles import oracle_matrix
from tests.test_distill import CLASSES, SIZE, picture_folder, train

TEACHER = "dot_cls.safetensors"
N, K, STEPS = 20, 3, 8  # N above FIELD_BATCH: the fit takes two batches, whose split decides its rounding
pytestmark = pytest.mark.slow  # every test here opens a student distilled once for the module (~30 s)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    from app.state import AppContext

    root = tmp_path_factory.mktemp("app-student")
    torch.manual_seed(0)
    teacher = ViT(num_classes=CLASSES, img_size=SIZE, patch_size=4, dim=24, depth=2, num_heads=3, attn="dot",
                  dropout=0.0, mlp_ratio=2.0, class_token=True, pool="token")  # fmt: skip
    with torch.no_grad():  # sharp heads whose keys carry their position, as tests/test_distill.py's lab teacher
        teacher.pos_embed.mul_(50.0)
        for block in teacher.blocks:
            block.attn.qkv.weight[: 2 * 24].mul_(5.0)
    train(teacher, lambda m, x: m(x))
    with torch.no_grad():  # a confident teacher: the student has something to learn, and its gates open
        teacher.head.weight.mul_(4.0)
        teacher.head.bias.mul_(4.0)
    save_checkpoint(root / "ckpt" / TEACHER, teacher, {"class_names": [f"quadrant {i}" for i in range(CLASSES)]})
    picture_folder(root / "assets", 2 * N, 2)
    return AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


@pytest.fixture(scope="module")
def student(ctx) -> str:
    """The student's picker name: distilled on the first N bundled pictures at a learning rate that opens its gates
    in a few steps, kept by the service."""
    from app import distill as distilling

    loaded = ctx.model(TEACHER)
    asked = job.DistillRequest(TEACHER, Pictures(bundled=ctx.assets_dir), N, K, ("mu", "sigma", "lambda"),
                               Recipe(steps=STEPS, lr=3e-2))  # fmt: skip
    out = job.distill((loaded.model, loaded.meta), asked, lambda *a: None, lambda: False)
    return distilling.keep(ctx, TEACHER, out).name


@pytest.fixture(scope="module")
def page(ctx):
    from app import layout

    demo, page = layout.build_page(ctx)
    yield page
    demo.close()


@pytest.fixture(scope="module")
def sha(ctx):
    return ctx.open_bundled(ctx.bundled_images()[0]).sha256


def _input(ctx, loaded, sha):
    return loaded.input(ctx.image(sha).image)


def _probs(model, x, edits=()):
    with torch.inference_mode(), edited(model, list(edits)):
        return torch.softmax(model(x)[0].double(), -1)


def test_the_students_step0_atoms_are_the_fields_commands_bit_for_bit(ctx, student, tmp_path):
    """The app's student (its fixed field, untouched by training the steering) holds exactly the raw parameters of
    the atoms ``python -m ssog_core fields`` writes for the same teacher, pictures and K; the app's own *Every head
    as a field* fits them too."""
    folder = tmp_path / "first"
    folder.mkdir()
    for name in sorted(p.name for p in ctx.assets_dir.iterdir())[:N]:  # the N pictures the job trained on
        shutil.copy(ctx.assets_dir / name, folder / name)
    out = tmp_path / "f.json"
    teacher = str(ctx.checkpoint_dir / TEACHER)
    assert fields_main(["--checkpoint", teacher, "--images", str(folder), "--atoms", str(K), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["heads"]
    loaded = ctx.model(TEACHER)
    measured = heavy.head_fields((loaded.model, loaded.meta), N, Pictures(bundled=ctx.assets_dir), K,
                                 lambda *a: None, lambda: False)  # fmt: skip
    state = ctx.model(student).model.state_dict()
    for layer in range(2):
        heads = [h for h in rows if h["layer"] == layer]
        atoms = [[(a["mu_y"], a["mu_x"], a["sigma_y"], a["sigma_x"], a["weight"]) for a in h["atoms"]] for h in heads]
        t = torch.tensor(atoms, dtype=torch.float64)  # (H, K, 5)
        fit = AtomFit(t[..., :2], t[..., 2:4], t[..., 4], torch.zeros(len(heads)))
        app_fit = measured.fits[layer]
        for name, a, b in (("mu", fit.mu, app_fit.mu), ("sigma", fit.sigma, app_fit.sigma), ("lam", fit.lam,
                                                                                            app_fit.lam)):  # fmt: skip
            assert torch.equal(a, b), f"layer {layer} {name}: the app's fields differ from the command's"
        for key, value in field_parameters(fit, 0.0).items():
            got = state[f"blocks.{layer}.attn.{key}"]
            assert torch.equal(got, value.float()), f"layer {layer} {key}"


# ------------------------------------------------------------------------------------------- the report


def test_opening_a_student_shows_its_report_beside_its_fields(ctx, student, page, sha):
    from app.tabs import geometry

    ui = page.geometry
    report = json.loads((ctx.checkpoint_dir / student.replace(".safetensors", ".report.json")).read_text())
    assert report["student"] == student and len(report["student_sha256"]) == 64
    out = geometry.render(ctx, ui, student, 0, sha)
    assert "2 layers × 3 heads × 3 atoms" in out[ui.note]
    note = out[ui.distill_note]
    assert f"**{student}** is an SSOG student of **{TEACHER}** ({STEPS} steps on {N} pictures)" in note
    assert f"{report['step0']['agreement']:.3f} → {report['final']['agreement']:.3f}" in note
    assert f"on {N} held-out pictures (after the first {N})" in note and "prefix quer" in note
    rows = out[ui.distill_table]["value"]
    assert [r[:4] for r in rows] == [[h["layer"], h["head"], round(h["share_fit"], 4), round(h["share_steered"], 4)]
                                     for h in report["heads"]]  # fmt: skip
    assert out[ui.distill_figure]["value"].endswith(".png") and out[ui.distill_compare]["visible"]
    assert out[ui.distill_shown] == {"student": student, "teacher": TEACHER}
    teacher = geometry.render(ctx, ui, TEACHER, 0, sha, None, out[ui.distill_shown])  # the teacher keeps it
    assert ui.distill_shown not in teacher and "no field" in teacher[ui.note]


def test_a_report_that_is_not_the_students_own_is_named_in_words(ctx, student, page, sha):
    """A copy without its report, a report left beside a replaced student, a malformed one, another teacher's: the
    tab opens the student and its note says what is wrong; nothing of the report is shown."""
    from app.tabs import geometry

    ui, folder = page.geometry, ctx.checkpoint_dir
    report = json.loads((folder / student.replace(".safetensors", ".report.json")).read_text())
    model, meta = load_checkpoint(folder / student)
    meta = {k: v for k, v in meta.items() if k != "config"}
    cases = {
        "copied": (None, "no report beside copied.safetensors: copied.report.json is not there"),
        "replaced": (report, "belongs to another student (SHA-256 "),
        "garbled": ("{not json", "not a readable distillation report (not JSON"),
        "headless": ({**report, "heads": None}, "not a distillation report of this student: no 'heads' list"),
        "short": ({**report, "heads": report["heads"][:-1]}, "5 head rows for a student of 2 layers × 3 heads"),
        "other": ({**report, "teacher": "other.safetensors"}, "reports a student of other.safetensors, but"),
        "unstamped": ({k: v for k, v in report.items() if k != "student_sha256"}, "does not name the student"),
    }
    for stem, (written, words) in cases.items():
        path = folder / f"{stem}.safetensors"
        if stem == "replaced":  # the student saved again with another step: its old report stays beside it
            save_checkpoint(path, model, {**meta, "step": meta["step"] + 1})
        else:
            shutil.copy(folder / student, path)
        if written is not None:
            text = written if isinstance(written, str) else json.dumps(written)
            (folder / f"{stem}.report.json").write_text(text)
        out = geometry.render(ctx, ui, path.name, 0, sha)
        assert words in out[ui.distill_note], (stem, out[ui.distill_note])
        assert out[ui.distill_shown] is None and out[ui.distill_figure]["visible"] is False, stem
        assert "2 layers × 3 heads × 3 atoms" in out[ui.note], stem  # the student itself opens


def test_the_commands_student_brings_its_report_through_the_same_reader(ctx, page, sha, tmp_path):
    """``python -m ssog_core distill`` writes its student and report into the folder: the app opens both, and Compare
    opens the student beside its teacher."""
    from app import layout
    from app.tabs import geometry

    held = picture_folder(tmp_path / "held", 8, 5)
    out = ctx.checkpoint_dir / "cli_student.safetensors"
    assert distill_main(["--teacher", str(ctx.checkpoint_dir / TEACHER), "--images", str(ctx.assets_dir),
                         "--eval-images", str(held), "--atoms", "2", "--steps", "2", "--out", str(out),
                         "--no-progress"]) == 0  # fmt: skip
    shown = geometry.render(ctx, page.geometry, out.name, 0, sha)
    assert (
        "is an SSOG student of" in shown[page.geometry.distill_note]
        and "on 8 held-out pictures." in (shown[page.geometry.distill_note])
    )
    assert len(shown[page.geometry.distill_table]["value"]) == 6
    on_show = shown[page.geometry.distill_shown]  # its metadata names the teacher by path: the picker's name opens
    assert on_show == {"student": out.name, "teacher": TEACHER} and shown[page.geometry.distill_compare]["visible"]
    opened = layout.on_compare_student(ctx, page, on_show, sha, 0.5, 0)
    assert opened[page.compare.a]["value"] == out.name and opened[page.compare.b]["value"] == TEACHER


# ------------------------------------------------------------------------------------------- every view


def test_playground_presets_are_the_students_own_fields(ctx, student, page):
    """Each preset is a head of the student, drawn as its fixed field: the oracle's row of the centre query."""
    from app.tabs import playground

    loaded, pg = ctx.model(student), page.playground
    choices, _ = playground.preset_choices(ctx, student)
    assert choices, "a student's heads are presets"
    grid, q = loaded.config.grid, centre_query(loaded.config.grid)
    for choice, preset in zip(choices, loaded.presets, strict=True):
        value = playground.on_preset(ctx, pg, student, choice, False)[pg.canvas]["value"]
        assert value["grid"] == list(grid) and value["query"] == list(q)
        s = preset.shape
        field = loaded.model.blocks[s.layer].attn.fixed_field()
        want = oracle_matrix(field, grid, "factorized")[0, s.head, q[0] * grid[1] + q[1]]
        got = evaluate(HeadSpec.from_dict(value)).density.double().flatten()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_geometry_draws_the_students_fields_and_cold_gates(ctx, student, page, sha):
    from app.tabs import geometry

    ui = page.geometry
    out = geometry.render(ctx, ui, student, 1, sha)
    assert out[ui.figure]["value"].endswith(".png") and out[ui.gates]["visible"] and out[ui.stats]["visible"]
    assert len(out[ui.table]["value"]) == 2 * 3 * K and "cold start" in out[ui.gates]["value"].data[-1].name


def test_steering_shows_a_patch_queries_steered_field(ctx, student, page, sha):
    """The clicked query's steered row is the student's own attention row over the patches (its class token's mass
    left out, renormalised), recomputed here in float64; its fixed row is the oracle's field; content has moved it."""
    import gradio as gr

    from app import layout
    from app.tabs import steering

    st, loaded = page.steering, ctx.model(student)
    out = steering.render(ctx, st, student, sha, 1, None, 0)
    assert out[st.steering]["visible"] and "Click a patch" in out[st.note]
    click = out[st.click]
    h, w = click.shape[:2]
    picked = steering.on_select(ctx, st, student, sha, 1, gr.SelectData(None, {"index": [w * 0.5, h * 0.6],
                                                                              "value": None}))  # fmt: skip
    q = tuple(picked[st.query])
    fixed, steered = steering.query_rows(steering.analyse(ctx, loaded, ctx.image(sha)), 1, q)
    model = ViT(loaded.config).double()
    model.load_state_dict(loaded.model.state_dict())
    x = _input(ctx, loaded, sha).double()
    with torch.no_grad(), reading({1: model.blocks[1].attn.hook_in}) as seen:
        model(x)
        a = model.blocks[1].attn.attention_matrix(seen[1], loaded.config.grid)  # (1, H, 1 + N, 1 + N)
    gw = loaded.config.grid[1]
    row = a[0, :, 1 + q[0] * gw + q[1], 1:]
    torch.testing.assert_close(torch.from_numpy(steered).double().flatten(1), row / row.sum(-1, keepdim=True),
                               rtol=1e-4, atol=1e-6)  # fmt: skip
    oracle = oracle_matrix(model.blocks[1].attn.fixed_field(), loaded.config.grid, "factorized")[0, :, q[0] * gw + q[1]]
    torch.testing.assert_close(torch.from_numpy(fixed).double().flatten(1), oracle, rtol=1e-4, atol=1e-6)
    assert float(steering_offsets(loaded.model, x.float()).dmu[1].abs().max()) > 1e-3  # its gates opened
    # the query's head opens in the playground; letting go of its gate at 0 shows the prediction with it closed
    src = layout.on_open_steered(ctx, page, student, sha, 0, list(q), 1, False)[page.playground.steer_src]
    text = layout.on_gate_release(ctx, page.playground, src, 0.0)[page.playground.gate_effect]
    closed = _probs(loaded.model, x.float(), [ScaleGate(0, "all", 1, factor=0.0)])
    assert f"**{loaded.class_names[int(closed.argmax())]}** {float(closed.max()):.4f} (Δ" in text


def test_export_maps_beside_its_teacher_with_its_content_blind_prefix_share(ctx, student, page, sha):
    """The export twin of a student is its teacher; a patch query's mass on the class token is the head's learnt
    constant, so the student's prefix share per layer is the mean over heads of softmax([prefix_logits, 0])[0]."""
    from app.state import default_twin
    from app.tabs import export

    ex, loaded = page.export, ctx.model(student)
    assert default_twin(ctx, student) == TEACHER
    out = export.render(ctx, ex, student, TEACHER, sha, 0.5, 1)
    assert f"**{student}**" in out[ex.text] and f"**{TEACHER}**" in out[ex.text] and out[ex.figure].endswith(".png")
    maps = export_maps(loaded.model, _input(ctx, loaded, sha), 0.5)
    for layer, block in enumerate(loaded.model.blocks):
        logits = block.attn.prefix_logits.double()  # (H, 1)
        mass = 1.0 / (1.0 + torch.exp(-logits[:, 0]))  # softmax([l, 0])[0]
        assert math.isclose(float(maps.prefix_share[0, layer]), float(mass.mean()), rel_tol=1e-4)
    assert f"per layer {', '.join(f'{float(p):.0%}' for p in maps.prefix_share[0])}" in out[ex.text]


def test_compare_opens_the_student_beside_its_teacher(ctx, student, page, sha):
    from app.tabs import compare

    cmp = page.compare
    out = compare.render(ctx, cmp, student, TEACHER, sha, 0.5, 1)
    text = out[cmp.text]
    assert f"A — **{student}" in text and f"B — **{TEACHER}" in text and "needs equal grids" not in text
    files = compare.downloads(ctx, cmp, student, TEACHER, sha, 0.5, 1)[cmp.files]
    assert any(f.endswith(".npz") for f in files)


def test_training_history_is_the_distillations(ctx, student, page):
    """The student's history: a snapshot at step 0 and through its steps, its gates, its fields."""
    from app.tabs import training

    ui = page.training
    out = training.render(ctx, ui, student)
    assert f"snapshots over {STEPS} steps" in out[ui.note]
    assert out[ui.gates]["visible"] and out[ui.geometry]["visible"] and out[ui.grid]["value"].endswith(".png")
    history = training.training_view(ctx, ctx.model(student)).history
    assert history.steps[0] == 0 and history.steps[-1] == STEPS
    assert training.on_step(ctx, ui, student, 1)[ui.grid].endswith(".png")


def test_intervene_closes_gates_ablates_heads_and_replaces_them_by_fields(ctx, student, page, sha):
    """close_gate and ablate_head on the student change its prediction as the same edit run here does;
    replace_with_field is offered and changes it too; head importance sweeps all three over its heads."""
    from app.tabs import intervene

    ui, loaded = page.intervene, ctx.model(student)
    ops = intervene.render(ctx, ui, student)[ui.op]["choices"]
    assert {"close_gate", "ablate_head", "replace_with_field"} <= set(ops)
    x = _input(ctx, loaded, sha)
    before = _probs(loaded.model, x)
    top = int(before.argmax())
    for edits, made in (
        ([{"op": "close_gate", "layer": 0, "tap": "all"}], [CloseGate(0, "all")]),
        ([{"op": "ablate_head", "layer": 1, "head": 2}], [AblateHead(1, 2)]),
    ):
        after = _probs(loaded.model, x, made)
        dlogp = float(after[top].log() - before[top].log())
        assert abs(dlogp) > 1e-4, edits  # the edit changes the prediction
        out = intervene.on_apply(ctx, ui, student, sha, edits)
        assert out[ui.status] == "" and f"**{dlogp:+.4f}**" in out[ui.prediction], (edits, out[ui.prediction])
    replace = [{"op": "replace_with_field", "layer": 1, "head": 0}]
    assert list(intervene.on_prepare(ctx, ui, student, sha, replace))[-1] == {ui.status: ""}
    out = intervene.on_apply(ctx, ui, student, sha, replace)
    assert out[ui.status] == "" and "Δ log p of the unedited prediction: **+0.0000**" not in out[ui.prediction]
    imp = heavy.importance((loaded.model, loaded.meta), 8, "zero", Pictures(bundled=ctx.assets_dir), lambda *a: None,
                           lambda: False)  # fmt: skip
    assert len(imp.ablate) == len(imp.replace) == 2 and all(len(row) == 3 for row in imp.replace)
    assert all(cell is not None for row in imp.close_gate.values() for cell in row)
    shown = intervene.importance_updates(ctx, ui, loaded, imp)
    assert shown[ui.heads_table] is not None and shown[ui.gates_table] is not None
