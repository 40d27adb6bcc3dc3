"""The policy's `inspect:` lists (per principal and in `defaults`): YAML nodes to `InspectEntry`
values, every mistake reported as `file:line: reason` through the loader's node reader.

Owns the schema of request rules: `host`, `ports`, `access`, `mode`, `allow` and `deny` rules
with `id`, `methods`, `paths`, `query` and `headers`. Rule ids are explicit or positional
(`inspect[0].allow[1]`). Called by `load.parse_policy`; never touches a file or a socket.
"""

from __future__ import annotations

import re
from typing import cast

import yaml

from gateway.policy.node_reader import NodeReader, normalise_glob
from gateway.policy.request_rules import (
    PRESET_METHODS,
    InspectEntry,
    InspectMode,
    PathGlob,
    RequestRule,
    ValueMatcher,
)

ENTRY_KEYS = frozenset({"host", "ports", "access", "allow", "deny", "mode"})
RULE_KEYS = frozenset({"id", "methods", "paths", "query", "headers"})
MAX_ENTRIES = 256
MAX_RULES = 256
_METHOD = re.compile(r"^[A-Z][A-Z-]{0,31}$")
_RULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")


def _methods(reader: NodeReader, node: yaml.Node, where: str) -> frozenset[str] | None:
    """A list of methods, or `*` / `[*]` for any."""
    items = [node] if isinstance(node, yaml.ScalarNode) else reader.sequence(node, where)
    methods: set[str] = set()
    for item in items:
        text = reader.string(item, where)
        if text is None:
            continue
        if text == "*":
            return None
        if not _METHOD.match(text.upper()):
            reader.error(item, f"{where}: {text!r} is not an HTTP method")
            continue
        methods.add(text.upper())
    if not methods:
        reader.error(node, f"{where} must name at least one method (or '*')")
    return frozenset(methods)


def _paths(reader: NodeReader, node: yaml.Node, where: str) -> tuple[PathGlob, ...]:
    items = [node] if isinstance(node, yaml.ScalarNode) else reader.sequence(node, where)
    globs: list[PathGlob] = []
    for item in items:
        text = reader.string(item, where)
        if text is None:
            continue
        try:
            globs.append(PathGlob.parse(text))
        except ValueError as exc:
            reader.error(item, f"{where}: {text!r}: {exc}")
    return tuple(globs)


def _matchers(reader: NodeReader, node: yaml.Node, where: str, *, headers: bool) -> tuple[ValueMatcher, ...]:
    """`name: true` (present), `name: false` (absent), `name: "glob"` (every value matches)."""
    out: list[ValueMatcher] = []
    for name, value_node in reader.mapping(node, where, set()).items():
        if headers and not _HEADER_NAME.match(name):
            reader.error(value_node, f"{where}: {name!r} is not a header name")
            continue
        key = name.lower() if headers else name
        value = reader.scalar(value_node, f"{where}.{name}")
        if isinstance(value, bool):
            out.append(ValueMatcher(key, present=value))
        elif isinstance(value, str | int | float) and str(value):
            out.append(ValueMatcher(key, glob=str(value)))
        elif value is not None:
            reader.error(value_node, f"{where}.{name} must be true, false or a value glob")
    return tuple(out)


def _rule(reader: NodeReader, node: yaml.Node, where: str, default_id: str) -> RequestRule | None:
    items = reader.mapping(node, where, RULE_KEYS)
    rule_id = default_id
    if "id" in items:
        text = reader.string(items["id"], f"{where}.id")
        if text is not None and not _RULE_ID.match(text):
            reader.error(items["id"], f"{where}.id must be 1-64 letters, digits, '.', '_', ':' or '-'")
        elif text is not None:
            rule_id = text
    if not items.keys() - {"id"}:
        reader.error(node, f"{where} names nothing to match (methods, paths, query or headers)")
        return None
    return RequestRule(
        rule_id=rule_id,
        line=node.start_mark.line + 1,
        methods=_methods(reader, items["methods"], f"{where}.methods") if "methods" in items else None,
        paths=_paths(reader, items["paths"], f"{where}.paths") if "paths" in items else (),
        query=_matchers(reader, items["query"], f"{where}.query", headers=False) if "query" in items else (),
        headers=_matchers(reader, items["headers"], f"{where}.headers", headers=True) if "headers" in items else (),
    )


def _rules(reader: NodeReader, node: yaml.Node, where: str, entry_id: str, kind: str) -> tuple[RequestRule, ...]:
    items = reader.sequence(node, where)
    if len(items) > MAX_RULES:
        reader.error(node, f"{where}: at most {MAX_RULES} rules")
    rules = [
        _rule(reader, item, f"{where}[{index}]", f"{entry_id}.{kind}[{index}]") for index, item in enumerate(items)
    ]
    return tuple(r for r in rules if r is not None)


def _entry(reader: NodeReader, node: yaml.Node, where: str, entry_id: str) -> InspectEntry | None:
    items = reader.mapping(node, where, ENTRY_KEYS)
    if "host" not in items:
        reader.error(node, f"{where} needs a host")
        return None
    text = reader.string(items["host"], f"{where}.host")
    host = normalise_glob(text) if text is not None else None
    if host is None:
        if text is not None:
            reader.error(items["host"], f"{where}.host: {text!r} is not '*', '*.domain' or a domain name")
        return None
    ports: tuple[int, ...] = ()
    if "ports" in items:
        values = [
            reader.integer(p, f"{where}.ports", 1, 65535) for p in reader.sequence(items["ports"], f"{where}.ports")
        ]
        ports = tuple(p for p in values if p is not None)
    allow = _rules(reader, items["allow"], f"{where}.allow", entry_id, "allow") if "allow" in items else ()
    deny = _rules(reader, items["deny"], f"{where}.deny", entry_id, "deny") if "deny" in items else ()
    if "access" in items:
        access = reader.choice(items["access"], f"{where}.access", tuple(PRESET_METHODS))
        if access is not None:
            preset = RequestRule(f"{entry_id}.access", items["access"].start_mark.line + 1, PRESET_METHODS[access])
            # The preset is one allow rule after the explicit ones: an explicit rule that says
            # more is named in the audit line when both match.
            allow = (*allow, preset)
    elif not allow:
        reader.error(node, f"{where} needs access or allow rules (deny rules alone would allow nothing)")
    mode = reader.choice(items["mode"], f"{where}.mode", ("enforce", "report")) if "mode" in items else None
    return InspectEntry(entry_id, host, node.start_mark.line + 1, ports, allow, deny, cast("InspectMode | None", mode))


def parse_inspect(reader: NodeReader, node: yaml.Node, where: str, id_prefix: str) -> tuple[InspectEntry, ...]:
    """`where` names the list in errors (`principals.ci.inspect`); ids are `{id_prefix}[i]`."""
    items = reader.sequence(node, where)
    if len(items) > MAX_ENTRIES:
        reader.error(node, f"{where}: at most {MAX_ENTRIES} entries")
    entries = [_entry(reader, item, f"{where}[{index}]", f"{id_prefix}[{index}]") for index, item in enumerate(items)]
    ids = [r.rule_id for e in entries if e is not None for r in (*e.allow, *e.deny)]
    if len(ids) != len(set(ids)):
        reader.error(node, f"{where}: two rules share one id (audit lines could not tell them apart)")
    return tuple(e for e in entries if e is not None)
