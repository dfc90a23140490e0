"""Convert between SSOG Lab checkpoints and other formats.

    python -m ssog_core convert REF.pt --config '{"num_classes": 100, "img_size": 32, "patch_size": 2}' OUT.safetensors
    python -m ssog_core convert --to timm CHECKPOINT.safetensors OUT_FOLDER

The first reads a state dict saved by the upstream implementation's PyTorch ViT. ``--config`` takes the keyword
arguments the upstream ``ViT`` was built with; omitted ones take the upstream's own defaults. The file is read with
``torch.load(weights_only=True)``: a pickle that tries to run code is refused, never executed. Parameter names
already match, so conversion is validation: every missing, unexpected or mis-shaped tensor is reported in one message.

``--to timm`` writes the lab's dot-attention ViT as a folder in timm's Hugging Face layout (``config.json`` with
``model_args``, ``model.safetensors``): no class token, average pooling, mean 0 / std 1 (the model takes [0, 1]
pixels), and the residual stream scaled so that timm's LayerNorm epsilon gives the lab's logits
(:func:`ssog_core.checkpoint.standard.timm_twin`). ``load_checkpoint`` opens the folder again.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ssog_core.checkpoint.format import CheckpointError, load_checkpoint, save_checkpoint
from ssog_core.checkpoint.upstream import convert


def to_timm(source: str, out: str) -> int:
    """The lab checkpoint ``source`` as a timm folder ``out``."""
    from ssog_core.checkpoint.standard import is_standard_source, save_timm_folder, timm_twin

    if is_standard_source(source):
        raise CheckpointError(f"{source} is a model folder; --to timm converts an SSOG Lab checkpoint file")
    if Path(out).exists() and not Path(out).is_dir():
        raise CheckpointError(f"{out} is a file; --to timm writes a folder (config.json, model.safetensors)")
    model, meta = load_checkpoint(source)
    folder = save_timm_folder(timm_twin(model), out, meta.get("class_names"))
    print(f"wrote {folder} (timm folder: config.json, model.safetensors)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="upstream state dict (torch.save); with --to timm, an SSOG Lab checkpoint")
    ap.add_argument("--config", default=None, help="the upstream ViT's keyword arguments, as JSON")
    ap.add_argument("--to", choices=("timm",), help="write an SSOG Lab dot-attention checkpoint in this format")
    ap.add_argument("out", help="output .safetensors path; with --to timm, the output folder")
    args = ap.parse_args(argv)
    try:
        if args.to == "timm":
            if args.config is not None:
                raise CheckpointError("--config describes an upstream state dict; --to timm reads the checkpoint's own")
            return to_timm(args.source, args.out)
        kwargs = json.loads(args.config or "{}")
        if not isinstance(kwargs, dict):
            raise CheckpointError("--config must be a JSON object of ViT keyword arguments")
        model = convert(args.source, kwargs)
    except (json.JSONDecodeError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta = {
        "converted_from": Path(args.source).name,
        "reference_config": kwargs,
        "command": "python -m ssog_core convert " + shlex.join(sys.argv[1:] if argv is None else argv),
    }
    out = save_checkpoint(args.out, model, meta)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({model.config.attn}, {n:,} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
