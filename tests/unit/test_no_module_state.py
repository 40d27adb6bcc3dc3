"""No module of `gateway/` keeps mutable state at module level (the style guide's rule).

Scans every module with `ast` for a module-level assignment whose value is a mutable container:
a dict, list or set literal or comprehension, or a call that makes one (`dict()`, `bytearray()`,
`OrderedDict()`, `defaultdict()`, `deque()`, `BoundedMemo()`, ...). Memos belong on an object a
listener owns (`proxy/http1/head_memos.HeadMemos`, `proxy/tunnel/splice.SharedReadBuffer`); a
new constant table is a `MappingProxyType`, a `frozenset` or a tuple. `__all__` is skipped (an
export list by convention). The allow-lists name each exception and why it is one; the constant
tables allowed are checked never to be written anywhere in `gateway/` (no item assignment or
deletion, no mutating method called on the name), so each stays a table, not state.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gateway

GATEWAY = Path(gateway.__file__).parent
MUTABLE_CALLS = frozenset(
    {"dict", "list", "set", "bytearray", "OrderedDict", "defaultdict", "deque", "Counter", "BoundedMemo", "WeakSet"}
    | {"WeakValueDictionary", "WeakKeyDictionary", "ChainMap"}
)
# Modules whose module-level mutables are state the style guide allows, and why.
ALLOWED_MODULES = {
    # The metrics registry: the one global mutable state the style guide allows.
    "observe/metrics.py": "the metrics registry",
    # `spawn` keeps a strong reference to each live task (asyncio keeps only weak ones, so an
    # unreferenced task may be collected mid-run) and drops it when the task ends.
    "tasks.py": "the live tasks spawn() must keep referenced",
}
# Constant tables built once at import from a fixed domain and only read after (the scan below
# checks that no module writes them). They predate this test: each could be frozen
# (MappingProxyType, frozenset), which some callers (orjson dumps of the tool schemas, `json`
# schema dicts) would have to unwrap first.
CONSTANT_TABLES: dict[str, tuple[str, ...]] = {
    "budget/redis_connect.py": ("_SCHEMES",),
    "egress/resolver.py": ("_FAILURE_REASONS",),
    "errors.py": ("HTTP_STATUS",),
    "observe/verdicts.py": ("_OUTCOME_BY_CODE", "_OUTCOME_BY_CLOSE", "_RULE_BY_CODE"),
    "policy/credentials.py": ("CREDENTIAL_KEYS", "ENTRY_KEYS", "BIND_KEYS", "SCAN_KEYS"),
    "policy/inspect_load.py": ("ENTRY_KEYS", "RULE_KEYS"),
    "policy/node_reader.py": ("_CHOICES",),
    "policy/request_rules.py": ("PRESET_METHODS",),
    "policy/suggest.py": ("_UNIT_SECONDS",),
    "policy/transparent.py": ("KEYS", "DNS_KEYS"),
    "proxy/http1/heads.py": ("REASONS", "CHANGE_HINTS"),
    "scan/rules.py": ("COMPILED",),
    "tools/api.py": ("_BUDGET_KEYS",),
    "tools/extract/challenge.py": ("HIDDEN_CLOSE",),
    "tools/extract/decode.py": ("WHATWG_SUPERSETS",),
    "tools/extract/main_content.py": ("TAG_BASE_SCORE",),
    "tools/extract/main_content_words.py": ("JUNK_TAGS", "CHROME_TAGS"),
    "tools/extract/markdown_render.py": ("HEADING_LEVEL",),
    "tools/extract/structure_guard.py": ("_RAW_TEXT_END",),
    "tools/mcp/envelope.py": ("NAME_BEARING_METHODS", "ERROR_HTTP_STATUS"),
    "tools/mcp/protocol.py": ("SERVER_INFO",),
    "tools/mcp/results.py": ("NEXT_STEP",),
    "tools/openapi.py": ("API_STATUS", "_EDGE_STATUSES"),
    "tools/schemas.py": (
        "FETCH_ARGUMENTS",
        "SEARCH_ARGUMENTS",
        "_BUDGET_RESULT",
        "CONTROL_CHARS_REMOVED",
        "FETCH_RESULT",
        "SEARCH_RESULT",
        "ERROR_BODY",
        "TOOL_ANNOTATIONS",
    ),
    "tools/search/aggregate.py": ("_OUTCOME_FOR_KIND", "_ENGINE_ERROR_TEXT"),
    "tools/search/bing.py": ("_RELATIVE_FILTERS",),
    "tools/search/brave.py": ("_TIME_FILTERS",),
    "tools/search/brave_api.py": ("_FRESHNESS",),
    "tools/search/links.py": ("_DEFAULT_PORTS",),
    "tools/search/registry.py": ("ENGINES",),
    "tools/search/searxng.py": ("_TIME_RANGES",),
    "tools/search/tavily.py": ("_TIME_RANGES",),
    "vet/urls.py": ("DEFAULT_PORTS",),
}
MUTATING_METHODS = frozenset(
    {"append", "add", "update", "pop", "popitem", "clear", "remove", "discard", "extend", "insert", "setdefault"}
    | {"put", "sort", "reverse", "difference_update", "intersection_update", "symmetric_difference_update"}
)


def _called_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


def _is_mutable(value: ast.expr) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    return _called_name(value) in MUTABLE_CALLS


def _targets(statement: ast.stmt) -> tuple[list[ast.expr], ast.expr | None]:
    if isinstance(statement, ast.Assign):
        return statement.targets, statement.value
    if isinstance(statement, ast.AnnAssign):
        return [statement.target], statement.value
    return [], None


def module_level_mutables(source: str) -> list[tuple[str, int]]:
    """The names (and lines) a module binds at its top level to a mutable container."""
    found: list[tuple[str, int]] = []
    for statement in ast.parse(source).body:
        targets, value = _targets(statement)
        if value is None or not _is_mutable(value):
            continue
        for target in targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Name) and node.id != "__all__":
                    found.append((node.id, statement.lineno))
    return found


def writes_to(source: str, names: frozenset[str]) -> list[tuple[str, int]]:
    """Where a module writes one of `names`: an item assigned or deleted, a mutating method called."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            base = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATING_METHODS:
            base = node.func.value
        else:
            continue
        if isinstance(base, ast.Attribute):  # `module.NAME[...] = ...`
            name = base.attr
        elif isinstance(base, ast.Name):
            name = base.id
        else:
            continue
        if name in names:
            found.append((name, node.lineno))
    return found


