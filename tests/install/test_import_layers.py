"""What a module loads says which layer it belongs to: the client (what the Spark connector and the CLI use) talks
to a broker over AMQP and loads nothing of the broker's core; and the import graph of ``src/shardbus`` has its
arrows pointing down, with no loops (docs/architecture.md draws the same floors)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = (
    "shardbus.namespace",
    "shardbus.registry",
    "shardbus.entity",
    "shardbus.partition",
    "shardbus.store",
    "shardbus.access",
    "shardbus.endpoint",
    "shardbus.http",
    "shardbus.listener",
    "shardbus.cluster",
    "shardbus.server",
    "shardbus.frontends",
    "shardbus.serve_command",
)


def loaded_by(statement: str) -> set[str]:
    script = f"import sys; {statement}; print('\\n'.join(m for m in sys.modules if m.startswith('shardbus')))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    return set(done.stdout.split())


def test_the_client_loads_nothing_of_the_core():
    loaded = loaded_by("import shardbus.client")
    assert not [m for m in loaded if m.startswith(CORE)], sorted(loaded)


def test_the_package_api_is_there_on_first_use():
    loaded = loaded_by("import shardbus; shardbus.Namespace; shardbus.Message; shardbus.EntityNotFound")
    assert "shardbus.namespace" in loaded
    loaded = loaded_by("from shardbus import *")
    assert "shardbus.namespace" in loaded


# ----------------------------------------------------------------------------------------------------------------
# The import graph, read from the source with ``ast``: arrows point down and there are no loops.
#
# What counts as an import: every ``import`` and ``from ... import`` statement anywhere in a module, at module level
# and inside functions and methods alike (a function-level import is an arrow too, only a later one), except those
# under ``if TYPE_CHECKING:``, which never run. ``from package import name`` counts as an import of the submodule
# ``package.name`` when there is one, else of ``package``. A package's ``__init__`` is not counted as imported by
# importing one of its submodules (the inits here only document their package).
# ----------------------------------------------------------------------------------------------------------------
SRC = Path(__file__).resolve().parents[2] / "src" / "shardbus"

# Rooms of the house, from the bottom up. A room imports only rooms below it, or rooms on its own floor where the
# floor says so; ``shardbus`` itself (the lazy package API) and the pytest plugin stand outside.
FLOORS: list[tuple[str, ...]] = [
    ("model", "stalltrace"),  # pure values and rules; the stall trace (a debugging aid that imports nothing of ours)
    ("amqp", "metrics", "logs", "extras", "runtime"),  # the sans-IO engine; what every process sets up
    ("message_wire",),  # a message's AMQP sections, shared by the client and the endpoint
    ("message_size",),  # a message's size on the wire: the Python API's size check, as AMQP's
    ("store",),
    ("partition",),
    ("entity", "cluster"),  # entities over partitions; partitions in workers (neither imports the other)
    ("registry",),  # the namespace's parts
    ("namespace",),
    ("access", "client"),  # who may talk to which namespace; our own blocking client (imports no core)
    ("endpoint", "http", "spark"),  # the front ends: none imports another
    ("config", "listener"),
    ("server",),
    ("frontends",),  # the supervisor of M front-end processes, each a whole server
    ("serve_command", "cli_commands"),
    ("cli",),
]
SAME_FLOOR_ALLOWED = {("http", "client"), ("spark", "client"), ("cli_commands", "serve_command")}
# Room-level arrows that skip the floors but are fine: the CLI's client side reads the HTTP side's ATOM mapping and
# the endpoint's mapping constants (both are values, not servers).
LATERAL_ALLOWED = {("cli_commands", "http"), ("cli_commands", "endpoint"), ("cli_commands", "access")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph() -> dict[str, set[str]]:
    """shardbus module -> the shardbus modules it imports (module- and function-level; see above)."""
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()

        def visit(node: ast.AST, package: str = package, found: set[str] = found) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for other in child.orelse:
                        visit(other)
                    continue
                if isinstance(child, ast.Import):
                    found.update(a.name for a in child.names)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                        target = ".".join(base + ([child.module] if child.module else []))
                    else:
                        target = child.module or ""
                    for alias in child.names:
                        sub = f"{target}.{alias.name}"
                        found.add(sub if sub in files else target)
                visit(child)

        visit(ast.parse(path.read_text(encoding="utf-8")))
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def room(module: str) -> str:
    """The room a module lives in: ``shardbus.endpoint.connection`` -> ``endpoint``; ``shardbus`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
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


def test_no_module_imports_itself_round_a_loop():
    """Outside the AMQP engine (whose connection/session/link trio is its own business), no module reaches itself
    through its imports."""
    graph = {m: {t for t in ts if room(t) != "amqp"} for m, ts in import_graph().items() if room(m) != "amqp"}
    assert cycles(graph) == []


def test_no_room_imports_itself_round_a_loop():
    """The same one level up: rooms (``endpoint``, ``http``, ``cluster``, ``server``, ``cli``...) form no loop."""
    rooms: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        if room(module) in ("", "amqp"):
            continue
        rooms.setdefault(room(module), set()).update(
            room(t) for t in targets if room(t) not in ("", "amqp", room(module))
        )
    assert cycles(rooms) == []


def test_arrows_point_down():
    floor = {name: level for level, names in enumerate(FLOORS) for name in names}
    rooms = {room(m) for m in import_graph()} - {"", "pytest_plugin"}
    assert rooms <= set(floor), f"rooms with no floor in FLOORS: {sorted(rooms - set(floor))}"
    wrong = []
    for module, targets in import_graph().items():
        here = room(module)
        if here in ("", "pytest_plugin"):
            continue
        for target in targets:
            there = room(target)
            if there in ("", here) or (here, there) in LATERAL_ALLOWED:
                continue
            if floor[there] < floor[here] or (here, there) in SAME_FLOOR_ALLOWED:
                continue
            wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_front_ends_talk_to_the_namespace_and_entities_only():
    """The protocol adapters (``endpoint/``, ``http/``) never reach partitions, stores, workers or the namespace's
    parts: what they need of those, the namespace offers (``namespace.OFFERED``)."""
    below_the_namespace = ("partition", "store", "cluster", "registry")
    wrong = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if room(module) in ("endpoint", "http")
        for target in targets
        if room(target) in below_the_namespace
    ]
    assert wrong == []
