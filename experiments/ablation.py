"""The SSOG post's ablation table on a scene task, as one resumable command: fixed field, +μδ, +μδ +σδ +λ (cold
gates) and the dot twin, three seeds each, on a small and a large board, plus one offset-bound row (±2 against ±4)
per board; every run a plain ``python -m ssog_core.train`` command that differs from its neighbours only in
``--attn`` / ``--steer`` / ``--seed`` (and ``--max-offset`` for the offset row). A large-board run starts from the
small-board model of its variant and seed (``--init-from``, 6 epochs; why: :data:`EPOCHS`).

    python experiments/ablation.py train  [--task pointer] [--jobs 2] [--only small|large] [--variant dot]
                                          [--cluster tcp://HOST:PORT]
    python experiments/ablation.py read   [--task pointer] [--seeds 0]
    python experiments/ablation.py report [--task pointer]
    python experiments/ablation.py bundle [--task pointer] [--board small] [--seed 0] [--epochs 40]
    python experiments/ablation.py park   [--task pointer]   # before a session ends: unfinished runs' state, committed

``bundle`` copies one seed's steered / +μδ / fixed / dot runs into ``checkpoints/`` as the app's matched models of the
task (``matched_ssog_pointer14.safetensors``, ``matched_ssog_mu_pointer14…``, ``matched_ssog_fixed_pointer14…``,
``matched_dot_pointer14…``; by default the converged small-board runs), each with
its training history and the standard zero-shot transfer curve (0.5×-2× the board, first 500 validation images)
stored in its header for the app's Scaling tab.

``train`` skips finished runs (a row in the results file), resumes interrupted ones (``--resume``) and starts the rest,
``--jobs`` at a time, one thread each; a run killed at any moment goes on from its last checkpoint the next time. The
runs end with the sweep: Ctrl-C or SIGTERM lets each save and stop, and a sweep killed outright takes them with it
(``ssog_core.train.child_runs``), so a rerun never trains a folder twice at once. A finished run's model is kept in
``experiments/results/models/`` (``runs/`` is scratch space), evaluated on every validation image and appended to
``experiments/results/ablation.jsonl``: one flat object per run (``task``, ``grid``, ``variant``, ``seed``, ``steps``,
``params``, ``cpu_s``, ``val_acc``, ``gate_scales``, ...) with its per-image correctness packed as hex, so the report
can pair runs image by image; then the instrument reads it (``read`` does the same for kept models not read yet).
``train --cluster ADDRESS`` hands each run, whole (lock, training under the same launcher, kept model, rows), to a
worker of the Dask scheduler at ADDRESS (``ssog_core.runtime.jobs``), ``--jobs`` at a time; the workers must share this
repository's folders. The run's lock is taken on the worker, so a sweep stopped or killed meanwhile leaves its runs
training there to their end, and a rerun skips them (``skip``) rather than training one twice.
``report`` renders the table (mean ± std over seeds; paired 95% bootstrap intervals over the same validation images for
steered − fixed, +μδ − fixed and SSOG − dot) into ``experiments/results/ablation_TASK.md`` and the marked section of
``docs/RESULTS.md``.

Why each task should need steering, and the recipe's pilot, are in docs/DATA.md and docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ssog_core import load_checkpoint
from ssog_core.analysis.report import layer_geometry
from ssog_core.checkpoint.files import atomic_write, replace_section, section_markers
from ssog_core.checkpoint.format import TRANSFER_KEY, read_history, update_metadata
from ssog_core.data import pointer, relation
from ssog_core.interventions.effects import bootstrap_ci, compare, outcomes
from ssog_core.interventions.target_share import target_share_report
from ssog_core.interventions.validation import load_eval_set
from ssog_core.runtime.jobs import Cancelled, Engine
from ssog_core.train.accuracy import evaluate_model_sizes, transfer_curve, transfer_sizes
from ssog_core.train.child_runs import Stopped, refuse_if_stopping, run_child, stop_children_on_signal
from ssog_core.train.trainer import gate_summary

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "ablation.jsonl"
READINGS = ROOT / "experiments" / "results" / "ablation_readings.jsonl"
RUNS = ROOT / "runs" / "ablation"
MODELS = ROOT / "experiments" / "results" / "models"  # every finished run's model, kept with the results
PARKED = ROOT / "experiments" / "results" / "parked"  # unfinished runs' resumable state, committed between sessions
RESUME_FILES = ("last.safetensors", "train_state.pt", "metrics.jsonl", "provenance.jsonl")
DOC = ROOT / "docs" / "RESULTS.md"
FIGURE = ROOT / "docs" / "figures" / "ablation_curves.png"
BUNDLE = {"steered": "matched_ssog", "+mu": "matched_ssog_mu", "fixed": "matched_ssog_fixed", "dot": "matched_dot"}
GRIDS = {"small": 14, "large": 20}  # cells a side: the SSOG post's 14×14 grid, and a board where targets lie
# beyond the ±4-cell offset bound from a resting field (20, not 24: the dot twin's step costs 2.4× more at 24)
SEEDS = (0, 1, 2)
# The table at convergence: every row and seed on the small board for 40 epochs (10,000 steps, 10/3 of the early
# table's schedule: +μδ seed 0 left its plateau after 2,000 steps and reached 100%, the dot twin did not move in
# 10,000), and the large board continued from those models; docs/RESULTS.md says why and what counts as a flip.
CONVERGED = 40
# The learning-rate check: the rate the dot twin's plateau might be an artefact of, each side of the recipe's 6e-4.
LR_CHECK = {"variants": ("dot", "+mu"), "seed": 0, "rates": ("1.2e-3", "3e-4")}
IMAGES = {"train": 16000, "val": 2000}
RECIPE = [  # the matched trio's recipe (checkpoints/MODEL_CARD.md) at depth 4, sized by the pilot in docs/RESULTS.md
    *("--dim", "64", "--depth", "4", "--heads", "4", "--batch-size", "64"),
    *("--warmup-epochs", "0.5", "--lr", "6e-4", "--dropout", "0", "--gate-lr-mult", "10", "--field-lr-mult", "3"),
    *("--transfer-sizes", "none", "--no-progress", "--ckpt-every", "50"),
]
# The large board starts from the small board's model of the same variant and seed (progressive resizing, the
# position embedding resized): from scratch, the fixed field and +μδ sat at chance for their first 1,000 / 750 of
# 3,000 steps on the 20×20 board, and the large half alone would have cost ~18 CPU-hours (docs/RESULTS.md).
EPOCHS = {"small": 12, "large": 6}
VARIANTS = {  # the SSOG post's rows, in its order
    "fixed": ["--attn", "ssog", "--steer", ""],
    "+mu": ["--attn", "ssog", "--steer", "mu"],
    "steered": ["--attn", "ssog", "--steer", "mu,sigma,lambda"],
    "dot": ["--attn", "dot"],
}
OFFSET_ROW = ("steered ±2", ["--attn", "ssog", "--steer", "mu,sigma,lambda", "--max-offset", "2"])
# The three, then +μδ − dot: added after the small board had shown +μδ the best SSOG row, to ask whether
# any SSOG variant reaches the twin (docs/RESULTS.md says so beside it).
CONTRASTS = (("steered", "fixed"), ("+mu", "fixed"), ("steered", "dot"), ("+mu", "dot"))
MARKS = section_markers("ablation")
READ_IMAGES = 500  # validation images per edit of the reading (the first 500: balanced, as every effect uses)
TRANSFER_STEP = 4  # cells added to the board per step of the transfer sweep
MIN_DISTANCE = {"pointer": pointer.min_reach, "relation": relation.min_gap}  # cells, on the training board


@dataclass(frozen=True)
class Run:
    task: str
    board: str
    variant: str
    seed: int
    flags: tuple[str, ...]
    epochs: int | None = None  # None: the board's schedule (EPOCHS); else a longer one (the converged table)
    lr: str | None = None  # None: the recipe's rate; else the last ``--lr`` of the command (the learning-rate check)
    start_epochs: int | None = None  # large board: the schedule of the small-board run it starts from (None: EPOCHS)

    @property
    def grid(self) -> int:
        return GRIDS[self.board]

    @property
    def schedule(self) -> int:
        return self.epochs or EPOCHS[self.board]

    @property
    def out(self) -> Path:
        name = self.variant.replace("±", "offset").replace("+", "plus-").replace(" ", "-")
        long = f"-e{self.epochs}" if self.epochs else ""
        rate = f"-lr{self.lr}" if self.lr else ""
        start = f"-from-e{self.start_epochs}" if self.start_epochs else ""
        return RUNS / f"{self.task}-g{self.grid}-{name}-s{self.seed}{long}{rate}{start}"

    @property
    def model(self) -> Path:
        """The finished model, kept beside the results (``runs/`` is scratch space a new machine does not have)."""
        return MODELS / f"{self.out.name}.safetensors"

    @property
    def source(self) -> Run | None:
        """The small-board run a large-board run starts from (same variant, seed and flags); ``None`` for small."""
        if self.board == "small":
            return None
        return Run(self.task, "small", self.variant, self.seed, self.flags, self.start_epochs, self.lr)

    def command(self) -> list[str]:
        data = f"{self.task}:grid={self.grid},train={IMAGES['train']},val={IMAGES['val']}"
        start = ["--init-from", os.path.relpath(self.source.model, ROOT)] if self.source else []
        return [
            *(sys.executable, "-m", "ssog_core.train", "--data", data, *RECIPE, "--epochs", str(self.schedule)),
            *start,
            *self.flags,
            *(("--lr", self.lr) if self.lr else ()),
            *("--seed", str(self.seed), "--out", os.path.relpath(self.out, ROOT)),
        ]

    def key(self) -> tuple[str, int, str, int, int, str | None, int | None]:
        return self.task, self.grid, self.variant, self.seed, self.schedule, self.lr, self.start_epochs


def plan(task: str, boards: tuple[str, ...]) -> list[Run]:
    """Every run, in the order a sweep starts them: the early table (seed by seed, then the offset rows), then the
    converged table: seed 0 of every row (the app's models), the dot twin at the check's rates (whether a rate frees
    it), seeds 1 and 2, +μδ at the check's rates, and last the large board from each converged model."""
    rows = [*VARIANTS.items(), OFFSET_ROW]
    runs = [Run(task, b, v, s, tuple(f)) for s in SEEDS for b in boards for v, f in VARIANTS.items()]
    runs += [Run(task, b, OFFSET_ROW[0], s, tuple(OFFSET_ROW[1])) for s in SEEDS for b in boards]
    if "small" in boards:

        def small(variant: str, seed: int, lr: str | None = None) -> Run:
            return Run(task, "small", variant, seed, tuple(dict(rows)[variant]), CONVERGED, lr)

        check = [(v, r) for v in LR_CHECK["variants"] for r in LR_CHECK["rates"]]
        runs += [small(v, 0) for v, _ in rows]
        runs += [small(v, LR_CHECK["seed"], r) for v, r in check if v == "dot"]
        runs += [small(v, s) for s in SEEDS[1:] for v, _ in rows]
        runs += [small(v, LR_CHECK["seed"], r) for v, r in check if v != "dot"]
    if "large" in boards:
        runs += [Run(task, "large", v, s, tuple(f), start_epochs=CONVERGED) for s in SEEDS for v, f in rows]
    return runs


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_results() -> list[dict]:
    return read_rows(RESULTS)


_write_lock = threading.Lock()


@contextmanager
def file_lock(path: Path, wait: bool = True) -> Iterator[bool]:
    """An exclusive lock on ``path`` shared with other processes (two sweeps at once, e.g. one per board); yields
    whether it was taken (``wait=False`` does not block)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def row_epochs(row: dict) -> int:
    """A row's schedule in epochs (rows written before the plateau diagnostic ran the board's schedule)."""
    return row.get("epochs") or EPOCHS[next(b for b, g in GRIDS.items() if g == row["grid"])]


def row_key(row: dict) -> tuple[str, int, str, int, int, str | None, int | None]:
    """The same key as :meth:`Run.key`, of a results row."""
    return (
        row["task"],
        row["grid"],
        row["variant"],
        row["seed"],
        row_epochs(row),
        row.get("lr"),
        row.get("start_epochs"),
    )


def is_table_row(row: dict) -> bool:
    """A row of the early table (the boards' schedules at the recipe's rate, the large board from the early small
    board), not of the converged table or the learning-rate check."""
    early = row_epochs(row) == EPOCHS[next(b for b, g in GRIDS.items() if g == row["grid"])]
    return early and row.get("lr") is None and row.get("start_epochs") is None


def append_row(path: Path, row: dict) -> None:
    """Add one run's row (replacing an older one of the same run), rewriting the file atomically (a kill leaves
    the old file or the new one)."""
    with _write_lock, file_lock(path.with_name(path.name + ".lock")):
        rows = [r for r in read_rows(path) if row_key(r) != row_key(row)]
        text = "".join(json.dumps(r) + "\n" for r in [*rows, row])
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def append_result(row: dict) -> None:
    append_row(RESULTS, row)


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``platform.processor()`` where there is no /proc)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())


def provenance(threads: int) -> dict:
    """What trained a run, recorded at each start or resume: the commit and whether the tree was clean (so a
    retrain gap can be traced to code), and the machine (CPU, threads, torch)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "clean": git("status", "--porcelain", "--untracked-files=no") == "" if git("rev-parse", "HEAD") else None,
        "cpu": cpu_model(),
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def train(run: Run, threads: int) -> None:
    """Run (or resume) the training command, recording what runs it; raises when it fails."""
    refuse_if_stopping()  # a stopping sweep records no start
    unpark(run)
    cmd = run.command()
    if (run.out / "train_state.pt").exists() or (run.out / "last.safetensors").exists():
        cmd.append("--resume")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    run.out.mkdir(parents=True, exist_ok=True)
    with open(run.out / "provenance.jsonl", "a") as f:
        f.write(json.dumps(provenance(threads)) + "\n")
    with open(run.out / "sweep.log", "a") as log:
        log.write("$ python " + shlex.join(cmd[1:]) + "\n")
        log.flush()
        code, _ = run_child(cmd, log, cwd=ROOT, env=env)  # it ends with the sweep (else a rerun trains it twice)
    if code != 0:
        raise RuntimeError(f"{run.out.name}: training exited with {code}; see {run.out / 'sweep.log'}")


