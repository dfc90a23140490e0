"""Distilled students (issue 45, item 4): how much of a dot-product teacher its heads' fitted fields recover when
content learns to steer them; writes experiments/results/distill/ and that section of docs/RESULTS.md.

    python experiments/distill.py [--steps 800] [--seeds 0 1 2] [--teachers layouts pointer digits] [--threads 1]
    python experiments/distill.py --smoke --out /tmp/d --work /tmp/d/work --results /tmp/d/RESULTS.md

Teachers (:data:`TEACHERS`): the matched trio's dot twin on ``layouts`` (``checkpoints/matched_dot_layouts``), the
converged 14×14 ``pointer`` dot twin (10,000 steps, on its 50% plateau), and a transformers ViT with a class token this
script trains on scikit-learn's digits and writes as a transformers folder. Each is distilled by
``python -m ssog_core distill`` (docs/DESIGN.md §2.5) into students that steer ``mu`` and ``mu,sigma,lambda``, seeds
0, 1, 2 (the seed orders the pictures each step draws), ``--steps`` steps each, on the first ``--images`` validation
images (a recorded data set) or training pictures (digits), reported on the ``--eval-images`` after them (the digits'
own validation split). Beside them, SSOG trained from scratch on the same task (:data:`SCRATCH`), scored on the same
held-out images.

The work is cut into units, each kept in experiments/results/distill/ (``--out``) as it finishes with the settings it
was measured under: a teacher (its fit, the step-0 student, the teacher's own accuracy), a student, a from-scratch
model, and the digits teacher's training. A rerun skips every unit kept with today's settings and measures again a
unit whose settings changed (steps, pictures, a retrained teacher's weights, :data:`FORMAT`); a student whose run was
stopped goes on from its last save through the distill command's ``--resume`` (``--ckpt-every`` steps apart), so a
kill -9 at any moment loses at most the current unit's progress since its last save. Students, their resume state
and the digits data live under ``--work`` (``runs/distill``, not committed).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ssog_core.analysis.head_as_field import (
    DIFFUSE_TV,
    FIELD_BATCH,
    FIT_ATOMS,
    AtomFit,
    fit_layers,
    mean_attention,
    patch_attention,
    pattern_points,
    uniform_rows,
)
from ssog_core.checkpoint.files import atomic_write, replace_section, section_markers
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.cli.distill import choose_pictures
from ssog_core.cli.distill import main as distill_main
from ssog_core.distill.loop import Recipe, load_state, state_path
from ssog_core.distill.report import kl_per_image
from ssog_core.distill.student import build_student
from ssog_core.interventions.effects import BOOTSTRAP, bootstrap_ci
from ssog_core.interventions.validation import EvalSet
from ssog_core.nn.hook_points import reading

ROOT = Path(__file__).resolve().parent.parent
MARKS = section_markers("distill")
FORMAT = 1  # what a kept unit holds and how it was measured; a unit of another format is measured again
TEACHERS = {
    "layouts": "checkpoints/matched_dot_layouts.safetensors",
    "pointer": "experiments/results/models/pointer-g14-dot-s0-e40.safetensors",
    "digits": None,  # trained by this script (:data:`DIGITS`)
}
# SSOG trained from scratch on each teacher's task, scored on the same held-out images; a file not there is skipped.
SCRATCH = {
    "layouts": ["checkpoints/matched_ssog_layouts.safetensors"],
    "pointer": [
        *(
            f"experiments/results/models/pointer-g14-{v}-s{s}.safetensors"
            for v in ("steered", "plus-mu")
            for s in (0, 1, 2)
        ),
        *(f"experiments/results/models/pointer-g14-{v}-s0-e40.safetensors" for v in ("steered", "plus-mu")),
    ],
    "digits": [],
}
STEERS = ("mu", "mu,sigma,lambda")
SEEDS = (0, 1, 2)
# The pilot (one thread, niced, this machine busy with two trainings): CPU seconds per distillation step at batch 16.
PILOT_STEP_S = {"layouts": 1.73, "pointer": 1.14, "digits": 0.15}
STEPS = 800  # per student: 18 students at the pilot's step costs ≈ 4.0 CPU-hours, ≤ 6 with the fits and reports
IMAGES, EVAL_IMAGES = 500, 500
BUDGET_H = 6.0
SMOKE = {"steps": 2, "images": 16, "eval_images": 16, "seeds": [0], "digits_epochs": 1}
# The digits teacher: transformers' ViT with a class token on scikit-learn's digits (8×8, upsampled to 16×16 by
# nearest neighbour, patch 2: an 8×8 grid of 64 patches), a fixed stratified 80/20 split.
DIGITS = {"size": 16, "patch": 2, "hidden": 64, "layers": 4, "heads": 4, "mlp": 128, "epochs": 40, "batch": 64,
          "lr": 1e-3, "seed": 0}  # fmt: skip
DIGITS_VAL_SHARE = 0.2
EVAL_BATCH = 16
TRAINING_UNIT = "digits-vit-training.json"  # the digits teacher's training, beside its teacher unit digits-teacher.json

# The rule, written down before any result was read (docs/RESULTS.md repeats it):
# * a head is *recovered by steering* in a student configuration when its normalised share_steered − normalised
#   share_fit is above 0 with its 95% paired bootstrap interval over the held-out images above 0, in every seed;
#   a diffuse head (within DIFFUSE_TV of uniform) has no normalised share and is not judged;
# * steering *recovers the teacher* when every head that is not diffuse is recovered, and, in every seed, the
#   agreement with the teacher rises and the KL to it falls from step 0 to the end with paired intervals excluding 0;
#   steering *recovers part of the teacher* when the predictions improve so but only some heads are recovered;
# * a head *stays content-scored* when its normalised share_steered, mean over seeds, is below CONTENT_SCORED: the
#   steered field explains less than half of the head's departure from uniform.
CONTENT_SCORED = 0.5


# ------------------------------------------------------------------------------------------- units kept


def rel(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it (as docs name files)."""
    path = Path(path).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def fingerprint(path: Path) -> str:
    """sha256 of a file, or of a folder's files (names and bytes, sorted): a retrained or replaced teacher differs."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
    for f in files:
        h.update(f.relative_to(path).as_posix().encode() if Path(path).is_dir() else b"")
        h.update(f.read_bytes())
    return h.hexdigest()


def write_json(path: Path, value: Any) -> None:
    text = json.dumps(value, indent=1)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def kept(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """A unit's numbers from an earlier run under the same ``settings`` (and :data:`FORMAT`), if there are any."""
    if not path.is_file():
        return None
    entry = json.loads(path.read_text(encoding="utf-8"))
    return entry if entry.get("settings") == settings else None


