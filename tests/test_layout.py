"""The package layout of docs/DESIGN.md §0, enforced: which package may import which, and no import cycle.

Imports are read with ``ast`` from every module of ``ssog_core/`` (also the ones inside functions), so the rules
hold for what a module can pull in at any time, not only at import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ssog_core"

# Each package's layer: a module may import its own package and any lower layer, never a higher layer or another
# package of its own layer. (The package root re-exports the public API and is exempt.)
LAYERS = {
    "field": 0,
    "version": 0,
    "runtime": 0,  # infrastructure: heavy jobs, the LRU, folders, malloc; the CLI and the app submit jobs through it
    "ops": 1,
    "testing": 1,
    "nn": 2,
    "data": 2,
    "checkpoint": 3,
    "train": 4,
    "analysis": 4,
    "interventions": 5,
    "viz": 5,
    "distill": 6,  # an SSOG student of any ViT: builds on train, analysis, interventions' pictures and viz
    "cli": 7,
    "entry": 8,  # `python -m ssog_core <command>` and `python -m ssog_core.train`: they only call ssog_core.cli
}
ENTRY_MODULES = {"ssog_core.__main__", "ssog_core.train.__main__"}
MAX_ROOT_MODULES = 3  # modules of the package root's own beside its subpackages (__init__ and __main__ aside)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The modules ``path`` imports (``from a import b`` counts as ``a.b`` where that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs or {node.module}
    return found


def package_of(module: str) -> str | None:
    """The layout package of an ``ssog_core`` module, ``None`` for the package root."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    if module in ENTRY_MODULES:
        return "entry"
    return parts[1]


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: {i for i in imports(p, known) if i.split(".")[0] in ("ssog_core", "app")} for m, p in mods.items()}


