"""The package's layering, read from the source with `ast` (issue 11).

Each part of `gateway` has a rank; an import may only point to a strictly lower rank, so the
drawing proxy/tools → egress → policy → vet → errors has no arrow back up, and two parts of the
same rank (proxy and tools) never import each other. Module-level imports also form no cycle.
Imports inside functions count for the layering (they are still dependencies) but not for the
cycle check (they run after both modules exist).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gateway"

# Lower ranks are imported by higher ones, never the reverse.
RANKS: dict[str, float] = {
    "gateway": 0,  # the root package: __version__ only
    "errors": 0,
    "memo": 0,
    "tasks": 0,
    "memory": 0,  # returning freed heap to the OS
    "peer_uid": 0,  # who owns a loopback peer socket (/proc/net/tcp)
    "idle_trim": 1,  # trims the heap when the tools go quiet (memory, asyncio)
    "settings": 1,
    "listener_guard": 2,  # connection budgets for the aiohttp listeners
    "vet": 1,
    "observe": 1,
    "policy": 2,
    "budget": 3,
    "egress": 3,
    # Between egress and the listeners that use them (issue 26): the pure scanner, then the
    # credential store and request screening built on it.
    "scan": 3.2,
    "credentials": 3.3,
    "inspect": 3.5,  # issue 25: the CA, leaves and TLS termination the listeners use; above egress
    "proxy": 4,
    "tools": 4,
    "transparent": 5,  # reuses the proxy's tunnel and SNI peek
    "redirect": 6,  # renders rules for the transparent listener's ports
    "dnsguard": 6,  # answers for the transparent listener's principals
    "app": 7,
    "commands": 8,
    "mcp_commands": 9,  # `egress-gateway mcp` and `tools`: builds the daemon's wiring through commands.py
    "cli": 10,
    "__main__": 11,
}


# Modules whose rank is not their package's name (none today; kept for a command module that
# must live beside the code it drives).
MODULE_RANKS: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    if module in MODULE_RANKS:
        return MODULE_RANKS[module]
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "gateway"


def gateway_imports(tree: ast.AST, *, top_level_only: bool) -> Iterator[str]:
    nodes = ast.iter_child_nodes(tree) if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gateway":
                # `from gateway import x` names a submodule (or the root's own __version__).
                for alias in node.names:
                    yield (
                        f"gateway.{alias.name}"
                        if (PACKAGE / alias.name).exists() or (PACKAGE / f"{alias.name}.py").exists()
                        else "gateway"
                    )
            elif node.module.startswith("gateway."):
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("gateway"))


def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_part_of_the_package_has_a_rank() -> None:
    assert {part_of(name) for name in modules()} <= set(RANKS)


def test_no_import_points_up_or_sideways() -> None:
    wrong: list[str] = []
    for name, tree in modules().items():
        source = part_of(name)
        for target in gateway_imports(tree, top_level_only=False):
            destination = part_of(target)
            if destination != source and RANKS[destination] >= RANKS[source]:
                wrong.append(f"{name} imports {target} ({source} rank {RANKS[source]} → {destination} rank "
                             f"{RANKS[destination]})")  # fmt: skip
    assert wrong == []


def test_vet_imports_nothing_of_the_gateway_but_errors() -> None:
    for name, tree in modules().items():
        if part_of(name) == "vet":
            assert {part_of(t) for t in gateway_imports(tree, top_level_only=False)} <= {"vet", "errors"}, name


def test_module_level_imports_form_no_cycle() -> None:
    graph = {
        name: {t for t in gateway_imports(tree, top_level_only=True) if t in modules_cache}
        for name, tree in modules_cache.items()
    }
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " → ".join([*path[path.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


modules_cache = modules()


@pytest.mark.parametrize(
    ("source", "target"),
    [("gateway.vet.urls", "gateway.policy.model"), ("gateway.egress.target", "gateway.proxy.server"),
     ("gateway.proxy.server", "gateway.tools.api")],
    ids=["vet-to-policy", "egress-to-proxy", "proxy-to-tools"],
)  # fmt: skip
def test_the_rule_itself_refuses_an_upward_import(source: str, target: str) -> None:
    # The check above is only worth something if it would catch these.
    assert RANKS[part_of(target)] >= RANKS[part_of(source)]
