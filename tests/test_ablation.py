"""experiments/ablation.py: the plan is the SSOG post's table (commands differ only where they should), a finished
run is skipped and an interrupted one resumed, and the report's numbers equal a direct computation."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ablation(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("ablation", ROOT / "experiments" / "ablation.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ablation", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results" / "ablation.jsonl")
    monkeypatch.setattr(module, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(module, "MODELS", tmp_path / "results" / "models")
    monkeypatch.setattr(module, "READINGS", tmp_path / "results" / "readings.jsonl")
    monkeypatch.setattr(module, "PARKED", tmp_path / "results" / "parked")
    monkeypatch.setattr(module, "DOC", tmp_path / "RESULTS.md")
    monkeypatch.setattr(module, "FIGURE", tmp_path / "figures" / "ablation_curves.png")
    return module


def _flags(cmd: list[str]) -> dict[str, str]:
    args = cmd[cmd.index("ssog_core.train") + 1 :]
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]], i = args[i + 1], i + 2
        else:
            out[args[i]], i = "", i + 1
    return out


def _row(run) -> dict:
    return dict(zip(("task", "grid", "variant", "seed", "epochs", "lr", "start_epochs"), run.key(), strict=True))


def test_the_plan_is_the_table(ablation):
    every = ablation.plan("pointer", tuple(ablation.GRIDS))
    runs = [r for r in every if r.epochs is None and r.start_epochs is None]  # the early table
    long = [r for r in every if r.epochs is not None and r.lr is None]  # the converged table, small board
    rates = [r for r in every if r.lr is not None]
    from_long = [r for r in every if r.start_epochs is not None]
    assert len(every) == len(runs) + len(long) + len(rates) + len(from_long)
    assert len(runs) == 4 * 3 * 2 + 2 * 3  # the table, then the offset row with three seeds on both boards
    assert {(r.variant, r.seed, r.grid) for r in runs[:24]} == {
        (v, s, g) for v in ablation.VARIANTS for s in (0, 1, 2) for g in ablation.GRIDS.values()
    }
    rows = [*ablation.VARIANTS, ablation.OFFSET_ROW[0]]
    # the converged table: every row and seed, small board, the same recipe on a 40-epoch schedule; seed 0 first
    assert sorted((r.variant, r.seed) for r in long) == sorted((v, s) for v in rows for s in (0, 1, 2))
    assert {r.seed for r in long[:5]} == {0} and all(r.grid == 14 for r in long)
    for r in long:
        twin = next(t for t in runs if (t.variant, t.grid, t.seed) == (r.variant, r.grid, r.seed))
        a, b = _flags(r.command()), _flags(twin.command())
        assert a["--epochs"] == "40" and {k for k in a if a[k] != b.get(k)} == {"--epochs", "--out"}
        assert r.key() != twin.key() and r.out != twin.out and r.model != twin.model
    # the learning-rate check: dot and +mu, seed 0, 40 epochs, the rate as the command's last --lr
    assert sorted((r.variant, r.seed, r.lr) for r in rates) == sorted(
        (v, 0, lr) for v in ("dot", "+mu") for lr in ("1.2e-3", "3e-4")
    )
    for r in rates:
        cmd = r.command()
        last = len(cmd) - 1 - cmd[::-1].index("--lr")
        assert cmd[last + 1] == r.lr and cmd.count("--lr") == 2 and r.out.name.endswith(f"-lr{r.lr}")
        twin = next(t for t in long if (t.variant, t.seed) == (r.variant, r.seed))
        a, b = _flags(cmd), _flags(twin.command())
        assert {k for k in a if a[k] != b.get(k)} == {"--lr", "--out"}
    # the large board continued from each converged model, 6 epochs
    assert sorted((r.variant, r.seed) for r in from_long) == sorted((v, s) for v in rows for s in (0, 1, 2))
    for r in from_long:
        flags = _flags(r.command())
        source = next(t for t in long if (t.variant, t.seed) == (r.variant, r.seed))
        assert flags["--epochs"] == "6" and r.grid == 20 and r.source == source
        assert (ablation.ROOT / flags["--init-from"]).resolve() == source.model.resolve()
    assert len({r.out for r in every}) == len(every)  # one folder per run
    may_differ = {"--attn", "--steer", "--seed", "--out", "--max-offset", "--init-from"}
    for grid in ablation.GRIDS.values():
        same_board = [_flags(r.command()) for r in runs if r.grid == grid]
        base = same_board[0]
        for flags in same_board[1:]:
            differ = {k for k in base.keys() | flags.keys() if base.get(k) != flags.get(k)}
            assert differ <= may_differ, differ
    offset = [r for r in runs if r.variant.startswith("steered ±")]
    assert [_flags(r.command())["--max-offset"] for r in offset] == ["2"] * 6
    assert sorted((r.seed, r.grid) for r in offset) == [(s, g) for s in (0, 1, 2) for g in (14, 20)]
    for r in runs:  # the large board starts from the small board's model of the same variant and seed
        flags = _flags(r.command())
        if r.board == "small":
            assert "--init-from" not in flags and flags["--epochs"] == "12"
        else:
            twin = next(s for s in runs if s.board == "small" and (s.variant, s.seed) == (r.variant, r.seed))
            assert (ablation.ROOT / flags["--init-from"]).resolve() == twin.model.resolve()
            assert flags["--epochs"] == "6" and r.source == twin


def test_a_large_board_run_waits_for_the_small_run_it_starts_from(ablation, monkeypatch):
    called = []

    def train(cmd: list[str], log, **kw) -> tuple[int, float]:
        out = ablation.ROOT / cmd[cmd.index("--out") + 1]
        if "--init-from" in cmd:
            assert (ablation.ROOT / cmd[cmd.index("--init-from") + 1]).exists()
        called.append(out.name)
        (out / "model.safetensors").write_bytes(b"m")
        return 0, 0.0

    monkeypatch.setattr(ablation, "run_child", train)
    monkeypatch.setattr(ablation, "evaluate", _row)
    monkeypatch.setattr(ablation, "read", _row)
    args = ablation.argparse.Namespace(
        task="pointer", jobs=2, threads=1, cluster=None, only=None, variant=["dot"], seeds={0, 1, 2}
    )
    lost = next(r for r in ablation.plan("pointer", ("small",)) if (r.variant, r.seed) == ("dot", 1))
    ablation.append_result(_row(lost))  # finished before models were kept: trained again for its large twin
    assert ablation.cmd_train(args) == 0
    converged = ["pointer-g14-dot-s0-e40", "pointer-g14-dot-s0-e40-lr1.2e-3", "pointer-g14-dot-s0-e40-lr3e-4"]
    converged += ["pointer-g14-dot-s1-e40", "pointer-g14-dot-s2-e40"]
    from_converged = [f"pointer-g20-dot-s{s}-from-e40" for s in (0, 1, 2)]
    assert sorted(called) == sorted(
        [*(f"pointer-g{g}-dot-s{s}" for g in (14, 20) for s in (0, 1, 2)), *converged, *from_converged]
    )
    for seed in (0, 1, 2):
        assert called.index(f"pointer-g14-dot-s{seed}") < called.index(f"pointer-g20-dot-s{seed}")
        assert called.index(f"pointer-g14-dot-s{seed}-e40") < called.index(f"pointer-g20-dot-s{seed}-from-e40")
    called.clear()
    for path in ablation.MODELS.iterdir():
        path.unlink()
    ablation.RESULTS.unlink()
    assert ablation.cmd_train(ablation.argparse.Namespace(**{**vars(args), "jobs": 1})) == 0
    assert called[:6] == [f"pointer-g{g}-dot-s{s}" for s in (0, 1, 2) for g in (14, 20)]  # whole seeds, in order
    assert called[6:] == [*converged, *from_converged]  # then the converged table, the rate check, the large board


def test_finished_runs_are_skipped_and_interrupted_ones_resumed(ablation, monkeypatch):
    runs = ablation.plan("pointer", ("small",))
    finished, interrupted = runs[0], runs[1]
    ablation.append_result({**_row(finished), "x": 1})
    finished.model.parent.mkdir(parents=True)
    finished.model.write_bytes(b"kept")
    interrupted.out.mkdir(parents=True)
    (interrupted.out / "last.safetensors").write_bytes(b"")
    called = []

    def train(cmd: list[str], log, **kw) -> tuple[int, float]:  # a finished run leaves its model in its folder
        called.append(cmd)
        (ablation.ROOT / cmd[cmd.index("--out") + 1] / "model.safetensors").write_bytes(cmd[-1].encode())
        return 0, 0.0

    monkeypatch.setattr(ablation, "run_child", train)
    monkeypatch.setattr(ablation, "evaluate", _row)
    monkeypatch.setattr(ablation, "read", _row)
    args = ablation.argparse.Namespace(
        task="pointer", jobs=1, threads=1, cluster=None, only="small", variant=None, seeds={0, 1, 2}
    )
    assert ablation.cmd_train(args) == 0
    outs = [c[c.index("--out") + 1] for c in called]
    assert len(called) == len(runs) - 1 and not any(o.endswith(finished.out.name) for o in outs)
    resumed = [c for c in called if "--resume" in c]
    assert len(resumed) == 1 and resumed[0][resumed[0].index("--out") + 1].endswith(interrupted.out.name)
    assert len(ablation.read_results()) == len(runs)  # one row per run, none twice
    assert len(ablation.read_rows(ablation.READINGS)) == len(runs) - 1  # each run trained here was read
    kept = sorted(p.name for p in ablation.MODELS.iterdir())
    assert kept == sorted(f"{r.out.name}.safetensors" for r in runs)  # each model kept beside the results
    assert (ablation.MODELS / f"{interrupted.out.name}.safetensors").read_bytes() == (
        interrupted.out / "model.safetensors"
    ).read_bytes()


def test_a_run_another_sweep_trains_is_left_to_it_and_variants_filter(ablation, monkeypatch):
    """Two sweeps at once (say, one per board) never train the same folder; ``--variant`` picks rows."""
    called = []
    monkeypatch.setattr(ablation, "train", lambda run, threads: called.append(run.variant) or 1 / 0)
    large = ablation.plan("pointer", ("large",))
    for run in large:  # the small-board models they start from
        run.source.model.parent.mkdir(parents=True, exist_ok=True)
        run.source.model.write_bytes(b"m")
    busy = next(r for r in large if r.variant == "dot")
    args = ablation.argparse.Namespace(
        task="pointer", jobs=1, threads=1, cluster=None, only="large", variant=["dot"], seeds={0, 1, 2}
    )
    with ablation.file_lock(busy.out.with_name(busy.out.name + ".lock")) as held:
        assert held
        assert ablation.cmd_train(args) == 1  # the rest ran (and failed here); the busy early seed 0 was left alone
    assert called == ["dot"] * 5  # early seeds 1 and 2, then seeds 0, 1, 2 from the converged models


def test_report_numbers_equal_a_direct_computation(ablation):
    rng = np.random.default_rng(0)
    n = 300
    correct = {}
    for variant, p in (("fixed", 0.5), ("+mu", 0.6), ("steered", 0.8), ("dot", 0.7)):
        for seed in (0, 1, 2):
            c = rng.random(n) < p
            correct[variant, seed] = c
            ablation.append_result(
                {"task": "pointer", "grid": 20, "variant": variant, "seed": seed, "val_acc": float(c.mean()),
                 "val_images": n, "cpu_s": 10.0, "correct_hex": np.packbits(c.astype(np.uint8)).tobytes().hex()}
            )  # fmt: skip
    rows = ablation.read_results()
    mean, ci, per_seed = ablation.contrast(rows, "steered", "fixed")
    direct = [correct["steered", s].mean() - correct["fixed", s].mean() for s in (0, 1, 2)]
    assert per_seed == pytest.approx(direct, abs=1e-12) and mean == pytest.approx(np.mean(direct), abs=1e-12)
    assert ci[0] < mean < ci[1] and 0.05 < ci[1] - ci[0] < 0.13  # ±2 SE: SE = (0.41 / 3 / 300) ** 0.5 = 0.021
    ablation.DOC.write_text(f"# Results\n\n{ablation.MARKS[0]}\nold\n{ablation.MARKS[1]}\n\nafter\n")
    ablation.cmd_report(ablation.argparse.Namespace(task="pointer"))
    doc = ablation.DOC.read_text()
    assert "old" not in doc and doc.endswith(f"{ablation.MARKS[1]}\n\nafter\n")
    steered = [100 * correct["steered", s].mean() for s in (0, 1, 2)]
    assert f"{np.mean(steered):.1f} ± {np.std(steered, ddof=1):.1f} (n=3)" in doc
    assert f"{100 * np.mean(direct):+.1f} [" in doc
    assert "(seeds: " + " ".join(f"{100 * d:+.1f}" for d in direct) + ")" in doc
    saved = json.loads(ablation.RESULTS.read_text().splitlines()[0])
    np.testing.assert_array_equal(ablation.correct_of(saved), correct["fixed", 0])


def test_the_converged_table_judges_each_early_claim_by_the_rule(ablation):
    """The converged table: accuracy and the step each run left its plateau (from its curve), each contrast judged
    against the early table's (survives / flips / open), the learning-rate check, and the curves' figure."""
    n = 400

    def row(variant: str, seed: int, acc: float, epochs: int, lr: str | None = None, exit_at: int | None = None):
        c = np.arange(n) < round(acc * n)  # the first images right: paired differences of one sign in every seed
        steps = epochs * 250
        curve = [{"step": s, "val_acc": acc if exit_at is not None and s >= exit_at else min(acc, 0.5)}
                 for s in range(250, steps + 1, 250)]  # fmt: skip
        return {"task": "pointer", "grid": 14, "variant": variant, "seed": seed, "epochs": epochs, "lr": lr,
                "val_acc": float(c.mean()), "val_images": n, "cpu_s": 36.0, "steps": steps, "curve": curve,
                "correct_hex": np.packbits(c.astype(np.uint8)).tobytes().hex()}  # fmt: skip

    early = {"fixed": 0.45, "+mu": 0.5, "steered": 0.45, "dot": 0.55}
    late = {"fixed": 0.45, "+mu": 1.0, "steered": 0.45, "dot": 0.5}
    for seed in (0, 1, 2):
        for variant in early:
            ablation.append_result(row(variant, seed, early[variant], 12))
            exit_at = 2000 + 250 * seed if late[variant] > 2 / 3 else None
            ablation.append_result(row(variant, seed, late[variant], 40, exit_at=exit_at))
    ablation.append_result(row("dot", 0, 0.5, 40, lr="1.2e-3"))
    rows = ablation.read_results()
    assert len([r for r in rows if ablation.is_converged(r)]) == 12 and not ablation.is_converged(rows[-1])
    text = ablation.render("pointer", rows)
    lines: dict[str, str] = {}
    for x in text.splitlines():  # the first line of each row: the converged table's, which comes first
        if x.startswith("| "):
            lines.setdefault(x.split(" |")[0], x)
    assert "| 100.0 ± 0.0 (n=3) | s0: 2,000; s1: 2,250; s2: 2,500 |" in lines["| +mu"]
    assert "s0: not within 10,000" in lines["| dot"]
    verdicts = {k: v.rsplit("|", 2)[-2].strip() for k, v in lines.items() if " − " in k}
    assert verdicts["| +mu − fixed"] == "survives"  # +5 early, +55 late, every seed
    assert verdicts["| +mu − dot"] == "flips"  # −5 early, +50 late
    assert verdicts["| steered − fixed"] == "open"  # 0 both times
    assert verdicts["| steered − dot"] == "survives"  # −10 early, −5 late
    assert verdicts["| steered ±2 − steered"] == "open (0 of 3 seeds)"
    assert "| dot | 1.2e-3 | 50.0 | not within 10,000 |" in text and "| dot | 6e-4 | 50.0 | not within 10,000 |" in text
    assert "The dot twin leaves its plateau" not in text  # one of the two checked rates still to run
    ablation.append_result(row("dot", 0, 0.5, 40, lr="3e-4"))
    assert "leaves its plateau at none of the rates (3e-4, 6e-4, 1.2e-3; seed 0)" in ablation.render(
        "pointer", ablation.read_results()
    )
    ablation.append_result(row("dot", 0, 0.9, 40, lr="3e-4", exit_at=3000))  # a later row of the same run replaces it
    assert "leaves its plateau at lr 3e-4: by the rule" in ablation.render("pointer", ablation.read_results())
    assert text.index("**At convergence.**") < text.index("**Early learning.**")
    ablation.DOC.write_text(f"{ablation.MARKS[0]}\n{ablation.MARKS[1]}\n")
    ablation.cmd_report(ablation.argparse.Namespace(task="pointer"))
    assert ablation.FIGURE.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reading_a_run(ablation, monkeypatch):
    """The instrument's reading of a (small, random, steered) model: geometry per layer, closing every gate equals
    the same weights without steering, predictions counted, a transfer sweep from the training board up."""
    from ssog_core import ViT, save_checkpoint
    from ssog_core.data.pointer import CLASS_NAMES, min_reach
    from tests.helpers import steered_vit

    config = dict(num_classes=6, img_size=48, patch_size=4, dim=16, depth=2, num_heads=2, mlp_ratio=2.0, dropout=0.0)
    model = steered_vit({**config, "attn": "ssog"}, seed=1).float()
    run = ablation.plan("pointer", ("small",))[2]  # steered, seed 0
    monkeypatch.setitem(ablation.GRIDS, "small", 12)
    meta = {"data": "pointer:grid=12,train=20,val=60", "class_names": list(CLASS_NAMES)}
    run.model.parent.mkdir(parents=True)
    save_checkpoint(run.model, model, meta)
    monkeypatch.setattr(ablation, "READ_IMAGES", 60)
    reading = ablation.read(run)

    assert len(reading["layers"]) == 2
    assert all(g > 1 for layer in reading["layers"] for g in layer["gate_opening"].values())  # warm, not cold
    mu_only, every = reading["gates_closed"]
    assert mu_only["closed"] == "mu" and every["closed"] == "mu+sigma+lambda"
    assert sum(every["predicted"].values()) == 60 and list(every["predicted"]) == list(CLASS_NAMES)
    fixed = ViT(**config, attn="ssog", steer=(), cold_init=False).eval()
    fixed.load_state_dict(model.state_dict(), strict=False)
    data = ablation.load_eval_set(meta, (48, 48), 60)
    with torch.no_grad():
        pred = torch.cat([fixed(x).argmax(-1) for x in data.batches(fixed)])
    counts = np.bincount(pred.numpy(), minlength=6)
    assert every["predicted"] == dict(zip(CLASS_NAMES, counts.tolist(), strict=True))
    assert every["edited"] == pytest.approx(float((pred == data.labels).float().mean()))
    grids = [row["grid"] for row in reading["transfer"]]
    assert grids[0] == 12 and grids == list(range(12, grids[-1] + 1, 4)) and grids[-1] <= 24
    assert reading["transfer"][1]["nearest_evidence"] == pytest.approx(min_reach(12) * 16 / 12, abs=0.01)
    ablation.append_row(ablation.READINGS, reading)
    table = ablation.render("pointer", [])
    line = next(x for x in table.splitlines() if x.startswith("| steered g12 s0 |"))
    assert f"{reading['layers'][-1]['reach']:.2f}" in line and line.count("[") == 2


def test_bundle_copies_the_trio_with_its_transfer_curve(ablation, monkeypatch, tmp_path, capsys):
    """``bundle`` refuses an unfinished trio; a finished one is copied tensor for tensor, with the standard transfer
    curve in its header (the Scaling tab reads it), evaluated on the same images a direct evaluation uses."""
    from safetensors.torch import load_file

    from ssog_core import ViT, save_checkpoint
    from ssog_core.checkpoint.transfer import read_transfer
    from ssog_core.data.pointer import CLASS_NAMES
    from ssog_core.train.accuracy import evaluate_model_sizes

    monkeypatch.setitem(ablation.GRIDS, "large", 12)
    monkeypatch.setattr(ablation, "READ_IMAGES", 30)
    config = dict(num_classes=6, img_size=48, patch_size=4, dim=16, depth=2, num_heads=2, mlp_ratio=2.0, dropout=0.0)
    meta = {"data": "pointer:grid=12,train=20,val=60", "class_names": list(CLASS_NAMES), "accuracy": 0.5}
    out = tmp_path / "ckpts"
    args = ablation.argparse.Namespace(task="pointer", board="large", seed=0, epochs=12, out=out, threads=1)
    runs = {r.variant: r for r in ablation.plan("pointer", ("large",)) if r.seed == 0 and r.start_epochs is None}
    for i, variant in enumerate(ablation.BUNDLE):
        flags = dict(zip(runs[variant].flags[::2], runs[variant].flags[1::2], strict=True))
        steer = tuple(t for t in flags.get("--steer", "").split(",") if t)
        torch.manual_seed(i)
        model = ViT(**config, attn=flags["--attn"], steer=steer)
        runs[variant].model.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(runs[variant].model, model, meta)
        if variant != "dot":
            ablation.append_result(_row(runs[variant]))
    assert ablation.cmd_bundle(args) == 2 and "pointer-g12-dot-s0" in capsys.readouterr().err
    ablation.append_result(_row(runs["dot"]))
    assert ablation.cmd_bundle(args) == 0
    for variant, run in runs.items():
        if variant not in ablation.BUNDLE:
            continue
        dest = out / ablation.bundle_name(variant, "pointer", 12)
        source, copied = load_file(run.model), load_file(dest)
        assert source.keys() == copied.keys() and all(torch.equal(source[k], copied[k]) for k in source)
        model, saved = ablation.load_checkpoint(dest)
        curve = read_transfer(dest, saved).rows
        assert [r["img_size"] for r in curve] == [[24, 24], [36, 36], [48, 48], [72, 72], [96, 96]]
        direct = evaluate_model_sizes(model, meta["data"], [(72, 72)], list(CLASS_NAMES), max_images=30)
        assert curve[3]["accuracy"] == pytest.approx(direct[0]["accuracy"])


def test_seeds_pick_runs_of_any_row_and_each_launch_is_recorded(ablation, monkeypatch):
    """``--seeds 1,2`` trains only those seeds of the chosen rows (the offset row included); every start or resume
    appends what trained it (commit, clean tree, CPU, threads, torch) to the run's folder, and the run's row carries
    the whole list."""
    called = []

    def train(cmd: list[str], log, **kw) -> tuple[int, float]:
        out = ablation.ROOT / cmd[cmd.index("--out") + 1]
        called.append(out.name)
        (out / "model.safetensors").write_bytes(b"m")
        return 0, 0.0

    monkeypatch.setattr(ablation, "run_child", train)
    monkeypatch.setattr(
        ablation, "evaluate", lambda run: {**_row(run), "trained_by": ablation.read_rows(run.out / "provenance.jsonl")}
    )
    monkeypatch.setattr(ablation, "read", _row)
    args = ablation.argparse.Namespace(
        task="pointer",
        jobs=1,
        threads=1,
        cluster=None,
        only=None,
        variant=["steered ±2"],
        seeds=ablation.seed_set("1,2"),
    )
    assert ablation.cmd_train(args) == 0
    assert called == [
        *(f"pointer-g{g}-steered-offset2-s{s}" for s in (1, 2) for g in (14, 20)),
        *(f"pointer-g14-steered-offset2-s{s}-e40" for s in (1, 2)),
        *(f"pointer-g20-steered-offset2-s{s}-from-e40" for s in (1, 2)),
    ]
    row = ablation.read_results()[0]
    (launch,) = row["trained_by"]
    head = ablation.subprocess.run(["git", "rev-parse", "HEAD"], cwd=ablation.ROOT, capture_output=True, text=True)
    assert launch["commit"] == head.stdout.strip() and isinstance(launch["clean"], bool)
    assert launch["threads"] == 1 and launch["torch"] == torch.__version__ and launch["cpu"]


def test_old_rows_keep_their_key_and_long_runs_stay_out_of_the_table(ablation):
    """Rows written before the plateau diagnostic (no ``epochs``) are the board's schedule; a long run's row neither
    replaces its table twin nor enters the table's means, and the report puts both curves side by side."""
    c = np.ones(10, dtype=bool)
    base = {"task": "pointer", "grid": 14, "variant": "dot", "seed": 0, "val_images": 10, "cpu_s": 1.0, "steps": 3000,
            "correct_hex": np.packbits(c.astype(np.uint8)).tobytes().hex()}  # fmt: skip
    ablation.append_result({**base, "val_acc": 0.5})
    ablation.append_result({**base, "val_acc": 0.9, "epochs": 40, "steps": 10000})
    rows = ablation.read_results()
    assert len(rows) == 2 and ablation.row_key(rows[0])[4] == 12
    text = ablation.render("pointer", rows)
    assert "| dot | 50.0 (n=1) |" in text
    assert "dot g14 s0, 12 epochs | 3000 |" in text and "dot g14 s0, 40 epochs | 10000 |" in text


