"""The package's layering, read from the source with `ast` (issues 11 and 27).

Each part of `gateway` has a rank; an import may only point to a strictly lower rank, so the
drawing proxy/tools → egress → policy → vet → errors has no arrow back up, and two parts of the
same rank (proxy and tools) never import each other. Every import counts: at module level, inside
a function (it still runs, later) and under `if TYPE_CHECKING:` (a type-only import is still a
dependency of the reader and of mypy). Module-level imports form no cycle; all imports together
form none either, but for the few type-only edges `ALLOWED_BACK_EDGES` names with their reason.

Inside `gateway/proxy/` the folders are ranked the same way (`PROXY_RANKS`: the HTTP/1.1 core,
TLS peeking and deadlines at the bottom, then decisions, then tunnels and forwarding, then the
listener at the package's root), and the pure folders import neither asyncio nor any socket API.
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


def all_imports(tree: ast.AST) -> Iterator[str]:
    """Every module `tree` imports, the standard library's and third parties' included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


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

# Type-only imports that close a cycle, each with why it is right (a new one fails the test below).
ALLOWED_BACK_EDGES: dict[tuple[str, str], str] = {
    # None today: `policy/node_reader.py` took the YAML node reader that `policy/transparent.py` and
    # `policy/inspect_load.py` annotated with out of `policy/load.py`, their caller.
}

# Inside gateway/proxy/: a folder may only import folders of strictly lower rank (or itself).
PROXY_RANKS: dict[str, int] = {
    "http1": 0,  # the HTTP/1.1 core: bytes in, heads and events out
    "tls": 0,  # the ClientHello peek and the SNI gate
    "deadlines": 0,  # the deadline wheel and what each deadline means
    "decision": 1,  # caches in front of the egress core's decision, and the audit records
    "tunnel": 2,  # opening a CONNECT and the splice
    "forward": 2,  # plain HTTP: dispatch, exchange, upstream, pool
    "": 3,  # the listener: server.py and client_connection.py
    "inspected": 4,  # TLS inspection: composes the listener's client connection and dispatcher
}
# Sans I/O: no event loop, no socket API.
PURE_PROXY_FOLDERS = ("http1", "tls")
PURE_PROXY_MODULES = ("gateway.proxy.deadlines.limits",)
IO_MODULES = ("asyncio", "socket", "selectors", "ssl", "uvloop")


def full_graph() -> dict[str, set[str]]:
    """Every import between modules of the gateway: module level, inside functions, type-only."""
    return {
        name: {t for t in gateway_imports(tree, top_level_only=False) if t in modules_cache and t != name}
        for name, tree in modules_cache.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_all_imports_form_no_cycle_but_the_allowed_back_edges() -> None:
    graph = full_graph()
    for source, target in ALLOWED_BACK_EDGES:
        assert target in graph[source], f"{source} no longer imports {target}: drop it from ALLOWED_BACK_EDGES"
        graph[source].discard(target)
    assert cycles(graph) == []


def test_every_allowed_back_edge_is_type_only() -> None:
    for source, target in ALLOWED_BACK_EDGES:
        tree = modules_cache[source]
        guarded = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        ]
        runtime = set(gateway_imports(tree, top_level_only=False)) - {
            t for block in guarded for statement in block.body for t in gateway_imports(statement, top_level_only=False)
        }
        assert target not in runtime, f"{source} imports {target} at run time"


def proxy_folder(module: str) -> str | None:
    """The folder of `gateway.proxy` a module is in ("" for the package's root), or None."""
    pieces = module.split(".")
    if pieces[:2] != ["gateway", "proxy"]:
        return None
    # gateway.proxy.<folder>[.<module>] (a folder's own __init__ is in it), else a root module.
    return pieces[2] if len(pieces) > 2 and (PACKAGE / "proxy" / pieces[2]).is_dir() else ""


def test_every_proxy_module_is_in_a_ranked_folder() -> None:
    assert {proxy_folder(name) for name in modules_cache} - {None} <= set(PROXY_RANKS)


def test_no_proxy_import_points_up_or_sideways_between_folders() -> None:
    wrong: list[str] = []
    for name, tree in modules_cache.items():
        source = proxy_folder(name)
        if source is None:
            continue
        for target in gateway_imports(tree, top_level_only=False):
            destination = proxy_folder(target)
            if destination is None or destination == source:
                continue
            if PROXY_RANKS[destination] >= PROXY_RANKS[source]:
                wrong.append(f"{name} imports {target} (proxy/{source} → proxy/{destination})")
    assert wrong == []


def test_each_proxy_folder_holds_no_cycle() -> None:
    graph = full_graph()
    for folder in PROXY_RANKS:
        inside = {name for name in graph if proxy_folder(name) == folder}
        assert cycles({name: graph[name] & inside for name in inside}) == [], folder


def test_the_pure_proxy_folders_use_no_event_loop_or_socket() -> None:
    pure = [name for name in modules_cache if proxy_folder(name) in PURE_PROXY_FOLDERS or name in PURE_PROXY_MODULES]
    assert len(pure) > len(PURE_PROXY_FOLDERS)
    for name in pure:
        used = {imported.split(".")[0] for imported in all_imports(modules_cache[name])}
        assert used.isdisjoint(IO_MODULES), name


@pytest.mark.parametrize(
    ("source", "target"),
    [("gateway.proxy.http1.heads", "gateway.proxy.decision.caches"),
     ("gateway.proxy.forward.dispatch", "gateway.proxy.tunnel.opener"),
     ("gateway.proxy.decision.records", "gateway.proxy.forward.exchange"),
     ("gateway.proxy.tunnel.splice", "gateway.proxy.server")],
    ids=["core-to-decision", "forward-to-tunnel", "decision-to-forward", "tunnel-to-listener"],
)  # fmt: skip
def test_the_proxy_rule_itself_refuses_an_upward_import(source: str, target: str) -> None:
    source_folder, target_folder = proxy_folder(source), proxy_folder(target)
    assert source_folder is not None
    assert target_folder is not None
    assert PROXY_RANKS[target_folder] >= PROXY_RANKS[source_folder]


def test_the_cycle_check_itself_finds_a_type_only_cycle() -> None:
    # As `tools/api.py` and `tools/mcp/http.py` once formed one through a function-level import.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    ("source", "target"),
    [("gateway.vet.urls", "gateway.policy.model"), ("gateway.egress.target", "gateway.proxy.server"),
     ("gateway.proxy.server", "gateway.tools.api")],
    ids=["vet-to-policy", "egress-to-proxy", "proxy-to-tools"],
)  # fmt: skip
def test_the_rule_itself_refuses_an_upward_import(source: str, target: str) -> None:
    # The check above is only worth something if it would catch these.
    assert RANKS[part_of(target)] >= RANKS[part_of(source)]
