"""``python -m ssog_core <command>``: the dispatcher lists every command, hands each its arguments and names it in
the command's usage line, and refuses an unknown command readably."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ssog_core.__main__ import COMMANDS, main
from ssog_core.nn.vit import ViT

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_help_lists_every_command():
    proc = subprocess.run(
        [sys.executable, "-m", "ssog_core", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m ssog_core")
    listed = [line.split()[0] for line in proc.stdout.split("commands:\n")[1].splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS) == [
        "train", "evaluate", "convert", "export-maps", "figures", "info", "intervene", "lm-train", "fields",
        "distill", "target-share",
    ]  # fmt: skip


def test_a_command_gets_its_arguments(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["python -m ssog_core"])  # main names the command there; restored after
    cfg = {"num_classes": 7, "img_size": 20, "patch_size": 4, "dim": 24, "depth": 3, "num_heads": 3}
    assert main(["info", "--config", json.dumps(cfg)]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("given")]
    params = sum(p.numel() for p in ViT(**cfg).parameters())  # counted here, not by the command's own code
    assert f"{params:,}" in row.split()


def test_a_command_names_itself_in_its_errors(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["python -m ssog_core"])
    with pytest.raises(SystemExit) as stop:
        main(["export-maps", "--image", "x.png"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "python -m ssog_core export-maps: error: the following arguments are required: --checkpoint" in err


def test_an_unknown_command_is_refused_with_the_list(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["export_maps"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'export_maps'" in err and "'export-maps'" in err
