"""The SSOG post's ablation table on a scene task, as one resumable command: fixed field, +μδ, +μδ +σδ +λ (cold
gates) and the dot twin, three seeds each, on a small and a large board, plus one offset-bound row (±2 against ±4)
per board; every run a plain ``python -m ssog_core.train`` command that differs from its neighbours only in
``--attn`` / ``--steer`` / ``--seed`` (and ``--max-offset`` for the offset row).

    python experiments/ablation.py train  [--task pointer] [--jobs 2] [--only small|large]
    python experiments/ablation.py report [--task pointer]

``train`` skips finished runs (a row in the results file), resumes interrupted ones (``--resume``) and starts the
rest, ``--jobs`` at a time, one thread each; a run killed at any moment goes on from its last checkpoint the next
time. A finished run is evaluated on every validation image and appended to
``experiments/results/ablation.jsonl``: one flat object per run (``task``, ``grid``, ``variant``, ``seed``,
``steps``, ``params``, ``cpu_s``, ``val_acc``, ``gate_scales``, ...) with its per-image correctness packed as hex,
so the report can pair runs image by image. ``report`` renders the table (mean ± std over seeds; paired 95%
bootstrap intervals over the same validation images for steered − fixed, +μδ − fixed and SSOG − dot) into
``experiments/results/ablation_TASK.md`` and the marked section of ``docs/RESULTS.md``.

Why each task should need steering, and the recipe's pilot, are in docs/DATA.md and docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ssog_core import load_checkpoint
from ssog_core.checkpoint.files import atomic_write
from ssog_core.interventions.effects import bootstrap_ci, outcomes
from ssog_core.interventions.validation import load_eval_set

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "ablation.jsonl"
RUNS = ROOT / "runs" / "ablation"
DOC = ROOT / "docs" / "RESULTS.md"
GRIDS = {"small": 14, "large": 20}  # cells a side: the SSOG post's 14×14 grid, and a board where targets lie
# beyond the ±4-cell offset bound from a resting field (20, not 24: the dot twin's step costs 2.4× more at 24)
SEEDS = (0, 1, 2)
IMAGES = {"train": 16000, "val": 2000}
RECIPE = [  # the matched trio's recipe (checkpoints/MODEL_CARD.md) at depth 4, sized by the pilot in docs/RESULTS.md
    *("--dim", "64", "--depth", "4", "--heads", "4", "--batch-size", "64", "--epochs", "12"),
    *("--warmup-epochs", "0.5", "--lr", "6e-4", "--dropout", "0", "--gate-lr-mult", "10", "--field-lr-mult", "3"),
    *("--transfer-sizes", "none", "--no-progress", "--ckpt-every", "50"),
]
VARIANTS = {  # the SSOG post's rows, in its order
    "fixed": ["--attn", "ssog", "--steer", ""],
    "+mu": ["--attn", "ssog", "--steer", "mu"],
    "steered": ["--attn", "ssog", "--steer", "mu,sigma,lambda"],
    "dot": ["--attn", "dot"],
}
OFFSET_ROW = ("steered ±2", ["--attn", "ssog", "--steer", "mu,sigma,lambda", "--max-offset", "2"])
CONTRASTS = (("steered", "fixed"), ("+mu", "fixed"), ("steered", "dot"))
BEGIN, END = "<!-- ablation:begin -->", "<!-- ablation:end -->"


@dataclass(frozen=True)
class Run:
    task: str
    board: str
    variant: str
    seed: int
    flags: tuple[str, ...]

    @property
    def grid(self) -> int:
        return GRIDS[self.board]

    @property
    def out(self) -> Path:
        name = self.variant.replace("±", "offset").replace("+", "plus-").replace(" ", "-")
        return RUNS / f"{self.task}-g{self.grid}-{name}-s{self.seed}"

    def command(self) -> list[str]:
        data = f"{self.task}:grid={self.grid},train={IMAGES['train']},val={IMAGES['val']}"
        out = os.path.relpath(self.out, ROOT)
        return [
            sys.executable,
            "-m",
            "ssog_core.train",
            "--data",
            data,
            *RECIPE,
            *self.flags,
            "--seed",
            str(self.seed),
            "--out",
            out,
        ]

    def key(self) -> tuple[str, int, str, int]:
        return self.task, self.grid, self.variant, self.seed


def plan(task: str, boards: tuple[str, ...]) -> list[Run]:
    """Every run of the table: seed by seed (a partial sweep is balanced), then the offset rows."""
    runs = [Run(task, b, v, s, tuple(f)) for s in SEEDS for b in boards for v, f in VARIANTS.items()]
    return runs + [Run(task, b, OFFSET_ROW[0], 0, tuple(OFFSET_ROW[1])) for b in boards]


def read_results() -> list[dict]:
    if not RESULTS.exists():
        return []
    return [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]


_write_lock = threading.Lock()


def row_key(row: dict) -> tuple[str, int, str, int]:
    """The same key as :meth:`Run.key`, of a results row."""
    return row["task"], row["grid"], row["variant"], row["seed"]


def append_result(row: dict) -> None:
    """Add one run's row, rewriting the file atomically (a kill leaves the old file or the new one)."""
    with _write_lock:
        rows = [r for r in read_results() if (r["task"], r["grid"], r["variant"], r["seed"]) != row_key(row)]
        text = "".join(json.dumps(r) + "\n" for r in [*rows, row])
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(RESULTS, lambda tmp: Path(tmp).write_text(text))


