"""Checkpoints: round trips, the converter against upstream-layout files, and every way a file can be bad."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ssog_core import CheckpointError, ViT, load_checkpoint, save_checkpoint
from ssog_core.checkpoint.format import read_checkpoint
from ssog_core.checkpoint.portable import rewrite_portable
from ssog_core.cli.convert import main as convert_main
from tests.dense_oracle import upstream_state_dict, vit_forward

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(num_classes=4, img_size=16, patch_size=4, dim=8, depth=2, num_heads=2, num_atoms=2)


def _randomised(model: ViT) -> ViT:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "delta" in name or "lambda_gate" in name:
                p.normal_(0, 0.3)
    return model.eval()


@pytest.mark.parametrize("kwargs", [dict(TINY), dict(TINY, attn="dot"), dict(TINY, field="axial", steer=("mu",))])
def test_round_trip_gives_identical_logits(tmp_path, kwargs):
    model = _randomised(ViT(**kwargs, cold_init=False))
    path = save_checkpoint(tmp_path / "m.safetensors", model, {"class_names": ["a", "b", "c", "d"], "accuracy": 0.5})
    loaded, meta = load_checkpoint(path)
    img = torch.rand(2, 3, 16, 16)
    assert torch.equal(loaded(img), model(img))
    assert meta["class_names"] == ["a", "b", "c", "d"] and meta["config"]["attn"] == kwargs.get("attn", "ssog")
    assert meta["software"]["torch"] == torch.__version__
    assert not list(tmp_path.glob(".*tmp"))  # no temporary file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # a normal file, readable by the app's other users


@pytest.mark.slow
def test_fp16_storage_and_compiled_model_has_no_prefix(tmp_path):
    model = _randomised(ViT(**TINY))
    compiled = torch.compile(model)  # saving the wrapper must not leak "_orig_mod." into the file
    path = save_checkpoint(tmp_path / "m.safetensors", compiled, dtype=torch.float16)
    _, state, _ = read_checkpoint(path)
    assert all(not k.startswith("_orig_mod") for k in state) and state["pos_embed"].dtype == torch.float16
    loaded, _ = load_checkpoint(path)
    img = torch.rand(1, 3, 16, 16)
    torch.testing.assert_close(loaded(img), model(img), rtol=2e-2, atol=2e-2)


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.safetensors"
    save_checkpoint(path, ViT(**TINY))
    before = path.read_bytes()

    def dies_halfway(state, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr("ssog_core.checkpoint.weights.save_file", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, ViT(**TINY))
    assert path.read_bytes() == before and len(list(tmp_path.iterdir())) == 1
    load_checkpoint(path)


def _valid_file(tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "ok.safetensors", ViT(**TINY))


def test_empty_and_truncated_files(tmp_path):
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="is empty"):
        load_checkpoint(empty)
    data = _valid_file(tmp_path).read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(cut)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.safetensors")


def test_every_mismatch_is_reported_in_one_message(tmp_path):
    config, state, meta = read_checkpoint(_valid_file(tmp_path))
    state["blocks.0.attn.mu"] = torch.zeros(2, 3, 2)
    state["blocks.1.attn.v.weight"] = torch.zeros(8, 9)
    del state["head.bias"]
    state["extra.weight"] = torch.zeros(1)
    state["blocks.0.norm1.weight"] = torch.full((8,), float("nan"))
    path = tmp_path / "bad.safetensors"
    save_file(state, path, metadata={"format": "ssog-lab/1", "config": json.dumps(config.to_dict())})
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    for part in [
        "missing tensors: head.bias",
        "unexpected tensors: extra.weight",
        "blocks.0.attn.mu has shape (2, 3, 2), expected (2, 2, 2)",
        "blocks.1.attn.v.weight has shape (8, 9), expected (8, 8)",
        "blocks.0.norm1.weight contains NaN",
    ]:
        assert part in msg


def test_bad_headers(tmp_path):
    _, state, _ = read_checkpoint(_valid_file(tmp_path))
    plain = tmp_path / "plain.safetensors"
    save_file(state, plain)
    with pytest.raises(CheckpointError, match="no SSOG Lab header"):
        load_checkpoint(plain)
    unknown = tmp_path / "unknown.safetensors"
    cfg = dict(ViT(**TINY).config.to_dict(), wings=2)
    save_file(state, unknown, metadata={"format": "ssog-lab/1", "config": json.dumps(cfg)})
    with pytest.raises(CheckpointError, match="unknown model config field"):
        load_checkpoint(unknown)


class _WritesAFile:
    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_pickles_never_run(tmp_path):
    marker = tmp_path / "pwned.txt"
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"pos_embed": _WritesAFile(str(marker))}))
    with pytest.raises(CheckpointError, match="pickle-based file"):
        load_checkpoint(evil)
    assert convert_main([str(evil), "--config", "{}", str(tmp_path / "out.safetensors")]) == 2
    torch_style = tmp_path / "evil_zip.pt"
    torch.save({"x": _WritesAFile(str(marker))}, torch_style)  # saving does not run __reduce__'s result
    assert convert_main([str(torch_style), "--config", "{}", str(tmp_path / "out.safetensors")]) == 2
    assert not marker.exists()
    assert not (tmp_path / "out.safetensors").exists()


REF_CFG = dict(num_classes=6, img_size=12, patch_size=2, dim=16, depth=2, num_heads=2, attn="ssog", num_atoms=3)


@pytest.mark.slow
@pytest.mark.parametrize("attn, prefix", [("ssog", ""), ("ssog", "_orig_mod."), ("dot", "module.")])
def test_converter_reproduces_upstream_logits(tmp_path, attn, prefix):
    cfg = dict(REF_CFG, attn=attn)
    sd = upstream_state_dict(cfg, seed=5)
    ref = tmp_path / "ref.pt"
    torch.save({prefix + k: v for k, v in sd.items()}, ref)
    out = tmp_path / "ours.safetensors"
    proc = subprocess.run(
        [sys.executable, "-m", "ssog_core", "convert", str(ref), "--config", json.dumps(cfg), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    model, meta = load_checkpoint(out)
    assert meta["converted_from"] == "ref.pt"
    img = torch.rand(3, 3, 12, 12)
    want, _ = vit_forward(img, sd, cfg)
    got = model(img).double()
    assert ((got - want).norm() / want.norm()) <= 1e-5


def test_converter_reports_config_mismatch(tmp_path, capsys):
    sd = upstream_state_dict(REF_CFG)
    ref = tmp_path / "ref.pt"
    torch.save(sd, ref)
    assert convert_main([str(ref), "--config", json.dumps(dict(REF_CFG, num_atoms=4)), str(tmp_path / "o.st")]) == 2
    err = capsys.readouterr().err
    assert "blocks.0.attn.mu has shape (2, 3, 2), expected (2, 4, 2)" in err
    assert "blocks.1.attn.lambda_gate.weight has shape (6, 16), expected (8, 16)" in err
    assert convert_main([str(ref), "--config", "[1, 2]", str(tmp_path / "o.st")]) == 2
    assert "JSON object" in capsys.readouterr().err


MACHINE = {"platform", "hostname", "node", "user", "machine", "processor"}


def _absolute_paths(value) -> list[str]:
    """Every string in ``value`` (nested) that holds an absolute path, also inside a command or a data spec."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in _absolute_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _absolute_paths(v)]
    return [w for w in str(value).replace("=", " ").replace(":", " ").split() if w.startswith(("/", "~"))]


