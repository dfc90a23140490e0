"""The app's security defaults, each with a test.

Loopback only unless ``--host`` says otherwise (whatever the environment asks), never a public share link, an
upload size cap, every checkpoint or file the API names confined to the checkpoint folder or to the request's own
uploads, and no pickle ever loaded by any tab or upload path.
"""

from __future__ import annotations

import _pickle
import json
import os
import pickle
import signal
import socket
import time
from pathlib import Path

import gradio as gr
import httpx
import pytest
import torch
from gradio_client import Client, handle_file

from app import layout
from app import main as app_main
from app import session_protocol as session
from app.api import uploaded_path
from app.main import MAX_UPLOAD_BYTES
from app.state import AppContext, AppError
from app.tabs import compare, export, geometry, playground, steering
from ssog_core.testing.app_process import AppProcess, free_port, wait_until_answering
from tests.app_fixtures import dot_twin, write_checkpoints, write_images
from tests.reliability_corpus import bad_checkpoints, bad_images

ROOT = Path(__file__).resolve().parents[1]
GOOD, TWIN = "ssog_test.safetensors", "dot_test.safetensors"
CAP = 1024**2  # the test server's upload cap (the real one is 64 MB: too large to send in a test)


def listening(port: int) -> list[str]:
    """Addresses with a socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                raw = bytes.fromhex(address)
                if len(raw) == 4:
                    found.append(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:  # IPv6 in /proc is four little-endian 32-bit words
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    found.append(socket.inet_ntop(socket.AF_INET6, words))
    return found


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sec")
    ckpts = write_checkpoints(root / "ckpt", depth=2)
    images = write_images(root / "assets")
    outside = root / "outside"
    outside.mkdir()
    (outside / "stolen.safetensors").write_bytes(ckpts["ssog"].read_bytes())
    (root / "ckpt" / "link.safetensors").symlink_to(outside / "stolen.safetensors")
    return {"root": root, "ckpt": root / "ckpt", "assets": root / "assets", "outside": outside, "images": images}


@pytest.fixture(scope="module")
def server(folders, tmp_path_factory):
    ctx = AppContext(folders["ckpt"], folders["assets"], upload_dir=tmp_path_factory.mktemp("up"))
    demo, page = layout.build_page(ctx)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_main, "MAX_UPLOAD_BYTES", CAP)
        # as on a busy machine, Gradio's one 3 s probe of the page fails: the start must not depend on it
        mp.setattr(gr.networking, "url_ok", lambda url: False)
        app_main.launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    wait_until_answering(demo.local_url)  # however long a loaded machine takes
    try:
        yield demo, Client(demo.local_url, verbose=False, download_files=False), page
    finally:
        demo.close()


# ---------------------------------------------------------------------------------------------- binding, share


@pytest.mark.slow
def test_serves_loopback_only_and_no_share_link_even_if_the_environment_asks(folders, tmp_path):
    """The real command line in a subprocess, with Gradio's own environment variables asking for the opposite;
    stopped with SIGTERM, it exits cleanly and leaves no upload folder behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SHARE": "True", "TMPDIR": str(tmp)}
    log = tmp_path / "app.log"
    with AppProcess(folders["ckpt"], folders["assets"], log, env=env) as app:
        assert set(listening(app.port)) == {"127.0.0.1"}
        assert list(tmp.glob("ssog-lab-uploads-*"))
    code = app.returncode
    text = log.read_text()
    assert "gradio.live" not in text and "public URL" not in text.lower() and "127.0.0.1" in text
    assert code == 0 and not list(tmp.glob("ssog-lab-uploads-*"))  # SIGTERM is a clean stop: uploads removed