def evaluate(run: Run) -> dict:
    """The finished run's row: accuracy on every validation image, per-image correctness, gates, CPU time."""
    model, meta = load_checkpoint(run.model)
    data = load_eval_set(meta, model.config.img_size, IMAGES["val"])
    correct = outcomes(model, data).correct(data.labels).numpy()
    metrics = read_rows(run.out / "metrics.jsonl")
    return {
        "task": run.task,
        "grid": run.grid,
        "variant": run.variant,
        "seed": run.seed,
        "epochs": run.schedule,
        "lr": run.lr,
        "start_epochs": run.start_epochs,
        "steps": metrics[-1]["step"],
        "curve": [{"step": m["step"], "val_acc": m["val_acc"]} for m in metrics],
        "params": sum(p.numel() for p in model.parameters()),
        "cpu_s": round(sum(m["epoch_cpu_s"] for m in metrics), 1),
        "val_acc": float(correct.mean()),
        "val_images": len(correct),
        "gate_scales": gate_summary(model),
        "max_offset": model.config.max_offset if run.variant != "dot" else None,
        "command": "python " + shlex.join(run.command()[1:]),
        "trained_by": read_rows(run.out / "provenance.jsonl"),  # one entry per start or resume
        "correct_hex": np.packbits(correct.astype(np.uint8)).tobytes().hex(),
    }