def test_train_runs_the_command_under_the_launcher_logging_and_recording_each_start(ablation, monkeypatch):
    """``train`` runs the real command as a child run (its own session, ended with the sweep), its output appended
    to the run's sweep.log after the command line, one provenance entry per start; a failure names the log."""
    run = ablation.plan("pointer", ("small",))[0]
    script = "import os, sys; print('pid', os.getpid(), 'session', os.getsid(0)); sys.exit(int(sys.argv[1]))"
    for code in ("0", "3"):
        monkeypatch.setattr(ablation.Run, "command", lambda self, code=code: [sys.executable, "-c", script, code])
        if code == "0":
            ablation.train(run, threads=1)
        else:
            with pytest.raises(RuntimeError, match=f"training exited with 3; see {run.out / 'sweep.log'}"):
                ablation.train(run, threads=1)
    log = (run.out / "sweep.log").read_text().splitlines()
    assert [line.split()[0] for line in log] == ["$", "pid", "$", "pid"] and log[0].startswith("$ python -c ")
    pid, session = (int(x) for x in log[1].split()[1::2])
    assert session != os.getsid(0) and session != pid  # a session of its own, led by the watchdog around it
    assert len(ablation.read_rows(run.out / "provenance.jsonl")) == 2


def test_a_stopped_sweep_starts_and_logs_nothing_more(ablation, monkeypatch, capsys):
    """SIGTERM while a run trains: that run ends, and the worker that would take the next run neither logs its
    start nor takes its lock (it used to print "start" for runs it never trained)."""
    import signal
    import time

    from ssog_core.train.child_runs import Stopped, refuse_if_stopping

    def stopped_child(cmd: list[str], log, **kw) -> tuple[int, float]:
        """A run that gets the sweep's SIGTERM and ends by it: it returns once the stop handler (which Python runs
        in the main thread, a moment later) has marked the sweep as stopping."""
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                refuse_if_stopping()
            except Stopped:
                break
            time.sleep(0.01)
        return 143, 0.0

    monkeypatch.setattr(ablation, "run_child", stopped_child)
    args = ablation.argparse.Namespace(
        task="pointer", jobs=1, threads=1, cluster=None, only="small", variant=["dot"], seeds={0, 1, 2}
    )
    with pytest.raises(SystemExit) as stop:
        ablation.cmd_train(args)
    assert stop.value.code == 143
    starts = [line for line in capsys.readouterr().out.splitlines() if line.startswith("start")]
    assert starts == ["start  pointer-g14-dot-s0"]
    second = ablation.plan("pointer", ("small",))[1]
    assert not second.out.with_name(second.out.name + ".lock").exists()