def test_the_scan_finds_each_kind_of_mutable_container() -> None:
    source = (
        "A = {}\nB: list[int] = []\nC = {1}\nD = dict(a=1)\nE = collections.OrderedDict()\n"
        "F = bytearray(4)\nG = BoundedMemo(8)\nH = {k: 1 for k in 'ab'}\n"
        "K = frozenset({1})\nL = (1, 2)\nM = types.MappingProxyType({})\nN: int = 1\n"
        "def f() -> None:\n    x = {}\n"
        "class C:\n    y = []\n"
    )
    assert [name for name, _ in module_level_mutables(source)] == ["A", "B", "C", "D", "E", "F", "G", "H"]


def test_the_write_scan_finds_item_writes_and_mutating_calls() -> None:
    source = "T[1] = 2\ndel T[3]\nT.update(a=1)\nm.T.add(4)\nT.get(1)\nU[1] = 2\nx = T[1]\n"
    assert writes_to(source, frozenset({"T"})) == [("T", 1), ("T", 2), ("T", 3), ("T", 4)]


def _modules() -> list[tuple[str, str]]:
    return [
        (path.relative_to(GATEWAY).as_posix(), path.read_text(encoding="utf-8"))
        for path in sorted(GATEWAY.rglob("*.py"))
    ]


def test_no_gateway_module_keeps_mutable_state_at_module_level() -> None:
    offenders = [
        f"gateway/{module}:{line} {name}"
        for module, source in _modules()
        if module not in ALLOWED_MODULES
        for name, line in module_level_mutables(source)
        if name not in CONSTANT_TABLES.get(module, ())
    ]
    assert not offenders, "module-level mutable state (move it onto an owned object, or freeze it):\n" + "\n".join(
        offenders
    )


def test_the_allowed_constant_tables_are_never_written() -> None:
    names = frozenset(name for table in CONSTANT_TABLES.values() for name in table)
    writes = [
        f"gateway/{module}:{line} {name}" for module, source in _modules() for name, line in writes_to(source, names)
    ]
    assert not writes, "a constant table is written:\n" + "\n".join(writes)


def test_every_allowed_name_is_still_there() -> None:
    """A stale allow-list entry would let a new mutable of that name in unnoticed."""
    for module, names in CONSTANT_TABLES.items():
        found = [name for name, _ in module_level_mutables((GATEWAY / module).read_text(encoding="utf-8"))]
        assert set(names) <= set(found), (module, names, found)
    for module in ALLOWED_MODULES:
        assert module_level_mutables((GATEWAY / module).read_text(encoding="utf-8")), module
