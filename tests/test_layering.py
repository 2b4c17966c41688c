"""Imports only point down, each room imports what docs/architecture.md says it may, and
supervisor/ has no import cycle.

Every module of hermes/, targetkit/, worker/, supervisor/, testkit/ and bench/ is read with `ast`
(never imported). The layers: `hermes` imports neither `worker` nor `supervisor`; `targetkit` (the
public kit a target is written with) stands on `hermes` alone; `worker` does not import
`supervisor`; nothing but `bench` imports `bench`; `testkit` stands on its own. Any
import counts, at module level or inside a function. Cycles are looked for among every import
inside supervisor/ that runs, at module level or in a function (an import under
`if TYPE_CHECKING:` never runs, and is not counted).
"""
from __future__ import annotations

import ast
import re
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
    runtime: set[str] = field(default_factory=set)               # every import but those for type checkers


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


def _walk(body: list[ast.stmt], module: Module, known: set[str], top: bool, typing: bool = False) -> None:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = _targets(node, module, known)
            module.imports.update(targets)
            if not typing:
                module.runtime.update(targets)
            if top:
                module.module_level.update(targets)
        elif isinstance(node, ast.If) and _is_type_checking(node):
            _walk(node.body, module, known, top=False, typing=True)
            _walk(node.orelse, module, known, top, typing)
        else:
            for name, value in ast.iter_fields(node):
                # Bodies of functions and classes' methods run later; a class body, try and if run now.
                nested = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                    _walk(value, module, known, nested, typing)
                elif isinstance(value, list):
                    for item in value:
                        if isinstance(item, ast.excepthandler):
                            _walk(item.body, module, known, nested, typing)


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


def test_the_supervisor_never_loads_the_model_sdk() -> None:
    """Only a worker calls a model: a campaign's or a daemon's own process that imported the OpenAI
    SDK would pay about a second of CPU for nothing, once per campaign and per command."""
    code = ("import sys, supervisor.cli, supervisor.chaos.campaign, supervisor.chaos.checker, "
            "supervisor.chaos.scenarios, supervisor.daemon.service, supervisor.daemon.events; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'openai')[:5])")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


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


# Import circles known and being taken apart, each with why it is tolerated until then. An entry
# is a circle's modules, sorted; one that no longer exists must be taken off (the test says so).
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {}


def test_supervisor_has_no_import_cycle() -> None:
    """A cycle counts every import that runs: at module level or inside a function (a lazy import
    only hides a circle until the function is called). Imports for type checkers never run and are
    not counted."""
    graph = {m.name: {t for t in m.runtime if t in MODULES and _package(t) == "supervisor"}
             for m in MODULES.values() if _package(m.name) == "supervisor"}
    assert sum(len(targets) for targets in graph.values()) > 20  # the graph was really built
    found = {tuple(cycle) for cycle in _cycles(graph)}
    assert not found - set(ALLOWED_CYCLES), f"new import cycles: {sorted(found - set(ALLOWED_CYCLES))}"
    assert not set(ALLOWED_CYCLES) - found, f"gone, take off ALLOWED_CYCLES: {sorted(set(ALLOWED_CYCLES) - found)}"


