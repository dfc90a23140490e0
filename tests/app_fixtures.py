"""Checkpoints and images for the app's tests and benchmarks, made on the spot (never the demo files).

``designed_ssog`` is a random ViT whose heads are set to recognisable shapes (a tight blob, a vertical and a
horizontal strip, a broad field) and whose steering probes are random and warm, so that presets, gates and
steering all show something; ``dot_twin`` is the matching dot-product model.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ssog_core import ViT, save_checkpoint
from ssog_core.analysis.measures import ssog_layers
from tests.helpers import RunsCode

CLASS_NAMES = ["circle", "square", "triangle", "star", "heart"]


def _inverse_softplus(y: float) -> float:
    return float(np.log(np.expm1(y)))


def designed_ssog(
    img_size: int = 32, patch: int = 4, dim: int = 32, depth: int = 3, heads: int = 4, atoms: int = 3, seed: int = 0
) -> ViT:
    """A small SSOG ViT with hand-set head shapes and open, random steering probes."""
    g = torch.Generator().manual_seed(seed)
    model = ViT(
        num_classes=len(CLASS_NAMES),
        img_size=img_size,
        patch_size=patch,
        dim=dim,
        depth=depth,
        num_heads=heads,
        num_atoms=atoms,
        cold_init=False,
    )
    grid = model.config.grid[0]
    shapes = [  # (μy, μx, σy, σx) of every atom of a head, in grid cells
        [(0.0, 0.0, 0.6, 0.6), (1.0, 0.0, 0.7, 0.7), (0.0, -1.0, 0.7, 0.7)],  # tight local blob
        [(0.0, 0.0, grid / 2, 0.5), (2.0, 1.0, grid / 3, 0.6), (-2.0, -1.0, grid / 3, 0.6)],  # vertical strip
        [(0.0, 0.0, 0.5, grid / 2), (1.0, 2.0, 0.6, grid / 3), (-1.0, -2.0, 0.6, grid / 3)],  # horizontal strip
        [(0.0, 0.0, grid, grid), (2.0, 2.0, grid, grid), (-2.0, 1.0, grid / 1.5, grid / 1.5)],  # broad global
    ]
    with torch.no_grad():
        for layer, attn in enumerate(ssog_layers(model)):
            for h in range(heads):
                shape = shapes[(h + layer) % len(shapes)]
                for r in range(atoms):
                    my, mx, sy, sx = shape[r % len(shape)]
                    attn.mu[h, r] = torch.tensor([my, mx]) + 0.3 * torch.randn(2, generator=g)
                    floor = attn.sigma_floor + 1e-3
                    attn.raw_sigma[h, r] = torch.tensor(
                        [_inverse_softplus(max(sy - floor, 0.05)), _inverse_softplus(max(sx - floor, 0.05))]
                    )
            attn.log_lambda.copy_(torch.randn(heads, atoms, generator=g) * 0.5)
            for name in ("mu_delta", "sigma_delta", "lambda_gate"):
                probe = getattr(attn, name)
                probe.weight.copy_(torch.randn(probe.weight.shape, generator=g) * 0.6)
                probe.bias.copy_(torch.randn(probe.bias.shape, generator=g) * 0.3)
            attn.raw_mu_delta_scale.fill_(-0.5 + 0.4 * layer)
            attn.raw_sigma_delta_scale.fill_(-1.0 + 0.3 * layer)
            attn.raw_lambda_gate_scale.fill_(-0.8 + 0.6 * layer)
    return model.eval()


def dot_twin(img_size: int = 32, patch: int = 4, dim: int = 32, depth: int = 3, heads: int = 4) -> ViT:
    torch.manual_seed(1)
    return ViT(
        num_classes=len(CLASS_NAMES),
        img_size=img_size,
        patch_size=patch,
        dim=dim,
        depth=depth,
        num_heads=heads,
        attn="dot",
    ).eval()


def meta(attn: str, accuracy: float) -> dict:
    return {
        "class_names": CLASS_NAMES,
        "accuracy": accuracy,
        "command": f"python -m ssog_core.train --data shapes --attn {attn} --epochs 1 (test fixture)",
        "data": "shapes (test fixture)",
        "epochs": 1,
    }


def write_checkpoints(folder: Path, **size) -> dict[str, Path]:
    """``ssog_test.safetensors`` and ``dot_test.safetensors`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    dot_size = {k: v for k, v in size.items() if k not in ("atoms", "seed")}
    return {
        "ssog": save_checkpoint(folder / "ssog_test.safetensors", designed_ssog(**size), meta("ssog", 0.61)),
        "dot": save_checkpoint(folder / "dot_test.safetensors", dot_twin(**dot_size), meta("dot", 0.48)),
    }


def write_upstream_checkpoint(folder: Path, depth: int = 2) -> tuple[Path, Path]:
    """A upstream-implementation state dict (``.pt``, compiled-model key prefix) and the ``.json`` of its ViT
    arguments: the pair a user uploads; the app names it ``uploaded/ref_ssog_full.safetensors``."""
    folder.mkdir(parents=True, exist_ok=True)
    ref = dot_twin(img_size=32, patch=4, dim=32, depth=depth, heads=4)
    pt, cfg = folder / "ref_ssog_full.pt", folder / "ref_ssog_full.json"
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in ref.state_dict().items()}}, pt)
    kwargs = {"num_classes": 5, "img_size": 32, "patch_size": 4, "dim": 32, "depth": depth, "num_heads": 4,
              "attn": "dot"}  # fmt: skip
    cfg.write_text(json.dumps(kwargs))
    return pt, cfg


def shapes_image(size: int = 96, seed: int = 0) -> Image.Image:
    """A textured background with one bright off-centre disc (an object a model could find)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    base = np.stack([0.3 + 0.2 * np.sin(9 * xx), 0.45 + 0.1 * np.cos(7 * yy), 0.35 + 0.1 * xx], -1)
    img = base + 0.05 * rng.standard_normal((size, size, 3))
    disc = (yy - 0.35) ** 2 + (xx - 0.62) ** 2 < 0.04
    img[disc] = [0.95, 0.75, 0.1]
    return Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8))


def write_images(folder: Path) -> dict[str, Path]:
    """A normal photo-like PNG plus the awkward kinds that must work: grayscale, RGBA, 16-bit."""
    folder.mkdir(parents=True, exist_ok=True)
    rgb = shapes_image()
    paths = {"rgb": folder / "scene.png", "gray": folder / "gray.png", "rgba": folder / "rgba.png"}
    rgb.save(paths["rgb"])
    rgb.convert("L").save(paths["gray"])
    rgba = rgb.convert("RGBA")
    rgba.putalpha(Image.fromarray((np.linspace(0, 255, 96 * 96).reshape(96, 96)).astype(np.uint8)))
    rgba.save(paths["rgba"])
    paths["16bit"] = folder / "sixteen.png"
    arr16 = (np.asarray(rgb.convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
    Image.fromarray(arr16).save(paths["16bit"])  # uint16 → mode I;16
    return paths


def write_bad_files(folder: Path) -> dict[str, Path]:
    """Inputs that must be refused with a message (and must never run code)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    paths["text"] = folder / "notes.png"
    paths["text"].write_text("this is not an image")
    good = folder / "good.png"
    shapes_image().save(good)
    paths["truncated_image"] = folder / "truncated.png"
    paths["truncated_image"].write_bytes(good.read_bytes()[:400])
    paths["bomb"] = folder / "bomb.png"
    Image.new("L", (9000, 9000)).save(paths["bomb"], optimize=True)  # 81 MP of zeros: a few kB on disk
    return paths


def write_bad_checkpoints(folder: Path, good: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"truncated": folder / "truncated.safetensors"}
    data = good.read_bytes()
    paths["truncated"].write_bytes(data[: len(data) // 2])
    # wrong shapes: a valid file whose config says dim 48 while the weights are dim 32
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(good), framework="pt") as f:
        header = dict(f.metadata())
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    cfg = json.loads(header["config"])
    cfg["num_heads"] = 2
    header["config"] = json.dumps(cfg)
    state["blocks.0.attn.mu"] = torch.zeros(7, 3, 2)
    paths["wrong_shape"] = folder / "wrong_shape.safetensors"
    save_file(state, str(paths["wrong_shape"]), metadata=header)
    paths["pickle"] = folder / "evil.pt"
    paths["marker"] = folder / "PWNED"
    with open(paths["pickle"], "wb") as f:
        pickle.dump({"weights": RunsCode(paths["marker"])}, f)
    paths["pickle_safetensors"] = folder / "evil.safetensors"
    paths["pickle_safetensors"].write_bytes(paths["pickle"].read_bytes())
    return paths
