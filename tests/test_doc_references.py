"""The docs name only what exists: every ``ssog_core.*`` / ``app.*`` module path (and the name after it), every
repository file path in code and every link that README.md, docs/*.md, the model card, assets/README.md and the
notebooks mention resolves in this checkout."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "checkpoints" / "MODEL_CARD.md"]
DOCS += [ROOT / "assets" / "README.md"]  # (benchmarks/*.md also name the files a GPU run will write)
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
TOP = ("ssog_core", "app", "docs", "tests", "experiments", "benchmarks", "checkpoints", "assets", "examples", ".ci")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"(?<![\w./-])((?:ssog_core|app)(?:\.[A-Za-z_]\w*)+)")
FILE = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(t) for t in TOP)})/[\w./*{{}},-]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def text_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"])
    return path.read_text(encoding="utf-8")


def resolves(name: str) -> bool:
    """``name`` is a module, or a module and attributes on it (the longest importable prefix is the module)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        here = ROOT.joinpath(*parts[:i])  # this checkout's file, not whatever else the path could import
        if not (here.with_suffix(".py").is_file() or (here / "__init__.py").is_file()):
            continue
        module = ".".join(parts[:i])
        if i == len(parts):
            return True
        if parts[i - 1] == "__main__":  # never run an entry module to look inside it
            return False
        obj = importlib.import_module(module)
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def brace_expansions(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    return [x for alt in m.group(1).split(",") for x in brace_expansions(head + alt + tail)]


def exists(path: str, base: Path) -> bool:
    """A path, a glob (at least one match) or a brace pattern (at least one alternative), from ``base``."""
    return any(any(base.glob(p)) if "*" in p else (base / p).exists() for p in brace_expansions(path.rstrip(".,:;)")))


def mentions(path: Path) -> tuple[set[str], set[str], set[str]]:
    """Module paths, repository paths (from the root) and relative links in ``path``."""
    text = text_of(path)
    spans = " ".join(CODE_SPAN.findall(text)) + "\n" + "\n".join(re.findall(r"```\w*\n(.*?)```", text, re.S))
    modules = {m.rstrip(".") for m in DOTTED.findall(spans)}
    files = {f.split("::")[0] for f in FILE.findall(spans) if "<" not in f}
    links = {
        link.split("#")[0] for link in LINK.findall(text) if not re.match(r"[a-z]+:", link) and not link.startswith("#")
    }
    return modules, files, links


@pytest.mark.parametrize("doc", DOCS + NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_and_file_a_doc_names_exists(doc: Path):
    modules, files, links = mentions(doc)
    assert sorted(m for m in modules if not resolves(m)) == []
    assert sorted(f for f in files if not exists(f, ROOT)) == []
    assert sorted(link for link in links if link and not exists(link, doc.parent)) == []


def test_the_checks_can_fail(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Run `python -m ssog_core.evaluate` on `docs/figures/gone.png`; the field is `ssog_core.field.apply_field`,"
        " drawn by `app.plots.nothing_here`; see [the design](DESIGN.md) and ![a](docs/figures/x.png).\n"
    )
    modules, files, links = mentions(doc)
    assert modules == {"ssog_core.evaluate", "ssog_core.field.apply_field", "app.plots.nothing_here"}
    assert [m for m in sorted(modules) if not resolves(m)] == ["app.plots.nothing_here", "ssog_core.evaluate"]
    assert files == {"docs/figures/gone.png"} and not exists("docs/figures/gone.png", ROOT)
    assert links == {"DESIGN.md", "docs/figures/x.png"} and not exists("DESIGN.md", tmp_path)
    assert exists("experiments/results/metrics_*_layouts_stage*.jsonl", ROOT)
    assert exists("benchmarks/results/rbf_{cpu,gpu}.json", ROOT)


def test_docs_hold_prose_and_figures_and_each_experiment_is_named_where_it_writes():
    docs = ROOT / "docs"
    prose = {*docs.glob("*.md"), *(p for p in (docs / "figures").rglob("*") if p.suffix != ".py")}
    assert sorted(str(p.relative_to(ROOT)) for p in docs.rglob("*") if p.is_file() and p not in prose) == []
    written = "\n".join(text_of(doc) for doc in DOCS)
    scripts = sorted(p.name for p in (ROOT / "experiments").glob("*.py"))
    assert scripts and [s for s in scripts if f"python experiments/{s}" not in written] == []
