"""The training CLI: real data formats, checkpoints and metadata, exact resume, NaN stop, flag checks, torchrun."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssog_core.checkpoint.format import load_checkpoint, read_checkpoint
from ssog_core.cli import train
from ssog_core.nn.vit import ViT
from ssog_core.train import optim, trainer
from ssog_core.train.config import TrainConfig
from ssog_core.train.state import resume_config
from tests.data_files import write_cifar_tar, write_imagefolder
from tests.helpers import assert_same_weights, weights

ROOT = Path(__file__).resolve().parent.parent
# A tiny model and data set: 6 steps per epoch, a second or two per run on one CPU core.
TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--atoms", "2", "--batch-size", "8", "--no-progress"]
SHAPES = ["--data", "shapes:size=16,train=48,val=16,classes=3"]


def run(out: Path, *extra: str) -> int:
    return train.main([*SHAPES, *TINY, "--epochs", "2", "--out", str(out), *extra])


@pytest.mark.slow
def test_train_shapes_writes_everything(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out, "--plot", "--save-dtype", "float16", "--ckpt-every", "4") == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "curves.png",
        "last.safetensors",
        "metrics.jsonl",
        "model.safetensors",
        "model.transfer.json",
        "train_state.pt",
    ]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and [r["step"] for r in rows] == [6, 12]
    assert all(0 <= r["val_acc"] <= 1 and r["train_loss"] > 0 and r["img_per_s"] > 0 for r in rows)
    assert all(r["epoch_cpu_s"] > 0 for r in rows)
    assert set(rows[-1]["gates"]) == {"mu", "sigma", "lambda"}
    model, meta = load_checkpoint(out / "last.safetensors")
    assert meta["class_names"] == ["circle", "square", "triangle"]
    assert meta["normalization"] is None
    assert meta["command"].startswith("python -m ssog_core.train --data shapes:size=16")
    assert meta["data"] == "shapes:size=16,train=48,val=16,classes=3"
    assert meta["epochs"] == 2 and meta["step"] == 12 and meta["finished"] is True
    assert meta["accuracy"] == rows[-1]["val_acc"]
    assert {"torch", "python", "ssog_lab"} <= set(meta["software"])
    cfg = meta["config"]
    assert cfg["img_size"] == [16, 16] and cfg["patch_size"] == 4 and cfg["num_classes"] == 3
    assert model.config.steer == ("mu", "sigma", "lambda") and model.config.cold_init
    _, half, _ = read_checkpoint(out / "model.safetensors")
    assert all(t.dtype == torch.float16 for t in half.values())
    full = {k: t for k, t in weights(out / "last.safetensors").items() if not k.startswith("history.")}
    assert all(t.dtype == torch.float32 for t in full.values())
    assert meta["augment"] == ["pad-crop", "flip"] and meta["crop_pad"] == 4
    assert meta["transforms"]["train"] == (
        "rendered natively at 16×16 + pad-crop (zero-pad 4 px, random 16×16 crop) + horizontal flip (p=0.5)"
    )
    err = capsys.readouterr().err
    assert "epoch 2: train loss" in err and f"transforms: train {meta['transforms']['train']}" in err
    # the zero-shot transfer of the final model: 0.5×–2× of 16² at patch 4 is 8, 12, 16, 24, 32
    curve = meta["resolution_transfer"]
    assert [c["img_size"] for c in curve] == [[8, 8], [12, 12], [16, 16], [24, 24], [32, 32]]
    assert [c["tokens"] for c in curve] == [4, 9, 16, 36, 64] and all(0 <= c["accuracy"] <= 1 for c in curve)
    assert curve[2]["accuracy"] == rows[-1]["val_acc"]  # 1×: the final evaluation again (16 < 1000 images)
    assert read_checkpoint(out / "model.safetensors")[2]["resolution_transfer"] == curve
    assert json.loads((out / "model.transfer.json").read_text()) == curve
    assert "zero-shot resolution transfer" in err


@pytest.mark.slow
def test_train_state_loads_without_unpickling_objects(tmp_path):
    out = tmp_path / "run"
    assert run(out, "--epochs", "1") == 0
    state = torch.load(out / "train_state.pt", weights_only=True)  # raises if anything but tensors/containers
    assert state["step"] == 6 and set(state) >= {"optimizer", "scheduler", "rng", "model", "args"}


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
    """Stop mid-epoch, resume, and end with exactly the weights of an uninterrupted run (dropout on)."""
    assert run(tmp_path / "a") == 0
    assert run(tmp_path / "b", "--stop-after", "4") == 0
    stopped = read_checkpoint(tmp_path / "b" / "last.safetensors")[2]
    assert stopped["step"] == 4 and stopped["accuracy"] is None  # not evaluated at this step
    assert train.main(["--out", str(tmp_path / "b"), "--resume", "--no-progress"]) == 0
    assert_same_weights(tmp_path / "a" / "last.safetensors", tmp_path / "b" / "last.safetensors")
    rows_a = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    rows_b = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    timing = ("epoch_time_s", "epoch_cpu_s", "img_per_s")
    strip = [{k: v for k, v in json.loads(r).items() if k not in timing} for r in rows_a]
    assert strip == [{k: v for k, v in json.loads(r).items() if k not in timing} for r in rows_b]
    meta = read_checkpoint(tmp_path / "b" / "last.safetensors")[2]
    assert meta["command"].endswith("--stop-after 4")  # the run's own command, not the resume line


@pytest.mark.slow
def test_init_from_starts_a_second_stage_from_the_weights(tmp_path, capsys):
    assert run(tmp_path / "a", "--epochs", "1", "--transfer-sizes", "none") == 0
    first = tmp_path / "a" / "last.safetensors"
    assert (
        run(tmp_path / "b", "--epochs", "1", "--transfer-sizes", "none", "--init-from", str(first), "--lr", "1e-9") == 0
    )
    a, b = weights(first), weights(tmp_path / "b" / "last.safetensors")
    moved = max(float((a[k].float() - b[k].float()).abs().max()) for k in a if not k.startswith("history."))
    assert moved < 1e-5  # a near-zero learning rate keeps the loaded weights, not a fresh initialisation
    assert run(tmp_path / "c", "--epochs", "1", "--dim", "8", "--init-from", str(first)) == 2
    assert "differs from this run's in dim" in capsys.readouterr().err
    assert run(tmp_path / "d", "--epochs", "1", "--init-from", str(tmp_path / "missing.safetensors")) == 2
    assert "--init-from" in capsys.readouterr().err


@pytest.mark.slow
def test_init_from_another_image_size_resizes_only_the_position_embedding(tmp_path):
    """Progressive resizing: a run at another image size starts from the weights, its position embedding resized
    to the new grid as resolution transfer resizes it (float64 reference: bilinear by hand on the corners)."""
    from ssog_core.nn.vit import resize_pos_embed

    assert run(tmp_path / "a", "--epochs", "1", "--transfer-sizes", "none") == 0
    first = tmp_path / "a" / "last.safetensors"
    args = ("--epochs", "1", "--transfer-sizes", "none", "--img-size", "24", "--lr", "1e-9")
    assert run(tmp_path / "b", *args, "--init-from", str(first)) == 0
    a, b = weights(first), weights(tmp_path / "b" / "last.safetensors")
    config_a, config_b = (read_checkpoint(p)[0] for p in (first, tmp_path / "b" / "last.safetensors"))
    assert config_b.img_size == (24, 24) and config_a.img_size != config_b.img_size
    for k in a:
        if k.startswith("history.") or k == "pos_embed":
            continue
        assert float((a[k].float() - b[k].float()).abs().max()) < 1e-5, k
    resized = resize_pos_embed(a["pos_embed"].float(), config_a.grid, config_b.grid)
    assert torch.allclose(b["pos_embed"].float(), resized, atol=1e-5)
    gh, gw = config_a.grid
    pe = a["pos_embed"].double().reshape(gh, gw, -1)
    # align_corners=False keeps the corners of an upsampled grid at the corner cells' values
    assert torch.allclose(resized.double().reshape(*config_b.grid, -1)[0, 0], pe[0, 0], atol=1e-6)


@pytest.mark.slow
def test_resume_at_epoch_boundary_keeps_the_epoch_eval(tmp_path):
    assert run(tmp_path / "b", "--stop-after", "6") == 0
    assert train.main(["--out", str(tmp_path / "b"), "--resume", "--no-progress"]) == 0
    rows = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["epoch"] for r in rows] == [1, 2]


def test_resume_refuses_a_changed_recipe_and_a_missing_run(tmp_path, capsys):
    assert run(tmp_path / "b", "--stop-after", "2") == 0
    assert train.main(["--out", str(tmp_path / "b"), "--resume", "--lr", "0.01"]) == 2
    assert "--lr 0.001 -> 0.01" in capsys.readouterr().err
    assert train.main(["--out", str(tmp_path / "nothing"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert run(tmp_path / "b") == 2  # an existing run is never overwritten silently
    assert "already holds a training run" in capsys.readouterr().err


@pytest.mark.parametrize("branch", ["complete state", "first save interrupted"])
def test_resume_compares_paths_as_the_folders_they_name(tmp_path, monkeypatch, capsys, branch):
    """A run started on ``imagefolder:/abs/images`` records the folder relative in its checkpoint (portable) and as
    typed in its state: resuming with the folder spelled either way (or with ``..`` and a final slash) keeps the
    recipe, whether the state is complete or the run was stopped during its first save; another folder is refused."""
    monkeypatch.chdir(tmp_path)
    folder = write_imagefolder(tmp_path / "images", classes=3, per_class=8, val_per_class=2)
    shutil.copytree(folder, tmp_path / "copy")
    recipe = ["--img-size", "16", "--patch-size", "4", *TINY, "--epochs", "2"]
    stopped = tmp_path / "stopped"
    assert train.main(["--data", f"imagefolder:{folder}", *recipe, "--out", str(stopped), "--stop-after", "2"]) == 0
    assert read_checkpoint(stopped / "last.safetensors")[2]["train_args"]["data"] == "imagefolder:images"
    if branch == "first save interrupted":  # killed between the two writes of its first save
        (stopped / "train_state.pt").unlink()
    capsys.readouterr()
    for n, spelling in enumerate(["images", str(folder), f"{tmp_path}/copy/../images/"]):
        out = shutil.copytree(stopped, tmp_path / f"resumed{n}")
        argv = ["--data", f"imagefolder:{spelling}", *recipe, "--out", str(out), "--resume", "--stop-after", "3"]
        assert train.main(argv) == 0, capsys.readouterr().err
        assert read_checkpoint(out / "last.safetensors")[2]["step"] == 3
        assert ("starting it afresh" in capsys.readouterr().err) == (branch == "first save interrupted")
    out = shutil.copytree(stopped, tmp_path / "other")
    assert train.main(["--data", f"imagefolder:{tmp_path / 'copy'}", *recipe, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "must keep its recipe; these differ from the saved run: --data 'imagefolder:" in err and "copy" in err


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    calls = {"n": 0}
    real = trainer.loss_fn

    def poisoned(logits, target):
        calls["n"] += 1
        loss = real(logits, target)
        return loss * float("nan") if calls["n"] == 9 else loss  # step 9: the middle of epoch 2

    monkeypatch.setattr(trainer, "loss_fn", poisoned)
    assert run(out) == 1
    err = capsys.readouterr().err
    assert "the loss became nan at step 9 (epoch 2)" in err and "last good checkpoint" in err
    meta = read_checkpoint(out / "last.safetensors")[2]
    assert meta["step"] == 6 and meta["finished"] is False
    assert not (out / "model.safetensors").exists()
    state = torch.load(out / "train_state.pt", weights_only=True)
    assert state["step"] == 6


def test_train_cifar_tar_and_imagefolder(tmp_path):
    tar = write_cifar_tar(tmp_path / "cifar", n_train=24, n_test=8, num_classes=4)
    # CIFAR at a lower resolution than its native 32² keeps the run tiny; pad-4 crop + flip
    args = ["--data", f"cifar100:{tar}", "--img-size", "16", "--patch-size", "4", "--epochs", "1"]
    assert train.main([*args, *TINY, "--out", str(tmp_path / "c")]) == 0
    _, meta = load_checkpoint(tmp_path / "c" / "last.safetensors")
    assert meta["class_names"] == ["class0", "class1", "class2", "class3"] and meta["step"] == 3
    root = write_imagefolder(tmp_path / "folder", classes=3, per_class=8, val_per_class=2)
    args = ["--data", f"imagefolder:{root}", "--img-size", "24x16", "--patch-size", "4", "--epochs", "1"]
    assert train.main([*args, *TINY, "--attn", "dot", "--augment", "crop", "--out", str(tmp_path / "f")]) == 0
    model, meta = load_checkpoint(tmp_path / "f" / "last.safetensors")
    assert meta["class_names"] == ["c0", "c1", "c2"] and model.config.img_size == (24, 16)
    assert meta["train_args"]["augment"] == ["crop"] and meta["augment"] == ["resized-crop"]  # imagefolder's crop
    assert meta["transforms"]["train"].startswith("resized-crop (Inception")


def test_fixed_field_and_options_reach_the_model(tmp_path):
    out = tmp_path / "run"
    extra = ["--steer", "", "--field", "axial", "--warm-gates", "--max-offset", "2", "--dropout", "0", "--epochs", "1"]
    assert run(out, *extra) == 0
    model, meta = load_checkpoint(out / "last.safetensors")
    cfg = model.config
    assert cfg.steer == () and cfg.field == "axial" and not cfg.cold_init and cfg.max_offset == 2 and cfg.dropout == 0
    assert "gates" not in json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--attn", "softmax"], "invalid choice"),
        (["--steer", "mu,beta"], "distinct taps"),
        (["--steer", "mu,mu"], "distinct taps"),
        (["--augment", "rotate"], "at most one of crop, pad-crop, resized-crop"),
        (["--augment", "pad-crop,resized-crop"], "at most one of crop"),
        (["--crop-pad", "-1"], "must be >= 0"),
        (["--transfer-sizes", "16,abc"], "not N or HxW"),
        (["--data", "mnist:/x"], "KIND must be one of"),
        (["--data", "cifar100"], "needs a path"),
        (["--data", "shapes:classes=1"], "between 2"),
        (["--img-size", "12x"], "not N or HxW"),
        (["--epochs", "0"], "must be >= 1"),
        (["--batch-size", "-4"], "must be >= 1"),
        (["--depth", "two"], "'two' is not an integer"),
        (["--registers", "-1"], "must be >= 0"),
        (["--lr", "0"], "outside"),
        (["--lr", "nan"], "outside"),
        (["--weight-decay", "abc"], "not a number"),
        (["--dropout", "1.5"], "outside"),
        (["--field", "radial"], "invalid choice"),
        (["--save-dtype", "int8"], "invalid choice"),
    ],
)
def test_bad_flags_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_model_combination_is_a_clear_error(tmp_path, capsys):
    assert run(tmp_path / "r", "--patch-size", "5") == 2
    assert "must be positive multiples of patch_size=5" in capsys.readouterr().err
    assert run(tmp_path / "s", "--atoms", "9") == 2
    assert "num_atoms=9 must be between 1 and 8" in capsys.readouterr().err


def test_unwritable_out_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert run(blocker / "run") == 2
    err = capsys.readouterr().err
    assert "cannot write to --out" in err and "epoch" not in err


def test_full_disk_fails_before_training(tmp_path, monkeypatch, capsys):
    class Usage:
        total, used, free = 10**9, 10**9 - 1000, 1000

    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage())
    assert run(tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert "MB free, but the checkpoints need about" in err and "epoch" not in err
    assert not (tmp_path / "run" / "last.safetensors").exists()


def test_lr_schedule_warmup_then_cosine():
    f = [optim.lr_factor(s, 4, 12) for s in range(12)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert f[4] == 1.0 and all(a > b for a, b in zip(f[4:], f[5:], strict=False))
    assert abs(optim.lr_factor(12, 4, 12)) < 1e-12
    assert abs(optim.lr_factor(8, 4, 12) - 0.5) < 1e-12


@pytest.mark.slow
def test_torchrun_two_processes_match_one(tmp_path):
    """DDP on CPU (gloo) with 2 processes: finishes, saves once, and (dropout off) learns what one process learns
    with the same global batch."""
    common = [*SHAPES, *TINY, "--epochs", "1", "--dropout", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "ssog_core.train", *common, "--out", str(tmp_path / "ddp")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("epoch 1: train loss") == 1  # rank 0 logs, rank 1 stays quiet
    meta = read_checkpoint(tmp_path / "ddp" / "last.safetensors")[2]
    assert meta["processes"] == 2 and meta["step"] == 6
    assert train.main([*common, "--out", str(tmp_path / "one")]) == 0
    assert_same_weights(
        tmp_path / "one" / "last.safetensors", tmp_path / "ddp" / "last.safetensors", rtol=1e-4, atol=1e-5
    )


def test_sigint_saves_and_resume_continues_exactly(tmp_path, monkeypatch, capsys):
    """A real SIGINT mid-epoch: the step finishes, a checkpoint is saved, exit code 130; --resume then ends
    with the weights of an uninterrupted run."""
    assert run(tmp_path / "a", "--epochs", "1") == 0
    calls = {"n": 0}
    real = trainer.loss_fn

    def interrupting(logits, target):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real(logits, target)

    monkeypatch.setattr(trainer, "loss_fn", interrupting)
    assert run(tmp_path / "b", "--epochs", "1") == 130
    assert "interrupted (SIGINT)" in capsys.readouterr().err
    assert read_checkpoint(tmp_path / "b" / "last.safetensors")[2]["step"] == 3
    monkeypatch.setattr(trainer, "loss_fn", real)
    assert train.main(["--out", str(tmp_path / "b"), "--resume", "--no-progress"]) == 0
    assert_same_weights(tmp_path / "a" / "last.safetensors", tmp_path / "b" / "last.safetensors")


def test_corrupt_train_state_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out, "--stop-after", "2") == 0
    data = (out / "train_state.pt").read_bytes()
    (out / "train_state.pt").write_bytes(data[: len(data) // 2])
    assert train.main(["--out", str(out), "--resume"]) == 2
    assert "not a readable training state" in capsys.readouterr().err


def test_rbf_with_registers_and_susie(tmp_path):
    out = tmp_path / "run"
    assert run(out, "--attn", "rbf", "--registers", "2", "--susie", "--epochs", "1") == 0
    model, _ = load_checkpoint(out / "last.safetensors")
    cfg = model.config
    assert cfg.attn == "rbf" and cfg.num_registers == 2 and cfg.susie
    assert run(tmp_path / "bad", "--registers", "2") == 2  # SSOG has no place for register tokens


def test_resume_of_a_run_saved_before_newer_options_existed():
    """A state written by an older version lacks later flags: they take their defaults, the recipe is kept."""
    args, explicit = train.parse_args(["--out", "runs/x", "--resume"])
    saved = {k: v for k, v in train.parse_args(["--dim", "32", "--out", "runs/x"])[0].to_dict().items()
             if k not in ("qk_norm", "susie", "susie_dim")}  # fmt: skip
    merged = resume_config(args, explicit, saved)
    assert merged.dim == 32 and merged.qk_norm is False and merged.susie is False and merged.resume is True


@pytest.mark.slow
def test_resume_of_a_run_saved_before_crop_pad_field_lr_and_transfer(tmp_path):
    """A run saved before --crop-pad, --field-lr-mult and --transfer-sizes existed resumes with their defaults, and
    its stored ``crop`` keeps its old meaning (pad-4 crop on shapes): the run ends exactly as an uninterrupted one."""
    assert run(tmp_path / "a", "--epochs", "1") == 0
    assert run(tmp_path / "b", "--epochs", "1", "--stop-after", "3") == 0
    path = tmp_path / "b" / "train_state.pt"
    state = torch.load(path, weights_only=True)
    for name in ("crop_pad", "field_lr_mult", "transfer_sizes"):
        del state["args"][name]
    torch.save(state, path)
    assert train.main(["--out", str(tmp_path / "b"), "--resume", "--no-progress"]) == 0
    assert_same_weights(tmp_path / "a" / "last.safetensors", tmp_path / "b" / "last.safetensors")
    meta = read_checkpoint(tmp_path / "b" / "last.safetensors")[2]
    assert meta["crop_pad"] == 4 and len(meta["resolution_transfer"]) == 5


@pytest.mark.slow
def test_transfer_sizes_chosen_or_off_and_checked_before_training(tmp_path, capsys):
    assert run(tmp_path / "a", "--epochs", "1", "--transfer-sizes", "12,16x24") == 0
    curve = read_checkpoint(tmp_path / "a" / "model.safetensors")[2]["resolution_transfer"]
    assert [(c["img_size"], c["tokens"]) for c in curve] == [([12, 12], 9), ([16, 24], 24)]
    assert run(tmp_path / "b", "--epochs", "1", "--transfer-sizes", "none") == 0
    assert "resolution_transfer" not in read_checkpoint(tmp_path / "b" / "model.safetensors")[2]
    assert not (tmp_path / "b" / "model.transfer.json").exists()
    capsys.readouterr()
    assert run(tmp_path / "c", "--transfer-sizes", "18") == 2
    err = capsys.readouterr().err
    assert "--transfer-sizes: image size 18×18 is not a positive multiple of the patch size 4" in err
    assert "epoch 1" not in err


def test_crop_pad_reaches_the_data(tmp_path):
    assert run(tmp_path / "a", "--epochs", "1", "--augment", "pad-crop", "--crop-pad", "2") == 0
    meta = read_checkpoint(tmp_path / "a" / "last.safetensors")[2]
    assert meta["augment"] == ["pad-crop"] and meta["crop_pad"] == 2 and "zero-pad 2 px" in meta["transforms"]["train"]


def _groups(argv: list[str]) -> tuple[torch.nn.Module, list[dict]]:
    args, _ = train.parse_args([*TINY, *argv])
    config = trainer.model_config(args, type("Data", (), {"num_classes": 3})())
    model = ViT(config)
    return model, optim.make_optimizer(model, args).param_groups


def test_field_lr_mult_groups_exactly_the_fixed_field():
    common = ["--img-size", "16", "--patch-size", "4", "--lr", "0.002", "--gate-lr-mult", "3"]
    model, default = _groups(common)
    assert [g["lr"] for g in default] == [0.002, 0.006]  # no field group by default: old optimizer states load
    _, same = _groups([*common, "--field-lr-mult", "1"])
    assert len(same) == 2
    model, groups = _groups([*common, "--field-lr-mult", "10"])
    assert [g["lr"] for g in groups] == [0.002, 0.006, 0.02]
    names = {id(p): n for n, p in model.named_parameters()}
    field = sorted(names[id(p)].rsplit(".", 1)[-1] for p in groups[2]["params"])
    assert set(field) == set(optim.FIELD_PARAMETERS) and len(field) == len(optim.FIELD_PARAMETERS)  # depth 1
    gates = {names[id(p)].rsplit(".", 1)[-1] for p in groups[1]["params"]}
    assert all(g.endswith("_scale") for g in gates)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    _, dot = _groups([*common, "--attn", "dot", "--field-lr-mult", "10"])
    assert len(dot) == 1  # no field, no gates: one group


def test_field_lr_mult_moves_the_field_faster(tmp_path):
    """One step of the same run with the field's lr ×20: μ moves about 20× as far (Adam: a step ~ lr)."""
    moved = {}
    for mult in ("1", "20"):
        out = tmp_path / mult
        assert run(out, "--stop-after", "1", "--field-lr-mult", mult, "--weight-decay", "0") == 0
        torch.manual_seed(0)  # what train does before building the model (--seed 0)
        start = ViT(read_checkpoint(out / "last.safetensors")[0]).state_dict()
        end = weights(out / "last.safetensors")
        moved[mult] = max(
            (end[k] - start[k]).abs().max().item() for k in end if k.endswith(".mu") and not k.startswith("history.")
        )
    assert 10 < moved["20"] / moved["1"] < 30


