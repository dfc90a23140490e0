"""``python -m ssog_core distill --cluster ADDRESS``: the whole distillation as one job on a Dask worker (the teacher
and a folder's pictures sent as bytes), whose student and report are a local run's with the same settings, written
here only at the end; a stopped job writes nothing. Teachers as tests/test_distill.py makes them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from ssog_core.checkpoint.format import save_checkpoint
from ssog_core.checkpoint.weights import read_safetensors
from ssog_core.cli.distill import main as distill_main
from ssog_core.nn.vit import ViT
from ssog_core.runtime.jobs import Job
from tests.helpers import one_thread_cluster
from tests.test_distill import SIZE, hf_teacher, lab_teacher, picture_folder

SHAPES = {"data": "shapes:train=4,val=60,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}
RECIPE = ["--atoms", "2", "--steps", "3", "--batch-size", "8", "--no-progress"]


@pytest.fixture(scope="module")
def cluster():
    """A scheduler with one worker thread in this process (:func:`tests.helpers.one_thread_cluster`)."""
    with one_thread_cluster() as address:
        yield address


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dcluster")
    torch.manual_seed(0)
    shapes = ViT(num_classes=5, img_size=SIZE, patch_size=4, dim=16, depth=1, num_heads=2, attn="dot", dropout=0.0)
    return {
        "lab": lab_teacher(root / "dot.safetensors"),
        "hf": hf_teacher(root / "hf_vit"),
        "shapes": save_checkpoint(root / "shapes_dot.safetensors", shapes, SHAPES),
        "train": picture_folder(root / "train", 40, 2),
        "held": picture_folder(root / "held", 24, 3),
    }


def _run(argv: list[str], out: Path) -> tuple[dict[str, torch.Tensor], dict[str, str], dict]:
    """The command's exit code checked; the student's tensors and header, and its report (whose SHA-256 is the
    file's own), its files removed for the next run."""
    assert distill_main([*argv, "--out", str(out)]) == 0
    header, tensors = read_safetensors(out)
    report_file = out.with_name(out.name.removesuffix(".safetensors") + ".report.json")
    report = json.loads(report_file.read_text())
    assert report.pop("student_sha256") == hashlib.sha256(out.read_bytes()).hexdigest()
    assert all(report_file.with_suffix(s).stat().st_size > 0 for s in (".png", ".svg"))
    for f in out.parent.glob(out.name.removesuffix(".safetensors") + ".*"):
        f.unlink()
    return tensors, header, report


@pytest.mark.slow
@pytest.mark.parametrize(
    ("teacher", "pictures"),
    [("lab", ("train", "held")), ("hf", ("train", "held")), ("shapes", ("20", "12"))],
)
def test_a_cluster_run_is_a_local_run(cluster, made, tmp_path, teacher, pictures):
    """The lab dot model and a transformers folder (folders' pictures sent as bytes), and a model that records its
    data (N validation images, opened on the worker): the same tensors bit for bit, the same header (the recorded
    command leaves --cluster out) and the same report as a local run; no state file for --resume."""
    images, held = (str(made[p]) if p in made else p for p in pictures)
    argv = ["--teacher", str(made[teacher]), "--images", images, "--eval-images", held, *RECIPE]
    out = tmp_path / "student.safetensors"
    local = _run(argv, out)
    there = _run([*argv, "--cluster", cluster], out)
    assert not (tmp_path / "student.state.pt").exists()
    assert local[0].keys() == there[0].keys()
    for name, value in local[0].items():
        assert torch.equal(value, there[0][name]), name
    assert local[1] == there[1] and local[2] == there[2]
    meta = json.loads(there[1]["meta"])
    assert meta["finished"] and meta["step"] == 3 and "--cluster" not in meta["command"]
    assert meta["distill"]["teacher_licence"] == ("apache-2.0" if teacher == "hf" else None)
    if teacher == "shapes":
        assert there[2]["held_out"] == {"data": SHAPES["data"], "split": "validation", "after": 20, "count": 12}
    else:
        assert there[2]["pictures"]["pictures"] == "train" and there[2]["held_out"]["pictures"] == "held"


def _watched(monkeypatch, out: Path, stop_at: int | None) -> list[tuple[int, bool]]:
    """Each look at the job while it runs, as (steps done, whether the student file exists yet); with ``stop_at``,
    a Ctrl-C once that many steps are done."""
    seen: list[tuple[int, bool]] = []
    result = Job.result

    def looked(self, timeout=None, stop=None):
        done = self.progress[0]
        seen.append((done, out.exists()))
        if stop_at is not None and done >= stop_at:
            raise KeyboardInterrupt
        return result(self, 0.05 if timeout is not None else None, stop)

    monkeypatch.setattr(Job, "result", looked)
    return seen


@pytest.mark.slow
def test_files_are_written_only_at_the_end_with_progress_on_stderr(cluster, made, tmp_path, monkeypatch, capsys):
    out = tmp_path / "s.safetensors"
    seen = _watched(monkeypatch, out, None)
    argv = ["--teacher", str(made["lab"]), "--images", str(made["train"]), "--eval-images", str(made["held"]),
            *RECIPE, "--steps", "12", "--out", str(out), "--cluster", cluster]  # fmt: skip
    assert distill_main(argv) == 0
    assert len(seen) > 2 and not any(exists for _, exists in seen), seen
    assert max(done for done, _ in seen) >= 1  # looked at while it trained
    err = capsys.readouterr().err
    assert "of 12 steps: loss " in err and f"on the Dask scheduler at {cluster}" in err
    assert out.is_file() and (tmp_path / "s.report.json").is_file()


@pytest.mark.slow
def test_ctrl_c_stops_the_job_and_writes_nothing(cluster, made, tmp_path, monkeypatch, capsys):
    out = tmp_path / "s.safetensors"
    _watched(monkeypatch, out, 2)
    argv = ["--teacher", str(made["lab"]), "--images", str(made["train"]), "--eval-images", str(made["held"]),
            *RECIPE, "--cluster", cluster]  # fmt: skip
    assert distill_main([*argv, "--steps", "500", "--out", str(out)]) == 130
    assert "was stopped; nothing was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()  # the worker's only thread is free again: a job still running there would hold it
    assert _run([*argv, "--steps", "2"], out)[1]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--resume"], "--resume"),
        (["--stop-after", "2"], "--stop-after"),
        (["--ckpt-every", "5", "--tensorboard", "tb"], "--ckpt-every, --tensorboard"),
    ],
)
def test_flags_a_job_cannot_honour_are_refused(flags, named, tmp_path, capsys):
    argv = ["--teacher", "t.safetensors", "--images", "8", "--eval-images", "8",
            "--out", str(tmp_path / "s.safetensors"), "--cluster", "tcp://127.0.0.1:1", *flags]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        distill_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{named} need a local run" in err and "writes the student once, at the end" in err
    assert list(tmp_path.iterdir()) == []


