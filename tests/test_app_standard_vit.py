"""The app on standard ViTs: transformers and timm folders in the checkpoint folder, every view on them, against a
live server (``gradio_client``, MCP) and the tabs' own functions.

References are independent of the lab's code: transformers' own eager attention (float64) for the export maps, the
prefix share and the heads' mean attention distance, and transformers' forward with a head's output zeroed for
``ablate_head``.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from gradio_client import Client
from PIL import Image

from app import fields
from app.layout import build_page, checkpoint_choices
from app.main import launch
from app.state import AppContext, AppError
from app.tabs import compare, export, geometry, intervene
from ssog_core import ViT
from ssog_core.analysis import report
from ssog_core.analysis.head_as_field import AtomFit, HeadFieldStats
from ssog_core.analysis.head_spec import DEFAULT_SPEC
from ssog_core.analysis.session import NO_TWIN
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.checkpoint.standard import save_timm_folder, timm_twin
from ssog_core.data.images import list_images, model_input
from ssog_core.runtime.jobs import JobError, ModelRef, load_ref
from ssog_core.testing.app_process import free_port
from tests.app_fixtures import write_images

transformers = pytest.importorskip("transformers")
mcp = pytest.importorskip("mcp")

MEAN, STD = [0.45, 0.5, 0.55], [0.22, 0.3, 0.26]
TINY = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, image_size=28, patch_size=7, num_labels=5,
            intermediate_size=40)  # fmt: skip


def _hf_model() -> torch.nn.Module:
    torch.manual_seed(3)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(**TINY))
    with torch.no_grad():  # every weight random, norm gains near 1: no term hides behind an initial 0 or 1
        for name, p in model.named_parameters():
            gain = p.dim() == 1 and name.endswith("weight") and "norm" in name
            p.copy_(1 + 0.3 * torch.randn_like(p) if gain else 0.3 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("standard")
    ckpt = root / "ckpt"
    _hf_model().save_pretrained(ckpt / "hf_vit")
    transformers.ViTImageProcessor(image_mean=MEAN, image_std=STD).save_pretrained(ckpt / "hf_vit")
    torch.manual_seed(4)
    lab = ViT(num_classes=5, img_size=32, patch_size=4, dim=32, depth=2, num_heads=4, attn="dot")
    save_timm_folder(timm_twin(lab).float(), ckpt / "timm_vit")
    shutil.copytree(ckpt / "hf_vit", ckpt / "wrong_depth")  # its config claims a layer its weights lack
    cfg = json.loads((ckpt / "wrong_depth" / "config.json").read_text())
    (ckpt / "wrong_depth" / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    (ckpt / "swin").mkdir()
    (ckpt / "swin" / "config.json").write_text(json.dumps({"model_type": "swin", "architectures": ["Swin"]}))
    (ckpt / "no_config").mkdir()
    shutil.copy(ckpt / "hf_vit" / "model.safetensors", ckpt / "no_config")
    write_images(root / "assets")
    ctx = AppContext(ckpt, root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))
    demo, page = build_page(ctx)
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True, mcp=True)
    try:
        yield ctx, page, demo, ckpt
    finally:
        demo.close()


@pytest.fixture(scope="module")
def client(served):
    return Client(served[2].local_url, verbose=False)


def _eager(folder) -> torch.nn.Module:
    return transformers.ViTForImageClassification.from_pretrained(folder, attn_implementation="eager").double().eval()


def _hf_input(ctx: AppContext, images: list) -> torch.Tensor:
    """Pictures as transformers' model takes them: the app's resize to 28×28, then its own mean and std."""
    x = model_input(images, (28, 28), {"normalization": None})[0].double()
    return (x - torch.tensor(MEAN, dtype=x.dtype).view(1, 3, 1, 1)) / torch.tensor(STD, dtype=x.dtype).view(1, 3, 1, 1)


def _patch_rows(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, T, T) with one class token → patch-to-patch rows renormalised, and the class token's share."""
    rows = a[:, :, 1:]
    patch = rows[..., 1:]
    return patch / patch.sum(-1, keepdim=True), rows[..., 0]


