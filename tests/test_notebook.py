"""examples/interventions.ipynb runs from top to bottom on the bundled model (executed with nbclient)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "interventions.ipynb"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the kernel runs the bundled model: room for a loaded machine
@pytest.mark.skipif(not (ROOT / "checkpoints" / "matched_ssog_layouts.safetensors").is_file(), reason="no demo model")
def test_the_interventions_notebook_runs(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    assert "most elongated head" in text and "log p(true) change" in text
    assert "standard ViT (timm folder, 0 prefix tokens)" in text and "ablate_head 0.0 on the standard ViT" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 4  # the figures are inline
