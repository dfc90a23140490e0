"""experiments/distill.py: its per-image numbers average to the distill command's report (one definition, two paths)
and its per-image share is 1 − mean TV computed out in float64; the ratio interval of a normalised difference and the
judging rule; the script end to end on tiny settings into a temporary folder, killed with SIGKILL in the middle of a
student and run again (kept units skipped, the student resumed from its last save, a changed setting measured
again); and the committed section is what the committed units say."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ssog_core.analysis.head_as_field import fit_layers, mean_attention
from ssog_core.checkpoint.files import section_markers
from ssog_core.distill.report import compare, head_shares
from ssog_core.distill.student import build_student, steering_parameters
from ssog_core.interventions.effects import bootstrap_ci
from tests.test_effects import eval_set
from tests.test_pattern_point import lab_model

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("distill_experiment", ROOT / "experiments" / "distill.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


dx = _script()


def test_image_shares_are_one_minus_the_mean_tv_of_each_image_in_float64():
    g = torch.Generator().manual_seed(0)
    attn = torch.rand(3, 2, 35, 35, generator=g, dtype=torch.float64)  # 3 images, 2 heads, a 7×5 grid
    attn /= attn.sum(-1, keepdim=True)
    rows = torch.rand(2, 35, 35, generator=g, dtype=torch.float64)
    rows /= rows.sum(-1, keepdim=True)
    got = dx.image_shares(attn, rows)
    for b in range(3):
        for h in range(2):
            tv = [0.5 * sum(abs(float(attn[b, h, q, k] - rows[h, q, k])) for k in range(35)) for q in range(35)]
            assert float(got[b, h]) == pytest.approx(1 - sum(tv) / 35, rel=1e-12)


def test_per_image_numbers_average_to_the_distill_commands_report():
    """A student with prefix tokens (two registers) whose steering is switched on (random probes, open gates): the
    per-image shares, agreement and KL average to ``head_shares`` and ``compare``; steering moved the rows."""
    teacher, data = lab_model("dot").float(), eval_set(10, seed=3)
    attention = mean_attention(teacher, data.batches(teacher, 16))
    fits = fit_layers(attention, 3)
    student = build_student(teacher, attention, fits, ("mu", "sigma", "lambda"))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in steering_parameters(student, "steering"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    m = dx.per_image(teacher, student, fits, data)
    shares = head_shares(teacher, student, fits, data)
    for key in ("share_fit", "share_steered", "share_uniform"):
        np.testing.assert_allclose(m[key].mean(0), getattr(shares, key).numpy(), rtol=1e-10, atol=1e-12)
    assert np.abs(m["share_steered"] - m["share_fit"]).max() > 1e-3  # steering changed the rows: not the trivial case
    c = compare(teacher, student, data)
    assert (m["teacher_top"] == m["student_top"]).mean() == pytest.approx(c["agreement"])
    # float32 forwards with the pattern points read (explicit attention) and without (SDPA) differ by rounding only
    assert m["kl"].mean() == pytest.approx(c["kl"], abs=1e-6) and c["kl"] > 1e-4


def test_the_ratio_interval_is_the_bootstrap_of_the_numerator_when_the_denominator_is_one():
    rng = np.random.default_rng(4)
    num = rng.normal(0.2, 1.0, 300)
    assert dx.ratio_ci(num, np.ones(300)) == pytest.approx(bootstrap_ci(num), rel=1e-12)
    lo, hi = dx.ratio_ci(num, np.full(300, 0.5))
    assert (lo, hi) == pytest.approx(tuple(2 * v for v in bootstrap_ci(num)), rel=1e-12)


def _heads(fit: float, steered: float, uniform: float, n: int = 40) -> dict:
    rng = np.random.default_rng(5)
    noise = rng.normal(0, 0.01, (3, n, 1, 1))
    return {
        "share_fit": fit + noise[0],
        "share_steered": steered + noise[1],
        "share_uniform": uniform + noise[2],
    }


def test_head_numbers_normalise_against_the_uniform_field_and_mark_diffuse_heads():
    h = dx.head_numbers(_heads(0.6, 0.8, 0.4))[0]
    m = _heads(0.6, 0.8, 0.4)
    gap = 1 - m["share_uniform"].mean()
    assert h["normalised_fit"] == pytest.approx((m["share_fit"].mean() - m["share_uniform"].mean()) / gap, rel=1e-12)
    assert (
        h["normalised_difference"] == pytest.approx(h["normalised_steered"] - h["normalised_fit"], rel=1e-9)
        and h["normalised_difference_ci95"][0] > 0
    )
    assert not h["diffuse"]
    flat = dx.head_numbers(_heads(0.96, 0.97, 0.95))[0]
    assert flat["diffuse"] and flat["normalised_fit"] is None and flat["normalised_difference_ci95"] is None


def test_the_rule_needs_every_seed():
    up = {"diffuse": False, "normalised_difference_ci95": [0.01, 0.2]}
    zero = {"diffuse": False, "normalised_difference_ci95": [-0.01, 0.2]}
    flat = {"diffuse": True, "normalised_difference_ci95": None}
    assert dx.recovered([[up, up, flat], [up, zero, flat]]) == [True, False, None]
    assert dx.improved({"agreement": (0.1, (0.05, 0.15)), "kl": (-0.2, (-0.3, -0.1))})
    assert not dx.improved({"agreement": (0.1, (-0.01, 0.15)), "kl": (-0.2, (-0.3, -0.1))})
    assert not dx.improved({"agreement": (0.1, (0.05, 0.15)), "kl": (-0.2, (-0.3, 0.01))})


def _run(args: list[str], **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(ROOT / "experiments" / "distill.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)  # fmt: skip


def _finish(args: list[str]) -> str:
    proc = _run(args)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    return out


@pytest.mark.slow
def test_killed_in_a_student_it_resumes_skips_kept_units_and_measures_changed_settings_again(tmp_path):
    """The digits teacher (trained by the script, 1 epoch), one seed, 24 steps a student saved every step: SIGKILL
    once the second student has saved a step; the rerun keeps the first student's unit byte for byte, resumes the
    second from its last save and writes the section; a changed --steps measures both students again and keeps the
    teacher's units."""
    units, work, doc = tmp_path / "out" / "distill", tmp_path / "work", tmp_path / "RESULTS.md"
    args = ["--teachers", "digits", "--seeds", "0", "--steps", "24", "--images", "24", "--eval-images", "16",
            "--digits-epochs", "1", "--ckpt-every", "1", "--out", str(tmp_path / "out"), "--work", str(work),
            "--results", str(doc)]  # fmt: skip
    state = work / "students" / "digits-mu+sigma+lambda-s0.state.pt"
    proc = _run(args)
    seen = -1
    deadline = time.monotonic() + 600
    while seen < 2 and proc.poll() is None and time.monotonic() < deadline:
        if state.is_file():
            seen = int(torch.load(state, weights_only=True)["step"])
        time.sleep(0.02)
    proc.kill()
    proc.communicate()
    assert seen >= 2, "the second student never saved a step before the script ended"
    first = units / "digits-mu-s0.json"
    assert first.is_file() and not (units / "digits-mu+sigma+lambda-s0.json").exists() and not doc.exists()
    kept = first.read_bytes()
    out = _finish(args)
    assert "digits-mu-s0: kept" in out and "training the digits ViT" not in out and "fitting" not in out, out
    resumed = int(re.search(r"digits-mu\+sigma\+lambda-s0: resuming from step (\d+)", out).group(1))
    assert resumed >= seen  # a kill loses at most the steps since the last save
    assert first.read_bytes() == kept
    second = json.loads((units / "digits-mu+sigma+lambda-s0.json").read_text())
    assert second["resumed"] and second["step"] == 24 and second["settings"]["steps"] == 24
    text = doc.read_text()
    assert "### `digits`" in text and "Not measured yet" not in text
    assert second["check"]["step0_agreement_gap"] == 0 and second["check"]["share_steered_gap"] < 1e-9
    changed = _finish([*args[: args.index("--steps") + 1], "25", *args[args.index("--steps") + 2 :]])
    assert changed.count("distilling 25 steps") == 2 and "kept" not in changed and "fitting" not in changed, changed
    assert json.loads(first.read_text())["step"] == 25
    assert "for 25 steps" in doc.read_text()