def train_run(run: Run, threads: int) -> bool:
    """Train (or resume) ``run`` under its lock, keep its model and append its rows; False when another sweep holds
    the lock (it trains the run)."""
    with file_lock(run.out.with_name(run.out.name + ".lock"), wait=False) as mine:
        if not mine:
            return False
        train(run, threads)
        run.model.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(run.model, lambda tmp: shutil.copyfile(run.out / "model.safetensors", tmp))
        append_result(evaluate(run))
        append_row(READINGS, read(run))
        shutil.rmtree(PARKED / run.out.name, ignore_errors=True)
    return True


def park(run: Run) -> bool:
    """Copy an unfinished run's resumable state (a few MB) to :data:`PARKED`, which is committed, so the next
    session's fresh checkout resumes it (``runs/`` is scratch space a new machine does not have); False when the
    run has no state."""
    if not (run.out / "train_state.pt").exists():
        return False
    dest = PARKED / run.out.name
    dest.mkdir(parents=True, exist_ok=True)
    for name in RESUME_FILES:
        if (run.out / name).exists():
            atomic_write(dest / name, lambda tmp, src=run.out / name: shutil.copyfile(src, tmp))
    return True


def unpark(run: Run) -> None:
    """Put a parked run's state back into its folder when the folder has none (a fresh checkout)."""
    src = PARKED / run.out.name
    if not src.is_dir() or (run.out / "train_state.pt").exists():
        return
    run.out.mkdir(parents=True, exist_ok=True)
    for name in RESUME_FILES:
        if (src / name).exists():
            atomic_write(run.out / name, lambda tmp, f=src / name: shutil.copyfile(f, tmp))


def cmd_park(args: argparse.Namespace) -> int:
    """Park every unfinished run that has state (run it before a session ends; ``train`` resumes from it)."""
    done = {row_key(r) for r in read_results()}
    for run in plan(args.task, tuple(GRIDS)):
        if run.key() not in done and park(run):
            print(f"parked {run.out.name}", flush=True)
    return 0


def train_job(run: Run, threads: int, progress, stopped) -> bool:
    """:func:`train_run` as a job of :class:`ssog_core.runtime.jobs.Engine` (what a cluster's worker runs)."""
    return train_run(run, threads)


def stopping() -> bool:
    """Whether the sweep is stopping (a signal within ``stop_children_on_signal``)."""
    try:
        refuse_if_stopping()
    except Stopped:
        return True
    return False