def pack(bits: np.ndarray) -> str:
    """Booleans as hex (the ablation's packing of per-image correctness)."""
    return np.packbits(np.asarray(bits, dtype=bool)).tobytes().hex()


def unpack(text: str, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(bytes.fromhex(text), dtype=np.uint8))[:n].astype(bool)


# ------------------------------------------------------------------------------------------- measuring


def image_shares(attn: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``(B, H)`` 1 − mean TV over patch queries between each image's patch rows ``(B, H, N, N)`` and ``rows``
    (``(H, N, N)`` or ``(B, H, N, N)``): :func:`~ssog_core.analysis.head_as_field.share_of` image by image."""
    return 1.0 - 0.5 * (attn - rows.to(attn.dtype)).abs().sum(-1).mean(-1)


@torch.no_grad()
def per_image(teacher: torch.nn.Module, student: torch.nn.Module, fits: list[AtomFit], data: EvalSet) -> dict:
    """Per held-out image: the teacher's and the student's top class, ``KL(teacher ‖ student)``, and per layer and
    head ``(n, L, H)`` the shares of the teacher's patch rows explained by its fitted field, by the student's steered
    rows and by the uniform field (the report's :func:`~ssog_core.distill.report.head_shares`, image by image)."""
    p = next(student.parameters())
    grid, prefix = student.grid_for(*data.images.shape[1:3]), student.num_prefix_tokens
    fit_rows, flat = [f.rows(grid) for f in fits], uniform_rows(grid)
    t_points, s_points = dict(enumerate(pattern_points(teacher))), dict(enumerate(pattern_points(student)))
    tops, kls, shares = [], [], []
    for start in range(0, len(data), EVAL_BATCH):
        x = data.batch(start, min(start + EVAL_BATCH, len(data)), p.device, p.dtype)
        with reading(t_points, replace=True) as taught:
            t = teacher(x)
        with reading(s_points, replace=True) as learnt:
            s = student(x)
        tops.append(torch.stack([t.argmax(-1), s.argmax(-1)], -1))
        kls.append(kl_per_image(t, s).double())
        layers = []
        for layer in range(len(fits)):
            ta = patch_attention(taught[layer], grid, prefix)[0]
            sa = patch_attention(learnt[layer], grid, prefix)[0]
            layers.append(torch.stack([image_shares(ta, r) for r in (fit_rows[layer], sa, flat)]))
        shares.append(torch.stack(layers, 2))  # (3, B, L, H)
    top, share = torch.cat(tops).numpy(), torch.cat(shares, 1).numpy()
    return {
        "teacher_top": top[:, 0],
        "student_top": top[:, 1],
        "kl": torch.cat(kls).numpy(),
        "share_fit": share[0],
        "share_steered": share[1],
        "share_uniform": share[2],
    }


def ratio_ci(num: np.ndarray, den: np.ndarray, n_boot: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of ``mean(num) / mean(den)`` over images resampled with replacement (``(n,)`` each,
    paired: the same draws for both)."""
    idx = np.random.default_rng(seed).integers(0, len(num), size=(n_boot, len(num)))
    lo, hi = np.quantile(num[idx].mean(-1) / den[idx].mean(-1), [0.025, 0.975])
    return float(lo), float(hi)


def head_numbers(m: dict) -> list[dict[str, Any]]:
    """Per head: the three shares (means over images), both normalised against the uniform field, the difference
    share_steered − share_fit and the normalised difference, each with a paired bootstrap interval over images."""
    heads = []
    _, layers, per_layer = m["share_fit"].shape
    for layer in range(layers):
        for head in range(per_layer):
            fit, steered, flat = (m[k][:, layer, head] for k in ("share_fit", "share_steered", "share_uniform"))
            gap = 1.0 - flat
            diffuse = bool(gap.mean() < DIFFUSE_TV)
            diff = steered - fit
            entry = {
                "layer": layer,
                "head": head,
                "share_fit": float(fit.mean()),
                "share_steered": float(steered.mean()),
                "share_uniform": float(flat.mean()),
                "diffuse": diffuse,
                "difference": float(diff.mean()),
                "difference_ci95": list(bootstrap_ci(diff)),
                "normalised_fit": None,
                "normalised_steered": None,
                "normalised_difference": None,
                "normalised_difference_ci95": None,
            }
            if not diffuse:
                entry |= {
                    "normalised_fit": float((fit - flat).mean() / gap.mean()),
                    "normalised_steered": float((steered - flat).mean() / gap.mean()),
                    "normalised_difference": float(diff.mean() / gap.mean()),
                    "normalised_difference_ci95": list(ratio_ci(diff, gap)),
                }
            heads.append(entry)
    return heads


def predictions(m: dict, labels: np.ndarray | None) -> dict[str, Any]:
    """Per-image agreement, KL and correctness (packed), and their means."""
    agree = m["teacher_top"] == m["student_top"]
    out = {
        "agreement": float(agree.mean()),
        "kl": float(m["kl"].mean()),
        "agreement_bits": pack(agree),
        "kl_per_image": [float(f"{v:.7g}") for v in m["kl"]],
        "accuracy": None,
        "teacher_accuracy": None,
    }
    if labels is not None:
        out |= {
            "accuracy": float((m["student_top"] == labels).mean()),
            "teacher_accuracy": float((m["teacher_top"] == labels).mean()),
            "correct_bits": pack(m["student_top"] == labels),
            "teacher_correct_bits": pack(m["teacher_top"] == labels),
        }
    return out


# ------------------------------------------------------------------------------------------- the digits teacher


def digits_split() -> dict[str, list[tuple[int, int]]]:
    """``{"train"|"held": [(load_digits index, label), ...]}``: a stratified 80/20 split (each class's first fifth
    of a permutation seeded 0 held out), each part in an order seeded 1 so that its first N files mix the classes."""
    from sklearn.datasets import load_digits  # only needed to build the pictures once

    target = load_digits().target
    rng = np.random.default_rng(0)
    parts: dict[str, list[int]] = {"train": [], "held": []}
    for label in range(10):
        idx = rng.permutation(np.flatnonzero(target == label))
        n_held = round(len(idx) * DIGITS_VAL_SHARE)
        parts["held"] += idx[:n_held].tolist()
        parts["train"] += idx[n_held:].tolist()
    order = np.random.default_rng(1)
    return {k: [(int(i), int(target[i])) for i in order.permutation(v)] for k, v in parts.items()}


def digits_pictures(folder: Path, train_n: int, held_n: int) -> dict[str, Any]:
    """The first ``train_n`` / ``held_n`` digits of each part as RGB PNGs ``folder/{train,held}/NNNN.png`` (16×16),
    their labels in ``folder/labels.json``; written whole (a temporary folder renamed), kept while the counts hold."""
    labels_file = folder / "labels.json"
    want = {"train": train_n, "held": held_n, "size": DIGITS["size"]}
    if labels_file.is_file():
        found = json.loads(labels_file.read_text(encoding="utf-8"))
        if found["counts"] == want:
            return found
    from sklearn.datasets import load_digits

    images = load_digits().images
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    labels: dict[str, list[int]] = {}
    for part, chosen in digits_split().items():
        (tmp / part).mkdir(parents=True)
        chosen = chosen[: want[part]]
        for k, (i, _) in enumerate(chosen):
            pixels = np.round(images[i] * (255 / 16)).astype(np.uint8)
            img = Image.fromarray(pixels).resize((DIGITS["size"],) * 2, Image.Resampling.NEAREST).convert("RGB")
            img.save(tmp / part / f"{k:04d}.png")
        labels[part] = [label for _, label in chosen]
    found = {"counts": want, "labels": labels}
    (tmp / "labels.json").write_text(json.dumps(found), encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return found


def train_digits_teacher(folder: Path, epochs: int) -> dict[str, Any]:
    """transformers' ViTForImageClassification (:data:`DIGITS`) trained on every training digit (AdamW, constant
    rate, no augmentation), saved as a transformers folder with its image processor and a README stating its
    licence; its accuracy on the held-out digits."""
    import transformers
    from sklearn.datasets import load_digits

    d = DIGITS
    digits = load_digits()
    split = digits_split()

    def tensors(part: str) -> tuple[torch.Tensor, torch.Tensor]:
        idx = [i for i, _ in split[part]]
        x = torch.tensor(digits.images[idx] / 16.0, dtype=torch.float32)[:, None]
        x = torch.nn.functional.interpolate(x, size=(d["size"],) * 2, mode="nearest").expand(-1, 3, -1, -1)
        x = (torch.round(x * 255) / 255 - 0.5) / 0.5  # the PNGs' 8-bit values, the processor's normalisation
        return x, torch.tensor([label for _, label in split[part]])

    torch.manual_seed(d["seed"])
    config = transformers.ViTConfig(
        image_size=d["size"],
        patch_size=d["patch"],
        num_channels=3,
        hidden_size=d["hidden"],
        num_hidden_layers=d["layers"],
        num_attention_heads=d["heads"],
        intermediate_size=d["mlp"],
        num_labels=10,
        id2label={i: str(i) for i in range(10)},
        label2id={str(i): i for i in range(10)},
    )
    model = transformers.ViTForImageClassification(config)
    x, y = tensors("train")
    opt = torch.optim.AdamW(model.parameters(), lr=d["lr"], weight_decay=0.05)
    gen = torch.Generator().manual_seed(d["seed"])
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=gen).split(d["batch"]):
            loss = torch.nn.functional.cross_entropy(model(x[batch]).logits, y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    hx, hy = tensors("held")
    with torch.no_grad():
        accuracy = float((model(hx).logits.argmax(-1) == hy).float().mean())
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    transformers.ViTImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3, size={"height": d["size"],
                                   "width": d["size"]}).save_pretrained(tmp)  # fmt: skip
    (tmp / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# digits ViT\n\nTrained by experiments/distill.py on scikit-learn's digits.\n",
        encoding="utf-8",
    )
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    steps = epochs * math.ceil(len(x) / d["batch"])
    return {"held_out_accuracy": accuracy, "train_images": len(x), "held_out_images": len(hx), "steps": steps}


# ------------------------------------------------------------------------------------------- the units


@dataclasses.dataclass
class Plan:
    """What one run measures (the command line's settings)."""

    steps: int
    images: int
    eval_images: int
    seeds: list[int]
    teachers: list[str]
    digits_epochs: int
    out: Path
    work: Path
    ckpt_every: int

    @property
    def units(self) -> Path:
        return self.out / "distill"


def teacher_source(plan: Plan, name: str) -> tuple[str, dict[str, Any]]:
    """The teacher's path (the digits ViT trained first when it is not kept) and its training unit, if any."""
    if TEACHERS[name] is not None:
        return str(ROOT / TEACHERS[name]), {}
    folder, epochs = plan.work / "digits_vit", plan.digits_epochs
    settings = {"format": FORMAT, "recipe": {**DIGITS, "epochs": epochs}}
    path = plan.units / TRAINING_UNIT
    entry = kept(path, settings)
    if entry is None or not folder.is_dir() or fingerprint(folder) != entry["fingerprint"]:
        print(f"training the digits ViT ({epochs} epochs)", flush=True)
        t0 = time.process_time()
        found = train_digits_teacher(folder, epochs)
        entry = {"settings": settings, **found, "cpu_s": time.process_time() - t0, "fingerprint": fingerprint(folder)}
        write_json(path, entry)
    return str(folder), entry


def picture_specs(plan: Plan, name: str) -> tuple[str, str, list[int] | None]:
    """``--images`` and ``--eval-images`` of the teacher's students, and the held-out labels where the distill
    command has none (the digits' folders)."""
    if TEACHERS[name] is not None:
        return str(plan.images), str(plan.eval_images), None
    found = digits_pictures(plan.work / "digits", plan.images, plan.eval_images)
    return str(plan.work / "digits" / "train"), str(plan.work / "digits" / "held"), found["labels"]["held"]


def held_out(model: torch.nn.Module, meta: dict, images: str, eval_images: str, labels: list[int] | None):
    """The pictures (the distill command's choice) and the held-out set, labelled where the digits' labels are known."""
    data, held, words = choose_pictures(model, meta, images, eval_images)
    if labels is not None:
        held = dataclasses.replace(held, labels=torch.tensor(labels[: len(held)]))
    return data, held, words


def teacher_unit(plan: Plan, name: str, source: str, trained: dict[str, Any]) -> dict[str, Any]:
    """The teacher on the held-out pictures against its step-0 student (the fitted fields, content steering
    nothing): what every student of it starts from."""
    images, eval_images, labels = picture_specs(plan, name)
    settings = {"format": FORMAT, "teacher": rel(Path(source)), "fingerprint": fingerprint(Path(source)),
                "images": images if labels is None else plan.images, "eval_images": eval_images if labels is None
                else plan.eval_images, "atoms": FIT_ATOMS}  # fmt: skip
    path = plan.units / f"{name}-teacher.json"
    entry = kept(path, settings)
    if entry is not None:
        return entry
    print(f"{name}: fitting the teacher's heads and measuring the step-0 student", flush=True)
    t0 = time.process_time()
    teacher, meta = load_checkpoint(source)
    data, held, words = held_out(teacher, meta, images, eval_images, labels)
    attention = mean_attention(teacher, data.batches(teacher, FIELD_BATCH))
    fits = fit_layers(attention, FIT_ATOMS)
    student = build_student(teacher, attention, fits, ("mu",))
    m = per_image(teacher, student, fits, held)
    heads = head_numbers(m)
    cfg, recorded = teacher.config, meta.get("train_args") or {}
    entry = {
        "settings": settings,
        "pictures": words,
        "held_out_images": len(held),
        "model": {
            "grid": list(cfg.grid),
            "depth": cfg.depth,
            "heads": cfg.num_heads,
            "dim": cfg.dim,
            "prefix": cfg.num_prefix_tokens,
            "classes": cfg.num_classes,
            "teacher_steps": meta.get("step") or trained.get("steps"),
            "teacher_batch": recorded.get("batch_size") or (DIGITS["batch"] if trained else None),
            "data": meta.get("data"),
        },  # fmt: skip
        "step0": predictions(m, None if held.labels is None else held.labels.numpy()),
        "step0_steered_is_fit": float(np.abs(m["share_steered"] - m["share_fit"]).max()),
        "heads": [
            {k: h[k] for k in ("layer", "head", "share_fit", "share_uniform", "diffuse", "normalised_fit")}
            for h in heads
        ],  # fmt: skip
        "cpu_s": time.process_time() - t0,
    }
    write_json(path, entry)
    return entry


def shown(arg: str) -> str:
    """A ``--teacher`` / ``--images`` value as the docs show it: a count as it is, a path from the repository."""
    return arg if arg.isdigit() else rel(Path(arg))


def unit_name(name: str, steer: str, seed: int) -> str:
    return f"{name}-{steer.replace(',', '+')}-s{seed}"


def distill_command(source: str, images: str, eval_images: str, steer: str, seed: int, steps: int, out: Path) -> list:
    return ["--teacher", source, "--images", images, "--eval-images", eval_images, "--atoms", str(FIT_ATOMS),
            "--steer", steer, "--steps", str(steps), "--seed", str(seed), "--out", str(out)]  # fmt: skip


def student_settings(teacher: dict[str, Any], steer: str, seed: int, steps: int) -> dict[str, Any]:
    """What a student unit is measured under: its teacher's settings, its own, and the distill command's default
    recipe (so a changed default, e.g. ``max_gate``, measures the students again)."""
    recipe = {k: v for k, v in Recipe().to_dict().items() if k not in ("steps", "seed")}
    return {**teacher, "steer": steer, "seed": seed, "steps": steps, "recipe": recipe}


def student_unit(plan: Plan, name: str, source: str, teacher: dict[str, Any], steer: str, seed: int) -> dict | None:
    """One student: distilled (or resumed, or kept), then measured image by image against its teacher. ``None``
    when the distillation was stopped by a signal (it saved; the next run resumes it)."""
    images, eval_images, labels = picture_specs(plan, name)
    unit = unit_name(name, steer, seed)
    settings = student_settings(teacher["settings"], steer, seed, plan.steps)
    path = plan.units / f"{unit}.json"
    entry = kept(path, settings)
    if entry is not None:
        print(f"{unit}: kept", flush=True)
        return entry
    out = plan.work / "students" / f"{unit}.safetensors"
    marker = out.with_suffix(".settings.json")
    argv = distill_command(source, images, eval_images, steer, seed, plan.steps, out)
    resume = state_path(out).is_file() and marker.is_file() and json.loads(marker.read_text()) == settings
    if resume:
        print(f"{unit}: resuming from step {int(load_state(out)['step'])}", flush=True)
        argv = ["--out", str(out), "--resume"]
    else:
        for stale in out.parent.glob(f"{unit}.*"):
            stale.unlink()
        write_json(marker, settings)
        print(f"{unit}: distilling {plan.steps} steps", flush=True)
    t0 = time.process_time()
    code = distill_main([*argv, "--no-progress", "--ckpt-every", str(plan.ckpt_every)])
    if code == 130:
        return None
    if code:
        raise SystemExit(f"{unit}: python -m ssog_core distill {' '.join(argv)} failed ({code})")
    distill_s = time.process_time() - t0
    report = json.loads(out.with_suffix(".report.json").read_text(encoding="utf-8"))
    t_model, meta = load_checkpoint(source)
    student = load_checkpoint(out)[0]
    fits = [AtomFit(f["mu"], f["sigma"], f["lam"], f["loss"]) for f in load_state(out)["fits"]]
    _, held, _ = held_out(t_model, meta, images, eval_images, labels)
    m = per_image(t_model, student, fits, held)
    heads = head_numbers(m)
    for h, r in zip(heads, report["heads"], strict=True):
        h["steering_reach"] = r["steering_reach"]
    final = predictions(m, None if held.labels is None else held.labels.numpy())
    entry = {
        "settings": settings,
        "command": "python -m ssog_core distill "
        + shlex.join(
            distill_command(
                *(shown(a) for a in (source, images, eval_images)), steer, seed, plan.steps, Path(shown(str(out)))
            )
        ),  # fmt: skip
        "step": report["step"],
        "final": final,
        "content_scored": report["content_scored"],
        # the command's own report on the same pictures: its means must be these (one definition, two paths)
        "check": {
            "report_step0_agreement": report["step0"]["agreement"],
            "step0_agreement_gap": abs(report["step0"]["agreement"] - teacher["step0"]["agreement"]),
            "final_kl_gap": abs(report["final"]["kl"] - final["kl"]),
            "share_steered_gap": max(
                abs(h["share_steered"] - r["share_steered"]) for h, r in zip(heads, report["heads"], strict=True)
            ),  # fmt: skip
        },
        "heads": heads,
        "distill_cpu_s": distill_s,
        "resumed": resume,
        "cpu_s": time.process_time() - t0,
    }
    write_json(path, entry)
    return entry


def scratch_unit(plan: Plan, name: str, file: str, teacher: dict[str, Any]) -> dict[str, Any] | None:
    """A model trained from scratch on the teacher's task, on the same held-out images (``None`` when its file is
    not there yet, or it was trained on other data)."""
    path = ROOT / file
    if not path.is_file():
        print(f"{name}: no {file} (yet): skipped", flush=True)
        return None
    settings = {"format": FORMAT, "model": file, "fingerprint": fingerprint(path), "images": plan.images,
                "eval_images": plan.eval_images}  # fmt: skip
    out = plan.units / f"{name}-scratch-{path.name.removesuffix('.safetensors')}.json"
    entry = kept(out, settings)
    if entry is not None:
        return entry
    model, meta = load_checkpoint(path)
    if meta.get("data") != teacher["model"]["data"]:
        print(f"{name}: {file} was trained on {meta.get('data')}, not the teacher's data: skipped", flush=True)
        return None
    _, held, _ = choose_pictures(model, meta, str(plan.images), str(plan.eval_images))
    with torch.no_grad():
        top = torch.cat([model(x).argmax(-1) for x in held.batches(model, EVAL_BATCH)]).numpy()
    correct = top == held.labels.numpy()
    args = meta.get("train_args") or {}
    entry = {
        "settings": settings,
        "steps": meta.get("step"),
        "batch_size": args.get("batch_size"),
        "steer": list(model.config.steer) if model.config.attn == "ssog" else None,
        "accuracy": float(correct.mean()),
        "correct_bits": pack(correct),
    }
    write_json(out, entry)
    return entry


def run_all(plan: Plan) -> bool:
    """Every unit of ``plan``, kept, resumed or measured; ``False`` when a signal stopped a student (it saved)."""
    for name in plan.teachers:
        source, trained = teacher_source(plan, name)
        teacher = teacher_unit(plan, name, source, trained)
        for file in SCRATCH[name]:
            scratch_unit(plan, name, file, teacher)
        for steer in STEERS:
            for seed in plan.seeds:
                if student_unit(plan, name, source, teacher, steer, seed) is None:
                    print("stopped: the student saved; run the same command again to go on", flush=True)
                    return False
    return True


# ------------------------------------------------------------------------------------------- the section


def ci(value: float, interval: list[float] | tuple[float, float], digits: int = 3) -> str:
    noise = " ·" if interval[0] <= 0 <= interval[1] else ""
    return f"{value:+.{digits}f} [{interval[0]:+.{digits}f}, {interval[1]:+.{digits}f}]{noise}"


def paired(a: np.ndarray, b: np.ndarray) -> tuple[float, tuple[float, float]]:
    """Mean of ``b − a`` over images and its paired bootstrap 95% interval."""
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    return float(d.mean()), bootstrap_ci(d)


def change(teacher: dict, student: dict) -> dict[str, Any]:
    """Step 0 → end on the held-out images: agreement and KL, each a paired difference with its interval."""
    n = teacher["held_out_images"]
    a0, a1 = (unpack(x["agreement_bits"], n) for x in (teacher["step0"], student["final"]))
    k0, k1 = (np.array(x["kl_per_image"]) for x in (teacher["step0"], student["final"]))
    return {"agreement": paired(a0, a1), "kl": paired(k0, k1)}


def improved(c: dict[str, Any]) -> bool:
    """Agreement up and KL down, both intervals excluding 0."""
    return c["agreement"][1][0] > 0 and c["kl"][1][1] < 0


def recovered(heads_by_seed: list[list[dict]]) -> list[bool | None]:
    """Per head, the rule: its normalised difference's interval above 0 in every seed (``None``: diffuse)."""
    out = []
    for per_seed in zip(*heads_by_seed, strict=True):
        if any(h["diffuse"] for h in per_seed):
            out.append(None)
            continue
        out.append(all(h["normalised_difference_ci95"][0] > 0 for h in per_seed))
    return out


def _mean(values: list[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


def _f(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def command_of(plan: Plan, threads: int) -> str:
    """The command that writes the section (flags only where they differ from the defaults)."""
    extra = []
    if plan.steps != STEPS:
        extra += ["--steps", str(plan.steps)]
    if (plan.images, plan.eval_images) != (IMAGES, EVAL_IMAGES):
        extra += ["--images", str(plan.images), "--eval-images", str(plan.eval_images)]
    if plan.seeds != list(SEEDS):
        extra += ["--seeds", *map(str, plan.seeds)]
    if plan.teachers != list(TEACHERS):
        extra += ["--teachers", *plan.teachers]
    if plan.digits_epochs != DIGITS["epochs"]:
        extra += ["--digits-epochs", str(plan.digits_epochs)]
    return " ".join(["python experiments/distill.py", *extra, "--threads", str(threads)])


def budget(plan: Plan, results: dict[str, Any]) -> str:
    """The budget arithmetic: the pilot's estimate, and the CPU time the kept units took."""
    students = len(plan.teachers) * len(STEERS) * len(plan.seeds)
    per_teacher = len(STEERS) * len(plan.seeds)
    est = sum(PILOT_STEP_S[t] * plan.steps * per_teacher for t in plan.teachers)
    spent = sum(
        e["teacher"]["cpu_s"]
        + sum(s["cpu_s"] for s in e["students"].values())
        + (e["trained"].get("cpu_s", 0.0) if e["trained"] else 0.0)
        for e in results.values()
    )
    done = sum(len(e["students"]) for e in results.values())
    measured = {
        name: sum(s["distill_cpu_s"] for s in fresh) / sum(s["step"] for s in fresh)
        for name, e in results.items()
        if (fresh := [s for s in e["students"].values() if not s["resumed"]])
    }
    return (
        f"**Budget** (≤ {BUDGET_H:g} CPU-hours, one thread): the pilot's CPU seconds per distillation step at batch 16 "
        + ", ".join(f"{t} {PILOT_STEP_S[t]:g}" for t in plan.teachers)
        + f"; {students} students × {plan.steps:,} steps ≈ {est / 3600:.1f} CPU-hours of steps, the rest of the budget "
        "for the fits, the reports (each student is measured twice: by the command's report and image by image here) "
        f"and the digits teacher. Measured: the {done} student unit(s) kept and their teachers took "
        f"{spent / 3600:.2f} CPU-hours (a resumed unit counts its last stretch only)"
        + (
            "; CPU seconds per step, the command's report included, in the units not resumed: "
            + ", ".join(f"{name} {v:.2f}" for name, v in measured.items())
            if measured
            else ""
        )
        + "."
    )


def section(plan: Plan, results: dict[str, Any], command: str) -> str:
    """The marked section of docs/RESULTS.md, from the kept units alone."""
    lines = [
        MARKS[0],
        "## Distilled students: how much of a dot-product teacher its fitted fields recover when content steers them",
        "",
        f"Written by `{command}` (units: `experiments/results/distill/*.json`, one per teacher, student and "
        "from-scratch model, each with the settings it was measured under). Each student is one "
        "`python -m ssog_core distill` run (docs/DESIGN.md §2.5; its command is in its unit's JSON): the teacher's "
        f"ViT with every head's patch-to-patch attention replaced by its {FIT_ATOMS}-atom fitted field (τ = 1), "
        "content steering the atoms (`--steer mu` or `mu,sigma,lambda`, cold gates), trained on the teacher's logits "
        f"plus its patch rows (the command's defaults: KL at temperature 1, `--rows-weight 1`, lr 3e-3, batch 16) "
        f"for {plan.steps:,} steps; the seed orders the pictures each step draws (the student's start is the same "
        "for every seed). All numbers are on held-out images the fits and the training never saw. *Agreement*: "
        "top-1 with the teacher; *KL*: KL(teacher ‖ student) of the predictions, nats; *step 0*: the fitted fields "
        "with content steering nothing. Per head (§2.5's report): *share_fit* = 1 − mean TV between the teacher's "
        "patch rows and its fitted field's, *share_steered* the same against the student's steered rows, "
        "*uniform* the uniform field's, *normalised* = (share − uniform) / (1 − uniform) (0: no better than uniform; "
        f"a head within {DIFFUSE_TV} of uniform is *diffuse*: not normalised, not judged). Intervals: paired bootstrap "
        f"95% over the held-out images ({BOOTSTRAP:,} resamples; · = the interval holds 0).",
        "",
        "**The rule, written into the script before any result was read.** A head is *recovered by steering* when "
        "its normalised share_steered − normalised share_fit is above 0 with its interval above 0 in every seed. "
        "Steering *recovers the teacher* when every head that is not diffuse is recovered and, in every seed, the "
        "agreement rises and the KL falls from step 0 to the end with intervals excluding 0; *part of the teacher* "
        "when the predictions improve so but only some heads are recovered. A head *stays content-scored* when its "
        f"normalised share_steered (mean over seeds) is below {CONTENT_SCORED}.",
        "",
        budget(plan, results),
        "",
    ]
    missing = [
        unit_name(name, steer, seed)
        for name in plan.teachers
        for steer in STEERS
        for seed in plan.seeds
        if (steer, seed) not in results.get(name, {}).get("students", {})
    ]
    if missing:
        lines += [f"Not measured yet: {', '.join(missing)}.", ""]
    for name, e in results.items():
        lines += teacher_lines(plan, name, e)
    lines.append(MARKS[1])
    return "\n".join(lines)


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def pictures_words(d: dict[str, Any]) -> str:
    """Which pictures, in words (the distill command's description of them)."""
    if d.get("split") == "validation":
        where = f"the first {d['first']}" if "first" in d else f"the {d['count']} after the first {d['after']}"
        return f"{where} validation images of `{d['data']}`"
    return f"the first {d.get('first', d.get('count'))} pictures of the folder `{d.get('pictures', d.get('data'))}`"


def content(students: dict) -> str:
    said = {s["content_scored"] for s in students.values()}
    return "; ".join(sorted(said)) if said else "—"


def step0_line(t: dict[str, Any]) -> str:
    """The step-0 student (the fitted fields, content steering nothing) against its teacher."""
    s0, heads = t["step0"], t["heads"]
    judged = [h["normalised_fit"] for h in heads if not h["diffuse"]]
    return (
        f"**Step 0** (every head its fitted field, content steering nothing): agreement {s0['agreement']:.3f}, KL "
        f"{s0['kl']:.4f}"
        + (f", accuracy {s0['accuracy']:.3f}" if s0["accuracy"] is not None else "")
        + f"; share_fit {_mean([h['share_fit'] for h in heads]):.3f} against the uniform field's "
        f"{_mean([h['share_uniform'] for h in heads]):.3f} (mean over {len(heads)} heads), normalised "
        + (f"{_mean(judged):.3f} ({min(judged):.3f}–{max(judged):.3f})" if judged else "—")
        + f"; {len(heads) - len(judged)} diffuse."
    )


def teacher_lines(plan: Plan, name: str, e: dict[str, Any]) -> list[str]:
    t, students, model = e["teacher"], e["students"], e["teacher"]["model"]
    source = t["settings"]["teacher"]
    acc = t["step0"]["teacher_accuracy"]
    what = {
        "layouts": "the matched trio's dot twin",
        "pointer": "the converged 14×14 pointer dot twin, still on its plateau at about 50% (the ablation's "
        "converged table above); its students are judged against the teacher (agreement, KL), and accuracy says little",
        "digits": "transformers' ViT with a class token, trained here on scikit-learn's digits and written as a "
        "transformers folder",
    }[name]
    lines = [
        f"### `{name}`: {what}",
        "",
        f"Teacher `{source}`: {model['depth']} layers × {model['heads']} heads, a {model['grid'][0]}×{model['grid'][1]}"
        f" grid, {model['prefix']} prefix token(s), trained {_n(model['teacher_steps'])} steps of "
        f"{_n(model['teacher_batch'])} labelled images; held-out accuracy {_f(acc, 4)}. Fitted and distilled on "
        f"{pictures_words(t['pictures']['pictures'])}; measured on {pictures_words(t['pictures']['held_out'])}. "
        f"Still content-scored in its students: {content(students)}.",
        "",
        step0_line(t),
        "",
    ]
    if not students:
        return lines + ["No student measured yet.", ""]
    lines += [
        "| steer | seed | steps | agreement: step 0 → end | Δ agreement [95%] | KL: step 0 → end | Δ KL [95%] "
        "| accuracy (teacher's) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    changes = {}
    for (steer, seed), s in sorted(students.items()):
        c = changes[(steer, seed)] = change(t, s)
        f = s["final"]
        lines.append(
            f"| {steer} | {seed} | {s['step']:,} | {t['step0']['agreement']:.3f} → {f['agreement']:.3f} | "
            f"{ci(*c['agreement'])} | {t['step0']['kl']:.4f} → {f['kl']:.4f} | {ci(*c['kl'], 4)} | "
            f"{_f(f['accuracy'], 3)} ({_f(f['teacher_accuracy'], 3)}) |"
        )
    for steer in STEERS:
        mine = [s for (st, _), s in students.items() if st == steer]
        if mine:
            lines.append(
                f"| **{steer}, mean of {len(mine)}** | | | {t['step0']['agreement']:.3f} → "
                f"{_mean([s['final']['agreement'] for s in mine]):.3f} | | {t['step0']['kl']:.4f} → "
                f"{_mean([s['final']['kl'] for s in mine]):.4f} | | "
                f"{_f(_mean([s['final']['accuracy'] for s in mine]))} |"
            )
    lines += ["", *steer_lines(t, students), *scratch_lines(plan, t, students, e["scratch"]),
              *head_lines(t, students), *verdict_lines(name, students, changes)]  # fmt: skip
    return lines


def steer_lines(t: dict, students: dict) -> list[str]:
    """mu,sigma,lambda − mu, seed by seed, paired over images."""
    n = t["held_out_images"]
    out = []
    for seed in sorted({seed for _, seed in students}):
        a, b = students.get(("mu", seed)), students.get(("mu,sigma,lambda", seed))
        if a is None or b is None:
            continue
        agree = paired(*(unpack(x["final"]["agreement_bits"], n) for x in (a, b)))
        kl = paired(*(np.array(x["final"]["kl_per_image"]) for x in (a, b)))
        out.append(f"seed {seed}: agreement {ci(*agree)}, KL {ci(*kl, 4)}")
    return ["**μ, σ, λ against μ alone** (the μ,σ,λ student − the μ student of the same seed): " + "; ".join(out) + ".",
            ""] if out else []  # fmt: skip


def scratch_lines(plan: Plan, t: dict, students: dict, scratch: dict) -> list[str]:
    """Each from-scratch SSOG model beside each student, paired over the held-out images."""
    if not scratch or t["step0"]["teacher_accuracy"] is None:
        return []
    n = t["held_out_images"]
    lines = [
        f"**Beside SSOG trained from scratch** (accuracy on the same {n} held-out images; student − model, paired, "
        "one interval per student seed). Steps are not equal: a student makes "
        f"{plan.steps:,} steps of 16 unlabelled pictures on top of its teacher's training (above); each "
        "from-scratch model made the steps given beside it, of labelled images. No from-scratch model at the students' "
        "step count exists, and training them (two tasks, three seeds) does not fit the budget above.",
        "",
        "| from scratch | steer | steps × batch | accuracy | μ student − it | μ,σ,λ student − it |",
        "|---|---|---:|---:|---|---|",
    ]
    for file, s in scratch.items():
        right = unpack(s["correct_bits"], n)
        cells = []
        for steer in STEERS:
            diffs = [
                ci(*paired(right, unpack(st["final"]["correct_bits"], n)))
                for (sv, _), st in sorted(students.items())
                if sv == steer
            ]
            cells.append("; ".join(diffs) or "—")
        lines.append(
            f"| `{file}` | {','.join(s['steer'] or []) or 'fixed'} | {_n(s['steps'])} × {_n(s['batch_size'])} | "
            f"{s['accuracy']:.3f} | " + " | ".join(cells) + " |"
        )
    return [*lines, ""]


def head_lines(t: dict, students: dict) -> list[str]:
    """Per head: uniform, fit, each configuration's steered share (normalised, mean over seeds) and the rule."""
    lines = [
        "Per head (means over seeds; normalised in brackets; ✓: recovered by steering by the rule; CS: stays "
        "content-scored; D: diffuse):",
        "",
        "| head | uniform | share_fit | "
        + " | ".join(f"{s}: share_steered | Δ normalised (seeds) | rule" for s in STEERS)
        + " | steering reach (cells) |",
        "|---|---:|---:|" + "---:|---|---|" * len(STEERS) + "---:|",
    ]
    rows = [[] for _ in t["heads"]]
    for steer in STEERS:
        runs = [s["heads"] for (sv, _), s in sorted(students.items()) if sv == steer]
        if not runs:
            for row in rows:
                row.append("— | — | —")
            continue
        rule = recovered(runs)
        for i, per_seed in enumerate(zip(*runs, strict=True)):
            steered = _mean([h["share_steered"] for h in per_seed])
            norm = _mean([h["normalised_steered"] for h in per_seed])
            diffs = ", ".join(_f(h["normalised_difference"]) for h in per_seed)
            mark = "D" if rule[i] is None else ("✓" if rule[i] else "✗")
            if norm is not None and norm < CONTENT_SCORED:
                mark += " CS"
            rows[i].append(f"{steered:.3f} ({_f(norm)}) | {diffs} | {mark}")
    reach = {(h["layer"], h["head"]): [] for h in t["heads"]}
    for s in students.values():
        for h in s["heads"]:
            reach[(h["layer"], h["head"])].append(h["steering_reach"])
    for h, row in zip(t["heads"], rows, strict=True):
        lines.append(
            f"| L{h['layer']}H{h['head']} | {h['share_uniform']:.3f} | {h['share_fit']:.3f} ({_f(h['normalised_fit'])})"
            f" | " + " | ".join(row) + f" | {_f(_mean(reach[(h['layer'], h['head'])]), 2)} |"
        )
    return [*lines, ""]


def verdict_lines(name: str, students: dict, changes: dict) -> list[str]:
    """The rule applied, configuration by configuration."""
    out = []
    for steer in STEERS:
        seeds = sorted(seed for sv, seed in students if sv == steer)
        if not seeds:
            continue
        runs = [students[(steer, seed)]["heads"] for seed in seeds]
        rule = recovered(runs)
        judged = [r for r in rule if r is not None]
        better = all(improved(changes[(steer, seed)]) for seed in seeds)
        content = [
            f"L{h['layer']}H{h['head']}"
            for h, per_seed in zip(runs[0], zip(*runs, strict=True), strict=True)
            if (v := _mean([x["normalised_steered"] for x in per_seed])) is not None and v < CONTENT_SCORED
        ]
        if better and judged and all(judged):
            verdict = "steering recovers the teacher"
        elif better and any(judged):
            verdict = "steering recovers part of the teacher"
        else:
            verdict = "steering does not recover the teacher"
        out.append(
            f"- **{name}, {steer} ({len(seeds)} seed(s)): {verdict}.** Predictions "
            + ("improve in every seed" if better else "do not improve in every seed")
            + f" (agreement and KL, intervals excluding 0); {sum(judged)} of {len(judged)} judged heads recovered"
            + (f", {len(rule) - len(judged)} diffuse" if len(rule) > len(judged) else "")
            + "; "
            + (f"content-scored: {', '.join(content)}" if content else "no head stays content-scored")
            + "."
        )
    return [*out, ""]


# ------------------------------------------------------------------------------------------- the command


def gather(plan: Plan) -> dict[str, Any]:
    """The kept units of ``plan`` as the section reads them (what the last run finished)."""
    results: dict[str, Any] = {}
    for name in plan.teachers:
        path = plan.units / f"{name}-teacher.json"
        if not path.is_file():
            continue
        t = json.loads(path.read_text(encoding="utf-8"))
        trained = plan.units / TRAINING_UNIT
        e = {"teacher": t, "trained": json.loads(trained.read_text()) if name == "digits" and trained.is_file()
             else {}, "students": {}, "scratch": {}}  # fmt: skip
        for file in SCRATCH[name]:
            p = plan.units / f"{name}-scratch-{Path(file).name.removesuffix('.safetensors')}.json"
            if p.is_file():
                e["scratch"][Path(file).name] = json.loads(p.read_text(encoding="utf-8"))
        for steer in STEERS:
            for seed in plan.seeds:
                p = plan.units / f"{unit_name(name, steer, seed)}.json"
                want = student_settings(t["settings"], steer, seed, plan.steps)
                if p.is_file() and (s := json.loads(p.read_text(encoding="utf-8")))["settings"] == want:
                    e["students"][(steer, seed)] = s
        results[name] = e
    return results


def options(argv: list[str] | None = None) -> tuple[argparse.Namespace, Plan]:
    """The command line and the plan it makes (the section's command, parsed again, makes the same plan)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=STEPS, help="distillation steps per student")
    ap.add_argument("--images", type=int, default=IMAGES, help="pictures the fits and the training use")
    ap.add_argument("--eval-images", type=int, default=EVAL_IMAGES, help="held-out pictures")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--teachers", nargs="+", choices=list(TEACHERS), default=list(TEACHERS))
    ap.add_argument("--digits-epochs", type=int, default=DIGITS["epochs"], help="the digits teacher's training")
    ap.add_argument("--ckpt-every", type=int, default=50, help="a student's save interval, in steps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="tiny settings (" + ", ".join(
        f"--{k.replace('_', '-')} {v if not isinstance(v, list) else ' '.join(map(str, v))}" for k, v in SMOKE.items()
    ) + "): the whole pipeline in a few minutes; give --out, --work and --results elsewhere")  # fmt: skip
    ap.add_argument("--report-only", action="store_true", help="rewrite the section from the kept units only")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results", help="the units go to OUT/distill/")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "distill", help="students, state, digits (scratch)")
    ap.add_argument("--results", type=Path, default=ROOT / "docs" / "RESULTS.md")
    args = ap.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    for flag in ("steps", "images", "eval_images", "digits_epochs", "ckpt_every", "threads"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1")
    plan = Plan(args.steps, args.images, args.eval_images, list(args.seeds), list(args.teachers), args.digits_epochs,
                args.out, args.work, args.ckpt_every)  # fmt: skip
    return args, plan


def main(argv: list[str] | None = None) -> int:
    args, plan = options(argv)
    torch.set_num_threads(args.threads)
    finished = True if args.report_only else run_all(plan)
    replace_section(args.results, MARKS, section(plan, gather(plan), command_of(plan, args.threads)))
    print(f"wrote {plan.units} and the section in {args.results}", flush=True)
    return 0 if finished else 130


if __name__ == "__main__":
    sys.exit(main())
