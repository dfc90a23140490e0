"""Print parameters and FLOPs per forward: ``python -m ssog_core info [--config JSON]``.

Without ``--config`` it lists the SSOG post's six ImageNet configurations beside the counts the post reports.
The counting itself is :mod:`ssog_core.nn.cost`.
"""

from __future__ import annotations

import argparse
import json

import torch

from ssog_core.nn.config import SEED_CONFIGS, ViTConfig
from ssog_core.nn.cost import count_flops, count_params
from ssog_core.nn.vit import ViT


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