def cmd_train(args: argparse.Namespace) -> int:
    """Train every unfinished run, ``--jobs`` at a time, each worker taking the first run in plan order (seed by
    seed) that can start: a large-board run once the small-board model it starts from is kept. So a partial sweep
    holds whole seeds, and seed 0's large-board trio (the app's models) comes early."""
    torch.set_num_threads(1)
    boards = tuple(GRIDS) if args.only is None else (args.only,)
    variants = set(args.variant or [*VARIANTS, OFFSET_ROW[0]])
    selected = [r for r in plan(args.task, boards) if r.variant in variants and r.seed in args.seeds]
    taken: set[Path] = set()  # started by this sweep (running, done, failed or left to another sweep)
    running: set[Path] = set()
    failed: list[str] = []
    changed = threading.Condition()

    def unfinished() -> list[Run]:
        """Runs without a row or without their kept model (finished before models were kept: trained again, the
        same command)."""
        done = {row_key(r) for r in read_results()}
        return [r for r in selected if not (r.key() in done and r.model.exists())]

    def next_run() -> Run | None:
        """The next run to start, waiting while one this sweep is training holds the model it starts from;
        ``None`` when nothing left can start."""
        with changed:
            while True:
                left = [r for r in unfinished() if r.out not in taken]
                ready = [r for r in left if r.source is None or r.source.model.exists()]
                if ready:
                    taken.add(ready[0].out)
                    running.add(ready[0].out)
                    return ready[0]
                if not any(r.source.out in running for r in left):
                    return None
                changed.wait()

    engine = Engine.cluster(args.cluster, args.threads, shared_files=True) if args.cluster else None

    def one(run: Run) -> None:
        refuse_if_stopping()  # a stopping sweep starts (and logs) nothing
        print(f"start  {run.out.name}" + (f" on {engine.where}" if engine else ""), flush=True)
        if engine is None:
            trained = train_run(run, args.threads)
        else:
            try:
                trained = engine.submit(train_job, run, args.threads).result(stop=stopping)
            except Cancelled:  # stopped before a worker took it
                raise Stopped("stopping: no new run starts") from None
        if not trained:
            print(f"skip   {run.out.name}: another sweep is training it", flush=True)
            return
        print(f"done   {run.out.name}", flush=True)

    def worker() -> None:
        while (run := next_run()) is not None:
            try:
                one(run)
            except Exception as e:  # one failed run must not stop the others; it is named at the end
                failed.append(f"{run.out.name}: {e}")
            finally:
                with changed:
                    running.discard(run.out)
                    changed.notify_all()

    todo = unfinished()
    print(f"{len(selected) - len(todo)} runs finished, {len(todo)} to go", flush=True)
    try:
        with stop_children_on_signal(), ThreadPoolExecutor(args.jobs) as pool:
            for f in [pool.submit(worker) for _ in range(args.jobs)]:
                f.result()
    finally:
        if engine is not None:
            engine.close()
    for run in unfinished():
        if run.out not in taken:
            print(f"wait   {run.out.name}: starts from {run.source.out.name}, not finished", flush=True)
    for f in failed:
        print("FAILED", f, file=sys.stderr)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------- reading


def gate_closing(model: torch.nn.Module, data, taps: tuple[str, ...]) -> dict:
    """Close ``taps`` in every layer: accuracy unedited → edited with its paired interval, and what the edited
    model predicts (a collapse onto one class reads as chance by accuracy but is not chance)."""
    edits = [{"op": "close_gate", "layer": layer, "tap": tap} for layer in range(model.config.depth) for tap in taps]
    unedited, closed = outcomes(model, data), outcomes(model, data, edits)
    effect = compare(unedited, closed, data.labels, data.class_names)
    counts = np.bincount(closed.pred.numpy(), minlength=len(data.class_names))
    return {
        "closed": "+".join(taps),
        "unedited": effect.accuracy.unedited,
        "edited": effect.accuracy.edited,
        "ci95": list(effect.accuracy.ci95),
        "within_noise": effect.accuracy.within_noise,
        "predicted": dict(zip(data.class_names, counts.tolist(), strict=True)),
    }


def transfer_until_it_falls(model: torch.nn.Module, meta: dict, task: str, grid: int, fall: float = 0.1) -> list:
    """Zero-shot accuracy on larger boards (the same scenes, more cells), ``TRANSFER_STEP`` cells at a time, until
    it is ``fall`` below the best seen or the board doubles; each row says how far the nearest evidence lies in
    cells there, and whether that is beyond the deepest layer's reach plus the offset bound (where the bound
    should bite)."""
    patch = model.config.patch_size
    reach = layer_geometry(model)[-1]["reach"] if model.config.attn == "ssog" else None
    rows, best = [], 0.0
    for g in range(grid, 2 * grid + 1, TRANSFER_STEP):
        (row,) = evaluate_model_sizes(model, meta["data"], [(g * patch, g * patch)], meta.get("class_names"),
                                      max_images=READ_IMAGES)  # fmt: skip
        nearest = MIN_DISTANCE[task](grid) * g / grid
        bites = None if reach is None else nearest > reach + model.config.max_offset
        rows.append(
            {"grid": g, "accuracy": row["accuracy"], "nearest_evidence": round(nearest, 2), "bound_bites": bites}
        )
        best = max(best, row["accuracy"])
        if row["accuracy"] < best - fall:
            break
    return rows


def read(run: Run) -> dict:
    """The project's instrument on one finished run: geometry per layer, gates closed, resolution transfer."""
    model, meta = load_checkpoint(run.model)
    data = load_eval_set(meta, model.config.img_size, READ_IMAGES)
    ssog = model.config.attn == "ssog"
    steered = tuple(model.config.steer) if ssog else ()
    closings = ([("mu",)] if "mu" in steered else []) + ([steered] if steered else [])  # μ gates, then every gate
    return {
        "task": run.task,
        "grid": run.grid,
        "variant": run.variant,
        "seed": run.seed,
        "epochs": run.schedule,
        "lr": run.lr,  # the learning-rate check's runs are read too, and kept apart from the table's by these two
        "start_epochs": run.start_epochs,
        "layers": layer_geometry(model) if ssog else None,
        "gates_closed": [gate_closing(model, data, taps) for taps in closings],
        "transfer": transfer_until_it_falls(model, meta, run.task, run.grid),
        **target_shares(model, meta, run.task),
    }


def target_shares(model: torch.nn.Module, meta: dict, task: str) -> dict:
    """On ``pointer``: the target share per layer (``ssog_core.interventions.target_share``) on the first
    :data:`READ_IMAGES` validation images, with the μ gates closed for a model that steers μ, and each image's share
    per layer (rounded), so the report can pair two runs image by image."""
    if task != "pointer":
        return {}
    return {"target_share": target_share_report(model, meta, READ_IMAGES, per_image=True)}


def cmd_read(args: argparse.Namespace) -> int:
    """Read every finished run of ``--seeds`` not read yet (or converged and read before the target share) into the
    readings file; give a results row written before rows kept their curve the curve its model's history holds."""
    torch.set_num_threads(args.threads)
    for row in read_results():
        if "curve" not in row and (curve := val_curve(row)):
            append_result({**row, "curve": [{"step": s, "val_acc": a} for s, a in curve]})
    done = {row_key(r) for r in read_results()}
    have = {row_key(r) for r in read_rows(READINGS) if "target_share" in r or args.task != "pointer" or is_table_row(r)}
    for run in plan(args.task, tuple(GRIDS)):
        if run.key() in done and run.key() not in have and run.seed in args.seeds:
            if not run.model.exists():
                print(f"skip   {run.out.name}: its model was not kept", flush=True)
                continue
            print(f"read   {run.out.name}", flush=True)
            append_row(READINGS, read(run))
    return 0