@pytest.mark.slow
def test_host_flag_and_launch_settings(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: calls.append(kw))
    threads, on_term = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
    try:
        app_main.main(["--checkpoint-dir", str(tmp_path / "none"), "--assets-dir", str(tmp_path / "none")])
        app_main.main(["--host", "0.0.0.0", "--port", "9123", "--checkpoint-dir", str(tmp_path / "none")])
        assert signal.getsignal(signal.SIGTERM) is app_main._interrupt
    finally:
        torch.set_num_threads(threads)
        signal.signal(signal.SIGTERM, on_term)
    default, public = calls
    assert default["server_name"] == "127.0.0.1" and default["server_port"] == 7860
    assert public["server_name"] == "0.0.0.0" and public["server_port"] == 9123
    for kw in calls:
        assert kw["share"] is False and kw["max_file_size"] == MAX_UPLOAD_BYTES == 64 * 1024**2
        assert kw["show_error"] is False
        assert kw["state_session_capacity"] == app_main.SESSIONS and kw["max_threads"] == app_main.SESSIONS + 40


@pytest.mark.slow
def test_sigterm_while_gradio_is_still_starting_is_a_clean_stop(monkeypatch, tmp_path):
    """Gradio's launch() makes requests of its own after the server answers; a SIGTERM landing then must not
    escape as a KeyboardInterrupt (exit by SIGINT, a traceback, uploads left behind): the server is closed."""
    closed = []

    def starting(self, **kw):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises in here
        raise AssertionError("SIGTERM was not delivered")

    monkeypatch.setattr(gr.Blocks, "launch", starting)
    monkeypatch.setattr(gr.Blocks, "close", lambda self, *a, **kw: closed.append(self))
    threads, on_term = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
    try:
        app_main.main(["--checkpoint-dir", str(tmp_path / "none"), "--assets-dir", str(tmp_path / "none")])
    finally:
        torch.set_num_threads(threads)
        signal.signal(signal.SIGTERM, on_term)
    assert len(closed) == 1


# ---------------------------------------------------------------------------------------------- upload size


@pytest.mark.slow
def test_uploads_over_the_cap_are_refused_by_the_server(server, tmp_path):
    demo, client, _ = server
    assert demo.max_file_size == 1024**2
    url = demo.local_url.rstrip("/") + "/gradio_api/upload"
    big = os.urandom(1024**2 + 1)
    r = httpx.post(url, files={"files": ("big.png", big)}, timeout=60)
    assert r.status_code == 413 and "maximum" in r.text.lower()
    r = httpx.post(url, files={"files": ("small.png", big[:1000])}, timeout=60)
    assert r.status_code == 200
    assert client.predict(api_name="/checkpoints")  # still serving


def test_file_size_caps_behind_the_upload_cap(server, tmp_path):
    """Files reaching the app by other routes (the checkpoint folder, a raised cap) are checked before reading."""
    ctx = AppContext(tmp_path, tmp_path, upload_dir=tmp_path / "up")
    (tmp_path / "up").mkdir()
    huge = tmp_path / "huge.png"
    with open(huge, "wb") as f:
        f.truncate(51 * 1024**2)  # sparse: no disk used
    with pytest.raises(AppError, match="over the 50 MB limit for pictures"):
        ctx.open_upload(str(huge))
    giant = tmp_path / "giant.safetensors"
    with open(giant, "wb") as f:
        f.truncate(3 * 1024**3)
    with pytest.raises(AppError, match="over the 2 GB limit"):
        ctx.add_upload([str(giant)])
    geo = server[2].geometry
    assert "over the 2 GB limit" in geometry.render(ctx, geo, "giant.safetensors", 0, None)[geo.note]


# ---------------------------------------------------------------------------------------------- confinement


@pytest.mark.parametrize(
    "name",
    ["../ckpt/ssog_test.safetensors", "ABSOLUTE", "link.safetensors", "uploaded/../../outside/stolen.safetensors",
     "outside/stolen.safetensors", "..%2Foutside%2Fstolen.safetensors", "./../outside/stolen.safetensors"],
)  # fmt: skip
def test_api_checkpoint_names_stay_in_the_folder(server, folders, name):
    _, client, _ = server
    if name == "ABSOLUTE":  # an existing, valid checkpoint: refused because of where it is
        name = str(folders["outside"] / "stolen.safetensors")
    for endpoint, args in (("/geometry_summary", ()), ("/export_summary", ("scene.png", 0.5))):
        with pytest.raises(Exception, match="refused|not found"):
            client.predict(name, *args, api_name=endpoint)
    assert client.predict(GOOD, api_name="/geometry_summary")["card"]["attention"] == "ssog"