@pytest.fixture
def cluster():
    """A Dask scheduler with two worker threads in this process (so the tests' monkeypatched training is what the
    workers run); torch's thread count, which a job sets, is restored after."""
    from distributed import LocalCluster

    threads = torch.get_num_threads()
    with LocalCluster(n_workers=2, processes=False, threads_per_worker=1, dashboard_address=":0", silence_logs=50) as c:
        yield c.scheduler_address
    torch.set_num_threads(threads)


def test_train_on_a_cluster_keeps_the_sweeps_guarantees(ablation, monkeypatch, cluster, capsys):
    """``train --cluster``: each run is trained on a worker of the scheduler, under the same launcher; a finished
    run is skipped, an interrupted one resumed, a run another sweep holds is left to it, and each finished run has
    one row; a second sweep trains nothing."""
    import threading

    runs = [r for r in ablation.plan("pointer", ("small",)) if r.variant == "dot"]  # seeds 0, 1, 2, then long runs
    finished, interrupted, busy = runs[0], runs[1], runs[2]
    ablation.append_result({**_row(finished), "x": 1})
    finished.model.parent.mkdir(parents=True)
    finished.model.write_bytes(b"kept")
    interrupted.out.mkdir(parents=True)
    (interrupted.out / "last.safetensors").write_bytes(b"")
    called, driver = [], threading.current_thread().name

    def train(cmd: list[str], log, **kw) -> tuple[int, float]:
        called.append((cmd, threading.current_thread().name))
        (ablation.ROOT / cmd[cmd.index("--out") + 1] / "model.safetensors").write_bytes(cmd[-1].encode())
        return 0, 0.0

    monkeypatch.setattr(ablation, "run_child", train)
    monkeypatch.setattr(ablation, "evaluate", _row)
    monkeypatch.setattr(ablation, "read", _row)
    args = ablation.argparse.Namespace(task="pointer", jobs=2, threads=1, cluster=cluster, only="small",
                                       variant=["dot"], seeds={0, 1, 2})  # fmt: skip
    with ablation.file_lock(busy.out.with_name(busy.out.name + ".lock")) as held:
        assert held
        assert ablation.cmd_train(args) == 0
    out = capsys.readouterr().out
    assert (
        f"skip   {busy.out.name}: another sweep is training it" in out and f"on the Dask scheduler at {cluster}" in out
    )
    trained = [c[c.index("--out") + 1].rsplit("/", 1)[-1] for c, _ in called]
    assert sorted(trained) == sorted([interrupted.out.name, *(r.out.name for r in runs[3:])])  # not finished / busy
    assert [("--resume" in c) for c, _ in called] == [n == interrupted.out.name for n in trained]
    assert not [name for _, name in called if name == driver or name.startswith("ThreadPoolExecutor")], called
    assert sorted(map(str, (ablation.row_key(r) for r in ablation.read_results()))) == sorted(
        str(r.key()) for r in (finished, interrupted, *runs[3:])
    )  # one row per finished run
    called.clear()
    assert ablation.cmd_train(args) == 0  # the busy run's lock is free now: it alone is trained
    assert [c[c.index("--out") + 1].rsplit("/", 1)[-1] for c, _ in called] == [busy.out.name]
    assert ablation.cmd_train(args) == 0 and len(called) == 1  # nothing left to train
    assert len(ablation.read_results()) == len(runs)