def test_a_lazy_import_closing_a_circle_is_a_cycle_and_a_type_only_one_is_not() -> None:
    def module(name: str, source: str) -> Module:
        found = Module(name, REPO / "supervisor" / "x.py")
        _walk(ast.parse(source).body, found, {"supervisor.a", "supervisor.b"}, top=True)
        return found

    lazy = module("supervisor.b", "def f():\n    from supervisor import a\n")
    typed = module("supervisor.b", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from supervisor import a\n")
    assert lazy.runtime == {"supervisor.a"} and typed.runtime == {"typing"}
    assert _cycles({"supervisor.a": {"supervisor.b"}, "supervisor.b": lazy.runtime}) == [["supervisor.a", "supervisor.b"]]
    assert _cycles({"supervisor.a": {"supervisor.b"}, "supervisor.b": typed.runtime}) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# ------------------------------------------------------------ the rooms of docs/architecture.md
ARCHITECTURE = REPO / "docs" / "architecture.md"
HEADER = "| room | what it owns | may import |"
ANYTHING, NOTHING_OF_OURS = "anything", "nothing of ours"


@dataclass
class Room:
    modules: list[str]                 # the room's modules (a prefix: a package, or one module)
    allowed: list[str] | None          # module prefixes of ours it may import (None: anything)
    only_through: dict[str, str] = field(default_factory=dict)  # allowed prefix -> the one module of the room that may


def _resolve(token: str, base: str) -> str:
    """A room table's name as a module: `procs/` under supervisor's table is supervisor.procs."""
    name = token.strip("`").removesuffix(".py").rstrip("/").replace("/", ".")
    return name if _package(name) in PACKAGES else f"{base}.{name}" if base else name


def read_rooms(text: str) -> list[Room]:
    """Every row of every table headed HEADER: its rooms (first cell) and what they may import (third)."""
    rooms, in_table, base = [], False, ""
    for line in text.splitlines():
        if line.strip() == HEADER:
            in_table = True
            continue
        if not in_table or not line.startswith("|"):
            in_table = in_table and line.startswith("|")
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set(cells[0]) <= {"-", " "}:
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        first = names[0].strip("/")
        base = "supervisor" if _package(first.replace("/", ".").removesuffix(".py")) not in PACKAGES else ""
        modules, parent = [], ""
        for name in names:
            module = _resolve(name, base)
            if "/" not in name and not base and parent:  # `finalizer.py` after `hermes/executor.py`
                module = f"{parent}.{name.removesuffix('.py')}"
            parent = module.rsplit(".", 1)[0] if name.endswith(".py") else module
            modules.append(module)
        rule = cells[2]
        if rule.startswith(ANYTHING):
            rooms.append(Room(modules, None))
            continue
        allowed = [] if rule.startswith(NOTHING_OF_OURS) else [
            _resolve(t, base) for t in re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", rule))]
        through = {_resolve(a, base): _resolve(b, f"{modules[0]}") for a, b in
                   re.findall(r"`([^`]+)` only through `([^`]+)`", rule)}
        rooms.append(Room(modules, [a for a in allowed if a not in through and a not in through.values()], through))
    return rooms


ROOMS = read_rooms(ARCHITECTURE.read_text(encoding="utf-8"))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _room_of(name: str) -> tuple[Room, str] | None:
    """The most specific room holding module `name`, with the prefix that matched."""
    found = [(room, m) for room in ROOMS for m in room.modules if _within(name, m)]
    return max(found, key=lambda pair: len(pair[1])) if found else None


def test_the_room_tables_are_read() -> None:
    rooms = {m: room for room in ROOMS for m in room.modules}
    assert {"supervisor.cli", "supervisor.chaos", "supervisor.daemon", "hermes.runner", "hermes.finalizer",
            "hermes.store", "targetkit", "worker.targets", "testkit", "bench"} <= set(rooms), sorted(rooms)
    assert rooms["bench"].allowed is None and rooms["hermes.transcript"].allowed == []
    assert rooms["supervisor.daemon"].only_through == {"testkit": "supervisor.daemon.demo",
                                                       "worker.chaos_tools": "supervisor.daemon.demo"}
    assert "testkit" not in rooms["supervisor.daemon"].allowed


def test_every_room_imports_only_what_its_row_says() -> None:
    """docs/architecture.md's rooms, each with what it may import: a module of a room imports, of
    ours, its own room and what the row allows (a `X` only through `Y` allows X in module Y alone).
    What is imported for type checkers only is no dependency of the running code, and is not counted."""
    wrong = []
    for module in MODULES.values():
        found = _room_of(module.name)
        if found is None or found[0].allowed is None:
            continue
        room = found[0]
        for target in sorted(module.runtime):
            if _package(target) not in PACKAGES or any(_within(target, m) for m in room.modules):
                continue
            if any(_within(target, a) for a in room.allowed):
                continue
            through = [v for k, v in room.only_through.items() if _within(target, k)]
            if through and any(_within(module.name, v) for v in through):
                continue
            wrong.append(f"{module.name} imports {target}, which its room's row does not allow")
    assert not wrong, "\n".join(wrong)
