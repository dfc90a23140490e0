"""``/intervene`` and ``/head_importance`` through ``gradio_client``: the JSON shapes the API promises, readable
refusals, and the heavy queue (one at a time, cancellable)."""

from __future__ import annotations

import threading
import time

import pytest
from gradio_client import Client

from app.common import stoppable
from app.layout import build_app
from app.main import launch
from app.state import AppContext
from ssog_core import save_checkpoint
from ssog_core.runtime.jobs import Cancelled
from ssog_core.testing.app_process import free_port
from tests.app_fixtures import designed_ssog, dot_twin, write_images

SHAPES = {"data": "shapes:train=4,val=60,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("intervene")
    (root / "ckpt").mkdir()
    save_checkpoint(root / "ckpt" / "ssog_shapes.safetensors", designed_ssog(depth=2), SHAPES)
    save_checkpoint(root / "ckpt" / "dot_shapes.safetensors", dot_twin(depth=2), SHAPES)
    write_images(root / "assets")
    demo = build_app(AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads")))
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield Client(demo.local_url, verbose=False)
    finally:
        demo.close()


def test_intervene_returns_the_promised_shape(client):
    edits = [
        {"op": "swap_axes", "layer": 1, "head": 1},
        {"op": "patch_head", "layer": 0, "head": 0, "source": "gray.png"},
    ]
    out = client.predict("ssog_shapes.safetensors", "scene.png", edits, 0, api_name="/intervene")
    assert set(out) == {"unedited", "edited", "accumulated_export"}
    assert len(out["edited"]["probs"]) == 5 and abs(sum(out["edited"]["probs"]) - 1) < 1e-9
    assert out["unedited"]["label"] in SHAPES["class_names"]
    assert len(out["accumulated_export"]["edited"]) == 8
    out = client.predict("ssog_shapes.safetensors", "scene.png", edits, 30, api_name="/intervene")
    v = out["validation"]
    assert v["n"] == 30 and set(v["accuracy"]) == {"unedited", "edited", "ci95", "mcnemar_p"}
    assert set(v["logp_true"]) == {"change", "ci95"} and len(v["per_class"]) == 5


def test_intervene_refuses_bad_edits_in_words(client):
    with pytest.raises(Exception, match="only ablate_head and patch_head"):
        client.predict("dot_shapes.safetensors", "scene.png", [{"op": "drop_atom", "layer": 0, "head": 0, "atom": 0}],
                       api_name="/intervene")  # fmt: skip
    with pytest.raises(Exception, match="'nowhere.png' is neither a bundled image"):
        client.predict("ssog_shapes.safetensors", "scene.png",
                       [{"op": "patch_head", "layer": 0, "head": 0, "source": "nowhere.png"}],
                       api_name="/intervene")  # fmt: skip


def test_head_importance_cells(client):
    out = client.predict("ssog_shapes.safetensors", 20, "zero", api_name="/head_importance")
    assert out["n"] == 20 and 0 <= out["unedited_accuracy"] <= 1
    assert len(out["ablate_head"]) == 2 and len(out["ablate_head"][0]) == 4
    assert set(out["ablate_head"][1][3]) == {"accuracy_drop", "logp_drop", "ci95", "within_noise"}
    assert set(out["close_gate"]) == {"mu", "sigma", "lambda"} and len(out["close_gate"]["mu"]) == 2
    dot = client.predict("dot_shapes.safetensors", 20, "dataset_mean", api_name="/head_importance")
    assert dot["close_gate"] == {} and len(dot["ablate_head"]) == 2


def test_heavy_requests_wait_in_their_own_queue_and_a_sweep_can_be_cancelled(client):
    job = client.submit("ssog_shapes.safetensors", 60, "zero", api_name="/head_importance")
    while job.status().code.name not in ("PROCESSING", "ITERATING"):
        time.sleep(0.05)
    job.cancel()
    quick = client.predict("ssog_shapes.safetensors", "scene.png", [], 0, api_name="/intervene")
    assert quick["edited"] == quick["unedited"]


def test_a_closed_stoppable_generator_tells_its_work_to_stop():
    stopped = threading.Event()

    def work(stop):
        while not stop():
            time.sleep(0.01)
        stopped.set()
        raise Cancelled("stopped")

    gen = stoppable(work, poll=0.01)
    assert next(gen) is None
    gen.close()
    assert stopped.wait(5)


def test_the_intervene_description_lists_every_op_of_the_registry(client):
    from ssog_core.interventions.edit import EDITS

    info = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/intervene"]
    assert all(f"{op}:" in info["description"] for op in EDITS) and "dy: float" in info["description"]