def test_a_parked_run_resumes_in_a_fresh_checkout(ablation, monkeypatch, tmp_path):
    """``park`` copies an unfinished run's state into the committed folder; a fresh checkout (no ``runs/``) gets it
    back and resumes instead of starting afresh; a finished run's parked state is removed."""
    monkeypatch.setattr(ablation, "PARKED", tmp_path / "results" / "parked")
    run = ablation.plan("pointer", ("small",))[0]
    run.out.mkdir(parents=True)
    for name in ablation.RESUME_FILES:
        (run.out / name).write_bytes(name.encode())
    assert ablation.cmd_park(ablation.argparse.Namespace(task="pointer")) == 0
    parked = ablation.PARKED / run.out.name
    assert sorted(p.name for p in parked.iterdir()) == sorted(ablation.RESUME_FILES)
    ablation.shutil.rmtree(ablation.RUNS)  # the next session's checkout has no runs/
    called = []

    def train(cmd: list[str], log, **kw) -> tuple[int, float]:
        called.append(cmd)
        out = ablation.ROOT / cmd[cmd.index("--out") + 1]
        assert (out / "train_state.pt").read_bytes() == b"train_state.pt"
        (out / "model.safetensors").write_bytes(b"m")
        return 0, 0.0

    monkeypatch.setattr(ablation, "run_child", train)
    monkeypatch.setattr(ablation, "evaluate", _row)
    monkeypatch.setattr(ablation, "read", _row)
    assert ablation.train_run(run, 1)
    assert "--resume" in called[0] and not parked.exists()


