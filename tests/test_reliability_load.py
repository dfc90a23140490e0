"""A small run of the load benchmark (``benchmarks/load_app.py``): 4 clients against the real ``python -m app`` in a
subprocess. It checks that the harness works and that no request fails; the full load and its memory figures are
the benchmark's job (speed and memory are measured there, never asserted in tests)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from PIL import Image

from ssog_core import save_checkpoint
from tests.app_fixtures import designed_ssog, dot_twin, meta, write_images

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def load_app():
    spec = importlib.util.spec_from_file_location("load_app", ROOT / "benchmarks" / "load_app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["load_app"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_picture_pool_is_varied(load_app, tmp_path):
    pool = load_app.picture_pool(tmp_path, None)
    modes = {Image.open(p).mode for p in pool}
    sizes = {Image.open(p).size for p in pool}
    assert {"RGB", "L", "CMYK", "P", "RGBA", "I;16"} <= modes and (1, 1) in sizes and (1600, 1200) in sizes


SHAPES = ["circle", "square", "triangle", "star", "cross"]  # the classes of the shapes data, in its order


@pytest.mark.slow
@pytest.mark.timeout(900)  # --deadline 450 bounds the run; beside CPU-bound processes the niced workers are slow
@pytest.mark.parametrize(
    "form", [[], ["--pace", "0.05", "0.2", "--cluster", "local"]], ids=["back_to_back", "paced_cluster"]
)
def test_load_smoke(load_app, tmp_path, form):
    (tmp_path / "ckpt").mkdir()  # the app's two test checkpoints, labelled so validation work runs on them
    for name, model in (("ssog_test", designed_ssog(depth=2)), ("dot_test", dot_twin(depth=2))):
        labels = {**meta(name.removesuffix("_test"), 0.5), "class_names": SHAPES}
        save_checkpoint(tmp_path / "ckpt" / f"{name}.safetensors", model, labels)
    write_images(tmp_path / "assets")
    out = tmp_path / "result"
    argv = ["--clients", "4", "--duration", "5", "--eval-images", "8", "16", "--importance-images", "12",
            "--burst", "4", "--alone", "2", "--warmup-mix", "3", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--assets-dir", str(tmp_path / "assets"), "--out", str(out), "--max-growth", "100",
            "--deadline", "450", "--max-slowdown", "1000", *form]  # fmt: skip
    code = load_app.main(argv)
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["errors"] == 0 and result["warmup_errors"] == 0, result.get("error_examples")
    assert code == 0 and result["passed"] and result["server_alive_after"] and result["logins"]
    assert result["refused"] == 0  # each client waits for its answer: never two heavy jobs of one user
    assert result["checkpoints"] == ["dot_test.safetensors", "ssog_test.safetensors"]
    latency = result["latency"]
    every = {"/head_field", "/export_summary (none)", "/export_summary (blank)", "/export_summary (validation)",
             "/intervene (one image)", "/intervene (validation)", "/head_importance", "/save_session",
             "/restore_session", "/upload_image"}  # fmt: skip
    assert set(result["warmup_endpoints"]) == every  # the warm-up sends every kind; the timed mix draws from them
    assert "/head_field (burst)" in latency
    assert set(latency) <= every | {"/head_field (burst)", "/export_summary (burst)"}
    light = every - {"/intervene (validation)", "/head_importance"}
    assert set(result["alone"]) == light and all(row["requests"] == 2 for row in result["alone"].values())
    assert set(result["slowdown"]) <= light and all(v > 0 for v in result["slowdown"].values())
    assert result["alone_requests"] == 2 * len(light)
    assert sum(row["requests"] for row in latency.values()) == result["requests"] > result["mixed_requests"] > 0
    assert result["pace_s"] == ([0.05, 0.2] if form else [0.0, 0.0])
    assert result["heavy_work"] == ("Dask: local" if form else "the app's local pool")
    assert latency["/head_field (burst)"]["requests"] + latency["/export_summary (burst)"]["requests"] == 16
    heavy = [row for name, row in latency.items() if name.startswith(("/head_importance", "/intervene (validation)"))]
    assert all(row["wait_max_ms"] >= row["wait_p50_ms"] >= 0 for row in heavy if "wait_p50_ms" in row)
    assert all(row["run_p50_ms"] > 0 for row in heavy if "run_p50_ms" in row)
    rss, threads = result["rss_mb"], result["threads"]
    assert min(rss["at_start"], rss["after_warmup"], rss["max_during_load"], rss["at_end"]) > 0
    assert min(threads.values()) > 1 and len(rss["at_quarters"]) == 3
    text = out.with_suffix(".md").read_text()
    assert "Command: `python benchmarks/load_app.py" in text and "| endpoint | requests | errors | refused |" in text
    assert "Server threads:" in text and "each logged in as its own user" in text and "| alone p95 |" in text
    assert ("between two requests" in text and "Dask" in text) if form else "back to back" in text
