"""``python -m ssog_core <command> ...``: one entry for every command line (``--help`` lists them).

Each command is the ``main`` of a module in ``ssog_core.cli``, imported only when that command runs; the ``ssog-*``
console scripts call the same mains. ``python -m ssog_core.train`` also stays: every checkpoint
records that command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {  # command → (its module in ssog_core.cli, what it does)
    "train": ("train", "train a ViT (what every checkpoint records as `python -m ssog_core.train`)"),
    "evaluate": ("evaluate", "a checkpoint's accuracy, and its zero-shot resolution transfer"),
    "convert": ("convert", "a state dict of the upstream implementation → an SSOG Lab checkpoint"),
    "export-maps": ("export_maps", "pull-in / pull-out / net export maps of images, raw and against a control"),
    "figures": ("figures", "the app's figures, headless (PNG + SVG), from arguments or a saved session"),
    "info": ("info", "parameters and FLOPs per forward of a configuration"),
    "intervene": ("intervene", "edit a model for one run: the prediction and validation accuracy, unedited / edited"),
    "lm-train": ("lm_train", "a byte/char-level causal LM with dot or RBF attention"),
    "fields": ("fields", "every head as a field: mean attention distance, share a field explains, fitted atoms"),
    "distill": (
        "distill",
        "an SSOG student of a dot-attention ViT: fitted fields, steered, distilled; per-head report",
    ),
    "target-share": (
        "target_share",
        "pointer: the share of disc attention on the pointed disc, per layer, μ gates closed",
    ),
}


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<12} {text}" for name, (_, text) in COMMANDS.items())
    ap = argparse.ArgumentParser(
        prog="python -m ssog_core",
        description=__doc__,
        epilog=f"commands:\n{listing}\n\n`python -m ssog_core COMMAND --help` shows a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", choices=COMMANDS, metavar="COMMAND", help="one of the commands below")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    module = importlib.import_module(f"ssog_core.cli.{COMMANDS[args.command][0]}")
    sys.argv[0] = f"python -m ssog_core {args.command}"  # argparse names the program after it in usage lines
    return module.main(args.args) or 0


if __name__ == "__main__":
    sys.exit(main())
