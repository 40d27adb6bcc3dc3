"""The policy's `credentials:` and `scan:` sections: YAML nodes to typed values, line-numbered errors.

Owns the schema of credential brokering (where a real value comes from, the placeholder's shape,
where the value is injected, what it is bound to) and of outbound secret scanning (each tier's
action, the body window). Called by `load.parse_policy` with its node reader; never reads a
secret, a file or the environment (the values are `gateway/credentials/`'s to read).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import yaml

from gateway.policy.model import (
    DEFAULT_SCAN_WINDOW_BYTES,
    CredentialBinding,
    CredentialRule,
    CredentialSettings,
    Injection,
    PlaceholderShape,
    Principal,
    ScanSettings,
    SecretSource,
)
from gateway.policy.node_reader import NodeReader

CREDENTIAL_KEYS = frozenset({"placeholder_key", "entries"})
ENTRY_KEYS = frozenset({"name", "source", "inject", "bind", "require", "placeholder", "agent_env"})
BIND_KEYS = frozenset({"hosts", "ports", "methods", "paths", "principals"})
SCAN_KEYS = frozenset({"tier1", "tier2", "tier3", "body_window_bytes"})
SCAN_ACTIONS = ("deny", "report", "off")
MAX_CREDENTIALS = 256
# A placeholder's random part: 22 characters of [A-Za-z0-9] carry 131 bits (16+ random bytes).
PLACEHOLDER_MARKER = "egph"
MIN_RANDOM_CHARS = 22
MAX_PLACEHOLDER_CHARS = 200
MAX_SCAN_WINDOW_BYTES = 16 * 1024 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
_METHOD = re.compile(r"^[A-Z]{1,20}$")
_PREFIX = re.compile(r"^[A-Za-z0-9_-]{0,40}$")
_PATH_GLOB = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*$")
# Headers a credential may never be injected into: the proxy's own, and framing fields.
_RESERVED_HEADERS = frozenset(
    {"proxy-authorization", "host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
)


def parse_scan(reader: NodeReader, node: yaml.Node, where: str) -> ScanSettings:
    """`scan: {tier1, tier2, tier3: deny|report|off, body_window_bytes}`; omitted keys keep the
    defaults (deny, deny, report, 1 MiB)."""
    items = reader.mapping(node, where, SCAN_KEYS)
    changes: dict[str, Any] = {}
    for tier in ("tier1", "tier2", "tier3"):
        if tier in items:
            value_node = items[tier]
            # YAML 1.1 reads an unquoted `off` as False: the word is meant.
            if isinstance(value_node, yaml.ScalarNode) and value_node.value in SCAN_ACTIONS:
                changes[tier] = value_node.value
            else:
                changes[tier] = reader.choice(value_node, f"{where}.{tier}", SCAN_ACTIONS)
    if "body_window_bytes" in items:
        changes["body_window_bytes"] = reader.integer(
            items["body_window_bytes"], f"{where}.body_window_bytes", 0, MAX_SCAN_WINDOW_BYTES
        )
    base = ScanSettings(body_window_bytes=DEFAULT_SCAN_WINDOW_BYTES)
    return replace(base, **{k: v for k, v in changes.items() if v is not None})


def _source(reader: NodeReader, node: yaml.Node, where: str) -> SecretSource | None:
    items = reader.mapping(node, where, {"env", "file"})
    if len(items) != 1:
        reader.error(node, f"{where} must name exactly one of env or file")
        return None
    ((kind, value_node),) = items.items()
    text = reader.string(value_node, f"{where}.{kind}")
    if text is None:
        return None
    if kind == "env" and not _ENV_NAME.match(text):
        reader.error(value_node, f"{where}.env: {text!r} is not an environment variable name")
        return None
    if kind == "file" and not text.startswith("/"):
        reader.error(value_node, f"{where}.file must be an absolute path")
        return None
    return SecretSource("env" if kind == "env" else "file", text)


def _injection(reader: NodeReader, node: yaml.Node, where: str) -> Injection | None:
    if isinstance(node, yaml.ScalarNode):
        if node.value == "bearer":
            return Injection("bearer")
        reader.error(node, f"{where} must be bearer, {{basic: USERNAME}} or {{header: NAME}}")
        return None
    items = reader.mapping(node, where, {"basic", "header"})
    if len(items) != 1:
        reader.error(node, f"{where} must be bearer, {{basic: USERNAME}} or {{header: NAME}}")
        return None
    ((kind, value_node),) = items.items()
    text = reader.string(value_node, f"{where}.{kind}")
    if text is None:
        return None
    if kind == "basic":
        if ":" in text or not text.isprintable():
            reader.error(value_node, f"{where}.basic: the username may not contain ':' or control characters")
            return None
        return Injection("basic", username=text)
    name = text.lower()
    if not _HEADER_NAME.match(text) or name in _RESERVED_HEADERS:
        reader.error(value_node, f"{where}.header: {text!r} is not a header a credential may go into")
        return None
    return Injection("header", header=name)


def _shape(reader: NodeReader, node: yaml.Node, where: str) -> PlaceholderShape | None:
    items = reader.mapping(node, where, {"prefix", "length"})
    prefix = reader.scalar(items["prefix"], f"{where}.prefix") if "prefix" in items else ""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        reader.error(node, f"{where}.prefix must be up to 40 letters, digits, '_' or '-'")
        return None
    least = len(prefix) + len(PLACEHOLDER_MARKER) + MIN_RANDOM_CHARS
    if "length" not in items:
        return PlaceholderShape(prefix, least + 10)
    length = reader.integer(items["length"], f"{where}.length", least, MAX_PLACEHOLDER_CHARS)
    return None if length is None else PlaceholderShape(prefix, length)


def _strings(reader: NodeReader, node: yaml.Node, where: str, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    out: list[str] = []
    for item in reader.sequence(node, where):
        text = reader.string(item, where)
        if text is not None and not pattern.match(text):
            reader.error(item, f"{where}: {text!r} is not {what}")
        elif text is not None:
            out.append(text)
    return tuple(out)


def _binding(
    reader: NodeReader, node: yaml.Node, where: str, principals: dict[str, Principal]
) -> CredentialBinding | None:
    items = reader.mapping(node, where, BIND_KEYS)
    if "hosts" not in items:
        reader.error(node, f"{where}.hosts is required")
        return None
    hosts = reader.domain_globs(items["hosts"], f"{where}.hosts")
    if "*" in hosts:
        # A credential bound to every host is a credential handed to whoever asks.
        reader.error(items["hosts"], f"{where}.hosts may not be '*'")
        return None
    if not hosts:
        reader.error(items["hosts"], f"{where}.hosts must name at least one host")
        return None
    ports: tuple[int, ...] = (443,)
    if "ports" in items:
        listed = [reader.integer(p, f"{where}.ports", 1, 65535) for p in reader.sequence(items["ports"], where)]
        ports = tuple(p for p in listed if p is not None)
    methods = (
        _strings(reader, items["methods"], f"{where}.methods", _METHOD, "an upper-case method")
        if ("methods" in items)
        else ()
    )
    paths = (
        _strings(reader, items["paths"], f"{where}.paths", _PATH_GLOB, "a path glob starting with '/'")
        if ("paths" in items)
        else ()
    )
    allowed: list[str] = []
    for item in reader.sequence(items["principals"], f"{where}.principals") if "principals" in items else []:
        text = reader.string(item, f"{where}.principals")
        if text is not None and text not in principals:
            reader.error(item, f"{where}.principals: no principal named {text!r}")
        elif text is not None:
            allowed.append(text)
    return CredentialBinding(tuple(hosts), ports, methods, paths, tuple(allowed))


def _entry(reader: NodeReader, node: yaml.Node, index: int, principals: dict[str, Principal]) -> CredentialRule | None:
    where = f"credentials.entries[{index}]"
    items = reader.mapping(node, where, ENTRY_KEYS)
    for required in ("name", "source", "inject", "bind"):
        if required not in items:
            reader.error(node, f"{where}.{required} is required")
    if not {"name", "source", "inject", "bind"} <= items.keys():
        return None
    name = reader.string(items["name"], f"{where}.name")
    if name is not None and not _NAME.match(name):
        reader.error(items["name"], f"{where}.name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
        name = None
    source = _source(reader, items["source"], f"{where}.source")
    inject = _injection(reader, items["inject"], f"{where}.inject")
    bind = _binding(reader, items["bind"], f"{where}.bind", principals)
    require = bool(reader.boolean(items["require"], f"{where}.require")) if "require" in items else False
    shape = _shape(reader, items["placeholder"], f"{where}.placeholder") if "placeholder" in items else None
    agent_env = ""
    if "agent_env" in items:
        agent_env = reader.string(items["agent_env"], f"{where}.agent_env") or ""
        if agent_env and not _ENV_NAME.match(agent_env):
            reader.error(items["agent_env"], f"{where}.agent_env: {agent_env!r} is not an environment variable name")
    if name is None or source is None or inject is None or bind is None:
        return None
    return CredentialRule(name, source, inject, bind, require, shape, agent_env)


def parse_credentials(reader: NodeReader, node: yaml.Node, principals: dict[str, Principal]) -> CredentialSettings:
    """`credentials: {placeholder_key: {env|file}, entries: [...]}`."""
    items = reader.mapping(node, "credentials", CREDENTIAL_KEYS)
    key = (
        _source(reader, items["placeholder_key"], "credentials.placeholder_key") if "placeholder_key" in items else None
    )
    entries: list[CredentialRule] = []
    if "entries" in items:
        listed = reader.sequence(items["entries"], "credentials.entries")
        if len(listed) > MAX_CREDENTIALS:
            reader.error(items["entries"], f"credentials.entries: at most {MAX_CREDENTIALS} credentials")
        seen: set[str] = set()
        for index, entry_node in enumerate(listed[:MAX_CREDENTIALS]):
            entry = _entry(reader, entry_node, index, principals)
            if entry is None:
                continue
            if entry.name in seen:
                reader.error(entry_node, f"credentials.entries[{index}].name {entry.name!r} is given twice")
                continue
            seen.add(entry.name)
            entries.append(entry)
    if entries and "placeholder_key" not in items:
        # Placeholders are derived from this key so they stay the same across restarts.
        reader.error(node, "credentials.placeholder_key is required when credentials are listed")
    return CredentialSettings(key, tuple(entries))