def test_picker_names_stay_in_the_folder(server, folders, tmp_path):
    geo = server[2].geometry
    ctx = AppContext(folders["ckpt"], folders["assets"], upload_dir=tmp_path)
    assert "link.safetensors" in ctx.checkpoint_names()  # listed (it is in the folder) but never opened
    for name in ("link.safetensors", str(folders["outside"] / "stolen.safetensors"), "../outside/stolen.safetensors"):
        for text in (geometry.render(ctx, geo, name, 0, None)[geo.note], playground.preset_choices(ctx, name)[1]):
            assert "refused" in text, text


@pytest.mark.parametrize("image", ["/etc/passwd", "../assets/scene.png", "scene.png/../../ckpt", "0" * 63 + "g"])
def test_api_images_are_named_never_pathed(server, image):
    _, client, _ = server
    with pytest.raises(Exception, match="neither a bundled image"):
        client.predict(GOOD, image, 0.5, api_name="/export_summary")
    with pytest.raises(Exception, match="neither a bundled image"):
        client.predict(playground.initial_value(), image, api_name="/head_field")


def test_api_file_arguments_must_be_uploads(server, folders, monkeypatch):
    demo, client, _ = server
    secret = folders["outside"] / "stolen.safetensors"
    for endpoint, arg in (("/upload_image", str(folders["images"]["rgb"])), ("/upload_checkpoint", [str(secret)])):
        with pytest.raises(Exception, match="send the file itself"):
            client.predict(arg, api_name=endpoint)
    # a file path pointing at the server's disk, sent as-is (the client would otherwise upload the file)
    import gradio_client.client as gc

    monkeypatch.setattr(gc.Endpoint, "_upload_file", lambda self, f, data_index: f)
    ref = {"path": str(secret), "meta": {"_type": "gradio.FileData"}, "orig_name": "x.safetensors"}
    names = client.predict(api_name="/checkpoints")
    with pytest.raises(Exception):  # noqa: B017 (Gradio refuses it before our code runs; its message is generic)
        client.predict([ref], api_name="/upload_checkpoint")
    assert client.predict(api_name="/checkpoints") == names
    with pytest.raises(AppError, match="only files uploaded"):
        uploaded_path(ref)  # and our own check refuses it too
    assert client.predict(GOOD, api_name="/geometry_summary")


def test_gradio_file_route_serves_no_checkpoint_or_system_file(server, folders):
    demo, _, _ = server
    base = demo.local_url.rstrip("/")
    for path in (folders["ckpt"] / GOOD, folders["outside"] / "stolen.safetensors", Path("/etc/passwd")):
        r = httpx.get(f"{base}/gradio_api/file={path}", timeout=30)
        assert r.status_code in (403, 404), (path, r.status_code)


# ---------------------------------------------------------------------------------------------- no pickle


def _refuse(*args, **kwargs):
    raise AssertionError("a pickle was about to be loaded")


class _NoUnpickler:
    def __init__(self, *args, **kwargs):
        _refuse()