def _die_with_parent() -> None:
    """A training process ends when the sweep is killed (else a rerun would train the same folder twice)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def train(run: Run, threads: int) -> None:
    """Run (or resume) the training command; raises when it fails."""
    cmd = run.command()
    if (run.out / "train_state.pt").exists() or (run.out / "last.safetensors").exists():
        cmd.append("--resume")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    run.out.mkdir(parents=True, exist_ok=True)
    with open(run.out / "sweep.log", "a") as log:
        log.write("$ python " + shlex.join(cmd[1:]) + "\n")
        log.flush()
        code = subprocess.call(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
    if code != 0:
        raise RuntimeError(f"{run.out.name}: training exited with {code}; see {run.out / 'sweep.log'}")


def evaluate(run: Run) -> dict:
    """The finished run's row: accuracy on every validation image, per-image correctness, gates, CPU time."""
    model, meta = load_checkpoint(run.out / "model.safetensors")
    data = load_eval_set(meta, model.config.img_size, IMAGES["val"])
    correct = outcomes(model, data).correct(data.labels).numpy()
    metrics = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    gates = {}
    for block in model.blocks:
        scales = getattr(block.attn, "gate_scales", None)
        for tap, s in (scales() if scales else {}).items():
            gates.setdefault(tap, []).append(round(float(s.detach()), 6))
    return {
        "task": run.task,
        "grid": run.grid,
        "variant": run.variant,
        "seed": run.seed,
        "steps": metrics[-1]["step"],
        "params": sum(p.numel() for p in model.parameters()),
        "cpu_s": round(sum(m["epoch_cpu_s"] for m in metrics), 1),
        "val_acc": float(correct.mean()),
        "val_images": len(correct),
        "gate_scales": gates,
        "max_offset": model.config.max_offset if run.variant != "dot" else None,
        "command": "python " + shlex.join(run.command()[1:]),
        "correct_hex": np.packbits(correct.astype(np.uint8)).tobytes().hex(),
    }


def cmd_train(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    boards = tuple(GRIDS) if args.only is None else (args.only,)
    done = {row_key(r) for r in read_results()}
    todo = [r for r in plan(args.task, boards) if r.key() not in done]
    print(f"{len(done)} runs finished, {len(todo)} to go", flush=True)
    failed = []

    def one(run: Run) -> None:
        try:
            print(f"start  {run.out.name}", flush=True)
            train(run, args.threads)
            append_result(evaluate(run))
            print(f"done   {run.out.name}", flush=True)
        except Exception as e:  # one failed run must not stop the others; it is named at the end
            failed.append(f"{run.out.name}: {e}")

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, todo))
    for f in failed:
        print("FAILED", f, file=sys.stderr)
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------------- report