@pytest.mark.slow
def test_smoke_runs_a_lab_teacher_with_its_from_scratch_models(tmp_path):
    """--smoke on the pointer dot twin: the step-0 student's numbers agree with the command's report, every
    from-scratch model there is scored on the same held-out images, and the section has the tables."""
    out = _finish(["--smoke", "--teachers", "pointer", "--out", str(tmp_path), "--work", str(tmp_path / "w"),
                   "--results", str(tmp_path / "R.md")])  # fmt: skip
    assert "pointer-mu-s0: distilling 2 steps" in out
    student = json.loads((tmp_path / "distill" / "pointer-mu-s0.json").read_text())
    assert student["check"]["step0_agreement_gap"] == 0 and student["check"]["final_kl_gap"] < 1e-5
    assert student["command"].startswith("python -m ssog_core distill --teacher experiments/results/models/")
    scratch = sorted((tmp_path / "distill").glob("pointer-scratch-*.json"))
    there = [f for f in dx.SCRATCH["pointer"] if (ROOT / f).is_file()]
    assert len(scratch) == len(there) >= 1
    text = (tmp_path / "R.md").read_text()
    assert "Beside SSOG trained from scratch" in text and "| L3H3 |" in text


def test_the_committed_section_is_what_the_committed_units_say():
    begin, end = section_markers("distill")
    text = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    if begin not in text:
        pytest.skip("docs/RESULTS.md has no distillation section yet")
    committed = text[text.index(begin) : text.index(end) + len(end)]
    command = re.search(r"Written by `python experiments/distill\.py([^`]*)`", committed).group(1)
    args, plan = dx.options(shlex.split(command))
    assert dx.section(plan, dx.gather(plan), dx.command_of(plan, args.threads)) == committed