def test_folders_are_listed_labelled_and_opened(served, client):
    ctx, _, _, _ = served
    names = client.predict(api_name="/checkpoints")
    assert names == ["hf_vit", "swin", "timm_vit", "wrong_depth"]  # no_config holds no config.json: not a model
    labels = dict((n, label) for label, n in checkpoint_choices(names, ctx))
    assert labels["hf_vit"] == "hf_vit (transformers folder: vit, 2 layers × 3 heads, 1 prefix token)"
    assert labels["timm_vit"].startswith("timm_vit (timm folder: ") and "0 prefix tokens" in labels["timm_vit"]
    assert labels["swin"] == "swin (cannot be opened: pick it to see why)"
    card = client.predict("hf_vit", api_name="/geometry_summary")
    assert card["card"]["dim / depth / heads"] == "24 / 2 / 3" and card["layers"] == [] and card["atoms"] == []


@pytest.mark.parametrize(
    "name, says",
    [
        ("wrong_depth", "the config says 3 layers, the weights hold 2"),
        ("swin", "model_type 'swin' is not supported"),
        ("no_config", "is not a model folder (no config.json)"),
        ("../ckpt/hf_vit", "refused checkpoint path"),
    ],
)
def test_bad_folders_say_why_and_the_server_keeps_serving(client, name, says):
    with pytest.raises(Exception, match=says.replace("(", r"\(").replace(")", r"\)")):
        client.predict(name, "scene.png", 0.5, api_name="/export_summary")
    assert "hf_vit" in client.predict(api_name="/checkpoints")


def test_export_maps_over_patch_tokens_match_transformers_attention(served, client):
    ctx, _, _, ckpt = served
    alpha = 0.3
    got = client.predict("hf_vit", "scene.png", alpha, api_name="/export_summary")
    x = _hf_input(ctx, [ctx.open_bundled("scene.png").image])
    with torch.no_grad():
        attns = _eager(ckpt / "hf_vit")(x, output_attentions=True).attentions
    acc, shares = torch.zeros(16, dtype=torch.float64), []
    for a in attns:
        patch, share = _patch_rows(a)
        shares.append(float(share.mean()))
        a_hat = alpha * patch[0].mean(0) + (1 - alpha) * torch.eye(16, dtype=torch.float64)
        diag = a_hat.diagonal()
        acc += (a_hat.sum(0) - diag) - (1 - diag)  # pull-out − pull-in
    assert got["grid"] == [4, 4]
    np.testing.assert_allclose(np.array(got["accumulated"]), acc.view(4, 4).numpy(), rtol=0, atol=2e-5)
    np.testing.assert_allclose(got["prefix_share"], shares, rtol=1e-4, atol=1e-6)
    assert min(shares) > 0.01  # the class token takes a visible share: the maps leave it out, the API reports it


def test_ablate_head_matches_transformers_with_the_head_output_zeroed(served, client):
    ctx, _, _, ckpt = served
    got = client.predict("hf_vit", "scene.png", [{"op": "ablate_head", "layer": 1, "head": 2}], api_name="/intervene")
    hf = _eager(ckpt / "hf_vit")

    def zero_head(module, args):
        y = args[0].clone()
        y[..., 16:24] = 0.0  # head 2 of 3, 8 channels each, before the output projection
        return (y,)

    x = _hf_input(ctx, [ctx.open_bundled("scene.png").image])
    with torch.no_grad():
        before = hf(x).logits.softmax(-1)[0]
        hook = hf.vit.layers[1].attention.o_proj.register_forward_pre_hook(zero_head)
        after = hf(x).logits.softmax(-1)[0]
        hook.remove()
    np.testing.assert_allclose(got["unedited"]["probs"], before.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["edited"]["probs"], after.numpy(), rtol=1e-4, atol=1e-6)
    assert np.abs(np.array(got["edited"]["probs"]) - before.numpy()).max() > 1e-3  # the edit changed something