# What train_state.pt held as "args" before TrainConfig (the argparse namespace as a plain dict), written by the
# code of that time for `run(out, "--epochs", "1", "--stop-after", "3")`; such states also had no "history".
PRE_CONFIG_ARGS = {
    "data": "shapes:size=16,train=48,val=16,classes=3", "img_size": [16, 16], "augment": ["crop", "flip"],
    "crop_pad": 4, "workers": None, "attn": "ssog", "field": "factorized", "steer": ["mu", "sigma", "lambda"],
    "atoms": 2, "patch_size": 4, "dim": 16, "depth": 1, "heads": 2, "mlp_ratio": 2.0, "dropout": 0.1,
    "max_offset": 4.0, "sigma_floor": 0.25, "warm_gates": False, "registers": 0, "qk_norm": False, "susie": False,
    "susie_dim": 0, "epochs": 1, "batch_size": 8, "lr": 0.001, "weight_decay": 0.05, "warmup_epochs": 5.0,
    "gate_lr_mult": 1.0, "field_lr_mult": 1.0, "seed": 0, "out": "runs/old", "resume": False, "init_from": None,
    "ckpt_every": 0, "stop_after": 3, "save_dtype": "float32", "plot": False, "device": None, "compile": None,
    "amp": None, "eval_batch_size": 256, "progress": False, "transfer_sizes": "auto",
}  # fmt: skip
ADDED_SINCE = {"tensorboard": None}  # options added after that format, at their defaults
CHANGED_SINCE = {"compile": False}  # defaults changed since that format: compile became opt-in (was None: on CUDA)


