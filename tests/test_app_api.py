"""The app's API through ``gradio_client`` against a running server (in-process, on a free port)."""

from __future__ import annotations

import numpy as np
import pytest
from gradio_client import Client

from app.layout import build_app
from app.main import CONCURRENCY, MAX_UPLOAD_BYTES, QUEUE_SIZE, launch, parse_args
from app.state import AppContext
from ssog_core.analysis.head_spec import DEFAULT_SPEC
from ssog_core.testing.app_process import free_port
from tests.app_fixtures import write_checkpoints, write_images


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    write_checkpoints(root / "ckpt", depth=2)
    write_images(root / "assets")
    ctx = AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))
    demo = build_app(ctx)
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield demo
    finally:
        demo.close()


@pytest.fixture(scope="module")
def client(demo):
    return Client(demo.local_url, verbose=False)


def test_server_settings(demo):
    assert parse_args([]).host == "127.0.0.1" and parse_args([]).port == 7860
    assert demo.max_file_size == MAX_UPLOAD_BYTES == 64 * 1024**2 and demo.share is False
    assert demo._queue.max_size == QUEUE_SIZE and demo._queue.default_concurrency_limit == CONCURRENCY


def test_api_lists_checkpoints_and_evaluates_a_head(client):
    assert client.predict(api_name="/checkpoints") == ["dot_test.safetensors", "ssog_test.safetensors"]
    out = client.predict(DEFAULT_SPEC.to_dict(), api_name="/head_field")
    assert len(out["density"]) == 24 and abs(sum(map(sum, out["density"])) - 1) < 1e-9
    assert out["lambda"] == pytest.approx([0.45, 0.35, 0.2]) and out["entropy"] > 0


def test_api_geometry_and_export(client):
    geo = client.predict("ssog_test.safetensors", api_name="/geometry_summary")
    assert len(geo["layers"]) == 2 and set(geo["layers"][0]) >= {"tau", "s_mu", "s_sigma", "s_lambda"}
    assert geo["card"]["attention"] == "ssog" and len(geo["atoms"]) == 24
    ex = client.predict("ssog_test.safetensors", "scene.png", 0.5, api_name="/export_summary")
    assert 0 <= ex["exporter_share"] <= 1 and ex["acc_min"] <= ex["acc_max"] and ex["grid"] == [8, 8]
    assert abs(sum(map(sum, ex["accumulated"]))) < 1e-4  # Σ net = 0 in every layer
    assert ex["control"] == "none" and not any("control" in k or "difference" in k for k in ex if k != "control")


@pytest.mark.parametrize("control", ["none", "blank", "validation"])
def test_api_export_against_a_control(client, control):
    raw = client.predict("ssog_test.safetensors", "scene.png", 0.5, api_name="/export_summary")
    ex = client.predict("ssog_test.safetensors", "scene.png", 0.5, control, api_name="/export_summary")
    assert ex["accumulated"] == raw["accumulated"] and ex["control"] == control  # accumulated stays the raw map
    if control == "none":
        assert ex == raw
        return
    acc, c, d = (np.array(ex[k]) for k in ("accumulated", "accumulated_control", "accumulated_difference"))
    assert c.shape == d.shape == (8, 8) and np.abs(c).max() > 0
    np.testing.assert_allclose(d, acc - c, rtol=0, atol=1e-6)
    assert ex["control_images"] == (1 if control == "blank" else 64)


def test_api_refuses_an_unknown_control(client):
    with pytest.raises(Exception, match="use one of none, blank, validation"):
        client.predict("ssog_test.safetensors", "scene.png", 0.5, "baseline", api_name="/export_summary")


@pytest.mark.parametrize("name", ["../ckpt/ssog_test.safetensors", "/etc/passwd", "nope.safetensors"])
def test_api_refuses_paths_outside_the_folder_with_a_message(client, name):
    with pytest.raises(Exception, match="refused|not found"):
        client.predict(name, api_name="/geometry_summary")
    assert client.predict(api_name="/checkpoints")  # still serving


def test_api_bad_head_is_a_message_and_bursts_wait_in_the_queue(client):
    with pytest.raises(Exception, match="a head has 1 to 8 atoms"):
        client.predict({**DEFAULT_SPEC.to_dict(), "atoms": []}, api_name="/head_field")
    jobs = [client.submit("ssog_test.safetensors", "scene.png", a / 20, api_name="/export_summary") for a in range(12)]
    results = [j.result(timeout=120) for j in jobs]
    assert len(results) == 12 and len({r["alpha"] for r in results}) == 12


def test_api_saves_and_restores_a_session_as_the_session_tab_does(client):
    head = DEFAULT_SPEC.to_dict()
    sections = {"playground": {"head": head}, "export": {"twin": "gone.safetensors", "alpha": 0.3, "layer": 1},
                "intervene": {"edits": [{"op": "close_gate", "layer": 0, "tap": "mu"}]}}  # fmt: skip
    text = client.predict("ssog_test.safetensors", "scene.png", sections, api_name="/save_session")
    back = client.predict(text, api_name="/restore_session")
    assert back["checkpoint"] == "ssog_test.safetensors" and back["image"]["name"] == "scene.png"
    assert back["session"]["export"]["alpha"] == 0.3 and back["session"]["playground"]["head"] == head
    assert back["session"]["intervene"]["edits"] == sections["intervene"]["edits"]
    assert back["notes"] == ["export twin 'gone.safetensors' is not in the checkpoint folder"]  # the tab's own note
    assert back["status"] == "Session restored. Not restored: " + back["notes"][0] + "."
    gone = text.replace("ssog_test.safetensors", "other.safetensors").replace(back["image"]["sha256"], "0" * 64)
    elsewhere = client.predict(gone, api_name="/restore_session")
    assert elsewhere["checkpoint"] is None and elsewhere["image"] is None
    assert [n.split(" ")[0] for n in elsewhere["notes"]] == ["checkpoint", "image", "export"]
    for bad, args in [("not a JSON session file", ("{",)), ("playground", ('{"format": "ssog-lab-session/1"}',))]:
        with pytest.raises(Exception, match=bad):
            client.predict(*args, api_name="/restore_session")
    with pytest.raises(Exception, match="no checkpoint 'nope'"):
        client.predict("nope", "scene.png", sections, api_name="/save_session")
    with pytest.raises(Exception, match="checkpoint and image are arguments"):
        client.predict("", "", {**sections, "image": None}, api_name="/save_session")