def test_bad_addresses_teachers_and_folders_fail_in_words(made, tmp_path, capsys, monkeypatch):
    from ssog_core.testing.app_process import free_port

    out = tmp_path / "s.safetensors"
    pictures = ["--images", str(made["train"]), "--eval-images", str(made["held"]), "--out", str(out)]
    address = f"tcp://127.0.0.1:{free_port()}"
    assert distill_main(["--teacher", str(made["lab"]), *pictures, "--cluster", address]) == 2
    assert f"error: cannot reach the Dask scheduler at {address}" in capsys.readouterr().err
    cases = [
        (str(tmp_path / "none.safetensors"), "none.safetensors: no such checkpoint file"),
        ("hf-hub:nobody/nothing-here", "is not in the local Hugging Face cache"),
    ]
    for teacher, words in cases:  # refused here, before any scheduler is asked
        assert distill_main(["--teacher", teacher, *pictures, "--cluster", address]) == 2
        assert words in capsys.readouterr().err
    argv = ["--teacher", str(made["lab"]), "--images", str(made["train"]), "--eval-images", str(made["train"]),
            "--out", str(out), "--cluster", address]  # fmt: skip
    assert distill_main(argv) == 2
    assert "held-out pictures must differ" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != tmp_path and access(p, mode))
    assert distill_main(["--teacher", str(made["lab"]), *pictures, "--cluster", address]) == 2
    assert f"cannot write into {tmp_path}: the student and its report go there" in capsys.readouterr().err