def correct_of(row: dict) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(row["correct_hex"]), dtype=np.uint8))
    return bits[: row["val_images"]].astype(np.float64)


def contrast(rows: list[dict], a: str, b: str) -> tuple[float, tuple[float, float], int] | None:
    """Mean over paired seeds of accuracy(a) − accuracy(b), with a 95% bootstrap interval over the validation
    images (the same draws for every seed); ``None`` without a seed both variants finished."""
    by = {(r["variant"], r["seed"]): r for r in rows}
    seeds = sorted(s for (v, s) in by if v == a and (b, s) in by)
    if not seeds:
        return None
    diff = np.mean([correct_of(by[a, s]) - correct_of(by[b, s]) for s in seeds], axis=0)
    return float(diff.mean()), bootstrap_ci(diff), len(seeds)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def render(task: str, rows: list[dict]) -> str:
    rows = [r for r in rows if r["task"] == task]
    grids = sorted({r["grid"] for r in rows})
    out = [
        f"Validation accuracy (%) on `{task}`, mean ± std over seeds (n = seeds finished), "
        f"{IMAGES['val']} validation images per run:",
        "",
        "| variant | " + " | ".join(f"{g}×{g} board" for g in grids) + " |",
        "|---|" + "---:|" * len(grids),
    ]
    for variant in [*VARIANTS, OFFSET_ROW[0]]:
        cells = []
        for g in grids:
            accs = [100 * r["val_acc"] for r in rows if r["grid"] == g and r["variant"] == variant]
            std = f" ± {np.std(accs, ddof=1):.1f}" if len(accs) > 1 else ""
            cells.append(f"{np.mean(accs):.1f}{std} (n={len(accs)})" if accs else "—")
        out.append(f"| {variant} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Paired differences (points), mean over the seeds both finished, 95% bootstrap interval over images:",
        "",
        "| contrast | " + " | ".join(f"{g}×{g}" for g in grids) + " |",
        "|---|" + "---:|" * len(grids),
    ]
    for a, b in [*CONTRASTS, (OFFSET_ROW[0], "steered")]:
        cells = []
        for g in grids:
            grid_rows = [r for r in rows if r["grid"] == g]
            if a == OFFSET_ROW[0]:
                grid_rows = [r for r in grid_rows if r["seed"] == 0]
            c = contrast(grid_rows, a, b)
            cells.append("—" if c is None else f"{_pct(c[0])} [{_pct(c[1][0])}, {_pct(c[1][1])}] (seeds={c[2]})")
        out.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
    cpu = sum(r["cpu_s"] for r in rows) / 3600
    out += [
        "",
        f"{len(rows)} runs, {cpu:.1f} CPU-hours of training (one thread each). "
        "Command: `python experiments/ablation.py train && python experiments/ablation.py report`.",
    ]
    return "\n".join(out) + "\n"


def cmd_report(args: argparse.Namespace) -> int:
    text = render(args.task, read_results())
    path = RESULTS.parent / f"ablation_{args.task}.md"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    doc = DOC.read_text()
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        new = head + BEGIN + "\n" + text + rest[rest.index(END) :]
        atomic_write(DOC, lambda tmp: Path(tmp).write_text(new))
    print(text)
    return 0


def main(argv: Iterator[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train, resume or skip every run of the table")
    t.add_argument("--task", default="pointer", choices=("pointer", "relation"))
    t.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    t.add_argument("--threads", type=int, default=1, help="threads per run (default 1)")
    t.add_argument("--only", choices=tuple(GRIDS), help="one board only")
    r = sub.add_parser("report", help="render the table from the results file")
    r.add_argument("--task", default="pointer", choices=("pointer", "relation"))
    args = ap.parse_args(argv)
    return cmd_train(args) if args.command == "train" else cmd_report(args)


if __name__ == "__main__":
    raise SystemExit(main())