def test_head_fields_match_a_float64_reference_on_the_bundled_pictures(served, client):
    ctx, _, _, ckpt = served
    got = client.predict("hf_vit", 3, 2, api_name="/head_fields")
    paths = list_images(ctx.assets_dir)[:3]
    assert got["measured_on"] == "3 bundled picture(s) (the model records no validation set)"
    assert got["grid"] == [4, 4] and got["num_prefix_tokens"] == 1 and got["images"]["measured"] == 3
    assert got["images"] == {"pictures": "assets", "first": 3, "reference": "unedited prediction", "measured": 3,
                             "size": [28, 28]}  # fmt: skip
    assert got["patch_px"] == [7.0, 7.0] and got["atoms_per_head"] == 2 and "L-BFGS" in got["method"]
    with torch.no_grad():
        attns = _eager(ckpt / "hf_vit")(_hf_input(ctx, paths), output_attentions=True).attentions
    ys, xs = np.mgrid[0:4, 0:4]
    pos = torch.tensor(np.stack([ys.ravel(), xs.ravel()], -1) * 7.0, dtype=torch.float64)  # patch centres, pixels
    heads = {(h["layer"], h["head"]): h for h in got["heads"]}
    assert sorted(heads) == [(layer, head) for layer in range(2) for head in range(3)]
    for layer, a in enumerate(attns):
        patch, share = _patch_rows(a)
        distance = (patch.mean(0) * torch.cdist(pos, pos)).sum(-1).mean(-1)  # (H,)
        for head in range(3):
            h = heads[layer, head]
            assert h["mean_distance_px"] == pytest.approx(float(distance[head]), rel=1e-4)
            assert h["prefix_share"] == pytest.approx(float(share[:, head].mean()), rel=1e-4)
            assert 0 < h["share_fit"] <= 1 and 0 < h["share_field"] <= 1 and len(h["atoms"]) == 2
            assert sum(atom["weight"] for atom in h["atoms"]) == pytest.approx(1.0)
    with pytest.raises(Exception, match="fit 1 to 8 atoms per head"):
        client.predict("hf_vit", 3, 9, api_name="/head_fields")


def test_the_geometry_tab_draws_any_model_as_fields_and_opens_a_fit_in_the_playground(served):
    ctx, page, _, _ = served
    geo = page.geometry
    sha = ctx.open_bundled("scene.png").sha256
    shown = geometry.render(ctx, geo, "hf_vit", 0, sha)
    assert "no field, atoms or gates of its own" in shown[geo.note] and "| prefix tokens | 1 |" in shown[geo.card]
    for name in ("hf_vit", "timm_vit"):
        *_, drawn = geometry.on_measure(ctx, geo, name, 3, 2)
        assert f"**{name}**: every head measured on 3 bundled picture(s)" in drawn[geo.field_note]
        assert drawn[geo.field_figure]["value"].endswith(".png") and drawn[geo.fit_figure]["visible"]
        assert len(drawn[geo.field_table]["value"]) == 2 * (3 if name == "hf_vit" else 4)
    traces = {t.name for t in drawn[geo.distance]["value"].data}
    assert traces == {"hf_vit", "timm_vit"}  # both models measured alike share the chart
    loaded = ctx.model("timm_vit")
    stats = fields.measure(ctx, loaded, 3, 2)
    png, boxes = geometry.field_pngs(ctx, loaded, stats, 3, 2)["fit"]
    width, height = Image.open(io.BytesIO(png)).size
    x0, y0, x1, y1 = boxes[2 * 2 + 1]  # head rows × layer columns: head 2 of layer 1
    centre = ((x0 + x1) / 2 * width, (y0 + y1) / 2 * height)
    spec, note = geometry.fitted_head_at(ctx, drawn[geo.field_shown], "fit", centre)
    assert note.startswith("Layer 1, head 2 of timm_vit as 2 fitted atoms") and spec.grid == (15, 15)
    star = np.array(spec.query, dtype=float)
    looks = np.array([[a.y, a.x] for a in spec.atoms])  # the playground's atoms sit at ★ − μ
    np.testing.assert_allclose(star - looks, stats.fits[1].mu[2].numpy(), atol=1e-9)
    assert geometry.fitted_head_at(ctx, drawn[geo.field_shown], "fit", (1, 1)) is None  # outside every panel
    with pytest.raises(AppError, match="measure the heads first"):
        geometry.fitted_head_at(ctx, None, "fit", (1, 1))