def test_a_learning_rate_checks_reading_does_not_replace_the_tables(ablation, monkeypatch):
    """A run of the learning-rate check is read like any other; its reading carries its rate, so it is kept beside
    the same variant and seed's reading at the recipe's rate instead of replacing it (it once did: readings had no
    rate, and the two runs shared a key)."""
    from ssog_core import save_checkpoint
    from ssog_core.data.pointer import CLASS_NAMES
    from tests.helpers import steered_vit

    config = dict(num_classes=6, img_size=48, patch_size=4, dim=16, depth=2, num_heads=2, mlp_ratio=2.0, dropout=0.0)
    monkeypatch.setitem(ablation.GRIDS, "small", 12)
    monkeypatch.setattr(ablation, "READ_IMAGES", 20)
    monkeypatch.setattr(ablation, "transfer_until_it_falls", lambda *a: [])
    monkeypatch.setattr(ablation, "target_shares", lambda *a: {})
    runs = [r for r in ablation.plan("pointer", ("small",)) if r.variant == "dot" and r.seed == 0]
    recipe = next(r for r in runs if r.schedule == ablation.CONVERGED and r.lr is None)
    checked = next(r for r in runs if r.lr is not None)
    meta = {"data": "pointer:grid=12,train=20,val=20", "class_names": list(CLASS_NAMES)}
    for seed, run in enumerate((recipe, checked)):
        run.model.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(run.model, steered_vit({**config, "attn": "dot"}, seed=seed).float(), meta)
        ablation.append_row(ablation.READINGS, ablation.read(run))

    rows = ablation.read_rows(ablation.READINGS)
    assert [ablation.row_key(r) for r in rows] == [recipe.key(), checked.key()]
    assert [r["lr"] for r in rows] == [None, checked.lr]
    assert [ablation.is_converged(r) for r in rows] == [True, False]
