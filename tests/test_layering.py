"""Imports only point down, and supervisor/ has no import cycle.

Every module of hermes/, targetkit/, worker/, supervisor/, testkit/ and bench/ is read with `ast`
(never imported). The layers: `hermes` imports neither `worker` nor `supervisor`; `targetkit` (the
public kit a target is written with) stands on `hermes` alone; `worker` does not import
`supervisor`; nothing but `bench` imports `bench`; `testkit` stands on its own. Any
import counts, at module level or inside a function. Cycles are looked for among the
module-level imports inside supervisor/ (an import under `if TYPE_CHECKING:` never runs).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("hermes", "targetkit", "worker", "supervisor", "testkit", "bench")

# package -> packages of ours it must never import
FORBIDDEN = {
    "hermes": {"targetkit", "worker", "supervisor", "testkit", "bench"},
    "targetkit": {"worker", "supervisor", "testkit", "bench"},
    "worker": {"supervisor", "testkit", "bench"},
    "supervisor": {"bench"},
    "testkit": {"hermes", "targetkit", "worker", "supervisor", "bench"},
}


@dataclass
class Module:
    name: str
    path: Path
    imports: set[str] = field(default_factory=set)               # every import, anywhere
    module_level: set[str] = field(default_factory=set)          # run when the module is imported


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: Module, known: set[str]) -> list[str]:
    """The modules an import statement loads: for `from X import Y`, X.Y when that is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: resolve against this module's package
        package = module.name.split(".")
        if module.path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        base = ".".join([*package, base] if base else package)
    found = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
    return found if len(found) == len(node.names) else [base, *found]


def _walk(body: list[ast.stmt], module: Module, known: set[str], top: bool) -> None:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = _targets(node, module, known)
            module.imports.update(targets)
            if top:
                module.module_level.update(targets)
        elif isinstance(node, ast.If) and _is_type_checking(node):
            _walk(node.body, module, known, top=False)
            _walk(node.orelse, module, known, top)
        else:
            for name, value in ast.iter_fields(node):
                # Bodies of functions and classes' methods run later; a class body, try and if run now.
                nested = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                    _walk(value, module, known, nested)
                elif isinstance(value, list):
                    for item in value:
                        if isinstance(item, ast.excepthandler):
                            _walk(item.body, module, known, nested)


def load_modules() -> dict[str, Module]:
    paths = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    modules = {_module_name(p): Module(_module_name(p), p) for p in paths}
    known = set(modules)
    for module in modules.values():
        _walk(ast.parse(module.path.read_text(encoding="utf-8")).body, module, known, top=True)
    return modules


MODULES = load_modules()


def _package(name: str) -> str:
    return name.split(".")[0]


def test_every_package_is_read() -> None:
    assert {_package(name) for name in MODULES} == set(PACKAGES)
    assert "supervisor.cli" in MODULES and "supervisor.chaos.checker" in MODULES


def test_imports_only_point_down() -> None:
    wrong = sorted(f"{m.name} imports {target}" for m in MODULES.values() for target in m.imports
                   if _package(target) in FORBIDDEN.get(_package(m.name), set()))
    assert not wrong, "\n".join(wrong)


def test_the_cli_and_the_daemon_import_neither_benchmarks_nor_the_model_server_up_front() -> None:
    """Read from the modules themselves: the daemon loads the scripted model server only for its demo
    model (lazily), and the CLI imports a verb's module only when that verb runs."""
    service = MODULES["supervisor.daemon.service"]
    assert "testkit.modelserver" not in service.module_level
    cli = MODULES["supervisor.cli"]
    assert not {t for t in cli.imports if _package(t) == "bench"}
    assert not {"supervisor.chaos.campaign", "supervisor.chaos.runner", "supervisor.daemon.service",
                "testkit.modelserver"} & cli.module_level


def test_a_daemon_process_loads_no_model_server_and_no_harness_until_asked() -> None:
    """The same, as a process sees it: everything `hermes-supervisor serve --base-url ...` imports."""
    code = ("import sys, supervisor.cli, supervisor.daemon.service; print('\\n'.join(sorted("
            "m for m in sys.modules if m.split('.')[0] in ('supervisor', 'testkit', 'bench'))))")
    loaded = set(subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split())
    assert "supervisor.daemon.service" in loaded
    assert not {m for m in loaded if _package(m) == "bench"}, loaded
    assert not {"testkit.modelserver", "supervisor.chaos.campaign", "supervisor.chaos.runner",
                "supervisor.chaos.checker"} & loaded, loaded


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_supervisor_has_no_module_level_import_cycle() -> None:
    graph = {m.name: {t for t in m.module_level if t in MODULES and _package(t) == "supervisor"}
             for m in MODULES.values() if _package(m.name) == "supervisor"}
    assert sum(len(targets) for targets in graph.values()) > 20  # the graph was really built
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