def test_a_folder_is_measured_on_the_bundled_pictures_against_its_own_predictions(served, client):
    """replace_with_field on a folder: fields and outcomes from the bundled pictures, the unedited model's top-1
    predictions as the reference (agreement, not accuracy)."""
    ctx, _, _, ckpt = served
    replace = [{"op": "replace_with_field", "layer": layer, "replacement": "field"} for layer in range(2)]
    got = client.predict("hf_vit", "scene.png", replace, 3, api_name="/intervene")
    val = got["validation"]
    paths = list_images(ctx.assets_dir)[:3]
    assert val["reference"] == "unedited prediction" and val["n"] == 3
    assert val["images"] == {"pictures": "assets", "first": 3, "reference": "unedited prediction"}
    with torch.no_grad():  # transformers' own unedited predictions on the same pictures, counted by hand
        ref = _eager(ckpt / "hf_vit")(_hf_input(ctx, paths)).logits.argmax(-1)
    assert [(r["class"], r["n"]) for r in val["per_class"]] == [
        (str(c), int((ref == c).sum())) for c in sorted(set(ref.tolist()))
    ]
    assert val["accuracy"]["unedited"] == 1.0 and got["edited"]["probs"] != got["unedited"]["probs"]
    with pytest.raises(Exception, match="evaluate 1 to 4 pictures"):
        client.predict("hf_vit", "scene.png", replace, 5, api_name="/intervene")
    assert "hf_vit" in client.predict(api_name="/checkpoints")


def _head_output_set(values: torch.Tensor):
    """A forward pre-hook on the output projection that sets head 2 of 3 (8 channels each) to ``values``."""

    def hook(module, args):
        y = args[0].clone()
        y[..., 16:24] = values
        return (y,)

    return hook


def test_head_importance_on_a_folder_sweeps_the_bundled_pictures_against_transformers(served, client):
    """Head importance (zero and dataset_mean) on a folder: the bundled pictures, labelled by the unedited model's
    predictions; cells against transformers in float64 with that head's output zeroed or set to its mean over the
    same pictures, per position. The tab says what the images are and sizes its slider to them."""
    ctx, page, _, ckpt = served
    paths = list_images(ctx.assets_dir)
    hf, x = _eager(ckpt / "hf_vit"), _hf_input(ctx, paths)
    o_proj = hf.vit.layers[1].attention.o_proj
    with torch.no_grad():
        logp0 = hf(x).logits.log_softmax(-1)
        ref = logp0.argmax(-1)
        seen = []
        hook = o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0][..., 16:24].clone()))
        hf(x)
        hook.remove()
        drops = {}
        for mode, values in (("zero", 0.0), ("dataset_mean", seen[0].mean(0))):
            hook = o_proj.register_forward_pre_hook(_head_output_set(values))
            logp1 = hf(x).logits.log_softmax(-1)
            hook.remove()
            drops[mode] = float((logp0 - logp1).gather(1, ref.view(-1, 1)).mean())
    for mode, drop in drops.items():
        got = client.predict("hf_vit", len(paths), mode, api_name="/head_importance")
        assert got["reference"] == "unedited prediction" and got["n"] == len(paths) == 4
        assert got["images"] == {"pictures": "assets", "first": 4, "reference": "unedited prediction"}
        assert got["unedited_accuracy"] == 1.0  # the unedited model agrees with itself on every picture
        np.testing.assert_allclose(got["ablate_head"][1][2]["logp_drop"], drop, rtol=1e-4, atol=1e-6)
    assert abs(drops["zero"]) > 1e-2 and drops["zero"] != drops["dataset_mean"]  # the two ablations differ
    edit = [{"op": "ablate_head", "layer": 1, "head": 2, "mode": "dataset_mean"}]  # the sweep's cell is that edit
    val = client.predict("hf_vit", "scene.png", edit, 4, api_name="/intervene")["validation"]
    np.testing.assert_allclose(-val["logp_true"]["change"], drops["dataset_mean"], rtol=1e-4, atol=1e-6)
    shown = intervene.render(ctx, page.intervene, "hf_vit")
    assert shown[page.intervene.n]["maximum"] == 4 and shown[page.intervene.n]["value"] == 4
    assert shown[page.intervene.n]["label"] == "bundled pictures (N, of 4)"
    assert "measured against the unedited model's predictions" in shown[page.intervene.evaluation]["label"]
    *_, done = intervene.on_sweep(ctx, page.intervene, "hf_vit", 4, "zero")
    assert done[page.intervene.sweep_note].startswith(
        "4 pictures, unedited agreement with the unedited model 1.0000. Cells: log p(the unedited model's class) drop"
    )
    first = next(intervene.on_evaluate(ctx, page.intervene, "hf_vit", edit, 4))
    assert first[page.intervene.validation] == "Evaluating the edits on 4 pictures…"