@pytest.mark.slow
def test_a_state_saved_before_train_config_resumes_exactly(tmp_path):
    """A run stopped by the code before TrainConfig (its state: the argparse namespace as a dict, an option this
    version no longer knows, no history) resumes and ends exactly as an uninterrupted run."""
    assert run(tmp_path / "a", "--epochs", "1") == 0
    assert run(tmp_path / "b", "--epochs", "1", "--stop-after", "3") == 0
    path = tmp_path / "b" / "train_state.pt"
    state = torch.load(path, weights_only=True)
    assert state["args"] == {**PRE_CONFIG_ARGS, **ADDED_SINCE, **CHANGED_SINCE, "out": str(tmp_path / "b")}
    state["args"] = {**PRE_CONFIG_ARGS, "an_option_since_removed": 7}
    del state["history"]
    torch.save(state, path)
    assert train.main(["--out", str(tmp_path / "b"), "--resume", "--no-progress"]) == 0
    (_, a, _), (_, b, meta) = (read_checkpoint(tmp_path / r / "last.safetensors") for r in "ab")  # weights only:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the old state had no history
    resumed = {"out": os.path.relpath(tmp_path / "b"), "resume": True, "stop_after": None}  # checkpoints: relative
    assert meta["train_args"] == {**PRE_CONFIG_ARGS, **ADDED_SINCE, **CHANGED_SINCE, **resumed}


def test_compile_is_opt_in_with_an_opt_out_flag():
    """Off by default (on CUDA too, until a GPU run of the compile check passes: docs/KERNELS.md §7); ``--compile``
    turns it on and ``--no-compile`` off, the flag that keeps a run eager once compiling is the default."""
    assert train.parse_args([])[0].compile is False
    assert train.parse_args(["--compile"])[0].compile is True
    assert train.parse_args(["--compile", "--no-compile"])[0].compile is False


def test_train_config_round_trips_and_ignores_unknown_keys():
    config, _ = train.parse_args([*SHAPES, *TINY, "--img-size", "16x24", "--transfer-sizes", "8,16x24"])
    assert config.img_size == (16, 24) and config.transfer_sizes == ((8, 8), (16, 24)) and config.dim == 16
    plain = config.to_dict()
    assert plain["img_size"] == [16, 24] and list(plain) == [f.name for f in dataclasses.fields(TrainConfig)]
    assert TrainConfig.from_dict({**plain, "gone": 1}) == config
    assert TrainConfig.from_dict({}) == TrainConfig() == train.parse_args([])[0]  # one set of defaults
