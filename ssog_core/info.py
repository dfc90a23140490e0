"""Count parameters and FLOPs per forward: ``python -m ssog_core.info [--config JSON]``.

FLOPs count 2 per multiply-add and include the attention itself. They are measured with
``torch.utils.flop_counter`` on a real forward pass, adding formulas for the operators it does not see
(the fused CPU SDPA kernel). Elementwise work (softmax, the Gaussians) is not counted, as in the SSOG post.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop

from ssog_core.config import SEED_CONFIGS, ViTConfig
from ssog_core.vit import ViT


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop(query_shape, key_shape, value_shape)


# Operators the flop counter has no formula for; each key maps to a formula over input shapes.
_EXTRA_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop}


def count_flops(model: nn.Module, img_size: tuple[int, int] | None = None, batch: int = 1) -> int:
    """FLOPs of one forward pass of ``model`` on ``batch`` images (of ``img_size``, default the training size)."""
    cfg = model.config
    h, w = img_size or cfg.img_size
    img = torch.rand(batch, cfg.in_chans, h, w, device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_EXTRA_FORMULAS) as counter:
            model(img)
    finally:
        model.train(was_training)
    return counter.get_total_flops()


def describe(cfg: ViTConfig) -> dict[str, float | int]:
    with torch.device("meta"):  # shapes are all counting needs: no memory, no arithmetic
        model = ViT(cfg)
    return {"params": count_params(model), "flops": count_flops(model)}


def _label(cfg: ViTConfig) -> str:
    if cfg.attn != "ssog":
        return cfg.attn
    taps = "+".join({"mu": "μδ", "sigma": "σδ", "lambda": "λ"}[t] for t in cfg.steer) or "fixed"
    return f"ssog {cfg.field} {taps} R{cfg.num_atoms}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help='ViT keyword arguments as JSON, e.g. \'{"dim": 192, "attn": "dot"}\'')
    args = ap.parse_args(argv)

    rows = []
    if args.config:
        try:
            cfg = ViTConfig.from_dict(json.loads(args.config))
        except (json.JSONDecodeError, ValueError) as e:
            ap.error(f"--config: {e}")
        d = describe(cfg)
        rows.append(
            ("given", _label(cfg), f"{cfg.dim}/{cfg.depth}/{cfg.num_heads}", d["params"], None, d["flops"], None)
        )
    else:
        for name, (cfg, seed_params, seed_flops) in SEED_CONFIGS.items():
            d = describe(cfg)
            rows.append(
                (
                    name,
                    _label(cfg),
                    f"{cfg.dim}/{cfg.depth}/{cfg.num_heads}",
                    d["params"],
                    seed_params,
                    d["flops"],
                    seed_flops,
                )
            )
    print(f"{'config':<16} {'attention':<28} {'d/L/H':<9} {'params':>12} {'seed':>12} {'GFLOPs':>8} {'seed':>6}")
    for name, label, shape, params, seed_params, flops, seed_flops in rows:
        sp = f"{seed_params:,}" if seed_params else "-"
        sf = f"~{seed_flops / 1e9:.1f}" if seed_flops else "-"
        print(f"{name:<16} {label:<28} {shape:<9} {params:>12,} {sp:>12} {flops / 1e9:>8.3f} {sf:>6}")


if __name__ == "__main__":
    main()