# ----------------------------------------------------------------------------------------------------- report


def correct_of(row: dict) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(row["correct_hex"]), dtype=np.uint8))
    return bits[: row["val_images"]].astype(np.float64)


def contrast(rows: list[dict], a: str, b: str) -> tuple[float, tuple[float, float], list[float]] | None:
    """Mean over paired seeds of accuracy(a) − accuracy(b), with a 95% bootstrap interval over the validation
    images (the same draws for every seed), and each seed's difference (the interval does not cover the spread
    between training runs; the seeds show it); ``None`` without a seed both variants finished."""
    by = {(r["variant"], r["seed"]): r for r in rows}
    seeds = sorted(s for (v, s) in by if v == a and (b, s) in by)
    if not seeds:
        return None
    per_seed = [correct_of(by[a, s]) - correct_of(by[b, s]) for s in seeds]
    diff = np.mean(per_seed, axis=0)
    return float(diff.mean()), bootstrap_ci(diff), [float(d.mean()) for d in per_seed]


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}"


PLATEAU_EXIT = 2 / 3  # validation accuracy at which a run has left its plateau (above the 1/3 of ignoring the cue)
RULE = (
    "A contrast is *decided* when its paired difference has the same sign in all three seeds and its 95% interval "
    "over images excludes 0. An early claim *survives* when the converged contrast is decided with the same sign, "
    "*flips* when it is decided with the opposite sign, and *does not hold* when it is no longer decided; a contrast "
    "undecided early and decided at convergence is *decided now*; one with fewer than three converged seeds stays "
    "*open*."
)


def curve_of(row: dict) -> list[tuple[int, float]]:
    """(step, validation accuracy) at each evaluation: the row's own ``curve``, else its kept model's history."""
    if row.get("curve"):
        return [(int(c["step"]), float(c["val_acc"])) for c in row["curve"]]
    return val_curve(row)


def plateau_exit(row: dict) -> int | None:
    """The first evaluated step at or above :data:`PLATEAU_EXIT`; ``None`` when the run never got there."""
    return next((step for step, acc in curve_of(row) if acc >= PLATEAU_EXIT), None)


def is_converged(row: dict) -> bool:
    """A row of the converged table: the small board on the long schedule, or the large board continued from it."""
    if row.get("lr") is not None:
        return False
    return row.get("start_epochs") == CONVERGED or (row["grid"] == GRIDS["small"] and row_epochs(row) == CONVERGED)


def decided(c: tuple[float, tuple[float, float], list[float]] | None) -> int:
    """+1 / −1 when a contrast is decided (:data:`RULE`) in that direction, else 0."""
    if c is None or len(c[2]) < len(SEEDS):
        return 0
    signs = {int(np.sign(d)) for d in c[2]}
    outside = c[1][0] > 0 or c[1][1] < 0
    return signs.pop() if len(signs) == 1 and outside and 0 not in signs else 0


def verdict(early: tuple | None, late: tuple | None) -> str:
    """What became of the early contrast at convergence, by :data:`RULE`."""
    if late is None or len(late[2]) < len(SEEDS):
        return f"open ({0 if late is None else len(late[2])} of {len(SEEDS)} seeds)"
    before, after = decided(early), decided(late)
    if before and after:
        return "survives" if before == after else "flips"
    if before:
        return "does not hold"
    return "decided now" if after else "open"


def accuracy_cell(accs: list[float]) -> str:
    """Accuracies (%) of a row's seeds as "mean ± std (n=k)"; "—" without any."""
    std = f" ± {np.std(accs, ddof=1):.1f}" if len(accs) > 1 else ""
    return f"{np.mean(accs):.1f}{std} (n={len(accs)})" if accs else "—"


def _contrast_cell(c: tuple | None) -> str:
    if c is None:
        return "—"
    return f"{_pct(c[0])} [{_pct(c[1][0])}, {_pct(c[1][1])}] (seeds: {' '.join(_pct(d) for d in c[2])})"


def _steps(step: int | None, total: int) -> str:
    return f"{step:,}" if step is not None else f"not within {total:,}"


def converged_section(task: str, rows: list[dict]) -> list[str]:
    """The converged table: accuracy, when each run left its plateau, paired contrasts judged against the early table
    by :data:`RULE`, the learning-rate check, and the target share of every run read."""
    rows = [r for r in rows if r["task"] == task]
    conv = [r for r in rows if is_converged(r)]
    early = [r for r in rows if is_table_row(r)]
    if not conv:
        return []
    grids = sorted({r["grid"] for r in conv})
    out = [
        f"**At convergence.** Validation accuracy (%) on `{task}`, mean ± std over seeds (n = seeds finished), "
        f"{IMAGES['val']} validation images per run: {CONVERGED} epochs ({CONVERGED * 250:,} steps) on the "
        f"{GRIDS['small']}×{GRIDS['small']} board from scratch, then {EPOCHS['large']} epochs on the "
        f"{GRIDS['large']}×{GRIDS['large']} board from each converged model; steps to leave the plateau: the first "
        "evaluation at ≥ 2/3 validation accuracy, per seed:",
        "",
        "| variant | " + " | ".join(f"{g}×{g} board | left the plateau ({g}×{g})" for g in grids) + " |",
        "|---|" + "---:|---|" * len(grids),
    ]
    for variant in [*VARIANTS, OFFSET_ROW[0]]:
        cells = []
        for g in grids:
            mine = sorted((r for r in conv if r["grid"] == g and r["variant"] == variant), key=lambda r: r["seed"])
            accs = [100 * r["val_acc"] for r in mine]
            cells.append(accuracy_cell(accs))
            cells.append("; ".join(f"s{r['seed']}: {_steps(plateau_exit(r), r['steps'])}" for r in mine) or "—")
        out.append(f"| {variant} | " + " | ".join(cells) + " |")
    out += ["", f"Paired differences (points) at convergence, as in the early table below, each judged against the "
            f"early table's by the rule written down before the runs finished: {RULE}", "",
            "| contrast | " + " | ".join(f"{g}×{g} at convergence | early {g}×{g} | verdict" for g in grids) + " |",
            "|---|" + "---:|---:|---|" * len(grids)]  # fmt: skip
    for a, b in [*CONTRASTS, (OFFSET_ROW[0], "steered")]:
        cells = []
        for g in grids:
            late = contrast([r for r in conv if r["grid"] == g], a, b)
            before = contrast([r for r in early if r["grid"] == g], a, b)
            cells += [_contrast_cell(late), _contrast_cell(before), verdict(before, late)]
        out.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
    out += rate_table(rows)
    out += readings_table(task, is_converged)
    out += target_share_table(task)
    out += [
        "",
        "Validation accuracy against step, every run (seeds as thin lines): `docs/figures/ablation_curves.png`.",
    ]
    return out


