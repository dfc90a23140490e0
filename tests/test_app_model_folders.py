"""Standard-ViT folders reaching the app by other roads than the checkpoint folder: a zipped model folder uploaded
through the picker (unpacked safely, refused in words) and ``hf-hub:ORG/NAME`` from a local Hugging Face cache laid
out as huggingface_hub lays it out (blobs, snapshot links, refs). Every folder is written here with random weights;
nothing touches the network."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch

from app import layout
from app.layout import build_page
from app.session_protocol import restoring_of, session_of
from app.state import UPLOADED, AppContext, AppError
from ssog_core import ViT, load_checkpoint
from ssog_core.analysis.head_spec import DEFAULT_SPEC
from ssog_core.analysis.session import dumps, loads
from ssog_core.checkpoint import folder_zip
from ssog_core.checkpoint.standard import save_timm_folder, timm_twin
from ssog_core.runtime.folders import OverCap, extract
from tests.app_fixtures import write_images


def timm_folder(folder: Path, seed: int = 4) -> Path:
    """A small timm-layout folder of the lab's dot ViT with random weights."""
    torch.manual_seed(seed)
    lab = ViT(num_classes=5, img_size=32, patch_size=4, dim=32, depth=2, num_heads=4, attn="dot")
    return save_timm_folder(timm_twin(lab).float(), folder)


def zipped(folder: Path, dest: Path, prefix: str = "", extra: dict[str, bytes] | None = None) -> Path:
    """``folder``'s files in a zip, under ``prefix`` (a folder in the archive, or its top level), plus ``extra``."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(folder.iterdir()):
            z.write(f, prefix + f.name)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return dest


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    (root / "ckpt").mkdir()
    write_images(root / "assets")
    ctx = AppContext(root / "ckpt", root / "assets", upload_dir=root / "uploads")
    ctx.upload_dir.mkdir()
    return ctx, build_page(ctx)[1]


def _same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    x = torch.rand(2, 3, *a.config.img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)


def test_a_zipped_model_folder_uploads_and_opens_like_a_picked_checkpoint(app, tmp_path):
    ctx, page = app
    src = timm_folder(tmp_path / "src" / "my vit")
    archive = zipped(src, tmp_path / "my vit.zip", "my vit/", {"my vit/README.md": b"notes", "other.txt": b"x"})
    name = ctx.add_upload([str(archive)])
    assert name == UPLOADED + "my_vit" and name in ctx.checkpoint_names()
    assert sorted(p.name for p in (ctx.upload_dir / "my_vit").iterdir()) == ["config.json", "model.safetensors"]
    assert ctx.checkpoint_label(name).startswith("timm folder: ") and "2 layers × 4 heads" in ctx.checkpoint_label(name)
    loaded = ctx.model(name)
    assert type(loaded.model).__name__ == "ViT" and loaded.model.config.family == "timm"
    _same_model(loaded.model, load_checkpoint(src)[0])
    # through the picker's handler, a flat zip (files at its top level): selected, and offered by every picker
    flat = zipped(src, tmp_path / "flat.zip")
    update = layout.on_checkpoint_upload(ctx, page, [str(flat)], name)
    assert update[page.status] == f"Loaded **{UPLOADED}flat**: it is now selected."
    assert update[page.checkpoint]["value"] == UPLOADED + "flat"
    assert UPLOADED + "flat" in [v for _, v in update[page.checkpoint]["choices"]]
    assert ctx.add_upload([str(flat)]) == UPLOADED + "flat_2"  # a second upload of one name never overwrites
    assert not [p for p in ctx.upload_dir.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_zipped_transformers_folder_keeps_its_preprocessor_config(app, tmp_path):
    from tests.test_standard_vit import _hf, _hf_folder

    ctx, _ = app
    src = _hf_folder(_hf("vit", "ViTForImageClassification"), tmp_path / "hf")
    name = ctx.add_upload([str(zipped(src, tmp_path / "hf_vit.zip", "hf/"))])
    assert (ctx.upload_dir / "hf_vit" / "preprocessor_config.json").is_file()
    assert ctx.model(name).meta["source"]["layout"] == "transformers"
    _same_model(ctx.model(name).model, load_checkpoint(src)[0])


def _corrupted(src: Path, dest: Path) -> Path:
    """A zip whose index is sound but whose weights' bytes are flipped (stored, so the CRC check finds it)."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as z:
        for f in sorted(src.iterdir()):
            z.write(f, f.name)
    data = bytearray(dest.read_bytes())
    at = data.index(b"model.safetensors") + 200  # inside the weights' stored bytes
    data[at : at + 64] = bytes(255 - b for b in data[at : at + 64])
    dest.write_bytes(bytes(data))
    return dest


