"""Convert a state dict saved by the upstream implementation's PyTorch ViT into an SSOG Lab checkpoint.

    python -m ssog_core convert REF.pt --config '{"num_classes": 100, "img_size": 32, "patch_size": 2}' OUT.safetensors

``--config`` takes the keyword arguments the upstream ``ViT`` was built with; omitted ones take the
upstream's own defaults. The file is read with ``torch.load(weights_only=True)``: a pickle that tries
to run code is refused, never executed. Parameter names already match, so conversion is validation:
every missing, unexpected or mis-shaped tensor is reported in one message.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ssog_core.checkpoint.format import CheckpointError, save_checkpoint
from ssog_core.checkpoint.upstream import convert


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("upstream", help="state dict saved by the upstream implementation (torch.save)")
    ap.add_argument("--config", default="{}", help="the upstream ViT's keyword arguments, as JSON")
    ap.add_argument("out", help="output .safetensors path")
    args = ap.parse_args(argv)
    try:
        kwargs = json.loads(args.config)
        if not isinstance(kwargs, dict):
            raise CheckpointError("--config must be a JSON object of ViT keyword arguments")
        model = convert(args.upstream, kwargs)
    except (json.JSONDecodeError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta = {
        "converted_from": Path(args.upstream).name,
        "reference_config": kwargs,
        "command": "python -m ssog_core convert " + shlex.join(sys.argv[1:] if argv is None else argv),
    }
    out = save_checkpoint(args.out, model, meta)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({model.config.attn}, {n:,} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