def test_every_package_has_a_layer():
    packages = {package_of(m) for m in modules()} - {None}
    assert packages == set(LAYERS), "a new package needs its layer here and in docs/DESIGN.md §0"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in graph.items():
        src = package_of(mod)
        if src is None:
            continue
        for target in targets:
            if target.split(".")[0] == "app":
                bad.append(f"{mod} imports the app ({target})")
                continue
            dst = package_of(target)
            if dst is None:
                bad.append(f"{mod} imports the package root ({target}): import the module that defines the name")
            elif dst == "testing" and src != "testing":
                bad.append(f"{mod} imports the test tooling ({target})")
            elif dst == "entry" and src != "entry":
                bad.append(f"{mod} imports a root entry module ({target})")
            elif dst != src and LAYERS[dst] >= LAYERS[src]:
                bad.append(f"{mod} ({src}, layer {LAYERS[src]}) imports {target} ({dst}, layer {LAYERS[dst]})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle between modules, each once (depth-first search)."""
    found, state = [], {}
    seen_cycles = set()

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt) :]
                key = frozenset(cycle)
                if key not in seen_cycles:
                    seen_cycles.add(key)
                    found.append([*cycle, nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_package_imports_a_higher_one():
    assert layer_violations(import_graph()) == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def runtime_reaches(graph: dict[str, set[str]]) -> set[str]:
    """The ``ssog_core`` modules outside ``ssog_core.runtime`` that a runtime module imports."""
    return {
        t
        for m, targets in graph.items()
        if package_of(m) == "runtime"
        for t in targets
        if t.split(".")[0] == "ssog_core" and package_of(t) != "runtime"
    }


def test_runtime_imports_no_domain_module():
    """Infrastructure stays below the domain: ssog_core.runtime imports only itself (a job's model loader is passed
    in by its caller), so the domain may use it and it never climbs back."""
    graph = import_graph()
    assert {m for m in graph if package_of(m) == "runtime"} >= {"ssog_core.runtime.jobs", "ssog_core.runtime.lru"}
    assert runtime_reaches(graph) == set()


def test_the_package_root_holds_at_most_three_modules_beside_its_subpackages():
    own = [p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")]
    assert len(own) <= MAX_ROOT_MODULES, f"{own}: move infrastructure into a subpackage (docs/DESIGN.md §0)"


def test_the_checks_can_fail():
    """The checks catch what they are for: a model importing the trainer, a loop, infrastructure reaching up."""
    graph = import_graph()
    graph["ssog_core.runtime.jobs"] = graph["ssog_core.runtime.jobs"] | {"ssog_core.checkpoint.format"}
    assert runtime_reaches(graph) == {"ssog_core.checkpoint.format"}
    assert any("ssog_core.runtime.jobs (runtime, layer 0) imports ssog_core.checkpoint.format" in v
               for v in layer_violations(graph))  # fmt: skip
    graph["ssog_core.nn.vit"] = graph["ssog_core.nn.vit"] | {"ssog_core.train.trainer"}
    assert any("ssog_core.nn.vit (nn, layer 2) imports ssog_core.train.trainer" in v for v in layer_violations(graph))
    graph["ssog_core.ops.env"] = {"ssog_core.ops.dispatch"}
    assert ["ssog_core.ops.dispatch", "ssog_core.ops.env", "ssog_core.ops.dispatch"] in cycles(graph)
    graph["ssog_core.data.shapes"] = {"app.main", "ssog_core.testing.oracles"}
    assert {"ssog_core.data.shapes imports the app (app.main)"} <= set(layer_violations(graph))
    assert any("imports the test tooling" in v for v in layer_violations(graph))


def test_the_entry_modules_only_reach_the_cli():
    known = set(modules())
    assert imports(PACKAGE / "train" / "__main__.py", known) == {"sys", "ssog_core.cli.train"}
    assert {m for m in imports(PACKAGE / "__main__.py", known) if m.startswith("ssog_core")} == set()
    # the dispatcher imports its command's module by name: one command per module of cli/ that has a main
    from ssog_core.__main__ import COMMANDS

    cli = {p.stem for p in (PACKAGE / "cli").glob("*.py") if p.stem != "__init__"}
    assert sorted(module for module, _ in COMMANDS.values()) == sorted(cli)
    assert all(name == module.replace("_", "-") for name, (module, _) in COMMANDS.items())
    top = ("__init__", "__main__", "field", "version")
    assert not [p.name for p in PACKAGE.glob("*.py") if p.stem not in top]


# ------------------------------------------------------------------------------------------------------------ app/
# The app draws what ssog_core computes: a tab imports no other tab (what tabs share lives in app/, what they compute
# in ssog_core), only app/layout.py (which builds the page from them) imports a tab (the API and the other modules
# call services: app/fields.py, app/interventions.py, ...), and nothing in app/ calls a command line.
PAGE = "app.layout"
APP = ROOT / "app"


def app_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(APP.rglob("*.py"))}


def app_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    def tab(name: str) -> bool:
        return name == "app.tabs" or name.startswith("app.tabs.")

    def cli(name: str) -> bool:
        return name == "ssog_core.cli" or name.startswith("ssog_core.cli.")

    def bad(m: str, t: str) -> bool:
        return (tab(t) and t != m and (tab(m) or m != PAGE)) or cli(t)

    return {(m, t) for m, ts in graph.items() for t in ts if bad(m, t)}


def app_graph() -> dict[str, set[str]]:
    known = set(app_modules()) | set(modules())
    return {m: imports(p, known) for m, p in app_modules().items()}


def test_tabs_import_no_tab_only_the_page_imports_tabs_and_the_app_no_command_line():
    assert app_violations(app_graph()) == set()


def test_the_app_checks_can_fail():
    graph = app_graph()
    graph["app.tabs.scaling"] = graph["app.tabs.scaling"] | {"app.tabs.export"}
    graph["app.plots"] = graph["app.plots"] | {"ssog_core.cli.figures"}
    graph["app.tabs.compare"] = graph["app.tabs.compare"] | {"ssog_core.cli"}
    graph["app.api"] = graph["app.api"] | {"app.tabs.geometry"}
    graph["app.layout"] = graph["app.layout"] | {"app.tabs.geometry"}  # the page builds itself from the tabs
    assert app_violations(graph) == {
        ("app.tabs.scaling", "app.tabs.export"),
        ("app.plots", "ssog_core.cli.figures"),
        ("app.tabs.compare", "ssog_core.cli"),
        ("app.api", "app.tabs.geometry"),
    }
