"""Apply interventions to a checkpoint and report what changes, with a noise floor.

    python -m ssog_core intervene --checkpoint checkpoints/ssog_layouts.safetensors --edits edits.json \\
        --image assets/layouts_val0003_vertical_pair.png --eval 500 --json out.json

``edits.json`` is a JSON list of edits (``ssog_core.analysis.interventions``), e.g.
``[{"op": "swap_axes", "layer": 5, "head": 0}, {"op": "close_gate", "layer": 2, "tap": "mu"}]``.
A ``patch_head`` source names an image file: a path, a file beside the edits file, or a bundled image in
``--assets`` (by name or SHA-256). ``--image`` gives the top-5 classes unedited and edited, the change in log p
of the unedited prediction and the accumulated export maps; ``--eval N`` the first N validation images of the
checkpoint's recorded data: accuracy and log p(true), unedited and edited, with paired bootstrap 95% intervals
and McNemar's test. ``--json`` writes the same JSON as the app's ``/intervene`` endpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ssog_core.analysis.effects import (
    ImageEffect,
    ValidationEffect,
    dataset_means,
    image_effect,
    load_eval_set,
    validation_effect,
)
from ssog_core.analysis.interventions import AblateHead, Edit, EditError, PatchHead, describe, parse_edits
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.data.images import ImageError, list_images, model_input
from ssog_core.data.sources import DataError

DEFAULT_ASSETS = Path(__file__).resolve().parent.parent / "assets"


def result_dict(
    class_names: Sequence[str], image: ImageEffect | None, validation: ValidationEffect | None
) -> dict[str, Any]:
    """The ``/intervene`` JSON: probabilities in the checkpoint's class order, ``validation`` only when evaluated."""
    out: dict[str, Any] = {}
    if image is not None:
        for side, p in (("unedited", image.probs_unedited), ("edited", image.probs_edited)):
            out[side] = {"probs": p.tolist(), "label": class_names[int(p.argmax())]}
        out["accumulated_export"] = {
            "unedited": image.accumulated_unedited.tolist(),
            "edited": image.accumulated_edited.tolist(),
        }
    if validation is not None:
        out["validation"] = validation.to_dict()
    return out


def find_image(ref: str, folders: Sequence[Path]) -> Path:
    """An image named by a path, a file name inside one of ``folders``, or the SHA-256 of a file there."""
    p = Path(ref)
    if p.is_file():
        return p
    for folder in folders:
        if (folder / ref).is_file():
            return folder / ref
    if len(ref) == 64:
        for folder in folders:
            for f in list_images(folder) if folder.is_dir() else []:
                if hashlib.sha256(f.read_bytes()).hexdigest() == ref:
                    return f
    raise EditError(f"patch source image {ref!r} is not there (looked in {', '.join(map(str, folders))})")


def sources_for(edits: Sequence[Edit], model: nn.Module, meta: dict, folders: Sequence[Path]) -> dict[str, Tensor]:
    """Model inputs of every image a ``patch_head`` edit names."""
    names = sorted({e.source for e in edits if isinstance(e, PatchHead)})
    size = tuple(model.config.img_size)
    return {n: model_input([find_image(n, folders)], size, meta)[0] for n in names}


def format_report(
    lines: list[str], class_names: Sequence[str], img: ImageEffect | None, val: ValidationEffect | None
) -> str:
    """The result as text for a terminal."""
    out = ["edits:", *(f"  {i + 1}. {line}" for i, line in enumerate(lines))]
    if img is not None:
        for name, side in (("unedited", False), ("edited", True)):
            top = ", ".join(f"{c} {p:.3f}" for c, p in img.top(class_names, side))
            out.append(f"{name:>9}: {top}")
        out.append(f"Δ log p of the unedited prediction: {img.dlogp:+.4f}")
    if val is not None:
        a, lp = val.accuracy, val.logp_true
        noise = lambda c: " (within noise)" if c.within_noise else ""  # noqa: E731
        out.append(
            f"validation ({val.n} images): accuracy {a.unedited:.4f} → {a.edited:.4f}, change {a.change:+.4f} "
            f"[{a.ci95[0]:+.4f}, {a.ci95[1]:+.4f}]{noise(a)}; McNemar p = {val.mcnemar_p:.3g} "
            f"(mid-p {val.mcnemar_mid_p:.3g}; {val.lost} lost, {val.gained} gained)"
        )
        out.append(f"mean log p(true) change {lp.change:+.4f} [{lp.ci95[0]:+.4f}, {lp.ci95[1]:+.4f}]{noise(lp)}")
        for r in val.per_class:
            ci = r["logp_true"]["ci95"]
            mark = " (within noise)" if r["within_noise"] else ""
            out.append(
                f"  {r['class']:<20} acc {r['accuracy']['unedited']:.3f} → {r['accuracy']['edited']:.3f}, "
                f"log p(true) {r['logp_true']['change']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]{mark}"
            )
    return "\n".join(out)


def run(
    checkpoint: str | Path,
    edits: list[Any],
    image: str | Path | None = None,
    eval_images: int = 0,
    assets: Path = DEFAULT_ASSETS,
    edits_dir: Path | None = None,
    progress: bool = True,
) -> tuple[dict[str, Any], str]:
    """Apply ``edits`` (JSON list) to a checkpoint; returns the ``/intervene`` JSON and the text report."""
    model, meta = load_checkpoint(checkpoint)
    parsed = parse_edits(edits)
    folders = [f for f in (edits_dir, Path.cwd(), assets) if f is not None]
    sources = sources_for(parsed, model, meta, folders)
    names = [str(n) for n in meta.get("class_names") or [f"class {i}" for i in range(model.config.num_classes)]]
    img = val = None
    head_means = None
    if any(isinstance(e, AblateHead) and e.mode == "dataset_mean" for e in parsed):
        head_means = dataset_means(model, meta)
    with torch.inference_mode():
        if image is not None:
            x, _ = model_input([image], tuple(model.config.img_size), meta)
            img = image_effect(model, x, parsed, sources, head_means)
        if eval_images:
            data = load_eval_set(meta, model.config.img_size, eval_images)
            val = validation_effect(model, data, parsed, sources, head_means, progress=progress)
    return result_dict(names, img, val), format_report(describe(parsed), names, img, val)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="an SSOG Lab .safetensors checkpoint")
    ap.add_argument("--edits", required=True, help="a JSON file holding the list of edits")
    ap.add_argument("--image", help="an image file: its prediction and export maps, unedited and edited")
    ap.add_argument("--eval", type=int, default=0, metavar="N", help="the first N validation images (max 2000)")
    ap.add_argument("--json", help="write the result as JSON (the app's /intervene shape)")
    ap.add_argument("--assets", type=Path, default=DEFAULT_ASSETS, help="folder of bundled images (patch sources)")
    args = ap.parse_args(argv)
    if args.image is None and not args.eval:
        ap.error("give --image IMG, --eval N, or both")
    try:
        edits = json.loads(Path(args.edits).read_text(encoding="utf-8"))
        result, text = run(args.checkpoint, edits, args.image, args.eval, args.assets, Path(args.edits).parent)
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: cannot read {args.edits}: {e}", file=sys.stderr)
        return 2
    except (CheckpointError, ImageError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    if args.json:
        atomic_write(args.json, lambda tmp: Path(tmp).write_text(json.dumps(result, indent=1), encoding="utf-8"))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
