"""The floors of the code: a module imports only from its own floor or the ones below it.

Every ``import`` of the package is read with ``ast``, function-level ones and
those under ``TYPE_CHECKING`` included, so a lazy import cannot hide a floor
broken the other way. The table below is the rule; a new top-level module or
package fails the test until it is given a floor.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import agent_gateway

SOURCE = Path(agent_gateway.__file__).parent

# Bottom to top. A name is a top-level module or package of agent_gateway, except
# "store.queries", the one sub-package with a floor of its own.
FLOORS: list[tuple[str, frozenset[str]]] = [
    # Neutral leaves: they import nothing of the gateway but errors (see LEAVES), so any floor may use them.
    # ``agent_gateway`` is the package itself (its __init__ is empty; the sandbox asks it for its path).
    ("leaves", frozenset({"agent_gateway", "errors", "clock", "jsontext", "merkle", "records", "ids", "config", "addresses"})),
    # The agent kit, installed beside programs that talk to the Agent server: the server may
    # use its shapes, and it imports nothing of the server (see KIT).
    ("kit", frozenset({"agent"})),
    # The storage floor's infrastructure: engine, sqlite, direct, wal, notifications, leadership,
    # woken, supervisor, vacuum, batch, unavailable, window, tables, migrate and migrations.
    ("store", frozenset({"store"})),
    # Each area's SQL, one module per area.
    ("queries", frozenset({"store.queries"})),
    # The areas: each one's service, routes and loops. They may use one another (a Message
    # emits a Signal, a Decision writes webhook deliveries); http is the routes' common
    # ground and uses none of them (test_http_imports_no_area).
    (
        "areas",
        frozenset({
            "users", "auth", "signatures", "decisions", "messages", "scheduler", "signals",
            "transparency", "webhooks", "streams", "runtimes", "sandbox", "mcp", "web", "ops", "http",
            "channels", "ledger",
        }),
    ),
    # What puts the areas together: the gateway's apps and loops, the processes, the commands.
    ("assembly", frozenset({"gateway", "serving", "deployment", "cli", "__main__"})),
]

LEAVES = FLOORS[0][1]
# What the kit may import: itself, clock (an LLM agent tells its model the time in clock's
# format) and records (the wire shapes it types its answers with): leaves of the same
# package that need nothing of the server.
KIT = frozenset({"agent", "clock", "records"})
AREAS = FLOORS[4][1]


def unit(module: str) -> str:
    """The name of ``module``'s unit in FLOORS (``agent_gateway.store.queries.runs`` is ``store.queries``)."""
    parts = module.split(".")[1:]
    if not parts:
        return "agent_gateway"
    if parts[:2] == ["store", "queries"]:
        return "store.queries"
    return parts[0]


FLOOR_OF = {name: level for level, (_, names) in enumerate(FLOORS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = SOURCE.parent / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Each module of the package that ``tree`` imports, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "agent_gateway":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"line {node.lineno}: the package imports absolutely, so that this test reads every import"
            if (node.module or "").split(".")[0] != "agent_gateway":
                continue
            for alias in node.names:
                # ``from agent_gateway.store import engine`` imports a module; ``from x import Name`` imports x.
                candidate = f"{node.module}.{alias.name}"
                yield node.lineno, candidate if is_module(candidate) else node.module


IMPORTS = [
    (module_name(path), line, target)
    for path in sorted(SOURCE.rglob("*.py"))
    for line, target in imported(ast.parse(path.read_text(), str(path)))
]


def breaking(rule: Callable[[str, str], bool]) -> list[str]:
    """Every import of the package, as ``module:line imports target``, for which ``rule(importer's
    unit, imported unit)`` holds."""
    return [f"{module}:{line} imports {target}" for module, line, target in IMPORTS if rule(unit(module), unit(target))]


def test_every_top_level_module_has_a_floor() -> None:
    units = {unit(module_name(path)) for path in SOURCE.rglob("*.py")}
    assert units - FLOOR_OF.keys() == set(), "give each new module or package a floor in FLOORS"


def test_no_floor_imports_a_higher_one() -> None:
    assert breaking(lambda importer, target: FLOOR_OF[target] > FLOOR_OF[importer]) == []


def test_leaves_import_nothing_of_the_gateway_but_its_errors() -> None:
    # config's SettingsError is a GatewayError, as every refusal is (errors.py imports nothing);
    # and config judges a webhook URL's literal address by the rule the sender applies at each
    # attempt (addresses.py, which imports nothing either).
    allowed = {"errors", "addresses"}
    assert breaking(lambda importer, target: importer in LEAVES and target not in (importer, *allowed)) == []


def test_the_agent_kit_imports_nothing_of_the_server() -> None:
    assert breaking(lambda importer, target: importer == "agent" and target not in KIT) == []


def test_http_imports_no_area() -> None:
    assert breaking(lambda importer, target: importer == "http" and target in AREAS - {"http"}) == []


def test_the_store_imports_neither_its_queries_nor_an_area() -> None:
    assert breaking(lambda importer, target: importer == "store" and FLOOR_OF[target] > FLOOR_OF["store"]) == []
    assert breaking(lambda importer, target: importer == "store.queries" and FLOOR_OF[target] > FLOOR_OF["store.queries"]) == []


def test_the_reader_sees_function_level_imports() -> None:
    tree = ast.parse("def f():\n    from agent_gateway.store.queries import runs\n    import agent_gateway.gateway\n")
    assert [target for _, target in imported(tree)] == ["agent_gateway.store.queries.runs", "agent_gateway.gateway"]
