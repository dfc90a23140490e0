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

from tests.app_fixtures import write_checkpoints, write_images

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


@pytest.mark.slow
def test_load_smoke(load_app, tmp_path):
    write_checkpoints(tmp_path / "ckpt", depth=2)
    write_images(tmp_path / "assets")
    out = tmp_path / "result"
    argv = ["--clients", "4", "--uploads", "1", "--exports", "2", "--playground", "2", "--rounds", "1",
            "--burst", "4", "--alone", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--assets-dir", str(tmp_path / "assets"), "--out", str(out), "--max-growth", "100",
            "--deadline", "240"]  # fmt: skip
    code = load_app.main(argv)
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["errors"] == 0 and result["warmup_errors"] == 0, result.get("error_examples")
    assert code == 0 and result["passed"] and result["server_alive_after"]
    assert result["requests"] == 4 * (1 + 2 + 2) + 4 * 4 + 2 * 2 and result["burst"]["errors"] == 0
    assert {"/export_summary", "/head_field", "/upload_image", "/head_field (burst)"} <= set(result["latency"])
    assert result["checkpoints"] == ["dot_test.safetensors", "ssog_test.safetensors"]
    rss = result["rss_mb"]
    assert min(rss["at_start"], rss["after_warmup"], rss["peak_during_load"], rss["after_load"]) > 0
    assert "| `/head_field` | 8 | 0 |" in out.with_suffix(".md").read_text()