def test_zips_that_cannot_be_a_model_folder_are_refused_in_words_and_leave_nothing(app, tmp_path, monkeypatch):
    ctx, page = app
    src = timm_folder(tmp_path / "src")
    weights = (src / "model.safetensors").read_bytes()
    config = (src / "config.json").read_bytes()
    swin = json.dumps({"model_type": "swin", "architectures": ["SwinForImageClassification"]}).encode()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "garbage.zip").write_bytes(os.urandom(2000))

    def archive(name: str, members: dict[str, bytes]) -> Path:
        with zipfile.ZipFile(bad / name, "w") as z:
            for member, data in members.items():
                z.writestr(member, data)
        return bad / name

    cases = [
        (archive("weights_only.zip", {"vit/model.safetensors": weights}), "weights_only.zip holds no config.json"),
        (bad / "garbage.zip", "garbage.zip is not a readable zip file"),
        (
            archive("climb.zip", {"../../escaped/config.json": config, "config.json": config}),
            "member '../../escaped/config.json' points outside the archive",
        ),
        (archive("abs.zip", {"/tmp/x/config.json": config}), "member '/tmp/x/config.json' points outside the archive"),
        (
            archive("swin.zip", {"config.json": swin, "model.safetensors": weights}),
            "model_type 'swin' is not supported",
        ),
        (
            archive("two.zip", {"a/config.json": config, "b/config.json": config}),
            "holds 2 model folders (a/config.json, b/config.json): zip one model folder",
        ),
        (archive("no_weights.zip", {"config.json": config}), "no_weights.zip: no_weights holds no weights"),
        (_corrupted(src, bad / "flipped.zip"), "flipped.zip could not be unpacked: Bad CRC-32"),
    ]
    before = sorted(p.name for p in ctx.upload_dir.iterdir())
    for path, says in cases:
        with pytest.raises(AppError) as refused:
            ctx.add_upload([str(path)])
        assert says in str(refused.value), (path.name, str(refused.value))
        assert sorted(p.name for p in ctx.upload_dir.iterdir()) == before, path.name  # nothing written, nothing left
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/x/config.json").exists()
    # too big: refused from the sizes the archive declares, before a byte is written
    monkeypatch.setattr(folder_zip, "MAX_FOLDER_BYTES", len(weights) // 2)
    update = layout.on_checkpoint_upload(ctx, page, [str(zipped(src, bad / "big.zip"))], None)
    assert set(update) == {page.status} and "big.zip unpacks to" in update[page.status]
    assert "refused before extracting" in update[page.status]
    assert sorted(p.name for p in ctx.upload_dir.iterdir()) == before


def test_an_archive_holding_more_than_it_declares_stops_at_the_cap(tmp_path):
    """The declared sizes are checked before extracting, and the bytes counted again while writing (an archive may
    declare less than it holds): a member running past what is left is cut off and refused."""
    src = timm_folder(tmp_path / "src")
    archive = zipped(src, tmp_path / "m.zip")
    size = sum(f.stat().st_size for f in src.iterdir())
    with zipfile.ZipFile(archive) as z:  # what the declared-size check sees: exactly the files' sizes
        assert sum(i.file_size for i in z.infolist()) == size
    with pytest.raises(folder_zip.CheckpointError, match="refused before extracting"):
        folder_zip.unpack_model_zip(archive, tmp_path / "out", cap=size - 1)
    with zipfile.ZipFile(archive) as z:  # a member whose bytes run past the budget left is cut off mid-write
        info = z.getinfo("model.safetensors")
        with pytest.raises(OverCap, match="unpacks to more than the 1,000 bytes"):
            extract(z, {"part": info}, tmp_path, 1000)
        assert (tmp_path / "part").stat().st_size <= 1000
    (tmp_path / "part").unlink()
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.zip", "src"]
    out = folder_zip.unpack_model_zip(archive, tmp_path / "out", cap=size)
    assert out == tmp_path / "out" and sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(folder_zip.CheckpointError, match="already exists"):
        folder_zip.unpack_model_zip(archive, tmp_path / "out")


# ---- hf-hub:ORG/NAME from the local cache ------------------------------------------------------------------------


def hub_cache(root: Path, repo: str, src: Path, commit: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """``src`` as huggingface_hub caches a repository: files in ``blobs/`` by hash, the snapshot's files links to
    them, ``refs/main`` naming the commit."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    (repo_dir / "blobs").mkdir(parents=True)
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in src.iterdir():
        data = f.read_bytes()
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def test_hub_names_open_from_the_local_cache_in_the_picker_and_by_name(app, tmp_path, monkeypatch):
    ctx, page = app
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    src = timm_folder(tmp_path / "src", seed=9)
    snapshot = hub_cache(tmp_path / "hub", "lab-org/tiny-vit", src)
    before = ctx.checkpoint_names()
    update = layout.on_hub_open(ctx, page, "  lab-org/tiny-vit ")  # the prefix may be left out
    name = "hf-hub:lab-org/tiny-vit"
    assert update[page.status] == (
        f"Opened **{name}** from the local Hugging Face cache (`{snapshot}`): it is now selected."
    )
    assert update[page.checkpoint]["value"] == name and ctx.checkpoint_names() == [*before, name]
    assert update[page.compare.a]["value"] == name
    assert ctx.checkpoint_label(name).startswith("timm folder: ")
    _same_model(ctx.model(name).model, load_checkpoint(src)[0])
    assert ctx.open_hub(name) == name and ctx.checkpoint_names().count(name) == 1  # opened twice, listed once
    pinned = "hf-hub:lab-org/tiny-vit@0123456789abcdef0123456789abcdef01234567"
    assert ctx.resolve(pinned) == snapshot  # a name is accepted wherever a checkpoint name is (the API included)
    # a session naming it restores it on a server that has not opened it yet (the name is looked up in the cache)
    text = dumps(session_of(ctx, name, None, {"playground": {"head": DEFAULT_SPEC.to_dict()}}))
    fresh = AppContext(ctx.checkpoint_dir, ctx.assets_dir, upload_dir=ctx.upload_dir)
    restoring, _ = restoring_of(fresh, loads(text, "the session"), None, None)
    assert (restoring.checkpoint, restoring.notes) == (name, []) and name in fresh.checkpoint_names()
    gone = loads(text.replace("tiny-vit", "gone-vit"), "the session")
    assert restoring_of(fresh, gone, None, None)[0].notes == [
        "checkpoint 'hf-hub:lab-org/gone-vit' is not in the checkpoint folder"
    ]


def test_a_hub_name_missing_from_the_cache_says_where_it_would_be_on_the_page(app, tmp_path, monkeypatch):
    ctx, page = app
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    before = ctx.checkpoint_names()
    update = layout.on_hub_open(ctx, page, "hf-hub:lab-org/other")
    where = tmp_path / "hub" / "models--lab-org--other" / "snapshots" / "main"
    assert set(update) == {page.status}
    assert (
        f"hf-hub:lab-org/other is not in the local Hugging Face cache (no {where}/config.json)" in (update[page.status])
    )
    assert "SSOG Lab does not download" in update[page.status] and "hf download lab-org/other" in update[page.status]
    for text, says in (("", "type a Hugging Face model name"), ("hf-hub:../etc", "is not hf-hub:ORG/NAME")):
        assert says in layout.on_hub_open(ctx, page, text)[page.status]
    with pytest.raises(AppError, match="not in the local Hugging Face cache"):
        ctx.model("hf-hub:lab-org/other")
    outside = timm_folder(tmp_path / "elsewhere")  # a model folder outside the cache, named by a climbing revision
    climb = "/".join([".."] * (len(where.relative_to(outside.parent).parts) - 1)) + "/elsewhere"
    assert (where.parent / climb).resolve() == outside
    for revision in (climb, "..", "a b"):
        with pytest.raises(AppError, match="a revision is a branch, tag or commit name"):
            ctx.model(f"hf-hub:lab-org/other@{revision}")
    assert ctx.checkpoint_names() == before


def test_the_api_takes_a_zipped_folder_and_a_hub_name(app, tmp_path, monkeypatch):
    """Against a live server: ``/upload_checkpoint`` with a zip, then the upload and an ``hf-hub:`` name as the
    checkpoint of other endpoints; a name missing from the cache comes back as the offline sentence."""
    from gradio_client import Client, handle_file

    from app.main import launch
    from ssog_core.testing.app_process import free_port

    ctx, _ = app
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    hub_cache(tmp_path / "hub", "lab-org/api-vit", timm_folder(tmp_path / "hub_src", seed=11))
    archive = zipped(timm_folder(tmp_path / "api vit", seed=12), tmp_path / "api.zip", "api vit/")
    demo, _ = build_page(ctx)
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        name = client.predict([handle_file(str(archive))], api_name="/upload_checkpoint")
        assert name.startswith(UPLOADED + "api") and name in client.predict(api_name="/checkpoints")
        assert client.predict(name, api_name="/geometry_summary")["card"]["dim / depth / heads"] == "32 / 2 / 4"
        hub = client.predict("hf-hub:lab-org/api-vit", api_name="/geometry_summary")
        assert hub["card"]["dim / depth / heads"] == "32 / 2 / 4"
        assert "hf-hub:lab-org/api-vit" in client.predict(api_name="/checkpoints")
        with pytest.raises(Exception, match="hf-hub:lab-org/nope is not in the local Hugging Face cache"):
            client.predict("hf-hub:lab-org/nope", api_name="/geometry_summary")
        with pytest.raises(Exception, match="holds no config.json"):
            client.predict([handle_file(str(zipped(tmp_path / "hub_src", tmp_path / "x.zip", "a/b/c/")))],
                           api_name="/upload_checkpoint")  # fmt: skip
    finally:
        demo.close()