@pytest.mark.slow
def test_no_pickle_is_ever_loaded_by_any_tab_upload_or_api(server, folders, monkeypatch, tmp_path):
    """With pickle's loaders replaced by a failure, every tab, every upload path and every API endpoint works (or
    refuses with its message); ``torch.load`` is only ever called with ``weights_only=True``."""
    demo, client, page = server
    ctx = AppContext(folders["ckpt"], folders["assets"], upload_dir=tmp_path / "up")
    (tmp_path / "up").mkdir()
    images = bad_images(tmp_path / "images")
    checkpoints = bad_checkpoints(tmp_path / "bad", folders["ckpt"] / GOOD)
    ref = dot_twin(depth=2)
    torch.save({"model": ref.state_dict()}, tmp_path / "ref.pt")
    (tmp_path / "ref.json").write_text(json.dumps({"num_classes": 5, "img_size": 32, "patch_size": 4, "dim": 32,
                                                   "depth": 2, "num_heads": 4, "attn": "dot"}))  # fmt: skip
    torch_load, weights_only = torch.load, []

    def checked_load(*args, **kwargs):
        weights_only.append(kwargs.get("weights_only"))
        assert kwargs.get("weights_only") is True, "torch.load without weights_only=True"
        return torch_load(*args, **kwargs)

    for module in (pickle, _pickle):
        monkeypatch.setattr(module, "load", _refuse)
        monkeypatch.setattr(module, "loads", _refuse)
        monkeypatch.setattr(module, "Unpickler", _NoUnpickler)
    monkeypatch.setattr(torch, "load", checked_load)

    # every upload path of the page
    for path, expected in images.values():
        text = layout.on_image_upload(ctx, page, str(path))[page.status]
        assert text.startswith("⚠️") == bool(expected), text
    sha = ctx.open_bundled("scene.png").sha256
    for files, _ in checkpoints.values():
        assert layout.on_checkpoint_upload(ctx, page, [str(p) for p in files], GOOD)[page.status].startswith("⚠️")
    good_upload = layout.on_checkpoint_upload(ctx, page, [str(folders["ckpt"] / TWIN)], GOOD)[page.status]
    pair = [str(tmp_path / "ref.pt"), str(tmp_path / "ref.json")]
    converted = layout.on_checkpoint_upload(ctx, page, pair, GOOD)[page.status]
    assert good_upload.startswith("Loaded") and converted.startswith("Loaded"), (good_upload, converted)
    # every tab
    geo, st, ex, cmp, pg = page.geometry, page.steering, page.export, page.compare, page.playground
    for ckpt in (GOOD, "uploaded/ref.safetensors"):  # an SSOG model, and a dot one converted from a .pt
        assert geometry.render(ctx, geo, ckpt, 0, sha)[geo.figure]["value"] is not None
        assert steering.render(ctx, st, ckpt, sha, 0, [1, 1])[st.query_figure] is not None
        assert export.render(ctx, ex, ckpt, TWIN, sha, 0.5, 0)[ex.figure] is not None
    assert export.downloads(ctx, ex, GOOD, TWIN, sha, 0.5, 0)[ex.files]
    assert compare.render(ctx, cmp, GOOD, TWIN, sha, 0.5, 0)[cmp.figure] is not None
    label = playground.preset_choices(ctx, GOOD)[0][0]
    value = playground.on_preset(ctx, pg, GOOD, label, True)[pg.canvas]["value"]
    assert playground.on_underlay(ctx, pg, value, True, sha)[pg.canvas]["bg"]
    values = {"playground": {"head": value, "underlay": True}, "geometry": {"layer": 0},
              "steering": {"layer": 0, "query": None}, "export": {"twin": TWIN, "alpha": 0.5, "layer": 0},
              "compare": {"a": GOOD, "b": TWIN, "alpha": 0.5, "layer": 0}}  # fmt: skip
    data = session.make_session(ctx, page.session_parts(ctx), GOOD, sha, values)
    (tmp_path / "s.json").write_text(json.dumps(data.to_dict()))
    assert layout.restore_session(ctx, page, str(tmp_path / "s.json"))[page.session.status] == "Session restored."
    # every API endpoint, through the running server
    assert client.predict([handle_file(str(tmp_path / "ref.pt")), handle_file(str(tmp_path / "ref.json"))],
                          api_name="/upload_checkpoint").startswith("uploaded/ref")  # fmt: skip
    for files, expected in checkpoints.values():
        with pytest.raises(Exception, match=expected):
            client.predict([handle_file(str(p)) for p in files], api_name="/upload_checkpoint")
    up = client.predict(handle_file(str(images["cmyk_jpeg"][0])), api_name="/upload_image")
    assert client.predict(GOOD, up["sha256"], 0.5, api_name="/export_summary")["grid"] == [8, 8]
    assert client.predict(TWIN, api_name="/geometry_summary")["card"]["attention"] == "dot"
    assert client.predict(playground.initial_value(), up["sha256"], api_name="/head_field")["underlay"]
    assert weights_only and all(weights_only)  # the .pt uploads did go through torch.load, safely
    assert not (tmp_path / "bad" / "PWNED").exists()
