"""Typed access to a policy file's YAML nodes, recording each error with its line number.

Owns `NodeReader` (mappings, scalars, numbers, choices, sequences, CIDRs, domain globs and
dataclass fields read from nodes, every mistake kept as `file:line: reason`) and
`normalise_glob`. Shared by `load.py` and the section parsers it calls (`transparent.py`,
`inspect_load.py`), below all of them, so that none imports its caller.

Never reads a file, never decides anything, never raises on a malformed node (it records).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import fields, replace
from types import MappingProxyType
from typing import Any, TypeVar

import idna
import yaml

from gateway.vet.addresses import IPNetwork

T = TypeVar("T")


class NodeReader:
    """Typed access to YAML nodes that records errors with their line numbers."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.errors: list[str] = []
        # Builds a scalar's value from the tag the composer resolved: what yaml.safe_load gives.
        self._constructor = yaml.constructor.SafeConstructor()

    def error(self, node: yaml.Node, message: str) -> None:
        self.errors.append(f"{self.source}:{node.start_mark.line + 1}: {message}")

    def mapping(self, node: yaml.Node, where: str, allowed: AbstractSet[str]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            self.error(node, f"{where} must be a mapping")
            return {}
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                self.error(key_node, f"{where}: keys must be strings")
                continue
            if key in out:
                self.error(key_node, f"{where}.{key} is given twice")
                continue
            if allowed and key not in allowed:
                self.error(key_node, f"{where}: unknown key {key!r} (expected one of {sorted(allowed)})")
                continue
            out[key] = value_node
        return out

    def scalar(self, node: yaml.Node, where: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.error(node, f"{where} must be a single value")
            return None
        return self._constructor.construct_object(node)

    def integer(self, node: yaml.Node, where: str, low: int, high: int) -> int | None:
        value = self.scalar(node, where)
        if isinstance(value, bool) or not isinstance(value, int):
            if value is not None:
                self.error(node, f"{where} must be an integer")
            return None
        if not low <= value <= high:
            self.error(node, f"{where} must be between {low} and {high}, got {value}")
            return None
        return value

    def number(self, node: yaml.Node, where: str, low: float, high: float) -> float | None:
        value = self.scalar(node, where)
        if isinstance(value, bool) or not isinstance(value, int | float):
            if value is not None:
                self.error(node, f"{where} must be a number")
            return None
        if not low <= value <= high:
            self.error(node, f"{where} must be between {low} and {high}, got {value}")
            return None
        return float(value)

    def boolean(self, node: yaml.Node, where: str) -> bool | None:
        value = self.scalar(node, where)
        if not isinstance(value, bool):
            self.error(node, f"{where} must be true or false")
            return None
        return value

    def choice(self, node: yaml.Node, where: str, choices: tuple[str, ...]) -> str | None:
        value = self.scalar(node, where)
        if value not in choices:
            self.error(node, f"{where} must be one of {', '.join(choices)}, got {value!r}")
            return None
        return str(value)

    def string(self, node: yaml.Node, where: str) -> str | None:
        value = self.scalar(node, where)
        if not isinstance(value, str) or not value:
            self.error(node, f"{where} must be a non-empty string")
            return None
        return value

    def sequence(self, node: yaml.Node, where: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            self.error(node, f"{where} must be a list")
            return []
        return list(node.value)

    def cidrs(self, node: yaml.Node, where: str) -> tuple[IPNetwork, ...]:
        nets: list[IPNetwork] = []
        for item in self.sequence(node, where):
            text = self.string(item, where)
            if text is None:
                continue
            try:
                nets.append(ipaddress.ip_network(text, strict=True))
            except ValueError as exc:
                self.error(item, f"{where}: {text!r} is not a CIDR network ({exc})")
        return tuple(nets)

    def domain_globs(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        globs: list[str] = []
        for item in self.sequence(node, where):
            text = self.string(item, where)
            if text is None:
                continue
            glob = normalise_glob(text)
            if glob is None:
                self.error(item, f"{where}: {text!r} is not '*', '*.domain' or a domain name")
            else:
                globs.append(glob)
        return tuple(globs)

    def dataclass_fields(self, node: yaml.Node, where: str, base: T) -> T:
        """Override a settings dataclass's fields from a mapping, type-checked by default value."""
        names = {f.name for f in fields(base)}  # type: ignore[arg-type]
        changes: dict[str, Any] = {}
        for key, value_node in self.mapping(node, where, names).items():
            current = getattr(base, key)
            path = f"{where}.{key}"
            value: Any
            if isinstance(current, bool):
                value = self.boolean(value_node, path)
            elif isinstance(current, int):
                value = self.integer(value_node, path, 0, 2**40)
            elif isinstance(current, float):
                value = self.number(value_node, path, 0.0, 86_400.0 * 7)
            else:
                choices = _CHOICES.get(key)
                # YAML 1.1 reads an unquoted `off` (or `on`, `yes`, `no`) as a boolean; a choice
                # written that way means the word, as the policy reference writes it (`sni: off`).
                if choices and isinstance(value_node, yaml.ScalarNode) and value_node.value in choices:
                    changes[key] = value_node.value
                    continue
                value = self.string(value_node, path)
                if value is not None and choices and value not in choices:
                    self.error(value_node, f"{path} must be one of {', '.join(choices)}")
                    value = None
            if value is not None:
                changes[key] = value
        return replace(base, **changes)  # type: ignore[type-var]


_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "sni": ("require", "match-if-present", "off"),
        "robots": ("respect", "ignore"),
    }
)


def normalise_glob(text: str) -> str | None:
    """`*`, `*.example.com` or `example.com`, IDNA-normalised; None if malformed."""
    text = text.strip().lower().rstrip(".")
    if text == "*":
        return text
    prefix = ""
    if text.startswith("*."):
        prefix, text = "*.", text[2:]
    if not text or "*" in text or "/" in text or ":" in text:
        return None
    try:
        ascii_name = idna.encode(text, uts46=True, transitional=False).decode("ascii")
    except (idna.IDNAError, UnicodeError, ValueError):
        # IP literals written in a rule are kept verbatim: literal hosts are matched as text.
        try:
            return prefix + str(ipaddress.ip_address(text)) if not prefix else None
        except ValueError:
            return None
    return prefix + ascii_name