def test_checkpoints_record_relative_paths_and_library_versions_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    meta = {
        "command": f"python -m ssog_core.train --data cifar100:{tmp_path}/c100 --out {tmp_path}/runs/a --steer ''",
        "data": f"imagefolder:{tmp_path}/imgs",
        "train_args": {"out": f"{tmp_path}/runs/a", "init_from": "/elsewhere/x.safetensors", "tensorboard": None},
    }
    _, _, saved = read_checkpoint(save_checkpoint(tmp_path / "m.safetensors", ViT(**TINY), meta))
    assert saved["command"] == "python -m ssog_core.train --data cifar100:c100 --out runs/a --steer ''"
    assert saved["data"] == "imagefolder:imgs" and saved["train_args"]["out"] == "runs/a"
    assert saved["train_args"]["init_from"] == os.path.relpath("/elsewhere/x.safetensors", tmp_path)
    assert set(saved["software"]) == {"ssog_lab", "torch", "numpy", "python"}


def _split(blob: bytes) -> tuple[dict, bytes]:
    """A safetensors file's JSON header and the tensor bytes after it."""
    size = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + size]), blob[8 + size :]


def test_rewriting_a_header_keeps_every_tensor_byte_and_is_atomic(tmp_path, monkeypatch):
    meta = {"command": "python -m ssog_core.train --out /runs/a", "software": {"platform": "Linux-x"}}
    path = save_checkpoint(tmp_path / "m.safetensors", _randomised(ViT(**TINY)), meta)
    header, data = _split(path.read_bytes())
    header["__metadata__"]["meta"] = json.dumps(meta)  # as an older version wrote it
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    before = len(text).to_bytes(8, "little") + text + data
    path.write_bytes(before)
    _, old_state, _ = read_checkpoint(path)
    monkeypatch.setattr("ssog_core.checkpoint.files.os.replace", lambda *a: (_ for _ in ()).throw(OSError("full")))
    with pytest.raises(OSError):
        rewrite_portable(path, "/")
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]
    monkeypatch.undo()
    assert rewrite_portable(path, "/") and not rewrite_portable(path, "/")  # a second pass changes nothing
    after = path.read_bytes()
    assert _split(after)[1] == data and int.from_bytes(after[:8], "little") % 8 == 0  # tensors kept, aligned
    _, state, saved = read_checkpoint(path)
    assert saved["command"] == "python -m ssog_core.train --out runs/a" and "platform" not in saved["software"]
    assert state.keys() == old_state.keys() and all(torch.equal(state[k], old_state[k]) for k in state)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="junk.safetensors is not a safetensors checkpoint"):
        rewrite_portable(junk, "/")


@pytest.mark.parametrize("path", sorted((ROOT / "checkpoints").glob("*.safetensors")), ids=lambda p: p.name)
def test_bundled_checkpoints_name_no_machine_and_no_absolute_path(path):
    _, _, meta = read_checkpoint(path)
    assert set(meta["software"]) <= {"ssog_lab", "torch", "numpy", "python"}
    assert not MACHINE & set(meta) and _absolute_paths(meta) == []
