"""The import graph of osfleet (and of the Pulumi program, ``infra/osfleet_infra``) read from the source: no cycle
between modules, and no import that goes up the layers (CONTRIBUTING.md, "The import graph's layers").

Every first-party import counts, at module level and inside functions (a function-level import is still a
dependency, and was where the earlier cycles hid); only imports under ``if TYPE_CHECKING:`` are left out, as they
never run. ``from package import name`` is an edge to the submodule when ``name`` is one, else to the package. As
in import-linter and pydeps, importing ``a.b.c`` is an edge to ``a.b.c`` alone, not to the ``__init__`` of its
parents.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

# Where each top-level package's source is: osfleet itself, and the Pulumi program (on sys.path as infra/).
ROOTS = {"osfleet": REPO, "osfleet_infra": REPO / "infra"}

# The layers, top first: a module may import from its own layer and the ones below, never from one above. A
# module belongs to the layer of its group: ``osfleet.<subpackage>`` (the host's primitives are ``osfleet.vm``,
# the measurement helpers ``osfleet.measure``), or ``osfleet.<module>`` for the flat modules, or
# ``osfleet_infra``; every area's ``cli.py`` (``osfleet/<area>/cli.py``), mounted by ``osfleet/cli.py``, is in
# the command line's layer whatever its package.
LAYERS: list[tuple[str, frozenset[str]]] = [
    ("command line", frozenset({"osfleet.cli", "osfleet.__main__", "*.cli"})),
    (
        "services and tools",
        frozenset(
            {
                "osfleet.api",
                "osfleet.bench",
                "osfleet.chaos",
                "osfleet.cua",
                "osfleet.e2b",
                "osfleet.fleet",
                "osfleet.gym",
                "osfleet.imaging",
                "osfleet.lab",
                "osfleet.loadtest",
                "osfleet.mcp",
                "osfleet.openenv",
                "osfleet.osworld",
                "osfleet.plan",
                "osfleet.report",
                "osfleet.ui",
                "osfleet_infra",
            }
        ),
    ),
    (
        "replicas, tasks, client",
        frozenset({"osfleet.client", "osfleet.recording", "osfleet.replicas", "osfleet.tasks"}),
    ),
    (
        "primitives",
        frozenset(
            {
                "osfleet",
                "osfleet.checkout",
                "osfleet.cli_support",
                "osfleet.config",
                "osfleet.errors",
                "osfleet.logs",
                "osfleet.measure",
                "osfleet.network_policy",
                "osfleet.peers",
                "osfleet.protocol",
                "osfleet.recipe",
                "osfleet.serving_gate",
                "osfleet.tls",
                "osfleet.vm",
            }
        ),
    ),
]

# Cycles between groups of one layer that are left as they are, each with its reason. A cycle between modules is
# never allowed; these close only through different modules of each group.
KNOWN_GROUP_CYCLES: dict[frozenset[str], str] = {
    frozenset({"osfleet.api", "osfleet.fleet", "osfleet.ui"}): (
        "the host agent's and the gateway's apps (api/app.py, fleet/app.py) mount the dashboard, whose backends "
        "use the agent's auth and errors and the gateway's ids; untangling it means one app factory above all three"
    ),
    frozenset({"osfleet.lab", "osfleet_infra"}): (
        "lab/engine.py runs the Pulumi program (osfleet_infra.program.run, an inline program), and the program's "
        "lab stack reads the lab's hosts back (lab.state); the engine would have to leave the lab package"
    ),
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    lazy: bool  # inside a function

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} -> {self.imported}{' (in a function)' if self.lazy else ''}"


def first_party_modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's ``__init__``)."""
    modules = {}
    for top, base in ROOTS.items():
        for path in sorted((base / top).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


MODULES = first_party_modules()


def known(name: str) -> str | None:
    """The longest prefix of ``name`` that is a first-party module (``a.b.Name`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str) -> Iterator[Import]:
    path, is_package = MODULES[module]
    package = module if is_package else module.rpartition(".")[0]

    def targets(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
        if isinstance(node, ast.Import):
            yield from (t for a in node.names if (t := known(a.name)))
            return
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            target = sub if sub in MODULES else known(base)
            if target:
                yield target

    def walk(node: ast.AST, lazy: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    yield from walk_one(other, lazy)
                continue
            yield from walk_one(child, lazy)

    def walk_one(node: ast.AST, lazy: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in targets(node):
                if target != module:
                    yield Import(module, target, node.lineno, lazy)
            return
        yield from walk(node, lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    yield from walk(ast.parse(path.read_text(), str(path)), False)


ALL_IMPORTS = [imp for module in MODULES for imp in imports_of(module)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def group(module: str) -> str:
    if module in ("osfleet.cli", "osfleet.__main__") or module.endswith(".cli"):
        return "*.cli"
    parts = module.split(".")
    return parts[0] if parts[0] != "osfleet" else ".".join(parts[:2])


def layer(module: str) -> int:
    g = group(module)
    for number, (_, groups) in enumerate(LAYERS):
        if g in groups:
            return number
    raise AssertionError(f"{module} ({g}) is in no layer: add its group to LAYERS (and to CONTRIBUTING.md)")


def test_the_graph_is_read() -> None:
    """The reader finds what is known to be there: else the checks below would pass on an empty graph."""
    edges = {(i.importer, i.imported) for i in ALL_IMPORTS}
    assert ("osfleet.tasks.model", "osfleet.tasks.osworld_format.convert") in edges  # from ... import name
    metrics = "osfleet.tasks.osworld_format.metrics"
    assert (metrics, f"{metrics}.archives") in edges  # a submodule by name
    assert any(i.lazy and i.importer == "osfleet.lab.engine" for i in ALL_IMPORTS)  # inside a function
    assert ("osfleet_infra.aws", "osfleet_infra.bare_metal") in edges  # the Pulumi program's package
    assert len(MODULES) > 200 and len(ALL_IMPORTS) > 1500
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    for imp in ALL_IMPORTS:
        graph.setdefault(imp.importer, set()).add(imp.imported)
    found = cycles(graph)
    where = [[str(i) for i in ALL_IMPORTS if i.importer in c and i.imported in c] for c in found]
    assert not found, f"import cycles between modules: {where}"


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer(module)


def test_no_import_goes_up_the_layers() -> None:
    upward = [
        f"{imp} ({LAYERS[layer(imp.importer)][0]} imports {LAYERS[layer(imp.imported)][0]})"
        for imp in ALL_IMPORTS
        if layer(imp.imported) < layer(imp.importer)
    ]
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)


def test_no_cycle_between_groups_but_the_known_ones() -> None:
    graph: dict[str, set[str]] = {}
    for imp in ALL_IMPORTS:
        if group(imp.importer) != group(imp.imported):
            graph.setdefault(group(imp.importer), set()).add(group(imp.imported))
    found = {frozenset(c) for c in cycles(graph)}
    assert found - set(KNOWN_GROUP_CYCLES) == set(), "new cycles between packages"
    assert set(KNOWN_GROUP_CYCLES) - found == set(), "a known cycle is gone: remove it from KNOWN_GROUP_CYCLES"


# The tooling: what measures, drives or reports on osfleet, as opposed to osfleet itself. The runtime (what a host
# or a gateway runs, and the client) never imports it, so the tooling can leave the runtime wheel (an extra or a
# package of its own) without the runtime noticing; the command line mounts both.
TOOLING = frozenset({"osfleet.bench", "osfleet.chaos", "osfleet.lab", "osfleet.loadtest", "osfleet.report"})
RUNTIME = frozenset(
    {
        "osfleet.api",
        "osfleet.client",
        "osfleet.cua",
        "osfleet.e2b",
        "osfleet.fleet",
        "osfleet.gym",
        "osfleet.imaging",
        "osfleet.mcp",
        "osfleet.openenv",
        "osfleet.osworld",
        "osfleet.protocol",
        "osfleet.recording",
        "osfleet.replicas",
        "osfleet.tasks",
        "osfleet.ui",
        "osfleet.vm",
    }
)


def test_the_runtime_never_imports_the_tooling() -> None:
    groups = {group(m) for m in MODULES}
    assert groups.issuperset(TOOLING | RUNTIME)  # the names above are still packages
    wrong = [str(i) for i in ALL_IMPORTS if group(i.importer) in RUNTIME and group(i.imported) in TOOLING]
    assert not wrong, "the runtime imports the tooling (bench, chaos, lab, loadtest, report):\n" + "\n".join(wrong)