def curves_figure(task: str, rows: list[dict], path: Path) -> None:
    """Validation accuracy against step, one panel per variant and board (seeds as thin lines, converged runs solid,
    early runs dashed): when each variant leaves its plateau, and how far its seeds spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = [*VARIANTS, OFFSET_ROW[0]]
    colours = dict(zip(order, ("#7f7f7f", "#d62728", "#1f77b4", "#2ca02c", "#9467bd"), strict=True))
    fig, axes = plt.subplots(2, len(order), figsize=(3.2 * len(order), 6.4), sharey=True, squeeze=False)
    for i, board in enumerate(("small", "large")):
        g = GRIDS[board]
        for j, variant in enumerate(order):
            ax = axes[i, j]
            mine = [r for r in rows if r["task"] == task and r["grid"] == g and r["variant"] == variant
                    and r.get("lr") is None]  # fmt: skip
            for r in sorted(mine, key=lambda r: r["seed"]):
                curve = curve_of(r)
                if curve:
                    early = is_table_row(r)
                    ax.plot(*zip(*curve, strict=True), color=colours[variant], lw=0.9, alpha=0.45 if early else 0.9,
                            ls="--" if early else "-")  # fmt: skip
            ax.axhline(PLATEAU_EXIT, color="k", lw=0.6, ls=":")
            ax.axhline(1 / 3, color="k", lw=0.4, ls="-.")
            ax.set_title(f"{variant}, {g}×{g}" + (" (from 14×14)" if board == "large" else ""), fontsize=9)
            ax.tick_params(labelsize=7)
            if i == 1:
                ax.set_xlabel("step (of this board's run)", fontsize=8)
        axes[i, 0].set_ylabel("validation accuracy", fontsize=8)
    fig.suptitle(f"{task}: each seed a thin line; converged runs solid, early runs dashed; "
                 "dotted: 2/3 (left the plateau), dash-dot: 1/3", fontsize=10)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def rate_table(rows: list[dict]) -> list[str]:
    """The learning-rate check: each checked variant at every rate it ran, seed 0, small board, 40 epochs."""
    seed = LR_CHECK["seed"]
    mine = [r for r in rows if r["grid"] == GRIDS["small"] and row_epochs(r) == CONVERGED and r["seed"] == seed
            and r["variant"] in LR_CHECK["variants"]]  # fmt: skip
    if not any(r.get("lr") for r in mine):
        return []
    out = ["", f"The learning-rate check (seed {seed}, {GRIDS['small']}×{GRIDS['small']} board, {CONVERGED} epochs; "
           "the rate is the command's last `--lr`, 6e-4 the recipe's):", "",
           "| variant | lr | validation accuracy | left the plateau |", "|---|---:|---:|---|"]  # fmt: skip
    for r in sorted(mine, key=lambda r: (LR_CHECK["variants"].index(r["variant"]), float(r.get("lr") or 6e-4))):
        out.append(f"| {r['variant']} | {r.get('lr') or '6e-4'} | {100 * r['val_acc']:.1f} | "
                   f"{_steps(plateau_exit(r), r['steps'])} |")  # fmt: skip
    checked = {r["lr"]: r for r in mine if r["variant"] == "dot" and r.get("lr") in LR_CHECK["rates"]}
    if len(checked) == len(LR_CHECK["rates"]):  # the rule's verdict once the dot twin ran at every checked rate
        freed = [lr for lr, r in checked.items() if plateau_exit(r) is not None]
        rates = ", ".join(sorted([*checked, "6e-4"], key=float))
        out += [
            "",
            f"The dot twin leaves its plateau at lr {', '.join(freed)}: by the rule, dot and +mu run three "
            "seeds at that rate, reported beside the same-recipe table."
            if freed
            else f"The dot twin leaves its plateau at none of the rates ({rates}; seed {seed}): over that range "
            "its plateau is not its learning rate, and by the rule no dot / +mu pair runs at another rate.",
        ]
    return out


def target_share_table(task: str) -> list[str]:
    """Every converged run read: the target share per layer with its interval, and its change with the μ gates
    closed; then per contrast and layer the paired difference over the same images, mean over seeds."""
    order = [*VARIANTS, OFFSET_ROW[0]]
    read_ = [r for r in read_rows(READINGS) if r["task"] == task and "target_share" in r and is_converged(r)]
    if not read_:
        return []
    read_.sort(key=lambda r: (r["grid"], order.index(r["variant"]), r["seed"]))
    n = read_[0]["target_share"]["images"]["first"]
    layers = " | ".join(f"layer {i}" for i in range(len(read_[0]["target_share"]["layers"])))
    rule = "|---|" + "---:|" * len(read_[0]["target_share"]["layers"])
    out = ["", f"Target share (`python -m ssog_core target-share`): of the attention patch queries put on the three "
           f"discs, the share on the disc the cue points at (1/3: not told apart), per layer, first {n} validation "
           "images, 95% interval over images; μ closed: the paired change with every μ gate closed:", "",
           f"| run | {layers} |", rule]  # fmt: skip
    for r in read_:
        ts = r["target_share"]
        cells = []
        for i, layer in enumerate(ts["layers"]):
            cell = f"{layer['share']:.2f} [{layer['ci95'][0]:.2f}, {layer['ci95'][1]:.2f}]"
            if ts["closed_mu"]:
                d = ts["closed_mu"]["change"][i]
                cell += f"; μ closed {d['change']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]"
            cells.append(cell)
        out.append(f"| {r['variant']} g{r['grid']} s{r['seed']} | " + " | ".join(cells) + " |")
    by = {(r["grid"], r["variant"], r["seed"]): np.asarray(r["target_share"]["per_image"]) for r in read_}
    lines = []
    for g in sorted({r["grid"] for r in read_}):
        for a, b in CONTRASTS:
            seeds = [s for s in SEEDS if (g, a, s) in by and (g, b, s) in by]
            if not seeds:
                continue
            diff = np.mean([by[g, a, s] - by[g, b, s] for s in seeds], axis=0)  # (n, L)
            ci = np.atleast_2d(bootstrap_ci(diff.T))
            cells = [f"{diff[:, i].mean():+.2f} [{ci[i, 0]:+.2f}, {ci[i, 1]:+.2f}]" for i in range(diff.shape[1])]
            lines.append(f"| {a} − {b}, g{g} ({len(seeds)} seed{'s' * (len(seeds) > 1)}) | " + " | ".join(cells) + " |")
    if lines:
        out += ["", "Paired differences of the target share (mean over the seeds both read, 95% interval over images):",
                "", f"| contrast | {layers} |", rule, *lines]  # fmt: skip
    return out


def early_section(task: str, rows: list[dict]) -> list[str]:
    """The early table: the boards' first schedules (3,000 steps on the small board, +1,500 on the large)."""
    long = [r for r in rows if r["task"] == task and is_converged(r) and r["grid"] == GRIDS["small"]]
    rows = [r for r in rows if r["task"] == task and is_table_row(r)]
    grids = sorted({r["grid"] for r in rows})
    out = [
        f"**Early learning.** Validation accuracy (%) on `{task}`, mean ± std over seeds (n = seeds finished), "
        f"{IMAGES['val']} validation images per run, {EPOCHS['small']} epochs on the small board and "
        f"{EPOCHS['large']} more on the large:",
        "",
        "| variant | " + " | ".join(f"{g}×{g} board" for g in grids) + " |",
        "|---|" + "---:|" * len(grids),
    ]
    for variant in [*VARIANTS, OFFSET_ROW[0]]:
        cells = []
        for g in grids:
            accs = [100 * r["val_acc"] for r in rows if r["grid"] == g and r["variant"] == variant]
            cells.append(accuracy_cell(accs))
        out.append(f"| {variant} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Paired differences (points), mean over the seeds both finished, 95% bootstrap interval over images "
        "(it does not cover the spread between training runs: each seed's difference follows):",
        "",
        "| contrast | " + " | ".join(f"{g}×{g}" for g in grids) + " |",
        "|---|" + "---:|" * len(grids),
    ]
    for a, b in [*CONTRASTS, (OFFSET_ROW[0], "steered")]:
        cells = []
        for g in grids:
            grid_rows = [r for r in rows if r["grid"] == g]
            c = contrast(grid_rows, a, b)
            cells.append(
                "—"
                if c is None
                else f"{_pct(c[0])} [{_pct(c[1][0])}, {_pct(c[1][1])}] (seeds: {' '.join(_pct(d) for d in c[2])})"
            )
        out.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
    out += readings_table(task)
    out += plateau_table(long, rows)
    return out