def test_compare_and_export_files_on_two_standard_vits(served):
    ctx, page, _, _ = served
    sha = ctx.open_bundled("scene.png").sha256
    shown = compare.render(ctx, page.compare, "hf_vit", "timm_vit", sha, 0.5, 1)
    assert "A sees a 4×4 patch grid and B a 8×8 one" in shown[page.compare.text] and shown[page.compare.figure]
    ex = export.render(ctx, page.export, "hf_vit", "timm_vit", sha, 0.5, 1)
    assert "prefix tokens (class, distillation, register) took" in ex[page.export.text]
    files = export.downloads(ctx, page.export, "hf_vit", "timm_vit", sha, 0.5, 1)[page.export.files]
    npz = [f for f in files if f.endswith(".npz")]
    assert len(npz) == 2 and any(f.endswith(".svg") for f in files)
    with np.load(next(f for f in npz if "hf_vit" in f)) as maps:
        assert maps["net"].shape[-2:] == (4, 4)
    blank = export.render(ctx, page.export, "hf_vit", NO_TWIN, sha, 0.5, 1, None, "blank")
    assert blank[page.export.control_figure]["visible"] and "Control: **a blank image" in blank[page.export.text]
    valid = export.render(ctx, page.export, "hf_vit", NO_TWIN, sha, 0.5, 1, None, "validation")
    assert valid[page.export.control_figure]["visible"] and "the bundled pictures)**" in valid[page.export.text]
    classes = export.per_class(ctx, page.export, "hf_vit", 0.5, "blank")
    assert classes[page.export.classes].endswith(".png")
    assert classes[page.export.classes_status].startswith("4 bundled pictures, each in the class the model predicts")


def test_the_validation_control_of_a_folder_is_the_mean_over_the_bundled_pictures(served, client):
    ctx, _, _, ckpt = served
    alpha = 0.4
    got = client.predict("hf_vit", "scene.png", alpha, "validation", api_name="/export_summary")
    paths = list_images(ctx.assets_dir)
    with torch.no_grad():
        attns = _eager(ckpt / "hf_vit")(_hf_input(ctx, paths), output_attentions=True).attentions
    acc = torch.zeros(len(paths), 16, dtype=torch.float64)
    for a in attns:
        a_hat = alpha * _patch_rows(a)[0].mean(1) + (1 - alpha) * torch.eye(16, dtype=torch.float64)
        diag = a_hat.diagonal(dim1=-2, dim2=-1)
        acc += (a_hat.sum(-2) - diag) - (1 - diag)  # per picture: pull-out − pull-in
    assert got["control"] == "validation" and got["control_images"] == len(paths) == 4
    np.testing.assert_allclose(np.array(got["accumulated_control"]), acc.mean(0).view(4, 4).numpy(), atol=1e-4)
    np.testing.assert_allclose(
        np.array(got["accumulated_difference"]), np.array(got["accumulated"]) - np.array(got["accumulated_control"])
    )


