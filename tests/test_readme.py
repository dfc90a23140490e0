"""README stays true: its Python example runs, and CI runs README's test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_python_example_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    (code,) = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["maps"].net.shape[1] == namespace["model"].config.depth


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()
    assert any(c.endswith(".venv/bin/python -m app") for c in commands)