def render(task: str, rows: list[dict]) -> str:
    """The marked section of docs/RESULTS.md: the converged table first, then the early one."""
    mine = [r for r in rows if r["task"] == task]
    converged = converged_section(task, rows)
    out = [*converged, *([""] if converged else []), *early_section(task, rows)]
    cpu = sum(r["cpu_s"] for r in mine) / 3600
    out += [
        "",
        f"{len(mine)} runs, {cpu:.1f} CPU-hours of training (one thread each). "
        "Command: `python experiments/ablation.py train && python experiments/ablation.py report`.",
    ]
    return "\n".join(out) + "\n"


def model_of(row: dict) -> Path:
    """The kept model of a results row."""
    board = next(b for b, g in GRIDS.items() if g == row["grid"])
    epochs = None if row_epochs(row) == EPOCHS[board] else row_epochs(row)
    return Run(
        row["task"], board, row["variant"], row["seed"], (), epochs, row.get("lr"), row.get("start_epochs")
    ).model


def val_curve(row: dict) -> list[tuple[int, float]]:
    """(step, validation accuracy) at every evaluation of the row's run, from the history its kept model stores
    (steps counted from the run's own start); empty when the model was not kept."""
    path = model_of(row)
    history = read_history(path) if path.exists() else None
    if history is None:
        return []
    start = history.stages[-1] if history.stages else 0
    return [(int(step) - start, float(acc)) for step, acc, _ in history.val if step > start]


def accuracy_at(curve: list[tuple[int, float]], step: float) -> str:
    """The last evaluation at or before ``step``, in %."""
    seen = [acc for s, acc in curve if s <= step + 1e-9]
    return f"{100 * seen[-1]:.1f}" if seen else "—"