def test_a_session_names_the_folder_and_restores_it(client):
    sections = {"playground": {"head": DEFAULT_SPEC.to_dict()}, "export": {"twin": "timm_vit", "alpha": 0.4}}
    text = client.predict("hf_vit", "scene.png", sections, api_name="/save_session")
    back = client.predict(text, api_name="/restore_session")
    assert back["checkpoint"] == "hf_vit" and back["session"]["export"]["twin"] == "timm_vit" and back["notes"] == []


def test_mcp_lists_head_fields_and_reads_a_folder(served):
    from tests.test_app_mcp import session_run

    names, (geo,) = session_run(served[2].local_url, "http", None, [("geometry_summary", {"checkpoint": "timm_vit"})])
    assert {"head_fields", "export_summary", "checkpoints"} <= set(names)
    assert geo["card"]["dim / depth / heads"] == "32 / 2 / 4"


def test_a_model_folder_travels_to_a_worker_as_bytes_and_is_checked(served, tmp_path):
    _, _, _, ckpt = served
    copy = shutil.copytree(ckpt / "timm_vit", tmp_path / "timm_vit")
    sent = ModelRef.of(copy, load_checkpoint, with_bytes=True)
    assert sent.folder and sent.sha256 == ModelRef.of(copy, load_checkpoint).sha256  # by path or as bytes: one hash
    shutil.rmtree(copy)  # the worker shares no files: the bytes are all it has
    model, meta = load_ref(sent)
    assert type(model).__name__ == "ViT" and model.config.family == "timm" and meta["source"]["layout"] == "timm"
    with pytest.raises(JobError, match="differ from the server's checkpoint"):
        load_ref(ModelRef(sent.path, "0" * 64, load_checkpoint, sent.data, True))


def test_head_field_layers_flip_the_field_to_key_offsets_and_measure_it_per_query():
    """The geometry figure's layers from measured fields, against loops in float64 on a 7×5 grid: the density is
    the positional field over key − query, and H / r are those of the field applied to every query."""
    gh, gw, heads = 7, 5, 2
    g = torch.Generator().manual_seed(5)
    field = torch.rand(1, heads, 2 * gh - 1, 2 * gw - 1, generator=g, dtype=torch.float64) + 0.05
    fit = AtomFit(torch.randn(heads, 2, 2, generator=g, dtype=torch.float64),
                  0.5 + torch.rand(heads, 2, 2, generator=g, dtype=torch.float64),
                  torch.tensor([[0.3, 0.7], [0.6, 0.4]], dtype=torch.float64), torch.zeros(heads))  # fmt: skip
    zeros = torch.zeros(1, heads, dtype=torch.float64)
    stats = HeadFieldStats((gh, gw), (4.0, 4.0), 1, 3, zeros, zeros, zeros, zeros, zeros, zeros, field, [fit])
    measured, fitted = report.head_field_layers(stats)
    lf = measured[0]
    assert lf.extent == (gh - 1, gw - 1) and fitted[0].density.shape == lf.density.shape
    for h in range(heads):
        for oy in range(-(gh - 1), gh):
            for ox in range(-(gw - 1), gw):  # key − query = −(query − key)
                want = float(field[0, h, gh - 1 - oy, gw - 1 - ox])
                assert float(lf.density[h, gh - 1 + oy, gw - 1 + ox]) == pytest.approx(want, rel=1e-6)
        entropy, radius = [], []
        for qy in range(gh):
            for qx in range(gw):
                row = {(ky, kx): float(field[0, h, gh - 1 + qy - ky, gw - 1 + qx - kx])
                       for ky in range(gh) for kx in range(gw)}  # fmt: skip
                total = sum(row.values())
                p = {k: v / total for k, v in row.items()}
                entropy.append(-sum(v * np.log(v) for v in p.values()))
                radius.append(np.sqrt(sum(v * ((qy - ky) ** 2 + (qx - kx) ** 2) for (ky, kx), v in p.items())))
        assert float(lf.entropy[h]) == pytest.approx(np.mean(entropy), rel=1e-5)
        assert float(lf.radius[h]) == pytest.approx(np.mean(radius), rel=1e-5)
        torch.testing.assert_close(lf.mu[h], fit.mu[h].float())
