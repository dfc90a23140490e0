"""Every bundled ``layouts`` checkpoint and an upstream ``.pt`` import give, bit for bit, the logits recorded in
``tests/data/recorded_logits.safetensors`` (float32 on the CPU, one thread): a change to the model code that changes
any arithmetic of these models fails here. The pictures are stored as bytes (a picture at the training size and one
on a 7×5 grid, which resizes the position embedding).

Recorded with ``python -m tests.test_recorded_logits`` (run it only when a change of the logits is intended and
say why in the commit); the sums are the CPU kernels', so the file is this machine's and torch build's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ssog_core import load_checkpoint
from ssog_core.checkpoint.upstream import convert
from tests.dense_oracle import upstream_state_dict

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "recorded_logits.safetensors"
BUNDLED = ("matched_ssog_layouts", "matched_ssog_fixed_layouts", "matched_dot_layouts", "ssog_layouts", "dot_layouts")
UPSTREAM = {  # an upstream ViT's arguments (its SSOG always steers with all three taps)
    "upstream_ssog": dict(num_classes=6, img_size=12, patch_size=2, dim=16, depth=2, num_heads=2, attn="ssog",
                          num_atoms=3),
    "upstream_dot": dict(num_classes=6, img_size=12, patch_size=2, dim=16, depth=2, num_heads=2, attn="dot"),
}  # fmt: skip
SIZES = {"bundled": ((56, 56), (28, 20)), "upstream": ((12, 12), (14, 10))}  # training size, a 7×5 grid


def pictures(kind: str) -> dict[str, torch.Tensor]:
    """Two seeded pictures ``(1, 3, H, W)`` as bytes, for a model of ``kind`` (bundled or upstream)."""
    g = torch.Generator().manual_seed(43)
    sizes = SIZES[kind]
    return {f"{kind}_{h}x{w}": torch.randint(0, 256, (1, 3, h, w), generator=g, dtype=torch.uint8) for h, w in sizes}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def models(tmp: Path) -> Iterator[tuple[str, str, torch.nn.Module]]:
    """(name, picture kind, model) for every recorded model; the upstream files are written into ``tmp``."""
    for name in BUNDLED:
        yield name, "bundled", load_checkpoint(ROOT / "checkpoints" / f"{name}.safetensors")[0]
    for name, cfg in UPSTREAM.items():
        path = tmp / f"{name}.pt"
        torch.save(upstream_state_dict(cfg, seed=5), path)
        yield name, "upstream", convert(path, cfg).eval()


def logits(tmp: Path) -> dict[str, torch.Tensor]:
    """Every model's logits on its pictures (and the pictures), keyed ``model@picture``."""
    out = pictures("bundled") | pictures("upstream")
    with one_thread(), torch.no_grad():
        for name, kind, model in models(tmp):
            for key, img in pictures(kind).items():
                out[f"{name}@{key}"] = model(img.float() / 255)
    return out


@pytest.mark.slow
def test_logits_are_the_recorded_ones_bit_for_bit(tmp_path):
    want = load_file(RECORDED)
    got = logits(tmp_path)
    assert sorted(got) == sorted(want)
    for key, value in got.items():
        assert value.dtype == want[key].dtype and torch.equal(value, want[key]), key


if __name__ == "__main__":
    import tempfile

    RECORDED.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_file({k: v.contiguous() for k, v in logits(Path(tmp)).items()}, str(RECORDED))
    print(f"wrote {RECORDED.relative_to(ROOT)}")