def plateau_table(long: list[dict], table: list[dict]) -> list[str]:
    """The plateau diagnostic: each long run beside its table run (same variant, board and seed), validation
    accuracy at the same steps and at the same fractions of their schedules."""
    if not long:
        return []
    out = ["", "Plateau diagnostic: validation accuracy (%, the per-epoch evaluation) of the table's run and of the "
           "same recipe on a longer schedule (from scratch, the same seed), at fixed steps and at fractions of each "
           "schedule:", "",
           "| run | steps | at 1,000 | at 2,000 | at 3,000 | 25% | 50% | 75% | 100% | final, all validation images |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in sorted(long, key=lambda r: (r["grid"], r["variant"], r["seed"])):
        twin = [t for t in table if (t["grid"], t["variant"], t["seed"]) == (r["grid"], r["variant"], r["seed"])]
        for row in [*twin, r]:
            curve, steps = val_curve(row), row["steps"]
            points = [*(1000, 2000, 3000), *(f * steps for f in (0.25, 0.5, 0.75, 1.0))]
            cells = [accuracy_at(curve, p) if p <= steps else "—" for p in points]
            out.append(f"| {row['variant']} g{row['grid']} s{row['seed']}, {row_epochs(row)} epochs | "
                       f"{row['steps']} | " + " | ".join(cells) + f" | {100 * row['val_acc']:.1f} |")  # fmt: skip
    return out


def readings_table(task: str, which=is_table_row) -> list[str]:
    """The instrument's readings (``read``) of every run read, one line each, in the table's order (board, variant,
    seed), not in the order the runs finished."""
    order = [*VARIANTS, OFFSET_ROW[0]]
    rows = sorted(
        (r for r in read_rows(READINGS) if r["task"] == task and which(r)),
        key=lambda r: (r["grid"], order.index(r["variant"]) if r["variant"] in order else len(order), r["seed"]),
    )
    if not rows:
        return []
    out = ["", f"The instrument on each run read (`python experiments/ablation.py read`, first {READ_IMAGES} "
           "validation images; closing a gate in every layer, accuracy change with its paired 95% interval and the "
           "edited model's most predicted class; transfer: accuracy on larger boards until it falls, on a fixed random "
           f"{READ_IMAGES} of the validation images, from the training board up, * where the "
           "nearest evidence lies beyond the deepest reach plus the offset bound):", "",
           "| run | deepest reach | most elongated (strips) | close μ | close all | transfer (board: accuracy) |",
           "|---|---:|---:|---|---|---|"]  # fmt: skip
    for r in rows:
        layers = r["layers"] or []
        reach = f"{layers[-1]['reach']:.2f}" if layers else "—"
        shape = (
            f"{max(x['max_elongation'] for x in layers):.1f}× ({sum(x['strips'] for x in layers)})" if layers else "—"
        )
        closed = {c["closed"]: c for c in r["gates_closed"]}

        def effect(c: dict | None) -> str:
            if c is None:
                return "—"
            top = max(c["predicted"], key=c["predicted"].get)
            share = c["predicted"][top] / sum(c["predicted"].values())
            return (
                f"{_pct(c['edited'] - c['unedited'])} [{_pct(c['ci95'][0])}, {_pct(c['ci95'][1])}]; {top} {share:.0%}"
            )

        every = next((c for k, c in closed.items() if k != "mu"), None)
        transfer = ", ".join(
            f"{t['grid']}: {100 * t['accuracy']:.0f}{'*' if t['bound_bites'] else ''}" for t in r["transfer"]
        )
        out.append(f"| {r['variant']} g{r['grid']} s{r['seed']} | {reach} | {shape} | {effect(closed.get('mu'))} | "
                   f"{effect(every)} | {transfer} |")  # fmt: skip
    return out


def cmd_report(args: argparse.Namespace) -> int:
    rows = read_results()
    text = render(args.task, rows)
    curves_figure(args.task, rows, FIGURE)
    path = RESULTS.parent / f"ablation_{args.task}.md"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    replace_section(DOC, MARKS, f"{MARKS[0]}\n{text}{MARKS[1]}")
    print(text)
    return 0


def bundle_name(variant: str, task: str, grid: int) -> str:
    return f"{BUNDLE[variant]}_{task}{grid}.safetensors"


def cmd_bundle(args: argparse.Namespace) -> int:
    """Copy the finished steered / +μδ / fixed / dot runs of one seed, board and schedule into ``--out`` with their
    transfer curve."""
    torch.set_num_threads(args.threads)
    done = {row_key(r) for r in read_results()}
    small = None if args.epochs == EPOCHS["small"] else args.epochs  # the small board's schedule, or the early one
    epochs, start = (small, None) if args.board == "small" else (None, small)
    runs = [Run(args.task, args.board, v, args.seed, tuple(VARIANTS[v]), epochs, start_epochs=start) for v in BUNDLE]
    missing = [r.out.name for r in runs if r.key() not in done]
    if missing:
        print(f"error: not finished yet: {', '.join(missing)} (run `train` first)", file=sys.stderr)
        return 2
    for run in runs:
        dest = args.out / bundle_name(run.variant, run.task, run.grid)
        atomic_write(dest, lambda tmp, src=run.model: shutil.copyfile(src, tmp))
        model, meta = load_checkpoint(dest)
        sizes = transfer_sizes(tuple(model.config.img_size), model.config.patch_size)
        rows = evaluate_model_sizes(model, meta["data"], sizes, meta.get("class_names"), max_images=READ_IMAGES)
        update_metadata(dest, {TRANSFER_KEY: json.dumps(transfer_curve(rows))})
        print(f"{dest}: {dest.stat().st_size / 2**20:.2f} MB, accuracy {meta['accuracy']:.4f}, transfer "
              + ", ".join(f"{r['grid'][0]}: {r['accuracy']:.3f}" for r in rows))  # fmt: skip
    return 0


def seed_set(text: str) -> set[int]:
    return {int(x) for x in text.split(",")}


def main(argv: Iterator[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train, resume or skip every run of the table")
    t.add_argument("--task", default="pointer", choices=("pointer", "relation"))
    t.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    t.add_argument("--threads", type=int, default=1, help="threads per run (default 1)")
    t.add_argument("--only", choices=tuple(GRIDS), help="one board only")
    t.add_argument("--variant", action="append", choices=[*VARIANTS, OFFSET_ROW[0]], help="only these (repeatable)")
    t.add_argument("--seeds", type=seed_set, default=set(SEEDS), help="only these seeds, e.g. 1,2 (default 0,1,2)")
    t.add_argument(
        "--cluster", metavar="ADDRESS", help="run each run on a worker of this Dask scheduler (tcp://HOST:PORT)"
    )
    k = sub.add_parser("park", help="copy unfinished runs' resumable state into experiments/results/parked/")
    k.add_argument("--task", default="pointer", choices=("pointer", "relation"))
    r = sub.add_parser("report", help="render the table from the results file")
    r.add_argument("--task", default="pointer", choices=("pointer", "relation"))
    d = sub.add_parser("read", help="read finished runs with the project's instrument (geometry, gates, transfer)")
    d.add_argument("--task", default="pointer", choices=("pointer", "relation"))
    d.add_argument("--seeds", type=seed_set, default={0}, help="e.g. 0,1,2 (default 0)")
    d.add_argument("--threads", type=int, default=1)
    b = sub.add_parser("bundle", help="copy one seed's steered / +μδ / fixed / dot runs into checkpoints/ for the app")
    b.add_argument("--task", default="pointer", choices=("pointer", "relation"))
    b.add_argument("--board", default="small", choices=tuple(GRIDS))
    b.add_argument(
        "--epochs",
        type=int,
        default=CONVERGED,
        help="the small board's schedule of the runs (or of the "
        f"runs the large board's start from): {CONVERGED} converged (default), {EPOCHS['small']} early",
    )
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", type=Path, default=ROOT / "checkpoints")
    b.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    commands = {"park": cmd_park, "train": cmd_train, "report": cmd_report, "read": cmd_read, "bundle": cmd_bundle}
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
