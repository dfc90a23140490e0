"""Training history: snapshot schedule, what a run records, storage in the checkpoint, resume and second stages."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ssog_core.checkpoint.format import (
    CheckpointError,
    has_history,
    load_checkpoint,
    read_checkpoint,
    read_history,
    save_checkpoint,
)
from ssog_core.checkpoint.history import History, at_chance, snapshot_steps, split_history, stalled_gates
from ssog_core.cli import train
from ssog_core.field import positive
from ssog_core.train import trainer

TINY = ["--dim", "16", "--depth", "2", "--heads", "2", "--atoms", "2", "--batch-size", "8", "--no-progress"]
SHAPES = ["--data", "shapes:size=16,train=48,val=16,classes=3", "--transfer-sizes", "none"]  # 6 steps per epoch
COLD = float(positive(torch.tensor(-8.0)))


def run(out, *extra: str) -> int:
    return train.main([*SHAPES, *TINY, "--epochs", "3", "--out", str(out), *extra])


@pytest.mark.parametrize("total", [1, 7, 100, 3000, 4488])
def test_snapshot_steps_start_at_zero_end_at_the_last_step_and_are_dense_early(total):
    steps = snapshot_steps(total)
    assert steps[0] == 0 and steps[-1] == total and steps == sorted(set(steps))
    if total >= 100:
        assert len(steps) >= 100
    if total >= 1000:
        early = sum(1 for s in steps if s <= 0.1 * total)
        assert early >= 0.2 * len(steps)  # a tenth of the run holds a fifth or more of the snapshots
    if total < 100:
        assert steps == list(range(total + 1))


@pytest.mark.slow
def test_a_run_records_fields_gates_and_accuracy_and_the_checkpoint_keeps_them(tmp_path):
    out = tmp_path / "run"
    assert run(out) == 0
    hist = read_history(out / "model.safetensors")
    assert hist.steps == snapshot_steps(18) and hist.stages == [0]
    n = len(hist.steps)
    assert [len(v) for v in hist.fields.values()] == [n] * 4
    assert hist.fields["mu"][0].shape == (2, 2, 2, 2) and hist.fields["lambda"][0].shape == (2, 2, 2)
    assert hist.fields["tau"][0].shape == (2,)
    assert set(hist.gates) == {"mu", "sigma", "lambda"} and all(len(v) == n for v in hist.gates.values())
    assert hist.gates["mu"][0] == pytest.approx([COLD, COLD], rel=1e-6)  # step 0: the cold start
    # the last snapshot is the final model's fixed field, exactly
    model, meta = load_checkpoint(out / "last.safetensors")
    for layer, block in enumerate(model.blocks):
        fixed = block.attn.fixed_field()
        np.testing.assert_array_equal(hist.fields["mu"][-1][layer], fixed.mu.detach().numpy())
        np.testing.assert_allclose(hist.fields["lambda"][-1][layer], fixed.lam().detach().numpy(), rtol=1e-6)
        assert hist.gates["sigma"][-1][layer] == pytest.approx(float(block.attn.gate_scales()["sigma"]), rel=1e-6)
    # the fields moved during training (the first and last snapshot differ)
    assert not np.array_equal(hist.fields["mu"][0], hist.fields["mu"][-1])
    # one train row per snapshot after step 0, one validation row per epoch, as the metrics say
    assert [r[0] for r in hist.train] == hist.steps[1:]
    assert all(r[1] > 0 and 0 <= r[2] <= 1 for r in hist.train)
    assert [r[0] for r in hist.val] == [6, 12, 18] and hist.val[-1][1] == pytest.approx(meta["accuracy"], abs=1e-6)
    # the model's tensors load as before; the history is never part of the model
    _, state, _ = read_checkpoint(out / "model.safetensors")
    assert not any(k.startswith("history.") for k in state)
    assert any(k.startswith("history.") for k in load_file(out / "model.safetensors"))


@pytest.mark.slow
def test_resume_continues_the_history_exactly(tmp_path):
    assert run(tmp_path / "a") == 0
    assert run(tmp_path / "b", "--stop-after", "8") == 0
    assert train.main(["--out", str(tmp_path / "b"), "--resume", "--no-progress"]) == 0
    a, b = (read_history(tmp_path / name / "model.safetensors") for name in "ab")
    assert a.steps == b.steps and a.train == b.train and a.val == b.val and a.gates == b.gates
    for key in a.fields:
        assert all(np.array_equal(x, y) for x, y in zip(a.fields[key], b.fields[key], strict=True))


@pytest.mark.slow
def test_init_from_appends_a_second_stage(tmp_path):
    assert run(tmp_path / "one") == 0
    assert run(tmp_path / "two", "--init-from", str(tmp_path / "one" / "model.safetensors")) == 0
    first = read_history(tmp_path / "one" / "model.safetensors")
    both = read_history(tmp_path / "two" / "model.safetensors")
    assert both.stages == [0, 18]
    assert both.steps[: len(first.steps)] == first.steps
    assert both.steps[len(first.steps) :] == [18 + s for s in snapshot_steps(18)[1:]]
    assert [r[0] for r in both.val] == [6, 12, 18, 24, 30, 36]


@pytest.mark.slow
def test_dot_model_records_accuracy_only(tmp_path):
    assert run(tmp_path / "dot", "--attn", "dot") == 0
    hist = read_history(tmp_path / "dot" / "model.safetensors")
    assert len(hist.steps) == 19 and hist.gates == {} and all(v == [] for v in hist.fields.values())
    assert len(hist.val) == 3 and len(hist.train) == 18


@pytest.mark.slow
def test_fixed_field_model_records_fields_without_gates(tmp_path):
    assert run(tmp_path / "fixed", "--steer", "") == 0
    hist = read_history(tmp_path / "fixed" / "model.safetensors")
    assert hist.gates == {} and len(hist.fields["sigma"]) == len(hist.steps)


@pytest.mark.slow
def test_shut_gates_warn_once_with_the_remedy(tmp_path, capsys):
    assert run(tmp_path / "shut", "--gate-lr-mult", "1e-6") == 0
    err = capsys.readouterr().err
    assert err.count("every steering gate is still within 2x") == 1
    assert "--gate-lr-mult" in err and "--warm-gates" in err
    assert run(tmp_path / "open", "--gate-lr-mult", "1000", "--lr", "0.05") == 0
    assert "every steering gate" not in capsys.readouterr().err


@pytest.mark.slow
def test_accuracy_at_chance_warns_once_with_the_remedy(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trainer, "evaluate_loader", lambda *a, **k: {"accuracy": 1 / 3, "loss": 1.1})  # guessing
    assert run(tmp_path / "still") == 0
    err = capsys.readouterr().err
    assert err.count("is still at chance (1/3)") == 1 and "lower peak --lr" in err and "check the labels" in err


@pytest.mark.slow
def test_has_history_reads_only_the_header_and_never_raises(tmp_path):
    assert run(tmp_path / "run") == 0
    model, meta = load_checkpoint(tmp_path / "run" / "model.safetensors")
    save_checkpoint(tmp_path / "bare.safetensors", model, meta)  # no history given
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "run" / "model.safetensors").read_bytes()[:300])
    assert has_history(tmp_path / "run" / "model.safetensors")
    assert not has_history(tmp_path / "bare.safetensors") and not has_history(tmp_path / "cut.safetensors")
    assert not has_history(tmp_path / "missing.safetensors")


def test_warning_rules():
    h = History(gates={"mu": [[COLD, COLD], [1.9 * COLD, 1.5 * COLD]]})
    assert stalled_gates(h, COLD)
    h.gates["mu"][-1][1] = 2.1 * COLD
    assert not stalled_gates(h, COLD)
    assert not stalled_gates(History(), COLD)  # no gates (dot, fixed field): nothing to warn about
    assert at_chance(0.12, 10) and not at_chance(0.2, 10) and at_chance(0.52, 2) and not at_chance(0.7, 2)


def test_history_round_trips_through_tensors_and_a_weights_only_state():
    rng = np.random.default_rng(0)
    h = History(
        steps=[0, 3, 9],
        fields={
            "mu": [rng.normal(size=(2, 3, 4, 2)).astype(np.float32) for _ in range(3)],
            "sigma": [rng.random((2, 3, 4, 2)).astype(np.float32) for _ in range(3)],
            "lambda": [rng.random((2, 3, 4)).astype(np.float32) for _ in range(3)],
            "tau": [rng.random(2).astype(np.float32) for _ in range(3)],
        },
        gates={"lambda": [[0.5, 0.25], [1.0, 2.0], [3.0, 4.0]]},
        train=[[3, 2.25, 0.5], [9, 1.5, 0.75]],
        val=[[9, 0.75, 1.25]],
        stages=[0, 3],
        warned=["gates"],
    )
    back = History.from_tensors(h.to_tensors())
    assert (back.steps, back.gates, back.train, back.val, back.stages) == (h.steps, h.gates, h.train, h.val, h.stages)
    for key in h.fields:
        assert all(np.array_equal(x, y) for x, y in zip(h.fields[key], back.fields[key], strict=True))
    buf = io.BytesIO()
    torch.save(h.to_state(), buf)
    buf.seek(0)
    again = History.from_state(torch.load(buf, weights_only=True))
    assert again.warned == ["gates"] and again.steps == h.steps
    js = h.to_json()
    assert js["val_acc"] == [[9, 0.75]] and np.array(js["fields"]["mu"]).shape == (3, 2, 3, 4, 2)


@pytest.mark.slow
def test_unreadable_history_is_a_clear_checkpoint_error(tmp_path):
    assert run(tmp_path / "r", "--epochs", "1") == 0
    state = load_file(tmp_path / "r" / "model.safetensors")
    with safe_open(str(tmp_path / "r" / "model.safetensors"), framework="pt") as f:
        header = f.metadata()
    del state["history.steps"]
    save_file(state, tmp_path / "broken.safetensors", metadata=header)
    with pytest.raises(CheckpointError, match="training history"):
        load_checkpoint(tmp_path / "broken.safetensors")
    _, hist = split_history({k: v for k, v in state.items() if not k.startswith("history.")})
    assert hist is None
