"""No module of `gateway/` keeps mutable state at module level (the style guide's rule).

Scans every module with `ast` for a module-level assignment whose value is a mutable container:
a dict, list or set literal or comprehension, or a call that makes one (`dict()`, `bytearray()`,
`OrderedDict()`, `defaultdict()`, `deque()`, `BoundedMemo()`, ...), or a frozen table holding
one (a `MappingProxyType`, `frozenset` or tuple with a dict, list or set literal inside). Memos
belong on an object a listener owns (`proxy/http1/head_memos.HeadMemos`,
`proxy/tunnel/splice.SharedReadBuffer`); a constant table is a `MappingProxyType`, a `frozenset`
or a tuple, and a JSON schema is frozen all the way down (`tools/schemas.frozen`). `__all__` is
skipped (an export list by convention). The allow-list names each module whose state the style
guide allows and why; no constant table is allowed to stay mutable (none needs to: a caller that
hands one to orjson or json unwraps it there, as `tools/schemas.thawed` does).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import gateway
from gateway.tools import schemas

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


def _called_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


MUTABLE_LITERALS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
FREEZING_CALLS = frozenset({"MappingProxyType", "frozenset"})


def _is_mutable(value: ast.expr) -> bool:
    if isinstance(value, MUTABLE_LITERALS):
        return True
    if _called_name(value) in MUTABLE_CALLS:
        return True
    return _holds_mutable(value)


def _holds_mutable(value: ast.expr) -> bool:
    """A frozen table (a tuple, or a MappingProxyType or frozenset call) with a mutable literal in
    its items: `MappingProxyType({"a": []})` is frozen only on the outside."""
    if isinstance(value, ast.Tuple):
        items: list[ast.expr] = list(value.elts)
    elif isinstance(value, ast.Call) and _called_name(value) in FREEZING_CALLS and value.args:
        table = value.args[0]
        if isinstance(table, ast.Dict):
            items = [item for item in (*table.keys, *table.values) if item is not None]
        elif isinstance(table, ast.DictComp):
            items = [table.key, table.value]
        elif isinstance(table, (ast.Set, ast.List, ast.Tuple)):
            items = list(table.elts)
        else:
            return False
    else:
        return False
    return any(isinstance(item, MUTABLE_LITERALS) or _is_mutable(item) for item in items)


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


def test_the_scan_finds_each_kind_of_mutable_container() -> None:
    source = (
        "A = {}\nB: list[int] = []\nC = {1}\nD = dict(a=1)\nE = collections.OrderedDict()\n"
        "F = bytearray(4)\nG = BoundedMemo(8)\nH = {k: 1 for k in 'ab'}\n"
        "K = frozenset({1})\nL = (1, 2)\nM = types.MappingProxyType({})\nN: int = 1\n"
        "P = MappingProxyType({'a': [1]})\nQ = (1, {2})\nR = MappingProxyType({k: (1,) for k in 'ab'})\n"
        "def f() -> None:\n    x = {}\n"
        "class C:\n    y = []\n"
    )
    assert [name for name, _ in module_level_mutables(source)] == ["A", "B", "C", "D", "E", "F", "G", "H", "P", "Q"]


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
    ]
    assert not offenders, "module-level mutable state (move it onto an owned object, or freeze it):\n" + "\n".join(
        offenders
    )


def test_every_allowed_module_still_keeps_state() -> None:
    """A stale allow-list entry would let new state into that module unnoticed."""
    for module in ALLOWED_MODULES:
        assert module_level_mutables((GATEWAY / module).read_text(encoding="utf-8")), module


def _mutable_parts(document: object) -> list[str]:
    if isinstance(document, (dict, list, set)):
        return [type(document).__name__]
    if isinstance(document, Mapping):
        return [part for value in document.values() for part in _mutable_parts(value)]
    if isinstance(document, (tuple, frozenset)):
        return [part for item in document for part in _mutable_parts(item)]
    return []


def test_the_tool_schemas_are_frozen_all_the_way_down() -> None:
    """The schemas are built by `frozen` (a call the scan above cannot see into): no dict, list
    or set anywhere inside one, so no caller can change what another renders."""
    tables = {name: value for name, value in vars(schemas).items() if name.isupper() and isinstance(value, Mapping)}
    assert {"FETCH_ARGUMENTS", "SEARCH_ARGUMENTS", "FETCH_RESULT", "ERROR_BODY"} <= set(tables)
    assert {name: _mutable_parts(value) for name, value in tables.items() if _mutable_parts(value)} == {}
    for spec in schemas.TOOL_SPECS:
        assert _mutable_parts(spec.arguments) == _mutable_parts(spec.result) == []
